"""The experiment runner's core: registry, presets, `--set` overrides, run directories and the report.

An experiment module calls `register(Experiment(name, Config, presets, run))` at import time, where `Config`
is a frozen dataclass, `presets` maps "smoke" / "cpu" / "full" to instances of it, and
`run(cfg, out_dir, resume) -> dict` trains/evaluates and returns the headline figures. The runner writes
`config.json`, `results.json` (flat keys) and `summary.md` around it; the experiment writes `metrics.jsonl`
and its PNG plots. Benchmarks register with `register_bench(name, fn)`, `fn(argv) -> dict`.
"""
from __future__ import annotations

import ast
import dataclasses
import datetime
import importlib
import json
import math
import os
import pkgutil
import time
import types
import typing
from typing import Any, Callable

PRESETS = ("smoke", "cpu", "full")
RESULT_FILES = ("results.json", "config.json", "metrics.jsonl", "checkpoints")


@dataclasses.dataclass(frozen=True)
class Experiment:
  """A registered experiment.

  Attributes:
    name: CLI name.
    config_cls: frozen config dataclass.
    presets: preset name -> config instance (at least "smoke", "cpu", "full").
    run: `(cfg, out_dir, resume) -> dict of results`.
    description: one line for `list`.
    resume_may_change: top-level config fields allowed to differ from the saved config.json on --resume.
  """
  name: str
  config_cls: type
  presets: dict
  run: Callable[[Any, str, bool], dict]
  description: str = ""
  resume_may_change: tuple[str, ...] = ()

  def __post_init__(self):
    missing = [p for p in PRESETS if p not in self.presets]
    if missing:
      raise ValueError(f"experiment {self.name!r}: presets must include {PRESETS}, missing {missing}")
    for p, c in self.presets.items():
      if not isinstance(c, self.config_cls):
        raise TypeError(f"experiment {self.name!r}: preset {p!r} is a {type(c).__name__}, expected "
                        f"{self.config_cls.__name__}")


@dataclasses.dataclass(frozen=True)
class Bench:
  name: str
  fn: Callable[[list], dict]
  description: str = ""


_EXPERIMENTS: dict[str, Experiment] = {}
_BENCHES: dict[str, Bench] = {}
_SKIP_MODULES = {"__main__", "registry"}


def register(exp: Experiment) -> Experiment:
  _EXPERIMENTS[exp.name] = exp
  return exp


def register_bench(name: str, fn: Callable[[list], dict], description: str = "") -> Bench:
  _BENCHES[name] = Bench(name, fn, description)
  return _BENCHES[name]


_IMPORT_ERRORS: dict[str, str] = {}


def load_all() -> None:
  """Imports every module of the `experiments` package so they register themselves.

  A module that fails to import is recorded (`import_errors()`) instead of breaking the other experiments.
  """
  import experiments
  for mod in pkgutil.iter_modules(experiments.__path__):
    if mod.name in _SKIP_MODULES or mod.name.startswith("_") or mod.name in _IMPORT_ERRORS:
      continue
    try:
      importlib.import_module(f"experiments.{mod.name}")
    except Exception as e:  # noqa: BLE001  (reported by list/run/reproduce)
      _IMPORT_ERRORS[mod.name] = f"{type(e).__name__}: {e}"


def import_errors() -> dict[str, str]:
  """Experiment modules that failed to import: module name -> error."""
  load_all()
  return dict(_IMPORT_ERRORS)


def experiments() -> dict[str, Experiment]:
  load_all()
  return dict(sorted(_EXPERIMENTS.items()))


def benches() -> dict[str, Bench]:
  load_all()
  return dict(sorted(_BENCHES.items()))


def get(name: str) -> Experiment:
  exps = experiments()
  if name not in exps:
    if name in _IMPORT_ERRORS:
      raise ImportError(f"experiment module experiments.{name} failed to import: {_IMPORT_ERRORS[name]}")
    raise KeyError(f"unknown experiment {name!r}; registered: {sorted(exps)}")
  return exps[name]


# ------------------------------------------------------------------------------------------ overrides

class OverrideError(ValueError):
  """A `--set key=value` that names no config field or does not parse as the field's type."""


