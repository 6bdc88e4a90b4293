"""experiments/dvworld: the reference programs score 1 and every broken kind less (through the sandbox), DV-Sheet's
series references resolved on a hand-made workbook, the DV-Interact env with scripted agents, an LM agent's code
path with a scripted stand-in, the full preset's scoring with a stand-in judge executable (DV-Evol, and DV-Sheet on
hand-made DV-World case folders), and the smoke preset as a subprocess writing every results key."""
import json
import os
import stat
import subprocess
import sys

import pytest

from experiments import dvworld as exp
from experiments.dvworld import run as run_exp
from experiments import registry
from experiments.dvworld import agents, interact, rubric, sheet, tasks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

def _frames(specs):
  return {s.source: tasks.load_frame(s.source) for s in specs}


@pytest.mark.sandbox
def test_reference_scores_one_and_each_broken_kind_less(tmp_path):
  specs = tasks.select(("tips_pie", "penguins_scatter"))
  frames = _frames(specs)
  agents_ = {"reference": agents.ProgramAgent(), **{k: agents.ProgramAgent(k) for k in tasks.BROKEN}}
  rows = []
  cfg = exp.Config(tasks=tuple(s.id for s in specs), agents=exp.PROGRAM_AGENTS)
  res = run_exp.run_evol(cfg, specs, frames, agents_, rubric.RuleRubric(), str(tmp_path), rows.append)
  assert res["dv_evol.reference"] == res["table_alignment.reference"] == res["visual.reference"] == 1.0
  for r in rows:
    if r["agent"] != "reference":
      assert r["score"] < 1.0, r
  assert max(res[f"table_alignment.{k}"] for k in ("wrong_aggregation", "wrong_column")) < 1.0
  # a scatter without its filter draws a superset: the table score (gold cells found) stays 1, the visual drops
  miss = next(r for r in rows if r["agent"] == "missing_filter" and r["task"] == "penguins_scatter")
  assert miss["table"] == 1.0 and miss["visual"] < 1.0
  assert res["table_alignment.wrong_chart_type"] == 1.0 and res["visual.wrong_chart_type"] == pytest.approx(0.2)

  srows = []
  sres = run_exp.run_sheet(cfg, specs, agents_, str(tmp_path), srows.append)
  assert sres["sheet.reference"] == 1.0
  assert all(sres[f"sheet_create.{k}"] < 1.0 for k in tasks.BROKEN)
  assert {r["break"] for r in srows if r["mode"] == "fix"} == {"series", "axis"}  # pie: no axis; scatter: no series


