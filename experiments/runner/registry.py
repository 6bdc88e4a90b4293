"""The experiment registry and `run_experiment`, the one place that runs an experiment end to end.

An experiment module calls `register(Experiment(name, Config, presets, run))` at import time, where `Config`
is a frozen dataclass, `presets` maps "smoke" / "cpu" / "full" to instances of it, and
`run(cfg, out_dir, resume) -> dict` trains/evaluates and returns the headline figures. The runner writes
`config.json`, `results.json` (flat keys) and `summary.md` around it; the experiment writes `metrics.jsonl`
and its PNG plots. Per-item scores (what a claim's `diff` bootstraps over) come back under the key `per_item`,
a mapping of name -> list of numbers (one per evaluated item, in a fixed item order, so that two arrays of one
length are paired item by item): the runner moves them out of results.json into `items.json` (`read_items`).
A paper's run records which items each of its splits holds (`splits.record`, `splits.json`) before it trains, and
any overlap between training and evaluation items that the experiment does not declare `shared=` stops it there.
config.json and results.json both record the code's `git_commit` and `git_dirty` (`provenance`). An experiment of
a paper names it (`paper=`, a short name of `claims.PAPERS`) and declares the paper's claims (`claims=`), its
harness self-checks apart from them (`checks=`, `claims.Check`s), and what it needs from outside pip's resolver
(`requires=`, names of `jaxlab.errors.APT` / `NO_DEPS`), which `run_experiment` checks before the experiment
starts, and the results keys it writes (`results=`), which every claim and check must read from and every finished
run must match.

Before anything runs, `config_for` builds the run's config: the preset with its `--set` overrides, every
`typing.Literal` field one of its values (`jaxlab.choices`), no `Required` placeholder left unset. Benchmarks
register with `register_bench(name, fn)`, `fn(argv) -> dict`.
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib
import json
import os
import pkgutil
import re
import sys
import time
from typing import Any, Callable

from experiments.runner import provenance
from experiments.runner.claims import PAPERS, Check, Claim
from experiments.runner.overrides import (Hub, OverrideError, Required, apply_overrides, config_dict,  # noqa: F401
                                          flatten, resolve_hubs, unset_required)
from experiments.runner.plots import plot_curves  # noqa: F401
from experiments.runner.report import (describe_config, plots_in, read_results, results_table,  # noqa: F401
                                       write_report, write_summary)
from experiments.runner.rundirs import (RESULT_FILES, RunDirExists, discard_failed_start, has_results,  # noqa: F401
                                        resolve_run_dir)
from jaxlab import choices, errors

PRESETS = ("smoke", "cpu", "full")
PER_ITEM, ITEMS_FILE, SPLITS_FILE = "per_item", "items.json", "splits.json"
RUNNER_KEYS = ("wall_s", "git_commit", "git_dirty")  # results.json keys the runner adds to an experiment's own


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
    paper: the short name of the paper this experiment reproduces (None: infrastructure, e.g. lm_pretrain).
    claims: the paper's claims, checked on results.json by `reproduce`.
    checks: harness self-checks (`claims.Check`: the benchmark's references behave as designed, a
      constructed-wrong agent scores low), judged like claims and reported apart, never counted as claims.
    seed_key: the config field `reproduce --seeds N` varies, or a tuple of them (dotted names reach nested
      configs; all move together; held as a tuple); None: the experiment is not repeated.
    requires: the tools and no-deps wheels a run needs (keys of `jaxlab.errors.APT` / `NO_DEPS`: "bwrap",
      "espeak-ng", "wordnet", "textworld", ...), or `cfg -> such names` when that depends on the config; checked
      before the run starts (MissingDependency), so a missing one costs no computation.
    shared: item kinds a run's `train` split may share with its evaluation splits (`runner.splits`), kind -> why
      (each also a row of the paper's departures table); any other overlap stops the run before it trains.
    plan: `(cfg, mesh) -> [runner.plan.Workload]`, the jitted functions the run calls with abstract arguments, for
      `python -m experiments plan` (None: the `workloads` of the module `run_of` names, if it has one; see
      `workloads_of`).
    results: the keys of the results `run` returns (flattened; the runner's own `RUNNER_KEYS` apart): exact keys,
      or patterns in which `<name>` stands for any non-empty text (`val_loss.<opt>`); a trailing "?" marks keys a
      run may leave out (those only some presets or configs write). A finished run must write exactly these (an
      undeclared key, or no key of a pattern without "?", fails it: `ResultsMismatch`), and every claim and check
      may read only declared keys. None: not declared, only for an experiment without claims and checks.
  """
  name: str
  config_cls: type
  presets: dict
  run: Callable[[Any, str, bool], dict]
  description: str = ""
  resume_may_change: tuple[str, ...] = ()
  paper: str | None = None
  claims: tuple[Claim, ...] = ()
  checks: tuple[Check, ...] = ()
  seed_key: str | tuple[str, ...] | None = "seed"
  requires: tuple[str, ...] | Callable[[Any], tuple[str, ...]] = ()
  results: tuple[str, ...] | None = None
  shared: dict[str, str] = dataclasses.field(default_factory=dict)
  plan: Callable[[Any, Any], list] | None = None

  def __post_init__(self):
    if self.paper is not None and self.paper not in PAPERS:
      raise ValueError(f"experiment {self.name!r}: paper {self.paper!r} is not one of {list(PAPERS)}")
    ids = [c.id for c in self.claims + self.checks]
    if len(set(ids)) != len(ids):
      raise ValueError(f"experiment {self.name!r}: claim and check ids repeat: {ids}")
    if any(isinstance(c, Check) for c in self.claims) or not all(isinstance(c, Check) for c in self.checks):
      raise TypeError(f"experiment {self.name!r}: claims= takes Claims, checks= takes Checks")
    fields = {f.name for f in dataclasses.fields(self.config_cls)}
    if self.seed_key == "seed" and "seed" not in fields:  # the default, for configs without a seed
      object.__setattr__(self, "seed_key", None)
    elif self.seed_key is not None:
      if isinstance(self.seed_key, str):
        object.__setattr__(self, "seed_key", (self.seed_key,))
      unknown = [k for k in self.seed_key if k.split(".")[0] not in fields]
      if unknown:
        raise ValueError(f"experiment {self.name!r}: seed_key names {unknown}, not fields of "
                         f"{self.config_cls.__name__}")
    missing = [p for p in PRESETS if p not in self.presets]
    if missing:
      raise ValueError(f"experiment {self.name!r}: presets must include {PRESETS}, missing {missing}")
    for p, c in self.presets.items():
      if not isinstance(c, self.config_cls):
        raise TypeError(f"experiment {self.name!r}: preset {p!r} is a {type(c).__name__}, expected "
                        f"{self.config_cls.__name__}")
      choices.check(c, functools.partial(_fail, ValueError, f"experiment {self.name!r}: preset {p!r}: "))
      self.requirements(c)
    self._check_results_declared()
    if not all(isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in dict(self.shared).items()):
      raise TypeError(f"experiment {self.name!r}: shared= maps an item kind to the reason it is shared, found "
                      f"{self.shared!r}")

  def _check_results_declared(self) -> None:
    if self.results is None:
      if self.claims or self.checks:
        raise ValueError(f"experiment {self.name!r}: declare the results keys it writes (results=...); its claims "
                         "and checks read them")
      return
    if isinstance(self.results, str) or not all(isinstance(k, str) and k.rstrip("?") for k in self.results):
      raise TypeError(f"experiment {self.name!r}: results= takes a tuple of key patterns, found {self.results!r}")
    object.__setattr__(self, "results", tuple(self.results))
    undeclared = [f"{c.id}: {k}" for c in self.claims + self.checks for k in c.all_keys if not self.declares(k)]
    if undeclared:
      raise ValueError(f"experiment {self.name!r}: claims and checks read results keys it does not declare "
                       f"({'; '.join(undeclared)}); declared: {list(self.results)}")

  def declares(self, key: str) -> bool:
    """Whether `key` is one of the declared results keys (or matches a pattern of them)."""
    return any(_key_regex(p).fullmatch(key) for p in self.results or ())

  def check_results(self, results: dict) -> None:
    """Raises ResultsMismatch unless `results`' keys (runner keys apart) are exactly the declared ones: none
    undeclared, and a key for every declared pattern not marked optional. Nothing to check without `results=`."""
    if self.results is None:
      return
    keys = [k for k in results if k not in RUNNER_KEYS]
    undeclared = [k for k in keys if not self.declares(k)]
    missing = [p for p in self.results if not p.endswith("?") and not any(_key_regex(p).fullmatch(k) for k in keys)]
    if undeclared or missing:
      raise ResultsMismatch(f"{self.name}: the run's results keys differ from its declared results=: "
                            + "; ".join(([f"undeclared {undeclared}"] if undeclared else [])
                                        + ([f"missing {missing}"] if missing else [])))

  def requirements(self, cfg) -> tuple[str, ...]:
    """The names `requires` gives for `cfg` (a ValueError for one that `jaxlab.errors` does not know)."""
    names = tuple(self.requires(cfg) if callable(self.requires) else self.requires)
    unknown = [n for n in names if n not in errors.APT and n not in errors.NO_DEPS]
    if unknown:
      raise ValueError(f"experiment {self.name!r}: requires names {unknown}, none of jaxlab.errors' "
                       f"{sorted(errors.APT) + sorted(errors.NO_DEPS)}")
    return names

  def check_requirements(self, cfg) -> None:
    """Raises jaxlab.errors.MissingDependency for the first requirement at `cfg` that is not installed."""
    for name in self.requirements(cfg):
      errors.require(name, f"{self.name}'s {errors.APT[name][1]}" if name in errors.APT else self.name)


