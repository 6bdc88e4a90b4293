"""DV-Sheet at small scale: native spreadsheet charts in .xlsx (openpyxl), creation and repair.

Every task starts from `start.xlsx`, whose sheet "data" holds the columns of one mini task (`tasks.Spec`). A
creation task asks for a sheet "result" holding the plotted table (x, y from A1) and one chart over it; a repair
task's start.xlsx already has them, with the chart broken one way (`BREAKS`: its values read the distractor column
C, its type changed, or its value axis clipped), and asks for the repaired workbook. The agent's program runs in
the sandbox and saves result.xlsx; on the host each chart's series references are resolved to the cell values
they point at and compared with the gold chart's, as the reference's DV-Sheet evaluator does through Excel:
  chart similarity = 0.2 type + 0.6 series + 0.15 value axis + 0.05 title (1 if equal, else 0.5), a series
  0.1 name + 0.45 categories + 0.45 values, sequences compared position by position (numbers within
  max(1e-6, 1e-4 max(|g|, 1))) and scaled by min/max length; a gold series takes its best unused candidate series,
  and the series term is their mean times matched / max(gold, candidate) series;
  repair (broken-gated): the aspects (type, series at 0.95, axis) in which the start chart differs from the gold
  one must all match the gold in the candidate, for 1, else 0; over whole workbooks (DV-World's own repair cases,
  `workbook_repair_score`) every gold chart, matched greedily to a start and a candidate chart, must pass.
Creation follows the reference's DV-Sheet creation evaluator (`creation_score`): the first worksheet holding a chart
(else the active one) is graded; three gates score 0 when the sheet has no chart, when the first chart's box (6
columns x 12 rows from its top-left cell, `anchor_box`) covers the sheet's whole used range (non-overlap ratio
1 - overlap / data area <= 0), or when none of its series reads all its data from cell references (dynamic share
0); past them the visual rubric score (here the chart similarity against the gold chart, standing in for the
reference's MLLM rubric over an Excel-exported image) is multiplied by the table coverage (`table_coverage`), or
weighted with it.
"""
from __future__ import annotations

import collections
import dataclasses
import datetime
import math
import os
import re

from experiments.dvworld import tasks
from experiments.dvworld import charts

BREAKS = ("series", "type", "axis")
SHEET_TYPES = {"bar": "BarChart", "line": "LineChart", "pie": "PieChart", "scatter": "ScatterChart"}
MAX_XLSX_BYTES = 8 << 20
_REF = re.compile(r"^\s*(?:'((?:[^']|'')+)'|([^!]+))!\s*(\$?[A-Z]+\$?\d+(?::\$?[A-Z]+\$?\d+)?)\s*$")


@dataclasses.dataclass(frozen=True)
class SheetSeries:
  name: str
  categories: tuple
  values: tuple


@dataclasses.dataclass(frozen=True)
class SheetChart:
  kind: str  # bar | line | pie | scatter | other:<class>
  title: str
  series: tuple[SheetSeries, ...]
  y_min: float | None  # None: automatic
  y_max: float | None


def _text(title) -> str:
  """The plain text of an openpyxl chart or axis title (rich runs joined), '' when there is none."""
  rich = getattr(getattr(title, "tx", None), "rich", None)
  if rich is None:
    return ""
  return "".join(r.t or "" for p in rich.p for r in (p.r or ()))


def resolve(wb, ref: str | None) -> list:
  """The cell values a series reference ("'result'!$B$2:$B$9") points at, row by row; [] when unresolvable."""
  from openpyxl.utils.cell import range_boundaries
  m = _REF.match(ref or "")
  if not m:
    return []
  sheet = (m.group(1) or "").replace("''", "'") or m.group(2).strip()
  if sheet not in wb.sheetnames:
    return []
  ws = wb[sheet]
  min_c, min_r, max_c, max_r = range_boundaries(m.group(3).replace("$", ""))
  if (max_r - min_r + 1) * (max_c - min_c + 1) > 100_000:
    return []
  return [ws.cell(row=r, column=c).value for r in range(min_r, max_r + 1) for c in range(min_c, max_c + 1)]


