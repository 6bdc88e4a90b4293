"""Chart evaluation for data-visualization agents (DV-World, experiments/dvworld/README.md; code DA-Open/DV-World).

- `table_alignment`: the DV-Evol table score. Columns are matched by exact name (case- and space-sensitive):
  every gold column that the candidate also has is compared, gold columns the candidate lacks are left out of the
  score (as the reference's `table_similarity`) and no common column scores 0. Within a common column the values
  are a multiset (row order ignored): NaN/None is one value, anything `float()` accepts and is finite becomes that
  float rounded to 2 decimals, anything else its stripped `str`. The score is the number of gold cells matched
  (per value, min(gold count, candidate count)) over the number of gold cells in the common columns.
- Chart extraction: `PROBE` is a script that runs inside `jaxlab.evals.sandbox` beside the candidate's plotting
  code. It executes the candidate file under the Agg backend (`show` and `close` made no-ops, so the figures
  survive), then walks every figure's axes and writes a JSON of what it found into the workdir: title, axis
  labels and one series per line (Line2D), bar container, scatter (PathCollection) and pie (its wedges, the
  values as fractions of the whole). Category axes are mapped back to their category strings. `run_plot` copies
  the data files and the code into a fresh workdir, runs the probe, and reads the JSON (and an optional
  `result.csv`) back on the host as a `Chart`.
- `visual_score`: a rule-based visual score of a candidate chart against the gold one, our choice where the
  reference asks a multimodal judge: 0.2 chart type + 0.6 series + 0.15 axis labels + 0.05 title, the weights of
  the reference's DV-Sheet chart similarity. A series is a multiset of (x, y) points normalised as table values;
  each gold series takes the best unused candidate series of the same kind (points matched over the larger
  count), and the series term is the mean over gold series times matched / max(gold, candidate) series.
- `dv_evol_score`: vis_weight * visual + (1 - vis_weight) * table, vis_weight 0.5 as the reference's default.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import shutil
import tempfile
from typing import Any, Mapping, Sequence

from jaxlab.evals import sandbox

KINDS = ("line", "bar", "scatter", "pie")
MAX_TABLE_BYTES = 8 << 20
PROBE_NAME, CHART_JSON = "_chart_probe.py", "_charts.json"


def normalize_value(v: Any):
  """A table cell as the reference compares it: None for missing, a 2-decimal float, else the stripped string."""
  if v is None or (isinstance(v, float) and math.isnan(v)):
    return None
  try:
    import pandas as pd
    if pd.isna(v):
      return None
  except (TypeError, ValueError, ImportError):
    pass
  try:
    f = float(v)
    if math.isfinite(f):
      return round(f, 2)
  except (TypeError, ValueError, OverflowError):
    pass
  return str(v).strip()


def _columns(table) -> dict[str, list]:
  """A table as {column name: values}: a mapping of sequences or anything with `.columns` and `[name]`."""
  if hasattr(table, "columns") and not isinstance(table, Mapping):
    return {str(c): list(table[c]) for c in table.columns}
  if isinstance(table, Mapping):
    out = {str(k): list(v) for k, v in table.items()}
    lengths = {len(v) for v in out.values()}
    if len(lengths) > 1:
      raise ValueError(f"table columns must have one length, found lengths {sorted(lengths)}")
    return out
  raise TypeError(f"a table must be a mapping of columns or a DataFrame, found {type(table).__name__}")


def table_alignment(gold, cand) -> float:
  """The DV-Evol table score of `cand` against `gold` (module docstring); 0 when either is empty."""
  g, c = _columns(gold), _columns(cand)
  common = [k for k in g if k in c]
  if not common or not next(iter(g.values())) or not next(iter(c.values())):
    return 0.0
  matched = total = 0
  for k in common:
    gc = collections.Counter(normalize_value(v) for v in g[k])
    cc = collections.Counter(normalize_value(v) for v in c[k])
    matched += sum(min(n, cc[v]) for v, n in gc.items())
    total += sum(gc.values())
  return matched / total if total else 0.0


def dv_evol_score(visual: float, table: float, vis_weight: float = 0.5) -> float:
  """DV-Evol's final score: vis_weight * visual + (1 - vis_weight) * table."""
  if not (0.0 <= visual <= 1.0 and 0.0 <= table <= 1.0 and 0.0 <= vis_weight <= 1.0):
    raise ValueError(f"dv_evol_score: scores and weight must be in [0, 1], found visual={visual}, table={table}, "
                     f"vis_weight={vis_weight}")
  return vis_weight * visual + (1.0 - vis_weight) * table