class SplitsMissing(RuntimeError):
  """A paper's run finished without recording its splits (`runner.splits.record`)."""


class ResultsMismatch(ValueError):
  """A finished run's results keys differ from its experiment's declared `results=`."""


def _fail(error: type, prefix: str, message: str):
  raise error(prefix + message)


@functools.lru_cache(maxsize=None)
def _key_regex(pattern: str) -> re.Pattern:
  """A declared results key as a regex: `<name>` stands for any non-empty text; a trailing "?" is dropped."""
  parts = re.split(r"<[^<>]+>", pattern.removesuffix("?"))
  return re.compile(".+".join(re.escape(p) for p in parts))


@dataclasses.dataclass(frozen=True)
class Bench:
  name: str
  fn: Callable[[list], dict]
  description: str = ""


_EXPERIMENTS: dict[str, Experiment] = {}
_BENCHES: dict[str, Bench] = {}
_SKIP_MODULES = {"__main__", "registry", "runner"}


def register(exp: Experiment) -> Experiment:
  _EXPERIMENTS[exp.name] = exp
  return exp


def _lazy(module: str, attr: str, wrapper: str) -> Callable:
  """`module.attr`, imported at the first call."""
  def call(*args):
    return getattr(importlib.import_module(module), attr)(*args)
  call.__qualname__ = call.__name__ = f"{wrapper}({module!r})"
  call.module = module
  return call