def _type_name(tp) -> str:
  return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _parse(text: str, tp, key: str):
  origin, args = typing.get_origin(tp), typing.get_args(tp)
  bad = OverrideError(f"--set {key}={text!r}: expected {_type_name(tp)}")
  if tp is Any:
    try:
      return ast.literal_eval(text)
    except (ValueError, SyntaxError):
      return text
  if origin in (typing.Union, types.UnionType):
    if type(None) in args and text.strip().lower() in ("none", "null"):
      return None
    for a in (a for a in args if a is not type(None)):
      try:
        return _parse(text, a, key)
      except OverrideError:
        continue
    raise bad
  if origin is typing.Literal:
    for a in args:
      if str(a) == text:
        return a
    raise OverrideError(f"--set {key}={text!r}: expected one of {list(args)}")
  if tp is bool:
    low = text.strip().lower()
    if low in ("true", "1", "yes", "on"):
      return True
    if low in ("false", "0", "no", "off"):
      return False
    raise bad
  if tp is int:
    try:
      return int(text.strip().replace("_", ""))
    except ValueError:
      raise bad from None
  if tp is float:
    try:
      return float(text)
    except ValueError:
      raise bad from None
  if tp is str:
    return text
  if origin in (tuple, list):
    try:
      items = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      items = [s for s in text.split(",") if s.strip()]
    if not isinstance(items, (tuple, list)):
      items = [items]
    elem = args[0] if args else Any
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis or origin is list:
      vals = [_parse(str(v), elem, key) for v in items]
    elif origin is tuple and args:
      if len(items) != len(args):
        raise OverrideError(f"--set {key}={text!r}: expected {len(args)} items, found {len(items)}")
      vals = [_parse(str(v), a, key) for v, a in zip(items, args)]
    else:
      vals = list(items)
    return tuple(vals) if origin is tuple else vals
  if dataclasses.is_dataclass(tp):
    raise OverrideError(f"--set {key}: is a nested config ({tp.__name__}); set its fields as {key}.<field>=...")
  raise OverrideError(f"--set {key}: fields of type {_type_name(tp)} cannot be set from the command line")


def _replace_all(cfg, changes: dict, prefix: str = ""):
  """`cfg` with `changes` ({field: text, or {subfield: ...} for a nested config}) applied in one
  `dataclasses.replace` per config, so validation sees every override together (steps=2 with warmup_steps=1)."""
  if not dataclasses.is_dataclass(cfg):
    raise OverrideError(f"--set {prefix}{next(iter(changes))}: {prefix.rstrip('.')} is not a nested config")
  fields = {f.name for f in dataclasses.fields(cfg) if f.init}
  hints = typing.get_type_hints(type(cfg))
  values = {}
  for name, change in changes.items():
    if name not in fields:
      raise OverrideError(f"--set {prefix}{name}: unknown key {name!r} for {type(cfg).__name__}; "
                          f"known keys: {sorted(fields)}")
    if isinstance(change, dict):
      values[name] = _replace_all(getattr(cfg, name), change, f"{prefix}{name}.")
    else:
      values[name] = _parse(change, hints.get(name, Any), f"{prefix}{name}")
  return dataclasses.replace(cfg, **values)


def apply_overrides(cfg, items) -> Any:
  """`cfg` with `key=value` overrides (dotted keys reach nested configs: model.d_model=128).

  Each value is parsed as its field's annotated type (int, float, bool, str, X | None, tuple[...]);
  an unknown key, a bad value or a config that fails its own validation (checked once, with every
  override applied) raises OverrideError naming the keys, before anything else runs.
  """
  changes: dict = {}
  for item in items or ():
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
      raise OverrideError(f"--set expects key=value, found {item!r}")
    *parents, leaf = key.split(".")
    node = changes
    for part in parents:
      node = node.setdefault(part, {})
      if not isinstance(node, dict):
        raise OverrideError(f"--set {key}: {part!r} is set as a value and as a nested config")
    if isinstance(node.get(leaf), dict):
      raise OverrideError(f"--set {key}: is a nested config; set its fields as {key}.<field>=...")
    node[leaf] = text
  if not changes:
    return cfg
  try:
    return _replace_all(cfg, changes)
  except OverrideError:
    raise
  except (ValueError, TypeError) as e:
    given = " ".join(f"{i.partition('=')[0].strip()}={i.partition('=')[2]!r}" for i in items)
    raise OverrideError(f"--set {given}: {e}") from e