@dataclasses.dataclass(frozen=True)
class Series:
  """One plotted series: kind in KINDS, legend label, x (categories or numbers) and y values."""
  kind: str
  label: str
  x: tuple
  y: tuple

  def points(self) -> collections.Counter:
    return collections.Counter((normalize_value(a), normalize_value(b)) for a, b in zip(self.x, self.y))


@dataclasses.dataclass(frozen=True)
class Axes:
  title: str
  xlabel: str
  ylabel: str
  series: tuple[Series, ...]

  @property
  def chart_type(self) -> str | None:
    """The kind of the axes' first series (None for empty axes)."""
    return self.series[0].kind if self.series else None


@dataclasses.dataclass(frozen=True)
class Chart:
  """What the probe found: the axes of every figure, in order, and the candidate's error (None if it ran)."""
  axes: tuple[Axes, ...]
  error: str | None = None
  table: dict | None = None  # result.csv as {column: values}, when the code wrote one

  @property
  def main(self) -> Axes | None:
    """The first axes that holds a series."""
    return next((a for a in self.axes if a.series), None)

  @property
  def chart_type(self) -> str | None:
    return self.main.chart_type if self.main else None

  @property
  def series(self) -> tuple[Series, ...]:
    return tuple(s for a in self.axes for s in a.series)


def chart_from_json(d: Mapping) -> Chart:
  """A `Chart` from the probe's JSON (validated: a dict of figures of axes of series of known kinds)."""
  if not isinstance(d, Mapping) or not isinstance(d.get("figures"), list):
    raise ValueError(f"chart JSON must be an object with a 'figures' list, found {str(d)[:80]!r}")
  axes = []
  for fig in d["figures"]:
    for ax in fig.get("axes", []):
      series = []
      for s in ax.get("series", []):
        if s.get("kind") not in KINDS:
          raise ValueError(f"chart JSON: series kind must be one of {KINDS}, found {s.get('kind')!r}")
        series.append(Series(s["kind"], str(s.get("label", "")), tuple(s.get("x", ())), tuple(s.get("y", ()))))
      axes.append(Axes(str(ax.get("title", "")), str(ax.get("xlabel", "")), str(ax.get("ylabel", "")),
                       tuple(series)))
  return Chart(tuple(axes), d.get("error"))


def series_similarity(g: Series, c: Series) -> float:
  """Matched (x, y) points over the larger point count; 0 across kinds."""
  if g.kind != c.kind:
    return 0.0
  gp, cp = g.points(), c.points()
  n = max(sum(gp.values()), sum(cp.values()))
  return sum(min(k, cp[p]) for p, k in gp.items()) / n if n else 1.0


def series_score(gold: Sequence, cand: Sequence, similarity=None) -> float:
  """Greedy best match per gold series, mean over gold, times matched / max(gold, candidate) series.
  `similarity(gold_series, cand_series) -> [0, 1]`: `series_similarity` unless given (e.g. for sheet series)."""
  similarity = similarity or series_similarity
  if not gold:
    return 1.0 if not cand else 0.0
  used, total = set(), 0.0
  for g in gold:
    best, best_j = 0.0, None
    for j, c in enumerate(cand):
      if j not in used and (s := similarity(g, c)) > best:
        best, best_j = s, j
    if best_j is not None:
      used.add(best_j)
    total += best
  return total / len(gold) * len(used) / max(len(gold), len(cand))