def _ref(source) -> str | None:
  if source is None:
    return None
  for attr in ("numRef", "strRef"):
    r = getattr(source, attr, None)
    if r is not None and r.f:
      return r.f
  return None


def _series_name(wb, ser) -> str:
  tx = ser.tx
  if tx is None:
    return ""
  if tx.strRef is not None and tx.strRef.f:
    vals = resolve(wb, tx.strRef.f)
    return str(vals[0]) if vals and vals[0] is not None else ""
  return str(tx.v or "")


def _load(path: str):
  """The workbook at `path`; None when missing, oversized or unreadable (a broken candidate file reads as no chart)."""
  if not path or not os.path.isfile(path) or os.path.getsize(path) > MAX_XLSX_BYTES:
    return None
  from openpyxl import load_workbook
  try:
    return load_workbook(path)
  except Exception:  # noqa: BLE001
    return None


def _charts_of(wb, ws) -> list[SheetChart]:
  out = []
  for ch in ws._charts:
    name = type(ch).__name__
    kind = next((k for k, v in SHEET_TYPES.items() if v == name), f"other:{name}")
    series = []
    for ser in ch.series:
      if kind == "scatter":
        cats, vals = resolve(wb, _ref(ser.xVal)), resolve(wb, _ref(ser.yVal))
      else:
        cats, vals = resolve(wb, _ref(ser.cat)), resolve(wb, _ref(ser.val))
      series.append(SheetSeries(_series_name(wb, ser), tuple(cats), tuple(vals)))
    scaling = getattr(getattr(ch, "y_axis", None), "scaling", None)
    y_min = None if scaling is None or scaling.min is None else float(scaling.min)
    y_max = None if scaling is None or scaling.max is None else float(scaling.max)
    out.append(SheetChart(kind, _text(ch.title), tuple(series), y_min, y_max))
  return out


def read_charts(path: str, sheet: str = "result") -> list[SheetChart]:
  """The charts of `sheet` in the workbook at `path`, series resolved to cell values; [] for a missing, oversized
  or unreadable workbook or sheet."""
  wb = _load(path)
  return _charts_of(wb, wb[sheet]) if wb is not None and sheet in wb.sheetnames else []


def workbook_charts(path: str) -> list[SheetChart]:
  """Every chart of every worksheet of the workbook at `path`, sheet by sheet; [] as `read_charts`."""
  wb = _load(path)
  return [] if wb is None else [c for ws in wb.worksheets for c in _charts_of(wb, ws)]


def _number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _cell(v):
  if isinstance(v, str):
    s = v.strip()
    try:
      return float(s)
    except ValueError:
      return s
  return float(v) if _number(v) else v


def sequence_similarity(gold, cand) -> float:
  """Positional matches (numbers within a relative 1e-4) over the shorter length, times min/max length."""
  g, c = [_cell(v) for v in gold], [_cell(v) for v in cand]
  if not g and not c:
    return 1.0
  n = min(len(g), len(c))
  if n == 0:
    return 0.0
  hits = 0
  for a, b in zip(g, c):
    if _number(a) and _number(b):
      hits += abs(a - b) <= max(1e-6, 1e-4 * max(abs(a), 1.0))
    else:
      hits += str(a) == str(b)
  return hits / n * n / max(len(g), len(c))


def series_similarity(g: SheetSeries, c: SheetSeries) -> float:
  cat, val = sequence_similarity(g.categories, c.categories), sequence_similarity(g.values, c.values)
  if cat == 0.0 and val == 0.0:
    return 0.0
  default = re.compile(r"^series\s*\d+$", re.IGNORECASE)
  gn, cn = g.name.strip(), c.name.strip()
  if gn and gn.lower() == cn.lower() or default.match(gn) and default.match(cn):
    name = 1.0
  elif not default.match(gn) and not default.match(cn):
    name = 0.5
  else:
    name = 0.0
  return 0.1 * name + 0.45 * cat + 0.45 * val