def test_sheet_series_resolve_to_cell_values(tmp_path):
  from openpyxl import Workbook
  from openpyxl.chart import BarChart, Reference, ScatterChart, Series
  wb = Workbook()
  ws = wb.active
  ws.title = "result"
  other = wb.create_sheet("Bob's data")
  for row in [["day", "tip", "bill"], ["Fri", 2.5, 10], ["Sat", 3.0, 20], ["Sun", 3.25, 30]]:
    ws.append(row)
    other.append(row)
  bar = BarChart()
  bar.add_data(Reference(ws, min_col=2, min_row=1, max_row=4), titles_from_data=True)
  bar.set_categories(Reference(ws, min_col=1, min_row=2, max_row=4))
  bar.title = "Tips"
  bar.y_axis.scaling.min = 1.0
  ws.add_chart(bar, "E2")
  sc = ScatterChart()
  sc.series.append(Series(Reference(other, min_col=3, min_row=2, max_row=4),
                          Reference(other, min_col=2, min_row=2, max_row=4), title="bill"))
  ws.add_chart(sc, "E20")
  path = str(tmp_path / "hand.xlsx")
  wb.save(path)
  got = sheet.read_charts(path)
  assert [c.kind for c in got] == ["bar", "scatter"]
  assert got[0].series == (sheet.SheetSeries("tip", ("Fri", "Sat", "Sun"), (2.5, 3.0, 3.25)),)
  assert (got[0].title, got[0].y_min, got[0].y_max) == ("Tips", 1.0, None)
  assert got[1].series == (sheet.SheetSeries("bill", (2.5, 3.0, 3.25), (10, 20, 30)),)
  assert sheet.resolve(wb, "'Bob''s data'!$C$2:$C$3") == [10, 20] and sheet.resolve(wb, "nowhere!A1") == []
  assert sheet.read_charts(str(tmp_path / "none.xlsx")) == [] and sheet.read_charts(path, "other") == []

  gold = got[0]
  wrong_vals = sheet.SheetChart("bar", "Tips", (sheet.SheetSeries("tip", ("Fri", "Sat", "Sun"), (2.5, 3.0, 9.0)),),
                                1.0, None)
  # categories 3/3, values 2/3, name equal: 0.1 + 0.45 + 0.45 * 2/3
  assert sheet.chart_similarity(gold, wrong_vals) == pytest.approx(0.2 + 0.6 * (0.55 + 0.3) + 0.15 + 0.05)
  retyped = sheet.SheetChart("line", "x", gold.series, 1.0, None)
  assert sheet.repair_score(gold, retyped, gold) == (1.0, ["type"])
  assert sheet.repair_score(gold, retyped, wrong_vals) == (1.0, ["type"])  # only the broken aspect is gated
  assert sheet.repair_score(gold, wrong_vals, retyped) == (1.0, ["series"])
  assert sheet.repair_score(gold, wrong_vals, wrong_vals)[0] == 0.0  # left as it was
  assert sheet.repair_score(gold, wrong_vals, None) == (0.0, ["series"])


def _play(specs, frames, policy):
  return interact.episodes(specs, frames, policy, max_turns=4)


def test_interact_env_with_scripted_agents():
  specs = tasks.select(("tips_bar", "gapminder_pie"))
  frames = _frames(specs)
  by_request = interact.requests(specs, frames)
  right = _play(specs, frames, interact.scripted_policy(by_request))
  assert [r["success"] for r in right] == [1.0, 1.0] and [r["asked"] for r in right] == [1, 1]
  assert right[0]["adjustment"] == 0.75  # 0.5 + 0.5 * (1 - 0) / 2
  guess = _play(specs, frames, interact.scripted_policy(by_request, ask=False))
  assert [r["success"] for r in guess] == [0.0, 0.0] and guess[0]["adjustment"] == 0.5

  def cheat(histories):  # asks for the code, then answers the intent outright
    out = []
    for h in histories:
      spec = by_request[h[0]["content"]][0]
      out.append("[action] Show me the Python code." if len(h) == 1 else
                 "[answer] " + json.dumps(interact.intent_spec(spec)))
    return out
  c = _play(specs, frames, cheat)
  assert c[0]["refused"] == 1 and c[0]["success"] == 1.0 and c[0]["adjustment"] == 0.25
  env = interact.InteractEnv(specs, frames)
  env.reset(0)
  assert env.interact("action", "Which rows?").observation == "Only rows where smoker is 'No'."
  assert env.interact("action", "Which aggregation?").observation == "Take the mean per day."
  bad = env.interact("answer", '{"y": "nope", "agg": "mean", "filter": {}, "kind": "bar"}')
  assert bad.done and bad.reward == 0.0 and "answer y must be a column" in bad.observation
  # equal tables are required both ways: a missing filter on a scatter gives a superset and fails
  sc = tasks.BY_ID["cars_scatter"]
  env = interact.InteractEnv([sc], _frames([sc]))
  env.reset(0)
  superset = dict(interact.intent_spec(sc), filter={})
  assert env.interact("answer", json.dumps(superset)).reward == 0.0