def same_text(a: str, b: str) -> bool:
  return " ".join(a.split()).lower() == " ".join(b.split()).lower()


def visual_score(gold: Chart, cand: Chart) -> float:
  """0.2 chart type + 0.6 series + 0.15 axis labels (half each) + 0.05 title, over the charts' first axes with
  a series (series: all of them); 0 when the candidate drew nothing."""
  if cand.main is None or gold.main is None:
    return 0.0
  g, c = gold.main, cand.main
  labels = 0.5 * same_text(g.xlabel, c.xlabel) + 0.5 * same_text(g.ylabel, c.ylabel)
  return (0.2 * (g.chart_type == c.chart_type) + 0.6 * series_score(gold.series, cand.series) + 0.15 * labels
          + 0.05 * same_text(g.title, c.title))


PROBE = r'''
import datetime, json, math, os, runpy, signal, sys, traceback
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.container import BarContainer
from matplotlib.collections import PathCollection
from matplotlib.patches import Wedge

def value(v):
  if hasattr(v, "item") and not isinstance(v, (str, bytes)):
    try:
      v = v.item()
    except (ValueError, TypeError):
      pass
  if isinstance(v, (datetime.date, datetime.datetime)):
    return v.isoformat()
  if isinstance(v, bool):
    return float(v)
  if isinstance(v, (int, float)):
    return float(v) if math.isfinite(v) else None
  return str(v)

def legend(artist):
  label = artist.get_label() or ""
  return "" if label.startswith("_") else label

def relabel(positions, axis):
  """Category strings for positions on a category axis (matplotlib's string units, or ticks at every position
  labelled with text that is not a number, as pandas draws); the values themselves otherwise."""
  mapping = getattr(axis.units, "_mapping", None)
  if mapping:
    cats = {float(i): str(k) for k, i in mapping.items()}
  else:
    cats = {}
    for t, lab in zip(axis.get_majorticklocs(), axis.get_majorticklabels()):
      text = lab.get_text().replace("\u2212", "-")
      try:
        float(text)
      except ValueError:
        if text:
          cats[round(float(t), 9)] = lab.get_text()
  if not cats:
    return [value(v) for v in positions]
  out = []
  for v in positions:
    key = round(float(v), 9) if isinstance(v, (int, float)) or hasattr(v, "item") else None
    if key is None or key not in cats:
      return [value(v) for v in positions]
    out.append(cats[key])
  return out

def walk(ax):
  series = []
  for line in ax.get_lines():
    xs = list(line.get_xdata(orig=True))
    x = [value(v) for v in xs] if any(isinstance(v, str) for v in xs) else relabel(xs, ax.xaxis)
    series.append({"kind": "line", "label": legend(line), "x": x, "y": [value(v) for v in line.get_ydata(orig=True)]})
  for cont in ax.containers:
    if not isinstance(cont, BarContainer):
      continue
    horizontal = getattr(cont, "orientation", "vertical") == "horizontal"
    pos = [p.get_y() + p.get_height() / 2 if horizontal else p.get_x() + p.get_width() / 2 for p in cont.patches]
    x = relabel(pos, ax.yaxis if horizontal else ax.xaxis)
    series.append({"kind": "bar", "label": legend(cont), "x": x,
                   "y": [value(v) for v in cont.datavalues]})
  for coll in ax.collections:
    if isinstance(coll, PathCollection):
      off = coll.get_offsets()
      series.append({"kind": "scatter", "label": legend(coll), "x": relabel([r[0] for r in off], ax.xaxis),
                     "y": [value(r[1]) for r in off]})
  wedges = [p for p in ax.patches if isinstance(p, Wedge)]
  if wedges:
    span = [abs(w.theta2 - w.theta1) for w in wedges]
    series.append({"kind": "pie", "label": "", "x": [w.get_label() for w in wedges],
                   "y": [s / 360.0 for s in span]})
  return {"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(), "series": series}

class Timeout(BaseException):
  pass

def on_alarm(signum, frame):
  raise Timeout(f"the candidate ran past {int(sys.argv[2])} s")

def run_job(job, job_timeout, real_close):
  os.chdir(job)
  plt.show = lambda *a, **k: None
  plt.close = lambda *a, **k: None
  error = None
  signal.signal(signal.SIGALRM, on_alarm)
  signal.alarm(job_timeout)
  try:
    runpy.run_path("candidate.py", run_name="__main__")
  except BaseException as e:
    error = "".join(traceback.format_exception_only(type(e), e)).strip()[-2000:]
  finally:
    signal.alarm(0)
  figures = []
  for i, num in enumerate(plt.get_fignums()):
    fig = plt.figure(num)
    try:
      fig.canvas.draw()
      if i == 0 and PNG:
        fig.savefig("_figure.png", dpi=60)
    except Exception:
      pass
    figures.append({"axes": [walk(ax) for ax in fig.get_axes()]})
  with open("_charts.json", "w") as f:
    json.dump({"error": error, "figures": figures}, f)
  real_close("all")
  matplotlib.rcdefaults()
  matplotlib.use("Agg")

def main():
  jobs, job_timeout = sys.argv[1].split(","), int(sys.argv[2])
  real_close, root = plt.close, os.getcwd()
  for job in jobs:
    try:
      run_job(os.path.join(root, job), job_timeout, real_close)
    except BaseException:
      pass
    os.chdir(root)

PNG = len(sys.argv) > 3 and sys.argv[3] == "png"
main()
'''


