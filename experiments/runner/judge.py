"""`python -m experiments judge PATH`: a finished run's claims judged again with the claims as declared now.

PATH is a run directory (its config.json names the experiment and preset), a results.json in one, or a
`reproduce` root (its claims.json; a claims.json itself): the verdicts come from the results and per-item scores
(`items.json`, else those claims.json holds) alone, nothing is rerun, so a run made elsewhere (on a GPU machine)
is judged by the current declarations.
"""
from __future__ import annotations

import json
import os

from experiments.runner import provenance, registry, reproduce
from experiments.runner.report import counts


def _load(path: str) -> dict:
  with open(path) as f:
    return json.load(f)


def _run(run_dir: str, experiment: str | None, preset: str | None) -> tuple[str, str, dict]:
  """(experiment, preset, report entry) of one run directory."""
  cfg_path = os.path.join(run_dir, "config.json")
  meta = _load(cfg_path) if os.path.exists(cfg_path) else {}
  experiment, preset = experiment or meta.get("experiment"), preset or meta.get("preset")
  if not experiment or not preset:
    raise ValueError(f"{run_dir}: no config.json naming the experiment and preset; pass --experiment and --preset")
  results = registry.read_results(run_dir)
  entry = {"run_dirs": [run_dir], "results_per_seed": [results], "items_per_seed": [registry.read_items(run_dir)],
           "commits": [provenance.label(results)]}
  return experiment, preset, entry


def _entries(path: str, experiment: str | None, preset: str | None) -> tuple[str, dict[str, dict]]:
  """(preset, experiment -> report entry) for a run directory, a results.json, a reproduce root or a claims.json."""
  if os.path.isdir(path) and os.path.exists(os.path.join(path, "claims.json")):
    path = os.path.join(path, "claims.json")
  if os.path.isdir(path):
    if not os.path.exists(os.path.join(path, "results.json")):
      raise FileNotFoundError(f"{path} holds neither results.json (a finished run) nor claims.json (a reproduce root)")
    name, preset, entry = _run(path, experiment, preset)
    return preset, {name: entry}
  data = _load(path)
  if "papers" in data and "experiments" in data:  # a claims report
    entries = {}
    for name, e in data["experiments"].items():
      if e.get("results_per_seed"):  # per-item scores from the run directories where they are still there
        items = [registry.read_items(d) if os.path.isdir(d) else i for d, i in
                 zip(e["run_dirs"], e.get("items_per_seed") or [{}] * len(e["run_dirs"]))]
        e = dict(e, items_per_seed=items)
      entries[name] = e
    return preset or data["preset"], entries
  name, preset, entry = _run(os.path.dirname(os.path.abspath(path)), experiment, preset)
  return preset, {name: entry}


def _line(name: str, group: str, v: dict) -> str:
  interval = f"  [{v['interval']}]" if v.get("interval_bounds") else ""
  return f"{name} {group} {v['id']}: {v['verdict']}{interval}"


def judge(path: str, experiment: str | None = None, preset: str | None = None) -> list[str]:
  """Lines to print: per experiment one naming its runs, then one per claim and per harness check (verdict, and
  the interval where per-item scores gave one); last, how many claims got each kind of verdict."""
  preset, entries = _entries(path, experiment, preset)
  exps, out, claims = registry.experiments(), [], []
  for name, e in entries.items():
    if name not in exps:
      out.append(f"{name}: not a registered experiment; not judged")
      continue
    exp, seeds = exps[name], len(e.get("results_per_seed", ()))
    state = e.get("error") or e.get("skipped") or f"{seeds} run(s) at commit(s) {', '.join(e.get('commits') or ['-'])}"
    out.append(f"{name} ({preset}): {state}")
    for group in ("claims", "checks"):
      verdicts = [reproduce.judged(c, e, preset) for c in getattr(exp, group)]
      claims += verdicts if group == "claims" else []
      out += [_line(name, group[:-1], v) for v in verdicts]
  out.append(f"claims: {counts(claims) or 'none judged'}")
  return out