def run_of(module: str) -> Callable[[Any, str, bool], dict]:
  """The `run(cfg, out_dir, resume)` of `module` (a paper's `experiments/<paper>/run.py`), imported at its first
  call: run.py reads its package's Config, so the package names its run instead of importing it."""
  return _lazy(module, "run", "run_of")


def plan_of(module: str) -> Callable[[Any, Any], list]:
  """The `workloads(cfg, mesh)` of `module` (a paper's run.py) for `Experiment(plan=...)`, imported at its first
  call, as `run_of` does for the run."""
  return _lazy(module, "workloads", "plan_of")


def workloads_of(exp: Experiment) -> Callable[[Any, Any], list] | None:
  """The experiment's `plan`, or else the `workloads(cfg, mesh)` of its run module (imported), or None."""
  if exp.plan is not None:
    return exp.plan
  module = getattr(exp.run, "module", None)
  if module is None or not hasattr(importlib.import_module(module), "workloads"):
    return None
  return plan_of(module)


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


def _per_item(name: str, items) -> dict[str, list[float]]:
  """`run()`'s per-item scores as name -> list of floats; anything else is left out with a warning (the run's
  results are kept)."""
  if items is None:
    return {}
  try:
    return {str(k): [float(v) for v in vs] for k, vs in dict(items).items()}
  except (TypeError, ValueError) as e:
    print(f"warning: {name}: {PER_ITEM} is not a mapping of names to lists of numbers ({e}); no items.json",
          file=sys.stderr, flush=True)
    return {}