@pytest.mark.sandbox
def test_lm_agent_code_path_with_a_stand_in(tmp_path):
  specs = tasks.select(("tips_bar",))
  frames = _frames(specs)
  seen = []

  def generate(batch, max_new_tokens=None):
    seen.append((len(batch), max_new_tokens))
    user = batch[0][-1]["content"]
    if batch[0][0]["content"] == agents.CODE_SYSTEM:
      return ["Here it is:\n```python\n" + tasks.program(specs[0]) + "```\nDone."]
    return ["[answer] " + json.dumps(interact.intent_spec(specs[0]))] if "Request" in user else ["[finish]"]
  lm = agents.LMAgent(generate, interact_tokens=7)
  cfg = exp.Config(tasks=("tips_bar",), agents=("reference", "smollm2"))
  res = run_exp.run_evol(cfg, specs, frames, {"reference": agents.ProgramAgent(), "smollm2": lm}, rubric.RuleRubric(),
                     str(tmp_path), lambda r: None)
  assert res["dv_evol.smollm2"] == 1.0
  ires = run_exp.run_interact(cfg, specs, frames, {"smollm2": lm}, lambda r: None)
  assert ires["interact_isr.smollm2"] == 1.0 and ires["interact_asked.smollm2"] == 0.0 and seen[-1] == (1, 7)
  assert agents.extract_code("no fence\nprint(1)") == "no fence\nprint(1)\n"
  assert agents.extract_code("```py\nx = 1\n") == "x = 1\n"


def test_rule_rubric_items_add_up_to_the_visual_score():
  from experiments.dvworld import charts
  def run(kind, ys, title):
    s = charts.Series(kind, "", ("a", "b", "c"), tuple(ys))
    return charts.PlotRun(charts.Chart((charts.Axes(title, "day", "tip", (s,)),)), None, None)
  gold = run("bar", (1, 2, 3), "T")
  for cand in (gold, run("line", (1, 2, 3), "T"), run("bar", (1, 2, 4), "other"), run("pie", (0, 0, 0), "")):
    v = rubric.RuleRubric()("", gold, cand)
    assert v.score == pytest.approx(charts.visual_score(gold.chart, cand.chart))
    assert set(v.items) == set(rubric.WEIGHTS)
  assert rubric.RuleRubric()("", gold, run("bar", (1, 2, 4), "other")).items == {
      "chart_type": 1.0, "x_label": 1.0, "y_label": 1.0, "title": 0.0, "series": pytest.approx(2 / 3)}


def test_full_preset_scores_cases_with_a_judge_executable(tmp_path):
  gold, cand = tmp_path / "gold" / "dv-evol-1", tmp_path / "cand" / "dv-evol-1"
  for d in (gold, cand):
    d.mkdir(parents=True)
    (d / "result.png").write_bytes(b"png")
  (gold / "gold.csv").write_text("a,b\n1,2\n3,4\n")
  (cand / "result.csv").write_text("b,a\n4,3\n2,9\n")
  judge = tmp_path / "judge.sh"
  reply = '```json {"Dimension_1": {"subtotal": 4}, "Total_Score": 12}```'
  judge.write_text(f"#!/bin/sh\ncat > /dev/null\necho '{reply}'\n")
  judge.chmod(judge.stat().st_mode | stat.S_IXUSR)
  cfg = registry.apply_overrides(exp.PRESETS["full"], [f"gold_dir={tmp_path / 'gold'}",
                                                      f"results_dir={tmp_path / 'cand'}", f"judge_path={judge}"])
  out = tmp_path / "run"
  out.mkdir()
  res = run_exp.run(cfg, str(out), False)
  assert res["table_alignment.candidate"] == 0.75 and res["visual.candidate"] == 0.75
  assert res["dv_evol.candidate"] == 0.75 and res["cases"] == 1
  assert rubric.parse_reply('{"Dimension_1": {"subtotal": 2}, "Dimension_2": {"subtotal": 6}}') == 0.5
  assert rubric.parse_reply('garbled "Total_Score": 40') == 1.0 and rubric.parse_reply("nothing") == 0.0


