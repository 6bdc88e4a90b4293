"""`python -m experiments reproduce`: every experiment (optionally over several seeds), then the claims report.

Resumable: a (experiment, seed) whose run directory under the root already holds results for the same preset
and config, made from a clean tree at the current git commit or at an earlier one where every source file it ran is
unchanged (`provenance.same_code`; the report names the commit it was made at), is read, not rerun (`force=True`
reruns it into a fresh directory, keeping the old one); one that holds the same config and code without results
(an interrupted run) is resumed. A run of other code is kept and run again in a fresh directory, unless
`reuse_any` (`--reuse-any`) takes a run of any code; the report records the command and its runs' commits.
Seed k > 0 of an experiment sets each of its `seed_key` fields (dotted names reach nested configs) to the
preset's value + k and runs in `root/NAME.seedK`.
An experiment whose tools or packages are not installed (jaxlab.errors.MissingDependency, raised before it starts
when it declares them) is skipped, not failed: the report names what to install, its claims read "skipped".
"""
from __future__ import annotations

import json
import os
import platform
import time
import traceback
from typing import Callable

from experiments.runner import claims as claims_lib
from experiments.runner import provenance, registry
from experiments.runner.overrides import apply_overrides, config_dict
from experiments.runner.report import departures, duration, write_report
from experiments.runner.rundirs import has_results
from jaxlab import errors


def _candidates(base: str):
  yield base
  i = 2
  while os.path.isdir(f"{base}-{i}"):
    yield f"{base}-{i}"
    i += 1


def _saved(run_dir: str) -> dict | None:
  try:
    with open(os.path.join(run_dir, "config.json")) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def _sources(run_dir: str) -> list[str] | None:
  try:
    with open(os.path.join(run_dir, provenance.SOURCES_FILE)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def matching_run(base: str, preset: str, cfg, code: dict | None = None) -> tuple[str | None, bool]:
  """(directory, done): the run under `base` or `base-K` with this preset and config (done when it has
  results.json), or (None, False); with `code` (`provenance.current()`), only one made by that code: at its
  commit, or, finished, at an earlier one with every source file it computed with unchanged."""
  want = config_dict(cfg)
  for d in _candidates(base):
    meta = _saved(d)
    if meta and meta.get("preset") == preset and meta.get("config") == want and (
        code is None or provenance.same_code(meta, code, _sources(d))):
      return os.path.abspath(d), os.path.exists(os.path.join(d, "results.json"))
  return None, False


def command(preset: str, seeds: int, only=None, reuse_any: bool = False) -> str:
  """The reproduce command line that makes a report with these settings."""
  return (f"python -m experiments reproduce --preset {preset} --seeds {seeds}"
          + (f" --only {' '.join(only)}" if only else "") + (" --reuse-any" if reuse_any else ""))


def first_free(base: str) -> str:
  """`base`, or the first `base-K` (K = 2, 3, ...) that holds no run."""
  if not has_results(base):
    return os.path.abspath(base)
  i = 2
  while has_results(f"{base}-{i}"):
    i += 1
  return os.path.abspath(f"{base}-{i}")


def previous_times(root: str, preset: str) -> dict[tuple[str, int], float]:
  """(experiment, seed index) -> wall seconds of the runs in `root/claims.json` when it is a report of `preset`."""
  try:
    with open(os.path.join(root, "claims.json")) as f:
      report = json.load(f)
  except (OSError, ValueError):
    return {}
  if report.get("preset") != preset:
    return {}
  return {(name, k): float(r["wall_s"]) for name, e in report.get("experiments", {}).items()
          for k, r in enumerate(e.get("results_per_seed") or ()) if isinstance(r.get("wall_s"), (int, float))}


def progress(i: int, n: int, elapsed: float, left: float | None, width: int = 20) -> str:
  """`[#####---------------] 5/20, elapsed 1m40s, about 5m00s left`: the bar of item i (1-based) of n."""
  done = round(width * (i - 1) / n)
  eta = "" if left is None else f", about {duration(left)} left"
  return f"[{'#' * done}{'-' * (width - done)}] {i}/{n}, elapsed {duration(elapsed)}{eta}"


def _field(cfg, dotted: str):
  for name in dotted.split("."):
    cfg = getattr(cfg, name)
  return cfg


def machine() -> dict:
  import jax
  return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
          **provenance.host(), "cpus": os.cpu_count(), "backend": jax.default_backend(),
          "devices": jax.device_count(), "jax": jax.__version__}