def config_dict(cfg) -> dict:
  return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def flatten(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    key = f"{prefix}{k}"
    if isinstance(v, dict):
      out.update(flatten(v, key + "."))
    else:
      out[key] = v
  return out


# ------------------------------------------------------------------------------------------ run dirs

class RunDirExists(FileExistsError):
  pass


def _has_results(path: str) -> bool:
  return os.path.isdir(path) and any(os.path.exists(os.path.join(path, f)) for f in RESULT_FILES)


def resolve_run_dir(name: str, out: str | None, resume: bool, root: str = "runs") -> str:
  """The directory a run writes to; never one holding another run's results unless resuming it.

  With an explicit `out` that already holds a run, refuses (RunDirExists) unless `resume`. Without `out`,
  uses `root/name`, or when that holds a run and not `resume`, the first free `root/name-2`, `-3`, ...
  The result is absolute (orbax requires absolute checkpoint paths; a relative `out` or `root` is taken
  relative to the working directory at the time of the call).
  """
  return os.path.abspath(_resolve_run_dir(name, out, resume, root))


def _resolve_run_dir(name: str, out: str | None, resume: bool, root: str) -> str:
  if out is not None:
    if _has_results(out) and not resume:
      raise RunDirExists(f"{out} already holds a run (config/results/checkpoints); pass --resume to continue "
                         "it or choose another --out")
    return out
  base = os.path.join(root, name)
  if resume or not _has_results(base):
    return base
  i = 2
  while _has_results(f"{base}-{i}"):
    i += 1
  return f"{base}-{i}"


def _is_main() -> bool:
  import jax
  return jax.process_index() == 0


def _barrier(tag: str) -> None:
  import jax
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(tag)


def _check_resume_config(exp: Experiment, out_dir: str, cfg) -> None:
  path = os.path.join(out_dir, "config.json")
  if not os.path.exists(path):
    return
  try:
    with open(path) as f:
      old = flatten(json.load(f).get("config", {}))
  except (ValueError, AttributeError) as e:
    raise ValueError(f"--resume {out_dir}: {path} is not a run's config (expected a JSON object with a "
                     f"'config' entry; {type(e).__name__}: {e})") from None
  new = flatten(config_dict(cfg))
  diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k)
                and k.split(".")[0] not in exp.resume_may_change)
  if diff:
    raise ValueError(f"--resume {out_dir}: config differs from the saved config.json in {diff} "
                     f"(saved {[old.get(k) for k in diff]}, now {[new.get(k) for k in diff]}); only "
                     f"{list(exp.resume_may_change)} may change on resume")


def _holds_work(path: str, written: set[str]) -> bool:
  """Whether `path` holds anything but the files this invocation wrote (and empty directories)."""
  for dirpath, _, files in os.walk(path):
    for f in files:
      full = os.path.join(dirpath, f)
      if full not in written and not (f == "metrics.jsonl" and os.path.getsize(full) == 0):
        return True
  return False


def _discard_failed_start(out_dir: str, existed: bool, written: set[str]) -> None:
  """After a run failed before producing anything, removes what the runner wrote, so the same --out (or
  --resume) starts cleanly next time; a run that logged, checkpointed or plotted anything is kept whole."""
  if not os.path.isdir(out_dir) or _holds_work(out_dir, written):
    return
  for f in written:
    if os.path.exists(f):
      os.remove(f)
  if not existed:
    for dirpath, _, _ in sorted(os.walk(out_dir), key=lambda t: -len(t[0])):
      if not os.listdir(dirpath):
        os.rmdir(dirpath)


def run_experiment(name: str, preset: str, overrides=(), out: str | None = None, resume: bool = False,
                   root: str = "runs") -> tuple[str, dict]:
  """Runs one experiment end to end; returns (run directory, results).

  A run that fails before writing anything of its own (a bad path, a config the experiment rejects at
  start-up) leaves no trace in its run directory.
  """
  exp = get(name)
  if preset not in exp.presets:
    raise ValueError(f"unknown preset {preset!r} for {name}; expected one of {sorted(exp.presets)}")
  cfg = apply_overrides(exp.presets[preset], overrides)
  out_dir = resolve_run_dir(name, out, resume, root)
  if resume:
    _check_resume_config(exp, out_dir, cfg)
    if not _has_results(out_dir) and _is_main():
      print(f"--resume: {out_dir} holds no run yet; starting from scratch", flush=True)
  _barrier("jaxlab_run_dir")
  meta = {"experiment": name, "preset": preset, "overrides": list(overrides),
          "started": datetime.datetime.now().isoformat(timespec="seconds"), "config": config_dict(cfg)}
  existed, written = os.path.isdir(out_dir), set()
  if _is_main():
    os.makedirs(out_dir, exist_ok=True)
    cfg_path = os.path.join(out_dir, "config.json")
    if os.path.exists(cfg_path):  # resuming: keep the original, record what this invocation used
      cfg_path = os.path.join(out_dir, "config.resumed.json")
    with open(cfg_path, "w") as f:
      json.dump(meta, f, indent=1)
    written.add(cfg_path)
  _barrier("jaxlab_run_dir_made")
  t0 = time.time()
  try:
    results = flatten(dict(exp.run(cfg, out_dir, resume) or {}))
  except BaseException:
    if _is_main():
      _discard_failed_start(out_dir, existed, written)
    raise
  results.setdefault("wall_s", round(time.time() - t0, 2))
  if _is_main():
    with open(os.path.join(out_dir, "results.json"), "w") as f:
      json.dump(results, f, indent=1, default=str)
    write_summary(out_dir, name, preset, list(overrides), results)
  return out_dir, results