def series_score(gold, cand) -> float:
  return charts.series_score(gold, cand, similarity=series_similarity)


def axis_similarity(g: SheetChart, c: SheetChart) -> float:
  """Automatic-or-fixed agreement of the value axis' min and max, and equal fixed values (relative 1e-3)."""
  def part(gv, cv):
    auto = 1.0 if (gv is None) == (cv is None) else 0.0
    if gv is None:
      return auto, 1.0
    if cv is None:
      return auto, 0.0
    return auto, float(abs(gv - cv) <= max(1e-6, 1e-3 * max(abs(gv), 1.0)))
  (a1, v1), (a2, v2) = part(g.y_min, c.y_min), part(g.y_max, c.y_max)
  return 0.25 * (a1 + a2 + v1 + v2)


def components(g: SheetChart, c: SheetChart) -> dict[str, float]:
  return {"type": float(g.kind == c.kind), "series": series_score(g.series, c.series),
          "axis": axis_similarity(g, c), "title": 1.0 if g.title.strip() == c.title.strip() else 0.5}


def chart_similarity(g: SheetChart, c: SheetChart) -> float:
  p = components(g, c)
  return 0.2 * p["type"] + 0.6 * p["series"] + 0.15 * p["axis"] + 0.05 * p["title"]


THRESHOLDS = {"type": 1.0, "series": 0.95, "axis": 1.0}


def repair_score(gold: SheetChart, start: SheetChart, cand: SheetChart | None) -> tuple[float, list[str]]:
  """(1 or 0, the must-fix aspects): every aspect in which `start` falls short of `gold` must reach its threshold
  in `cand`."""
  before = components(gold, start)
  must = [k for k, t in THRESHOLDS.items() if before[k] < t]
  if cand is None:
    return 0.0, must
  after = components(gold, cand)
  return float(all(after[k] >= THRESHOLDS[k] for k in must)), must


def match_charts(gold: list[SheetChart], other: list[SheetChart]) -> list[int | None]:
  """Each gold chart's partner in `other` (an index, None when none is left): pairs taken greedily by descending
  (chart_similarity, gold index, other index), each chart used once."""
  pairs = sorted(((chart_similarity(g, o), i, j) for i, g in enumerate(gold) for j, o in enumerate(other)),
                 reverse=True)
  out, used = [None] * len(gold), set()
  for _, i, j in pairs:
    if out[i] is None and j not in used:
      out[i] = j
      used.add(j)
  return out


def workbook_repair_score(gold_path: str, start_path: str, cand_path: str | None) -> tuple[float, list]:
  """(1 or 0, each gold chart's must-fix aspects) over whole workbooks: the charts of every worksheet, each gold chart
  matched (`match_charts`) to one of the broken start's and one of the candidate's; 1 when every gold chart has both
  partners and `repair_score` gives it 1."""
  gold = workbook_charts(gold_path)
  if not gold:
    raise ValueError(f"the gold workbook {gold_path} has no chart")
  start, cand = workbook_charts(start_path), workbook_charts(cand_path)
  musts, ok = [], True
  for g, si, ci in zip(gold, match_charts(gold, start), match_charts(gold, cand)):
    if si is None:
      musts.append(None)
      ok = False
      continue
    score, must = repair_score(g, start[si], None if ci is None else cand[ci])
    musts.append(must)
    ok = ok and score == 1.0
  return float(ok), musts


DEFAULT_ANCHOR = (6, 12)  # the columns and rows a chart is taken to span


def chart_sheet(wb):
  """The worksheet graded: the first holding a chart, else the active one."""
  return next((ws for ws in wb.worksheets if ws._charts), wb.active)