def test_bad_configs_and_paths_are_named(tmp_path):
  with pytest.raises(ValueError, match="agents must be a non-empty subset"):
    exp.Config(agents=("reference", "gpt"))
  with pytest.raises(ValueError, match="unknown dvworld task ids"):
    exp.Config(tasks=("nope",))
  with pytest.raises(registry.OverrideError, match="judge_path is required .*gold_dir is required .*results_dir"):
    registry.config_for("dvworld", "full")
  with pytest.raises(registry.OverrideError, match="dvworld --preset full: judge_path is required"):
    registry.config_for("dvworld", "full", [f"gold_dir={tmp_path}", f"results_dir={tmp_path}"])
  with pytest.raises(ValueError, match="needs an MLLM judge"):
    rubric.CommandJudge("")
  with pytest.raises(FileNotFoundError, match="expected an executable MLLM judge"):
    rubric.CommandJudge(str(tmp_path / "judge"))
  with pytest.raises(ValueError, match="needs judge='mllm'"):
    exp.Config(gold_dir=str(tmp_path), judge="rule")


@pytest.mark.slow
@pytest.mark.sandbox
def test_smoke_preset_as_a_subprocess(tmp_path):
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAXLAB_")}
  env.update(JAX_PLATFORMS="cpu", JAXLAB_NO_PROGRESS="1", PYTHONPATH=REPO)
  p = subprocess.run([sys.executable, "-m", "experiments", "run", "dvworld", "--preset", "smoke", "--out",
                      str(tmp_path / "r")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  res = json.loads((tmp_path / "r" / "results.json").read_text())
  for agent in exp.PROGRAM_AGENTS:
    for key in ("table_alignment", "dv_evol", "sheet", "interact_isr"):
      assert 0.0 <= res[f"{key}.{agent}"] <= 1.0, (key, agent)
  assert res["interact_isr.guess"] == 0.0 and res["dv_evol.reference"] == 1.0
  assert (tmp_path / "r" / "scores.png").exists()


GOLD_TABLE = [["day", "tip"], ["Fri", 2.5], ["Sat", 3.0], ["Sun", 3.25]]


def _creation_book(path, rows, anchor="E2", chart=True, literal_series=0, kind="bar"):
  """A workbook like an agent's result.xlsx: sheet "data" first (no chart), then "result" with `rows` from A1 and a
  bar (or `kind`="line") chart over them at `anchor`, plus `literal_series` series given as literal numbers (no cell
  reference)."""
  from openpyxl import Workbook
  from openpyxl.chart import BarChart, LineChart, Reference
  from openpyxl.chart.data_source import NumData, NumDataSource, NumVal
  from openpyxl.chart.series import Series
  wb = Workbook()
  wb.active.title = "data"
  wb.active.append(["day", "tip", "bill"])
  ws = wb.create_sheet("result")
  for r in rows:
    ws.append(r)
  if chart:
    bar = {"bar": BarChart, "line": LineChart}[kind]()
    bar.add_data(Reference(ws, min_col=2, min_row=1, max_row=len(rows)), titles_from_data=True)
    bar.set_categories(Reference(ws, min_col=1, min_row=2, max_row=len(rows)))
    bar.title = "Tips"
    for _ in range(literal_series):
      pts = [NumVal(idx=i, v=r[1]) for i, r in enumerate(rows[1:])]
      bar.series.append(Series(val=NumDataSource(numLit=NumData(pt=pts, ptCount=len(pts)))))
    ws.add_chart(bar, anchor)
  wb.save(path)
  return str(path)


def test_creation_gates_rubric_and_coverage_on_hand_computed_cases(tmp_path):
  gold = _creation_book(tmp_path / "gold.xlsx", GOLD_TABLE)
  score = lambda name, rows, **kw: sheet.creation_score(_creation_book(tmp_path / f"{name}.xlsx", rows, **kw), gold)
  same = score("same", GOLD_TABLE)
  assert same == {"score": 1.0, "gate": None, "visual": 1.0, "coverage": 1.0, "non_overlap": 1.0, "dynamic": 1.0}
  # gate 1: no chart on any sheet
  assert score("nochart", GOLD_TABLE, chart=False)["gate"] == "chart" == sheet.creation_score(
      str(tmp_path / "missing.xlsx"), gold)["gate"]
  # gate 2: a chart at A1 spans columns A-F, rows 1-12 and so covers the whole 2 x 4 table
  a1 = score("a1", GOLD_TABLE, anchor="A1")
  assert (a1["gate"], a1["score"], a1["non_overlap"]) == ("overlap", 0.0, 0.0)
  # at B3 (columns B-G, rows 3-14) it covers B3:B4, 2 of the table's 8 cells: the gate passes, the score is kept
  b3 = score("b3", GOLD_TABLE, anchor="B3")
  assert b3["gate"] is None and b3["non_overlap"] == pytest.approx(0.75) and b3["score"] == pytest.approx(1.0)
  # gate 3: a chart whose every series is literal numbers fails; one referenced series of two passes (share 1/2)
  lit = sheet.creation_score(_creation_book(tmp_path / "lit.xlsx", GOLD_TABLE, literal_series=1), gold)
  assert lit["gate"] is None and lit["dynamic"] == pytest.approx(0.5)
  from openpyxl import load_workbook
  wb = load_workbook(tmp_path / "lit.xlsx")
  wb["result"]._charts[0].series.pop(0)  # keep only the literal series
  wb.save(tmp_path / "onlylit.xlsx")
  only = sheet.creation_score(str(tmp_path / "onlylit.xlsx"), gold)
  assert (only["gate"], only["score"], only["dynamic"]) == ("dynamic", 0.0, 0.0)
  # rubric x coverage: headers match by key ("Tip (USD)" -> "tip"), Sun's 9.0 is wrong: 5 of 6 cells covered; the
  # chart: type 1, series 0.1 * 0.5 (other name) + 0.45 * 1 (categories) + 0.45 * 2/3 (values) = 0.8, axis 1,
  # title 1 -> visual 0.2 + 0.6 * 0.8 + 0.15 + 0.05 = 0.88
  wrong = [["Day", "Tip (USD)"], ["Fri", 2.5], ["Sat", 3.0], ["Sun", 9.0]]
  got = score("wrong", wrong)
  assert got["gate"] is None and got["visual"] == pytest.approx(0.88) and got["coverage"] == pytest.approx(5 / 6)
  assert got["score"] == pytest.approx(0.88 * 5 / 6)
  weighted = sheet.creation_score(str(tmp_path / "wrong.xlsx"), gold, combine="weighted", vis_weight=0.5)
  assert weighted["score"] == pytest.approx(0.5 * 0.88 + 0.5 * 5 / 6)
  # unmatched headers fall back to the first unused candidate column of the same type; an extra row (Thur, 1.0)
  # leaves 6 of the candidate's 8 cells covered
  extra = [["weekday", "amount"], ["Thur", 1.0], ["Fri", 2.5], ["Sat", 3.0], ["Sun", 3.25]]
  assert score("extra", extra)["coverage"] == pytest.approx(6 / 8)
  # a numeric first column cannot stand for the categorical "day": only "tip" maps, to "x" (3 of 3 cells)
  assert score("nums", [["x", "y"], [2.5, 1], [3.0, 2], [3.25, 3]])["coverage"] == pytest.approx(1.0)


def test_header_keys_and_coverage_without_gold_table(tmp_path):
  assert sheet.header_key("Total Bill (USD)") == "totalbill" and sheet.header_key("tip_pct-2") == "tippct2"
  assert sheet.header_key(None) == "" and sheet.header_key("2020") == "2020"
  from openpyxl import Workbook
  empty, cand = Workbook().active, Workbook().active
  for r in GOLD_TABLE:
    cand.append(r)
  assert sheet.table_coverage(cand, empty) == 1.0


def test_splits_hold_each_suites_tasks_once_and_nothing_to_train_on(tmp_path):
  from experiments.runner import splits
  specs = tasks.select(None)
  items = run_exp.split_items(specs, specs, _frames(specs))
  assert set(items) == {"dv_evol", "dv_sheet", "dv_interact"} and splits.TRAIN not in items
  hashes = splits.hashed(items)
  assert [len(hashes[k]["tasks"]) for k in ("dv_evol", "dv_sheet", "dv_interact")] == [len(specs), 2 * len(specs),
                                                                                        len(specs)]
  assert splits.overlaps(hashes) == []
  splits.record(str(tmp_path), "dvworld", items)
  with pytest.raises(splits.SplitOverlap):
    splits.record(str(tmp_path), "dvworld", {"train": {"tasks": items["dv_evol"]["tasks"][:2]}, **items})


WRONG_TABLE = [["Day", "Tip (USD)"], ["Fri", 2.5], ["Sat", 3.0], ["Sun", 9.0]]


def _full_overrides(tmp_path, marker=None):
  """A one-case DV-Evol gold and results folder and a stand-in judge (touching `marker` when called), as overrides."""
  for d in (tmp_path / "gold" / "dv-evol-1", tmp_path / "cand" / "dv-evol-1"):
    d.mkdir(parents=True)
    (d / "result.png").write_bytes(b"png")
    (d / "result.csv").write_text("a,b\n1,2\n")
  judge = tmp_path / "judge.sh"
  touch = f"touch {marker}\n" if marker else ""
  judge.write_text(f"#!/bin/sh\ncat > /dev/null\n{touch}echo '{{\"Total_Score\": 16}}'\n")
  judge.chmod(judge.stat().st_mode | stat.S_IXUSR)
  return [f"gold_dir={tmp_path / 'gold'}", f"results_dir={tmp_path / 'cand'}", f"judge_path={judge}"]


def _sheet_folders(tmp_path):
  """DV-World's dv-sheet layout: gold/<case>/ with the gold workbook (and, for repair, the broken start), the
  agent's results/<case>/ with its workbook. Creation: a matching chart, no chart, a wrong table; repair of a chart
  whose type was broken (bar drawn as line): fixed, left broken."""
  gold, cand = tmp_path / "sheet_gold", tmp_path / "sheet_results"
  for case in ("dvsheet-create-1", "dvsheet-create-2", "dvsheet-create-3", "dvsheet-fix-1", "dvsheet-fix-2"):
    (gold / case).mkdir(parents=True)
    (cand / case).mkdir(parents=True)
  for case in ("dvsheet-create-1", "dvsheet-create-2", "dvsheet-create-3"):
    _creation_book(gold / case / "gold.xlsx", GOLD_TABLE)
    (gold / case / "query.md").write_text("Chart the mean tip per day.")
  _creation_book(cand / "dvsheet-create-1" / "result.xlsx", GOLD_TABLE)
  (cand / "dvsheet-create-1" / ".~result.xlsx").write_bytes(b"lock")
  _creation_book(cand / "dvsheet-create-2" / "result.xlsx", GOLD_TABLE, chart=False)
  _creation_book(cand / "dvsheet-create-3" / "result.xlsx", WRONG_TABLE)
  for case in ("dvsheet-fix-1", "dvsheet-fix-2"):
    _creation_book(gold / case / "gold.xlsx", GOLD_TABLE)
    _creation_book(gold / case / "start.xlsx", GOLD_TABLE, kind="line")
  _creation_book(cand / "dvsheet-fix-1" / "fixed.xlsx", GOLD_TABLE)
  _creation_book(cand / "dvsheet-fix-2" / "fixed.xlsx", GOLD_TABLE, kind="line")
  return gold, cand


def test_full_preset_scores_dv_worlds_sheet_cases(tmp_path):
  gold, cand = _sheet_folders(tmp_path)
  base = _full_overrides(tmp_path)
  cfg = registry.apply_overrides(exp.PRESETS["full"], base + [f"sheet_gold_dir={gold}", f"sheet_results_dir={cand}"])
  out = tmp_path / "run"
  out.mkdir()
  res = run_exp.run(cfg, str(out), False)
  registry.get("dvworld").check_results(res)
  # creation_score: 1 (same chart and table), 0 (chart gate), visual 0.88 x coverage 5/6 (the wrong table, as in
  # test_creation_gates_rubric_and_coverage_on_hand_computed_cases); repair: the type must be fixed, 1 then 0
  create = [1.0, 0.0, 0.88 * 5 / 6]
  assert res["sheet_create.candidate"] == pytest.approx(sum(create) / 3)
  assert res["sheet_fix.candidate"] == 0.5 and res["sheet_cases"] == 5
  assert res["sheet.candidate"] == pytest.approx((sum(create) + 1.0) / 5)
  assert res["dv_evol.candidate"] == 1.0 and "sheet_skipped" not in res
  rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  fixes = [r for r in rows if r.get("mode") == "fix"]
  assert [r["must_fix"] for r in fixes] == [[["type"]], [["type"]]]
  assert [r["gate"] for r in rows if r.get("mode") == "create"] == [None, "chart", None]
  assert rows[0]["candidate"].endswith(os.path.join("dvsheet-create-1", "result.xlsx"))
  recorded = json.loads((out / "splits.json").read_text())
  assert len(recorded["dv_sheet"]["cases"]) == 5 and len(recorded["dv_evol"]["cases"]) == 1
  # results_dir holds the DV-Sheet case folders too when sheet_results_dir is left out; a missing one scores 0
  for case in ("dvsheet-create-1", "dvsheet-fix-1"):
    os.rename(cand / case, tmp_path / "cand" / case)
  cfg = registry.apply_overrides(exp.PRESETS["full"], base + [f"sheet_gold_dir={gold}"])
  res = run_exp.run(cfg, str(tmp_path / "run"), False)
  assert res["sheet_create.candidate"] == 1 / 3 and res["sheet_fix.candidate"] == 0.5 and res["sheet.candidate"] == 0.4


def test_full_preset_without_sheet_gold_skips_dv_sheet(tmp_path):
  cfg = registry.apply_overrides(exp.PRESETS["full"], _full_overrides(tmp_path))
  out = tmp_path / "run"
  out.mkdir()
  res = run_exp.run(cfg, str(out), False)
  registry.get("dvworld").check_results(res)
  assert res["sheet_skipped"].startswith("DV-Sheet not scored: no --set sheet_gold_dir=PATH")
  assert not any(k.startswith("sheet.") or k.startswith("sheet_create") for k in res) and res["cases"] == 1
  assert set(json.loads((out / "splits.json").read_text())) == {"dv_evol", "shared"}


def test_bad_sheet_paths_fail_in_one_line_before_the_judge_runs(tmp_path):
  marker = tmp_path / "judged"
  base = _full_overrides(tmp_path, marker)
  gold, cand = _sheet_folders(tmp_path)
  (gold / "dvsheet-fix-2" / "start.xlsx").unlink()
  cases = [([f"sheet_gold_dir={tmp_path / 'nope'}"], r"sheet_gold_dir: expected a directory of dvsheet-create-\* / "
            r"dvsheet-fix-\* case folders, found none at '.*nope'"),
           ([f"sheet_gold_dir={gold}", f"sheet_results_dir={tmp_path / 'nada'}"],
            r"sheet_results_dir: expected a directory .* found none at '.*nada'"),
           ([f"sheet_gold_dir={cand / 'dvsheet-fix-1'}"], r"expected dvsheet-create-\* or dvsheet-fix-\* case folders, "
            r"found none \(entries: \['fixed.xlsx'\]\)"),
           ([f"sheet_gold_dir={gold}"], r"broken \*start\*/\*broken\* .xlsx beside it .* found no gold .xlsx in "
            r"\[\], no start in \['dvsheet-fix-2'\]")]
  for extra, message in cases:
    with pytest.raises(FileNotFoundError, match=message) as err:
      run_exp.run(registry.apply_overrides(exp.PRESETS["full"], base + extra), str(tmp_path), False)
    assert "\n" not in str(err.value)
  assert not marker.exists()
  with pytest.raises(ValueError, match="set gold_dir too"):
    exp.Config(sheet_gold_dir=str(gold))
  with pytest.raises(ValueError, match="sheet_results_dir .* needs sheet_gold_dir"):
    exp.Config(gold_dir=str(tmp_path), judge="mllm", sheet_results_dir=str(cand))