def _mpl_cache(workdir: str) -> dict[str, str]:
  """Copies the host's matplotlib font cache into the workdir, so the sandboxed run skips the font scan."""
  import matplotlib
  dst = os.path.join(workdir, ".mpl")
  os.makedirs(dst, exist_ok=True)
  src = matplotlib.get_cachedir()
  for name in os.listdir(src) if os.path.isdir(src) else ():
    if name.startswith("fontlist") and name.endswith(".json"):
      shutil.copy(os.path.join(src, name), dst)
  return {"MPLCONFIGDIR": f"{sandbox.WORKDIR}/.mpl", "MPLBACKEND": "Agg"}


def read_table(path: str) -> dict | None:
  """A candidate's CSV as {column: values} (pandas' parsing, as the reference reads it); None if absent or bad."""
  if not os.path.isfile(path) or os.path.getsize(path) > MAX_TABLE_BYTES:
    return None
  import pandas as pd
  try:
    df = pd.read_csv(path)
  except Exception:  # noqa: BLE001  (a malformed candidate file scores as no table)
    return None
  return {str(c): df[c].tolist() for c in df.columns}


@dataclasses.dataclass(frozen=True)
class PlotRun:
  chart: Chart
  result: sandbox.Result  # of the whole batch the run was part of
  png: str | None  # host path of the first figure's PNG, when asked for and drawn


@dataclasses.dataclass(frozen=True)
class Job:
  """One candidate program: its source and the data files it reads (workdir name -> host path)."""
  code: str
  files: Mapping[str, str] = dataclasses.field(default_factory=dict)
  name: str = "chart"