def used_box(ws) -> tuple[int, int, int, int] | None:
  """(first col, first row, last col, last row), 0-based inclusive, of the non-blank cells; None when there are none."""
  cells = [(c.column - 1, c.row - 1) for row in ws.iter_rows() for c in row
           if c.value is not None and not (isinstance(c.value, str) and not c.value.strip())]
  if not cells:
    return None
  cols, rows = zip(*cells)
  return min(cols), min(rows), max(cols), max(rows)


def anchor_box(chart) -> tuple[int, int, int, int]:
  """The chart's cell box, 0-based inclusive: DEFAULT_ANCHOR from its top-left cell, whatever the anchor kind (the
  reference looks for a two-cell anchor's far corner as `_to`, which openpyxl names `to`, so it never finds it)."""
  frm = getattr(chart.anchor, "_from", None)
  if frm is None:
    raise ValueError(f"chart anchor {chart.anchor!r} has no cell position")
  return frm.col, frm.row, frm.col + DEFAULT_ANCHOR[0] - 1, frm.row + DEFAULT_ANCHOR[1] - 1


def non_overlap(chart, ws) -> float:
  """1 - (cells of the used range under the chart) / (cells of the used range); 1 for an empty sheet."""
  data = used_box(ws)
  if data is None:
    return 1.0
  box = anchor_box(chart)
  w = max(0, min(box[2], data[2]) - max(box[0], data[0]) + 1)
  h = max(0, min(box[3], data[3]) - max(box[1], data[1]) + 1)
  return 1.0 - w * h / ((data[2] - data[0] + 1) * (data[3] - data[1] + 1))


def _bound(source) -> bool:
  return any(getattr(getattr(source, a, None), "f", None) for a in ("numRef", "strRef"))


def dynamic_share(chart) -> float:
  """The share of series whose data sources present (values, x, y, bubble sizes) all read cell references."""
  series = list(chart.series)
  def dynamic(ser):
    present = [d for d in (ser.val, ser.xVal, ser.yVal, ser.bubbleSize) if d is not None]
    return bool(present) and all(_bound(d) for d in present)
  return sum(map(dynamic, series)) / len(series) if series else 0.0


def header_key(h) -> str:
  """A header as the coverage matches it: lower case, parenthesised units dropped, the letters of each space-,
  underscore- or hyphen-separated word (a word without letters kept as written)."""
  if h is None:
    return ""
  words = re.split(r"[\s_\-]+", re.sub(r"\(.*?\)", "", str(h).lower().strip()))
  return "".join(re.sub(r"[^a-z]", "", w) or w for w in words)


def _column_type(rows, i: int) -> str:
  vals = [r[i] for r in rows if i < len(r) and r[i] not in (None, "")]
  if not vals:
    return "cat"
  if sum(isinstance(v, (int, float)) for v in vals) / len(vals) > 0.7:
    return "num"
  if sum(isinstance(v, (datetime.date, datetime.datetime)) for v in vals) / len(vals) > 0.3:
    return "date"
  return "cat"


def table_coverage(cand_ws, gold_ws) -> float:
  """The share of the candidate's table cells (row 1 the header) found in the gold table's matched column, as
  multisets of stripped text: gold columns take the candidate column of the same `header_key`, else the first
  unused one of the same type (num, date, cat); 1 when the gold has no table, 0 when no column matches."""
  def table(ws):
    rows = list(ws.iter_rows(values_only=True))
    return ([header_key(h) for h in rows[0]], rows[1:]) if rows else ([], [])
  (ch, crows), (gh, grows) = table(cand_ws), table(gold_ws)
  if not gh or not grows:
    return 1.0
  mapping, used = {}, set()
  for g in gh:
    if g in ch and g not in used:
      mapping[g] = g
      used.add(g)
  gtypes, ctypes = [_column_type(grows, i) for i in range(len(gh))], [_column_type(crows, i) for i in range(len(ch))]
  for gi, g in enumerate(gh):
    if g in mapping:
      continue
    ci = next((i for i, c in enumerate(ch) if c not in used and ctypes[i] == gtypes[gi]), None)
    if ci is not None:
      mapping[g] = ch[ci]
      used.add(ch[ci])
  if not mapping:
    return 0.0
  def counts(headers, rows):
    out = collections.defaultdict(collections.Counter)
    for row in rows:
      for h, v in zip(headers, row):
        if h and v not in (None, ""):
          out[h][str(v).strip()] += 1
    return out
  gc, cc = counts(gh, grows), counts(ch, crows)
  total = sum(sum(cc[c].values()) for c in mapping.values())
  matched = sum(min(n, gc[g][v]) for g, c in mapping.items() for v, n in cc[c].items())
  return matched / total if total else 0.0


