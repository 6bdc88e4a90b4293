"""Reading back metrics records: the last record per step, and a NaN-tolerant median."""
from __future__ import annotations

import math

import numpy as np


def dedupe(records: list[dict]) -> list[dict]:
  """Last record per step (a resumed run re-logs the steps after its checkpoint), in step order."""
  by_step: dict = {}
  for r in records:
    if "step" in r and "event" not in r:
      by_step.setdefault(r["step"], {}).update(r)
  return [by_step[s] for s in sorted(by_step)]


def median(xs) -> float:
  """Median of the finite numbers of `xs` (NaN when there are none)."""
  xs = [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
  return float(np.median(xs)) if xs else float("nan")
