"""experiments.dvworld.charts: table-value alignment against a brute-force pairing of cells, chart extraction through the
sandbox recovering the exact series of hand-written charts, the visual and DV-Evol scores."""
import math
import os
import random
import textwrap

import pytest

from experiments.dvworld import charts


def _cell(v):
  """The comparison key, written out: missing, a number to 2 decimals, or stripped text."""
  if v is None or (isinstance(v, float) and math.isnan(v)):
    return ("missing",)
  try:
    f = float(v)
  except (TypeError, ValueError):
    return ("text", str(v).strip())
  return ("num", round(f, 2)) if math.isfinite(f) else ("text", str(v).strip())


def brute_force(gold: dict, cand: dict) -> float:
  """Every gold cell of a shared column takes one still-free equal candidate cell of that column, by search."""
  common = [k for k in gold if k in cand]
  if not common or not gold[common[0]] or not next(iter(cand.values())):
    return 0.0
  matched = total = 0
  for k in common:
    free = [_cell(v) for v in cand[k]]
    for v in gold[k]:
      total += 1
      key = _cell(v)
      for i, w in enumerate(free):
        if w == key:
          matched += 1
          del free[i]
          break
  return matched / total


def test_hand_made_tables():
  gold = {"day": ["Sat", "Sun", "Thur"], "tip": [2.99, 3.255, 1.0]}
  shuffled = {"tip": [1.0, 3.2549, 2.994], "day": ["Thur", " Sun", "Sat"]}  # order, rounding, spaces
  assert charts.table_alignment(gold, shuffled) == 1.0
  assert charts.table_alignment(gold, {"day": ["Sat", "Sun", "Thur"], "tip": [2.99, 3.27, 1.0]}) == 5 / 6
  assert charts.table_alignment({"a": [1, 1, 2]}, {"a": [1, 2, 2]}) == 2 / 3  # duplicates count once each
  assert charts.table_alignment({"a": [1, 1]}, {"a": [1, 1, 1, 1]}) == 1.0  # extra candidate cells: recall
  # A gold column the candidate lacks is left out (the reference's rule); no shared column scores 0.
  assert charts.table_alignment({"a": [1, 2], "b": [3, 4]}, {"a": [2, 1]}) == 1.0
  assert charts.table_alignment({"a": [1, 2]}, {"A": [1, 2]}) == 0.0
  assert charts.table_alignment({"a": []}, {"a": [1]}) == 0.0
  assert charts.table_alignment({"a": ["3", None, float("nan")]}, {"a": [3.0, None, None]}) == 1.0


def test_alignment_equals_brute_force_on_random_tables():
  rng = random.Random(0)
  for _ in range(200):
    n = rng.randint(1, 8)
    pool = [rng.choice([0.1, 0.104, 0.106, 2, "x", " x", None, 7.777]) for _ in range(6)]
    gold = {c: [rng.choice(pool) for _ in range(n)] for c in rng.sample("abcd", rng.randint(1, 4))}
    cols = rng.sample("abcde", rng.randint(1, 5))
    m = rng.randint(1, 9)
    cand = {c: [rng.choice(pool) for _ in range(m)] for c in cols}
    if rng.random() < 0.3:  # a shuffled copy of gold's shared columns
      perm = rng.sample(range(n), n)
      cand = {c: [gold[c][i] for i in perm] for c in gold}
    assert charts.table_alignment(gold, cand) == pytest.approx(brute_force(gold, cand))


def test_dataframes_and_bad_tables():
  pd = pytest.importorskip("pandas")
  gold = pd.DataFrame({"x": ["a", "b"], "y": [1.0, 2.5]})
  assert charts.table_alignment(gold, {"y": [2.5, 1.0], "x": ["b", "a"]}) == 1.0
  with pytest.raises(ValueError, match="one length"):
    charts.table_alignment({"a": [1, 2], "b": [1]}, gold)
  with pytest.raises(TypeError, match="mapping of columns or a DataFrame"):
    charts.table_alignment([1, 2], gold)


def _s(kind, x, y, label=""):
  return charts.Series(kind, label, tuple(x), tuple(y))


def _chart(*series, title="t", xlabel="x", ylabel="y"):
  return charts.Chart((charts.Axes(title, xlabel, ylabel, tuple(series)),))