def creation_score(cand_path: str, gold_path: str, combine: str = "product", vis_weight: float = 0.5) -> dict:
  """The creation score of the workbook at `cand_path` against the gold one (module docstring): {"score", "gate"
  (None when all pass, else the failed gate), "visual", "coverage", "non_overlap", "dynamic"}; `combine` is
  "product" (visual x coverage) or "weighted" (vis_weight visual + (1 - vis_weight) coverage)."""
  out = {"score": 0.0, "gate": "chart", "visual": 0.0, "coverage": 0.0, "non_overlap": 0.0, "dynamic": 0.0}
  if not os.path.isfile(cand_path) or os.path.getsize(cand_path) > MAX_XLSX_BYTES:
    return out
  from openpyxl import load_workbook
  try:
    wb = load_workbook(cand_path)
  except Exception:  # noqa: BLE001  (a candidate's broken file reads as no chart)
    return out
  ws = chart_sheet(wb)
  if not ws._charts:
    return out
  chart = ws._charts[0]
  out.update(gate="overlap", non_overlap=non_overlap(chart, ws))
  if out["non_overlap"] <= 0:
    return out
  out.update(gate="dynamic", dynamic=dynamic_share(chart))
  if out["dynamic"] <= 0:
    return out
  gold_wb = load_workbook(gold_path)
  gold_ws = chart_sheet(gold_wb)
  gold, cand = read_charts(gold_path, gold_ws.title), read_charts(cand_path, ws.title)
  if not gold:
    raise ValueError(f"the gold workbook {gold_path} has no chart")
  visual, coverage = chart_similarity(gold[0], cand[0]), table_coverage(ws, gold_ws)
  score = visual * coverage if combine == "product" else vis_weight * visual + (1 - vis_weight) * coverage
  out.update(gate=None, visual=visual, coverage=coverage, score=score)
  return out


def data_columns(spec: tasks.Spec) -> list[str]:
  return list(dict.fromkeys([spec.x, spec.y, spec.other_y, *(c for c, _ in spec.filter)]))


def start_workbook(spec: tasks.Spec, path: str) -> str:
  """start.xlsx with the task's columns on sheet "data"."""
  from openpyxl import Workbook
  df = tasks.load_frame(spec.source)[data_columns(spec)]
  wb = Workbook()
  ws = wb.active
  ws.title = "data"
  ws.append(list(df.columns))
  for row in df.itertuples(index=False):
    ws.append([None if isinstance(v, float) and math.isnan(v) else (v.item() if hasattr(v, "item") else v)
               for v in row])
  wb.save(path)
  return path