def read_items(run_dir: str) -> dict[str, list[float]]:
  """A run's per-item scores (items.json), or {} for a run that recorded none."""
  try:
    with open(os.path.join(run_dir, ITEMS_FILE)) as f:
      return json.load(f)
  except FileNotFoundError:
    return {}


def config_for(name: str, preset: str, overrides=(), required: bool = True):
  """The config a run of `name` at `preset` with `--set` overrides (`key=value` strings) uses, checked before
  anything runs: the overrides parsed and applied, every `typing.Literal` field one of its values, and (unless
  `required` is False, as for `plan`, which reads no data) every downloaded `Hub` checkpoint replaced by its
  directory and no `Required` placeholder left (naming each with how to set it or the command that fetches it). Errors are one line (OverrideError) that starts with the experiment's name."""
  exp = get(name)
  if preset not in exp.presets:
    raise ValueError(f"unknown preset {preset!r} for {name}; expected one of {sorted(exp.presets)}")
  try:
    cfg = apply_overrides(exp.presets[preset], overrides)
    choices.check(cfg, functools.partial(_fail, OverrideError, ""))
  except OverrideError as e:
    raise OverrideError(f"{name}: {e}") from None
  if not required:
    return cfg
  cfg = resolve_hubs(cfg)
  unset = unset_required(cfg)
  if unset:
    raise OverrideError(f"{name} --preset {preset}: " + "; ".join(
        f"{k}: {how.how(k)}" if isinstance(how, Hub) else f"{k} is required ({how})" for k, how in unset))
  return cfg


def run_experiment(name: str, preset: str, overrides=(), out: str | None = None, resume: bool = False,
                   root: str = "runs") -> tuple[str, dict]:
  """Runs one experiment end to end; returns (run directory, results).

  A run that fails before writing anything of its own (a bad path, a config the experiment rejects at
  start-up) leaves no trace in its run directory; one whose config fails `config_for` (a bad override, a
  `Required` value not given) or whose `requires` are not installed (MissingDependency) fails before it has a run
  directory. A run whose results keys differ from the declared `results=` fails (ResultsMismatch) after writing
  them, so that nothing it computed is lost.
  """
  exp = get(name)
  cfg = config_for(name, preset, overrides)
  exp.check_requirements(cfg)
  out_dir = resolve_run_dir(name, out, resume, root)
  if resume:
    _check_resume_config(exp, out_dir, cfg)
    if not has_results(out_dir) and _is_main():
      print(f"--resume: {out_dir} holds no run yet; starting from scratch", flush=True)
  _barrier("jaxlab_run_dir")
  code = provenance.current()
  meta = {"experiment": name, "preset": preset, "overrides": list(overrides),
          "started": datetime.datetime.now().isoformat(timespec="seconds"), **code, "host": provenance.host(),
          "config": config_dict(cfg)}
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
  from jaxlab.train import interrupt
  try:
    with interrupt.handled():  # Ctrl-C: never lost; in the training loops, at a step boundary
      results = dict(exp.run(cfg, out_dir, resume) or {})
  except BaseException:
    if _is_main():
      discard_failed_start(out_dir, existed, written)
    raise
  items = _per_item(name, results.pop(PER_ITEM, None))
  results = flatten(results)
  results.setdefault("wall_s", round(time.time() - t0, 2))
  results.update(code)
  if _is_main():
    if items:
      with open(os.path.join(out_dir, ITEMS_FILE), "w") as f:
        json.dump(items, f)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
      json.dump(results, f, indent=1, default=str)
    if (files := provenance.sources()) is not None:
      with open(os.path.join(out_dir, provenance.SOURCES_FILE), "w") as f:
        json.dump(files, f, indent=0)
    write_summary(out_dir, name, preset, list(overrides), results)
  exp.check_results(results)
  if exp.paper is not None and not os.path.exists(os.path.join(out_dir, SPLITS_FILE)):
    raise SplitsMissing(f"{name}: the run wrote no {SPLITS_FILE}; a paper's run records its splits "
                        "(experiments.runner.splits.record) before it trains")
  return out_dir, results
