"""Which items each split of a run holds, written to `splits.json` and checked before anything trains.

A run calls `record(out_dir, name, {"train": {"questions": [...]}, "test": {"questions": [...]}})` once it has chosen its
data and before it trains. Split names are `train` and evaluation splits (`calibration`, `test`, `ood`, ...); kinds
name what the items are (`questions`, `personas`, `problems`, `puzzles`, `rules`, `scenes`, `prompts`, ...). Each item
is stored as the sha256 hex of its canonical text (a string with its whitespace collapsed; anything else as JSON with
sorted keys), so splits.json is
`{"<split>": {"<kind>": ["<sha256 hex>", ...]}, "shared": {"<kind>": "<why>"}}`.

An item of `train` that is also in an evaluation split of the same kind is refused (`SplitOverlap`, one line naming
the splits, the kind and how many items) unless the experiment declares that kind shared, with its reason
(`Experiment(shared={kind: why})`, which is also a row of its paper's departures table). `run_experiment` fails a
paper's run that finishes without a splits.json (`registry.SplitsMissing`).
"""
from __future__ import annotations

import hashlib
import json
import os

from experiments.runner import registry

FILE, TRAIN, SHARED = registry.SPLITS_FILE, "train", "shared"


class SplitOverlap(ValueError):
  """A training item is also an evaluation item of the same kind, and the experiment does not declare it shared."""


def canonical(item) -> str:
  if isinstance(item, str):
    return " ".join(item.split())
  return json.dumps(item, sort_keys=True, ensure_ascii=False, default=str)


def digest(item) -> str:
  return hashlib.sha256(canonical(item).encode()).hexdigest()


def hashed(splits: dict) -> dict[str, dict[str, list[str]]]:
  """`splits` ({split: {kind: items}}) with each item replaced by its digest (order kept, repeats dropped)."""
  return {s: {k: list(dict.fromkeys(digest(i) for i in items)) for k, items in kinds.items()}
          for s, kinds in splits.items()}


def overlaps(hashes: dict) -> list[tuple[str, str, int]]:
  """(evaluation split, kind, how many items) for every evaluation split sharing items of a kind with `train`."""
  train = hashes.get(TRAIN, {})
  return [(s, k, len(set(train[k]) & set(items))) for s, kinds in hashes.items() if s not in (TRAIN, SHARED)
          for k, items in kinds.items() if k in train and set(train[k]) & set(items)]


def declared_shared(experiment: str) -> dict[str, str]:
  """The kinds `experiment` (a registered name) declares shared between train and evaluation."""
  return dict(registry.get(experiment).shared)


def check(hashes: dict, shared: dict[str, str], who: str = "") -> None:
  """Raises SplitOverlap for the first train/evaluation overlap of a kind not in `shared`."""
  for split, kind, n in overlaps(hashes):
    if kind not in shared:
      raise SplitOverlap(f"{who}splits '{TRAIN}' and '{split}' share {n} of their {kind} (of {len(hashes[TRAIN][kind])} "
                         f"training and {len(hashes[split][kind])} {split} items); make them disjoint or declare "
                         f"'{kind}' shared with its reason (Experiment(shared=...))")


def record(out_dir: str, experiment: str, splits: dict) -> dict:
  """Checks `splits` ({split: {kind: items}}) against the kinds `experiment` declares shared and writes them, hashed,
  to `out_dir`/splits.json (on the main process); returns what it wrote. Call it before training."""
  bad = [s for s, kinds in splits.items() if not isinstance(kinds, dict) or s == SHARED]
  if bad:
    raise TypeError(f"splits must map split -> kind -> items, found {[type(splits[s]).__name__ for s in bad]} for {bad}")
  shared = declared_shared(experiment)
  hashes = hashed(splits)
  check(hashes, shared, f"{experiment}: ")
  data = {**hashes, SHARED: {k: shared[k] for k in sorted(shared)}}
  import jax
  if jax.process_index() == 0:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, FILE), "w") as f:
      json.dump(data, f)
  return data


def read(run_dir: str) -> dict | None:
  """A run's splits.json, or None where it wrote none."""
  try:
    with open(os.path.join(run_dir, FILE)) as f:
      return json.load(f)
  except FileNotFoundError:
    return None