def describe_config(exp: Experiment) -> str:
  """A table of every `--set` key of `exp`: type and value in each preset (nested keys dotted)."""
  hints: dict[str, Any] = {}

  def walk(cls, prefix):
    for f in dataclasses.fields(cls):
      if not f.init:
        continue
      tp = typing.get_type_hints(cls).get(f.name, Any)
      if dataclasses.is_dataclass(tp):
        walk(tp, f"{prefix}{f.name}.")
      else:
        hints[f"{prefix}{f.name}"] = tp

  walk(exp.config_cls, "")
  values = {p: flatten(config_dict(c)) for p, c in exp.presets.items()}
  rows = [("key", "type", *values)]
  rows += [(k, _type_name(tp), *(_fmt(v.get(k, "-")) for v in values.values())) for k, tp in hints.items()]
  widths = [min(40, max(len(str(r[i])) for r in rows)) for i in range(len(rows[0]))]
  return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


# --------------------------------------------------------------------------------------- summaries

def _fmt(v) -> str:
  if isinstance(v, float):
    return f"{v:.4g}" if math.isfinite(v) else str(v)
  return str(v)


def results_table(results: dict) -> str:
  lines = ["| key | value |", "|---|---|"]
  lines += [f"| {k} | {_fmt(v)} |" for k, v in results.items()]
  return "\n".join(lines)


def plots_in(run_dir: str) -> list[str]:
  return sorted(f for f in os.listdir(run_dir) if f.lower().endswith(".png")) if os.path.isdir(run_dir) else []


def write_summary(run_dir: str, name: str, preset: str, overrides: list, results: dict) -> str:
  path = os.path.join(run_dir, "summary.md")
  lines = [f"# {name} ({preset})", ""]
  if overrides:
    lines += ["Overrides: " + " ".join(f"`{o}`" for o in overrides), ""]
  lines += [results_table(results), ""]
  lines += [f"![{p}]({p})" for p in plots_in(run_dir)]
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
  return path


def write_report(root: str, entries: list[dict], preset: str) -> str:
  """`root/report.md` from entries {name, run_dir, results, error}: one results table and the plots per run."""
  path = os.path.join(root, "report.md")
  lines = [f"# jaxlab experiments report (preset {preset})", "",
           f"Generated {datetime.datetime.now().isoformat(timespec='seconds')}.", ""]
  for e in entries:
    lines += [f"## {e['name']}", ""]
    if e.get("run_dir"):
      lines += [f"Run directory: `{e['run_dir']}`", ""]
    if e.get("error"):
      lines += [f"**Failed:** `{e['error']}`", ""]
      continue
    lines += [results_table(e.get("results", {})), ""]
    for p in plots_in(e["run_dir"]):
      rel = os.path.relpath(os.path.join(e["run_dir"], p), root)
      lines += [f"![{e['name']}: {p}]({rel})", ""]
  os.makedirs(root, exist_ok=True)
  with open(path, "w") as f:
    f.write("\n".join(lines))
  return path


def read_results(run_dir: str) -> dict:
  with open(os.path.join(run_dir, "results.json")) as f:
    return json.load(f)


def plot_curves(path: str, series: dict[str, tuple[list, list]], xlabel: str = "step", ylabel: str = "loss",
                title: str = "", logy: bool = False) -> str:
  """A PNG line plot of {label: (xs, ys)} (matplotlib Agg)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
  for label, (xs, ys) in series.items():
    if len(xs):
      ax.plot(xs, ys, label=label, marker="o" if len(xs) < 20 else None, markersize=3)
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  if logy:
    ax.set_yscale("log")
  if title:
    ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return path