def reproduce(preset: str, root: str, only=None, seeds: int = 1, force: bool = False,
              on_error: Callable[[str, BaseException], None] | None = None,
              on_skip: Callable[[str, errors.MissingDependency], None] | None = None,
              reuse_any: bool = False) -> tuple[str, int, int]:
  """Runs the experiments, writes `root/report.md` and `root/claims.json`; returns (report path, failures, skips).

  `on_error(name, exception)` reports a failed experiment (default: its traceback), `on_skip(name, exception)` one
  skipped for a MissingDependency (default: nothing). `reuse_any`: read back (or resume) a run of this preset and
  config whatever code made it."""
  if seeds < 1:
    raise ValueError(f"--seeds must be >= 1, found {seeds}")
  exps = registry.experiments()
  names = [n for n in exps if not only or n in only]
  plan = []
  for name in names:
    exp = exps[name]
    keys = exp.seed_key or ()
    base_seeds = [_field(exp.presets[preset], key) for key in keys]
    for k in range(seeds if keys else 1):
      sets = () if k == 0 else tuple(f"{key}={s + k}" for key, s in zip(keys, base_seeds))
      cfg = apply_overrides(exp.presets[preset], sets)
      plan.append((name, k, sets, os.path.join(root, name if k == 0 else f"{name}.seed{k}"), cfg))
  entries = {name: {"name": name, "run_dirs": [], "results_per_seed": [], "items_per_seed": [], "commits": []}
             for name in names}
  code = None if reuse_any else provenance.current()
  failed, skipped, t_start, ran_s, ran_n = 0, 0, time.time(), 0.0, 0
  before = previous_times(root, preset)
  for name, err in registry.import_errors().items():
    if not only or name in only:
      entries[name] = {"name": name, "error": f"import failed: {err}"}
      failed += 1
  for i, (name, k, sets, base, cfg) in enumerate(plan):
    if entries[name].get("skipped"):  # its other seeds lack the same tool
      continue
    known = [before[(n, j)] for n, j, *_ in plan[i:] if (n, j) in before]
    mean = ran_s / ran_n if ran_n else (sum(before.values()) / len(before) if before else None)
    left = None if mean is None else sum(known) + mean * (len(plan) - i - len(known))
    label = name + (f" seed +{k}" if k else "")
    print(f"=== {label} ({preset}) {progress(i + 1, len(plan), time.time() - t_start, left)}", flush=True)
    out_dir, done = matching_run(base, preset, cfg, code)
    if done and not force:
      print(f"    {out_dir} already holds these results; not rerun (--force reruns)", flush=True)
      results = registry.read_results(out_dir)
    else:
      other = matching_run(base, preset, cfg)[0] if out_dir is None and code is not None else None
      if other:
        print(f"    {other} holds this config, made by other or uncommitted code (commit "
              f"{provenance.label(_saved(other))}; now {provenance.label(code)}); run again (--reuse-any reads it "
              "back)", flush=True)
      resume = out_dir is not None and not done  # an interrupted run of this config continues
      if not resume:  # a fresh directory; a finished run (with --force) is kept
        out_dir = first_free(base)
      t0 = time.time()
      try:
        out_dir, results = registry.run_experiment(name, preset, sets, out_dir, resume)
      except errors.MissingDependency as e:
        if on_skip:
          on_skip(name, e)
        entries[name].update(skipped=str(e), missing=e.package)
        skipped += 1
        continue
      except Exception as e:  # noqa: BLE001  (one failed experiment must not hide the others' results)
        (on_error or (lambda n, x: traceback.print_exc()))(name, e)
        entries[name]["error"] = f"{type(e).__name__}: {e}"
        failed += 1
        continue
      ran_s, ran_n = ran_s + time.time() - t0, ran_n + 1
    entries[name]["run_dirs"].append(out_dir)
    entries[name]["results_per_seed"].append(results)
    entries[name]["items_per_seed"].append(registry.read_items(out_dir))
    made = provenance.label(results)  # a run read back from an earlier commit counts as this code's, noted
    entries[name]["commits"].append(made if code is None else provenance.label(code))
    if code is not None and made != provenance.label(code):
      entries[name].setdefault("made_at", []).append(made)
  report = build(list(entries.values()), exps, preset, seeds, command(preset, seeds, only, reuse_any))
  os.makedirs(root, exist_ok=True)
  with open(os.path.join(root, "claims.json"), "w") as f:
    json.dump(report, f, indent=1, default=str)
  return write_report(root, report), failed, skipped


def judged(c: claims_lib.Claim, e: dict | None, preset: str) -> dict:
  """One claim's (or check's) verdict on an experiment's entry of the report (None: not run)."""
  if e is None:
    return dict(claims_lib.verdict(c, [], preset), verdict=claims_lib.NOT_RUN)
  if e.get("error"):
    return dict(claims_lib.verdict(c, [], preset), verdict=claims_lib.FAILED)
  if e.get("skipped"):
    return dict(claims_lib.verdict(c, [], preset), verdict=f"{claims_lib.SKIPPED} ({e['missing']} not installed)")
  return claims_lib.verdict(c, e["results_per_seed"], preset, e.get("items_per_seed"))


def build(entries: list[dict], exps: dict, preset: str, seeds: int, cmd: str | None = None) -> dict:
  """The claims report as data: per paper its experiments' claim verdicts and, apart, their harness checks' (never
  counted as claims); per experiment its runs (results, per-item scores, commits); the command and the commits
  of its runs."""
  papers = {short: {"title": title, "experiments": [], "claims": [], "checks": [],
                   "departures": departures(short, provenance.REPO)}
            for short, title in claims_lib.PAPERS.items()}
  by_name = {e["name"]: e for e in entries}
  for name, exp in exps.items():
    if exp.paper is None:
      continue
    papers[exp.paper]["experiments"].append(name)
    for group in ("claims", "checks"):
      papers[exp.paper][group] += [dict(judged(c, by_name.get(name), preset), experiment=name)
                                   for c in getattr(exp, group)]
  return {"preset": preset, "seeds": seeds, "generated": time.strftime("%Y-%m-%d %H:%M:%S"),
          "command": cmd or command(preset, seeds),
          "commits": sorted({c for e in entries for c in e.get("commits", ())}),
          "machine": machine(), "papers": papers,
          "experiments": {e["name"]: {k: v for k, v in e.items() if k != "name"} for e in entries}}