def program(spec: tasks.Spec, kind: str | None = None, *, break_: str | None = None) -> str:
  """The program that writes result.xlsx from start.xlsx: the reference (kind None), a broken variant of
  `tasks.BROKEN`, or (break_) the broken start of a repair task, with the distractor column C and the break."""
  v = tasks.variant(spec, kind)
  chart_kind = tasks.WRONG_TYPE[v["kind"]] if break_ == "type" else v["kind"]
  table = tasks.table_code(spec, v).replace("pd.read_csv('data.csv')", "pd.read_excel('start.xlsx', sheet_name='data')")
  cls = SHEET_TYPES[chart_kind]
  value_col = 3 if break_ == "series" else 2
  lines = [
      "import pandas as pd", "from openpyxl import load_workbook",
      f"from openpyxl.chart import {cls}, Reference, Series", table,
      "def cell(v):", "  v = v.item() if hasattr(v, 'item') else v",
      "  return None if isinstance(v, float) and v != v else v",
      "wb = load_workbook('start.xlsx')", "if 'result' in wb.sheetnames:", "  del wb['result']",
      "ws = wb.create_sheet('result')",
  ]
  if break_ == "series":  # a distractor column: the other value column, aggregated as asked
    d = tasks.variant(spec, "wrong_column")
    lines += [tasks.table_code(spec, d).replace("t = ", "u = ").replace("t.columns", "u.columns")
              .replace("t.sort_values", "u.sort_values").replace("pd.read_csv('data.csv')",
                                                                 "pd.read_excel('start.xlsx', sheet_name='data')"),
              f"ws.append([{spec.x!r}, {spec.y!r}, {spec.other_y!r}])",
              "for a, b, c in zip(t.iloc[:, 0], t.iloc[:, 1], u.iloc[:, 1]):",
              "  ws.append([cell(a), cell(b), cell(c)])"]
  else:
    lines += [f"ws.append([{spec.x!r}, {spec.y!r}])", "for a, b in zip(t.iloc[:, 0], t.iloc[:, 1]):",
              "  ws.append([cell(a), cell(b)])"]
  lines += ["n = len(t)", f"chart = {cls}()"]
  if chart_kind == "scatter":
    lines += [f"chart.series.append(Series(Reference(ws, min_col={value_col}, min_row=2, max_row=n + 1), "
              f"Reference(ws, min_col=1, min_row=2, max_row=n + 1), title={spec.y!r}))"]
  else:
    lines += [f"chart.add_data(Reference(ws, min_col={value_col}, min_row=1, max_row=n + 1), titles_from_data=True)",
              "chart.set_categories(Reference(ws, min_col=1, min_row=2, max_row=n + 1))"]
  lines += [f"chart.title = {spec.title!r}"]
  if chart_kind != "pie":
    lines += [f"chart.x_axis.title = {spec.xlabel!r}", f"chart.y_axis.title = {spec.ylabel!r}"]
    if break_ == "axis":
      lines += ["chart.y_axis.scaling.min = float(t.iloc[:, 1].max()) * 2"]
  lines += ["ws.add_chart(chart, 'E2')", "wb.save('result.xlsx')", ""]
  return "\n".join(lines)


def fix_break(spec: tasks.Spec, i: int) -> str:
  """The break of the i-th repair task: BREAKS in turn, skipping those a chart kind cannot show (a scatter's
  points have no aggregated distractor column, a pie has no value axis)."""
  allowed = [b for b in BREAKS if not (spec.kind == "scatter" and b == "series" or spec.kind == "pie" and b == "axis")]
  return allowed[i % len(allowed)]


def instruction(spec: tasks.Spec, mode: str, break_: str | None = None) -> str:
  """The agent's task text for a creation ('create') or repair ('fix') task."""
  cols = ", ".join(data_columns(spec))
  where = " and ".join(f"{c} == {v!r}" for c, v in spec.filter)
  what = (f"a scatter chart of {spec.y} against {spec.x}" if spec.agg is None else
          f"a {spec.kind} chart of the {spec.agg} of {spec.y} per {spec.x}")
  if mode == "create":
    return (f"start.xlsx has a sheet 'data' (columns: {cols}). With openpyxl, add a sheet 'result' holding the "
            f"table of {what} over the rows where {where} (header {spec.x}, {spec.y} in A1:B1), and a native "
            f"{SHEET_TYPES[spec.kind]} over that table titled {spec.title!r}. Save the workbook as result.xlsx.")
  why = {"series": "its values read the wrong column", "type": "it has the wrong chart type",
         "axis": "its value axis range hides the data"}[break_]
  return (f"start.xlsx has a sheet 'data' (columns: {cols}) and a sheet 'result' whose chart should show {what} "
          f"over the rows where {where}, but {why}. Repair the chart with openpyxl and save the workbook as "
          f"result.xlsx.")