def test_visual_score_terms():
  gold = _chart(_s("bar", "abc", [1, 2, 3]))
  assert charts.visual_score(gold, gold) == 1.0
  assert charts.visual_score(gold, _chart(_s("line", "abc", [1, 2, 3]))) == pytest.approx(0.2 * 0 + 0.15 + 0.05)
  half = _chart(_s("bar", "abcd", [1, 2, 9, 9]), title="T ", xlabel="X", ylabel="other")
  # 2 of max(3, 4) points; one of two axis labels; the title compares case- and space-insensitively
  assert charts.visual_score(gold, half) == pytest.approx(0.2 + 0.6 * 2 / 4 + 0.075 + 0.05)
  two = _chart(_s("bar", "abc", [1, 2, 3]), _s("bar", "abc", [5, 5, 5]))
  assert charts.visual_score(gold, two) == pytest.approx(0.2 + 0.6 * 1 * 1 / 2 + 0.15 + 0.05)
  assert charts.visual_score(gold, charts.Chart(())) == 0.0
  assert charts.dv_evol_score(0.4, 1.0) == pytest.approx(0.7)
  with pytest.raises(ValueError, match=r"in \[0, 1\]"):
    charts.dv_evol_score(1.5, 0.0)


CHARTS = textwrap.dedent("""
  import datetime
  import matplotlib.pyplot as plt
  import pandas as pd
  fig, ax = plt.subplots(2, 3)
  ax[0, 0].plot([1, 2, 3], [4.5, 5, -6], label="up")
  ax[0, 0].plot(["a", "b"], [1, 2])
  ax[0, 0].set_title("Lines"); ax[0, 0].set_xlabel("step"); ax[0, 0].set_ylabel("value")
  ax[0, 1].bar(["Mon", "Tue", "Wed"], [3, 1, 2], label="days")
  ax[0, 2].barh(["p", "q"], [5, 6])
  ax[1, 0].scatter([1.5, 2.5, 1.5], [3, 4, 3])
  ax[1, 1].pie([1, 2, 3], labels=["r", "s", "t"])
  pd.Series([7, 8], index=["u", "v"]).plot.bar(ax=ax[1, 2])
  plt.savefig("out.png")
  plt.close()
  pd.DataFrame({"k": ["a", "b"], "v": [1.5, 2]}).to_csv("result.csv", index=False)
""")


@pytest.mark.sandbox
def test_extraction_recovers_the_exact_series(tmp_path):
  runs = charts.run_plots([charts.Job(CHARTS, name="all"), charts.Job("import sys\nwhile True: pass\n", name="loop"),
                           charts.Job("raise ValueError('bad column')", name="err"),
                           charts.Job("import matplotlib.pyplot as plt\nplt.plot([0, 1], [1, 0])\n", name="after")],
                          job_timeout_s=20, png_dir=str(tmp_path))
  c = runs[0].chart
  assert c.error is None and len(c.axes) == 6
  lines = c.axes[0]
  assert (lines.title, lines.xlabel, lines.ylabel, lines.chart_type) == ("Lines", "step", "value", "line")
  assert lines.series == (_s("line", [1, 2, 3], [4.5, 5, -6], "up"), _s("line", "ab", [1, 2]))
  assert c.axes[1].series == (_s("bar", ["Mon", "Tue", "Wed"], [3, 1, 2], "days"),)
  assert c.axes[2].series == (_s("bar", "pq", [5, 6]),)
  assert c.axes[3].series == (_s("scatter", [1.5, 2.5, 1.5], [3, 4, 3]),)
  pie = c.axes[4].series[0]
  assert pie.kind == "pie" and pie.x == ("r", "s", "t") and pie.y == pytest.approx((1 / 6, 2 / 6, 3 / 6))
  assert c.axes[5].series == (_s("bar", "uv", [7, 8]),)
  assert c.table == {"k": ["a", "b"], "v": [1.5, 2.0]} and c.chart_type == "line"
  assert os.path.getsize(runs[0].png) > 0
  assert "ran past 20 s" in runs[1].chart.error and runs[1].chart.series == ()
  assert "ValueError: bad column" in runs[2].chart.error
  # the figures of one job never leak into the next one
  assert runs[3].chart.error is None and runs[3].chart.series == (_s("line", [0, 1], [1, 0]),)


@pytest.mark.sandbox
def test_run_plot_reads_data_files_and_rejects_bad_names(tmp_path):
  data = tmp_path / "d.csv"
  data.write_text("g,v\na,1\nb,2\na,3\n")
  code = ("import pandas as pd, matplotlib.pyplot as plt\nt = pd.read_csv('data.csv').groupby('g')['v'].sum()\n"
          "plt.bar(t.index, t.values)\n")
  run = charts.run_plot(code, files={"data.csv": str(data)})
  assert run.chart.series == (_s("bar", "ab", [4, 2]),) and run.chart.table is None
  with pytest.raises(ValueError, match="plain names"):
    charts.run_plot(code, files={"../x.csv": str(data)})
  with pytest.raises(FileNotFoundError, match="expected at"):
    charts.run_plot(code, files={"data.csv": str(tmp_path / "none.csv")})
