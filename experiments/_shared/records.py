"""Reading back metrics records: the last record per step, a NaN-tolerant median; per-item scores of a macro mean,
and results merged with their per-item scores."""
from __future__ import annotations

import collections
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


def macro_items(values, groups) -> list[float]:
  """Per-item scores whose plain mean is the macro mean of `values` over `groups` (each group's mean, then their
  mean): item i scaled by n / (k n_g), with n items, k groups and n_g items in its group. What a claim on a macro
  mean records as its per-item scores; the bootstrap then resamples items, not groups (exact when the groups are
  equal in size, an approximation otherwise)."""
  values, groups = np.asarray(values, np.float64), list(groups)
  if len(values) != len(groups):
    raise ValueError(f"macro_items: {len(values)} values but {len(groups)} groups")
  size = collections.Counter(groups)
  return [float(v * len(groups) / (len(size) * size[g])) for v, g in zip(values, groups)]


def merge(res: dict, part: dict) -> dict:
  """`res` updated with `part`, their "per_item" scores (a run's items for the claims' intervals) joined, not
  replaced."""
  items = {**res.get("per_item", {}), **part.get("per_item", {})}
  res.update(part)
  if items:
    res["per_item"] = items
  return res
