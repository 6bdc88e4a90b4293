"""Rubric judges of a candidate chart against the gold one: the visual half of the DV-Evol score.

`RuleRubric` (cpu preset) checks what the extracted chart data shows, item by item with weights: the chart type
(0.2), the x and y axis labels (0.075 each), the title (0.05), and the series match (0.6 times
`charts.series_score`); its score equals `charts.visual_score`. `CommandJudge` (full preset) is a multimodal judge
given by path: an executable called as `PATH GOLD_PNG CANDIDATE_PNG` with the rubric prompt on stdin, whose
reply (stdout) is JSON in the reference's layout, {"Dimension_1": {..., "subtotal": s1}, ..., "Total_Score": s},
over 16 one-point checks (data integrity 4, style 6, layout 6); the score is Total_Score / 16 clipped to [0, 1]
(the sum of the subtotals when Total_Score is absent), as the reference's DV-Evol evaluator normalises it.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from typing import NamedTuple

from experiments.dvworld import charts

WEIGHTS = {"chart_type": 0.2, "x_label": 0.075, "y_label": 0.075, "title": 0.05, "series": 0.6}
TOTAL_POINTS = 16.0
PROMPT = """You are grading a chart drawn by an agent (second image) against the expected chart (first image).
Task: {context}
Award one point per check that holds, zero otherwise.
Dimension_1, data integrity (4 checks): same trend; every series present and none invented; labels and values
where they belong; the same scales and proportions.
Dimension_2, style (6 checks): colours; markers, line styles and grid; background; fonts; spacing between
elements; borders and shadows.
Dimension_3, layout (6 checks): title, axis labels and legend placed alike; legible text; axes aligned and
spaced alike; marks aligned with their axes; aspect ratio; overall balance.
Reply with JSON only: {{"Dimension_1": {{"subtotal": n}}, "Dimension_2": {{"subtotal": n}},
"Dimension_3": {{"subtotal": n}}, "Total_Score": n}}"""


class Verdict(NamedTuple):
  score: float
  items: dict


class RuleRubric:
  """The rule rubric over extracted chart data (module docstring)."""
  name = "rule"

  def __call__(self, context: str, gold: charts.PlotRun, cand: charts.PlotRun) -> Verdict:
    del context
    g, c = gold.chart.main, cand.chart.main
    if g is None or c is None:
      return Verdict(0.0, {k: 0.0 for k in WEIGHTS})
    same = charts.same_text
    items = {"chart_type": float(g.chart_type == c.chart_type), "x_label": float(same(g.xlabel, c.xlabel)),
             "y_label": float(same(g.ylabel, c.ylabel)), "title": float(same(g.title, c.title)),
             "series": charts.series_score(gold.chart.series, cand.chart.series)}
    return Verdict(sum(WEIGHTS[k] * v for k, v in items.items()), items)


def parse_reply(text: str) -> float:
  """Total_Score / 16 from a judge's reply (JSON, possibly fenced, else the first "Total_Score": n), in [0, 1]."""
  m = re.search(r"\{.*\}", text, re.DOTALL)
  data = None
  if m:
    try:
      data = json.loads(m.group(0))
    except ValueError:
      data = None
  total = None
  if isinstance(data, dict):
    if isinstance(data.get("Total_Score"), (int, float)):
      total = float(data["Total_Score"])
    else:
      subs = [v.get("subtotal") for v in data.values() if isinstance(v, dict)]
      total = float(sum(s for s in subs if isinstance(s, (int, float))))
  elif m := re.search(r'"?Total_Score"?\s*:\s*([0-9]+(?:\.[0-9]+)?)', text):
    total = float(m.group(1))
  return 0.0 if total is None else max(0.0, min(1.0, total / TOTAL_POINTS))


class CommandJudge:
  """A multimodal judge behind an executable (module docstring)."""
  name = "mllm"

  def __init__(self, path: str, timeout_s: float = 300):
    if not path:
      raise ValueError(f"this preset needs an MLLM judge: {path or 'judge_path is empty'}")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
      raise FileNotFoundError(f"judge_path: expected an executable MLLM judge (PATH GOLD_PNG CAND_PNG, prompt on "
                              f"stdin), found none at {path!r}")
    self.path, self.timeout_s = path, timeout_s

  def __call__(self, context: str, gold: charts.PlotRun, cand: charts.PlotRun) -> Verdict:
    if not gold.png:
      raise RuntimeError(f"the gold chart has no image to judge ({gold.chart.error})")
    if not cand.png:
      return Verdict(0.0, {"reply": "", "why": "the candidate drew no figure"})
    proc = subprocess.run([self.path, gold.png, cand.png], input=PROMPT.format(context=context), text=True,
                          capture_output=True, timeout=self.timeout_s)
    if proc.returncode != 0:
      raise RuntimeError(f"MLLM judge {self.path} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return Verdict(parse_reply(proc.stdout), {"reply": proc.stdout[-2000:]})