def run_plots(jobs: Sequence[Job], *, job_timeout_s: int = 60, memory_mb: int = 2048, table_name: str = "result.csv",
              png_dir: str | None = None, keep: Sequence[str] = (), keep_dir: str | None = None) -> list[PlotRun]:
  """Runs each job's plotting code beside the probe, all in one sandboxed process, and reads back what they drew.

  Each job runs in its own subdirectory of the sandbox's workdir (as `candidate.py`, with that directory as cwd),
  one after another, with the figures closed and matplotlib's rc settings reset between them. One process saves
  the interpreter start per job but lets a job see the others' directories: batch one agent's programs only.

  Args:
    jobs: the programs and their data.
    job_timeout_s: per job (an alarm in the probe); the sandbox's wall clock is that times len(jobs), plus 30 s.
    memory_mb: the sandbox's address-space limit.
    table_name: the CSV each job is asked to write (read back as `Chart.table`).
    png_dir: when given, each job's first figure is saved there as `{job.name}.png` (for an image judge).
    keep, keep_dir: further output files of each job copied to `{keep_dir}/{job.name}/` (e.g. a workbook).
  """
  if not jobs:
    return []
  if not (isinstance(job_timeout_s, int) and job_timeout_s > 0):
    raise ValueError(f"run_plots: job_timeout_s must be a positive int, found {job_timeout_s!r}")
  for job in jobs:
    bad = [n for n in job.files if os.path.basename(n) != n or n.startswith(".") or n.startswith("_")
           or n == "candidate.py"]
    if bad:
      raise ValueError(f"run_plots: data file names must be plain names not starting with '.' or '_' and not "
                       f"candidate.py, found {bad}")
  with tempfile.TemporaryDirectory(prefix="jaxlab-chart-") as workdir:
    dirs = [f"job{i}" for i in range(len(jobs))]
    for d, job in zip(dirs, jobs):
      os.makedirs(os.path.join(workdir, d))
      for n, src in job.files.items():
        if not os.path.isfile(src):
          raise FileNotFoundError(f"run_plots: data file {n!r} expected at {src!r}, found nothing")
        shutil.copy(src, os.path.join(workdir, d, n))
      with open(os.path.join(workdir, d, "candidate.py"), "w") as f:
        f.write(job.code)
    with open(os.path.join(workdir, PROBE_NAME), "w") as f:
      f.write(PROBE)
    env = _mpl_cache(workdir)
    argv = ["python", PROBE_NAME, ",".join(dirs), str(job_timeout_s)] + (["png"] if png_dir else [])
    res = sandbox.run(argv, workdir=workdir, timeout_s=job_timeout_s * len(jobs) + 30, memory_mb=memory_mb,
                      env=env)
    return [_read_job(os.path.join(workdir, d), job, res, table_name, png_dir, keep, keep_dir)
            for d, job in zip(dirs, jobs)]


def _read_job(d: str, job: Job, res: sandbox.Result, table_name: str, png_dir, keep, keep_dir) -> PlotRun:
  out = os.path.join(d, CHART_JSON)
  chart = None
  if os.path.isfile(out) and os.path.getsize(out) <= MAX_TABLE_BYTES:
    try:
      with open(out) as f:
        chart = chart_from_json(json.load(f))
    except (ValueError, KeyError, TypeError, AttributeError):
      chart = None
  if chart is None:
    why = "timed out" if res.timed_out else f"exit {res.returncode}: {res.stderr.strip()[-300:]}"
    chart = Chart((), f"the chart probe wrote no chart ({why})")
  chart = dataclasses.replace(chart, table=read_table(os.path.join(d, table_name)))
  png = None
  if png_dir and os.path.isfile(os.path.join(d, "_figure.png")):
    png = os.path.join(png_dir, f"{job.name}.png")
    shutil.copy(os.path.join(d, "_figure.png"), png)
  if keep_dir:
    for n in keep:
      src = os.path.join(d, n)
      if os.path.isfile(src) and not os.path.islink(src) and os.path.getsize(src) <= MAX_TABLE_BYTES:
        os.makedirs(os.path.join(keep_dir, job.name), exist_ok=True)
        shutil.copy(src, os.path.join(keep_dir, job.name, n))
  return PlotRun(chart, res, png)


def run_plot(code: str, *, files: Mapping[str, str] | None = None, job_timeout_s: int = 60, memory_mb: int = 2048,
             table_name: str = "result.csv", png_dir: str | None = None, name: str = "chart") -> PlotRun:
  """`run_plots` of one program."""
  return run_plots([Job(code, dict(files or {}), name)], job_timeout_s=job_timeout_s, memory_mb=memory_mb,
                   table_name=table_name, png_dir=png_dir)[0]
