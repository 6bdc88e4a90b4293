"""`python -m experiments plan NAME --topology T`: a preset's compute, compiled ahead of time for a slice, before it is
rented: per chip bytes, whether it fits, FLOPs and chip-hours.

A paper's run module defines `workloads(cfg, mesh) -> [Workload]` (`registry.workloads_of`): the jitted functions
its run calls (train step, evaluation, generation step, ...) built by the same code the run uses, every argument
abstract (`jax.ShapeDtypeStruct`s carrying their shardings: no weights, nothing allocated), and how many times the
run calls each. `plan` builds the preset's mesh over the topology's devices, lowers and compiles each workload for
them, and reads the compiler's `memory_analysis` (argument + output + temporary bytes, less donated buffers, per
chip) and `cost_analysis`.

Topologies: Cloud TPU accelerator types (`v5e-8`, `v5p-64`, `v6e-16`, `v4-8`, ...; needs libtpu, `pip install -e
'.[tpu]'`), `cpu-N` (N virtual CPU devices; HBM is the host's memory split N ways), or `local` (this machine's
devices). FLOPs: XLA's `cost_analysis` counts a loop's body once (a `lax.scan` over 16 layers counts one), so
`flops_per_step` is counted on the traced program that is compiled: matmuls and convolutions, each scan's body
times its length, each while loop's body `Workload.loop_trips` times, a `lax.cond`'s costliest branch.
`seconds_per_step` on a TPU is the TPU cost model's `optimal_seconds` for the compiled program, its loops scaled by
the ratio of that count to the compiler's; elsewhere (no cost model) it is the count at the chips' peak FLOP/s
(100% MFU: a lower bound). `chip_hours` sums steps x seconds x chips.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
from typing import Any

GiB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Workload:
  """One jitted function of a run, ready to compile for a mesh.

  Attributes:
    name: what it is ("train_step", "eval_step", "decode_step", ...).
    kind: "train", "forward" or "generate".
    fn: the `jax.jit`-wrapped function the run calls.
    args: its arguments, abstract: pytrees of `jax.ShapeDtypeStruct` with shardings (static ones as values).
    steps: how many times the run calls it at this preset.
    analytic_flops: FLOPs per call from the model config (6·N·tokens for a train step, 2·N·tokens forward).
    loop_trips: how many times a `lax.while_loop` inside it runs per call (a generation loop's new tokens), which
      the traced program does not know; None counts each while body once.
  """
  name: str
  kind: str
  fn: Any
  args: tuple
  steps: int
  analytic_flops: float | None = None
  loop_trips: int | None = None


@dataclasses.dataclass(frozen=True)
class Topology:
  name: str
  platform: str  # "tpu" or "cpu"
  chips: int
  hbm_bytes_per_chip: int
  peak_flops_per_chip: float  # bf16 matmul FLOP/s
  tpu_topology: str | None = None  # jax.experimental.topologies name, e.g. "v5e:4x4"


# accelerator type -> (topology, chips, HBM GiB per chip, peak bf16 TFLOP/s per chip), from Cloud TPU's tables
_TPU = {
    **{f"v5e-{n}": (f"v5e:{s}", n, 16, 197) for n, s in [(1, "1x1"), (4, "2x2"), (8, "2x4"), (16, "4x4"),
                                                          (32, "4x8"), (64, "8x8"), (128, "8x16"), (256, "16x16")]},
    **{f"v6e-{n}": (f"v6e:{s}", n, 32, 918) for n, s in [(1, "1x1"), (4, "2x2"), (8, "2x4"), (16, "4x4"),
                                                          (32, "4x8"), (64, "8x8"), (128, "8x16"), (256, "16x16")]},
    **{f"v5p-{2 * n}": (f"v5p:{s}", n, 95, 459) for n, s in [(4, "2x2x1"), (8, "2x2x2"), (16, "2x2x4"),
                                                              (32, "2x4x4"), (64, "4x4x4"), (128, "4x4x8")]},
    **{f"v4-{2 * n}": (f"v4:{s}", n, 32, 275) for n, s in [(4, "2x2x1"), (8, "2x2x2"), (16, "2x2x4"),
                                                            (32, "2x4x4"), (64, "4x4x4")]},
}
TPU_TYPES = tuple(_TPU)


class DoesNotFit(RuntimeError):
  """A workload needs more memory per chip than the topology's chips have."""


def topology(name: str) -> Topology:
  """The topology named `name` (one-line ValueError naming the accepted names otherwise)."""
  if name in _TPU:
    topo, chips, hbm, tflops = _TPU[name]
    return Topology(name, "tpu", chips, hbm * GiB, tflops * 1e12, topo)
  m = re.fullmatch(r"cpu-([1-9]\d*)", name)
  if m or name == "local":
    import jax
    n = int(m.group(1)) if m else jax.device_count()
    if m and jax.device_count("cpu") < n:
      raise ValueError(f"topology {name} needs {n} CPU devices, this process has {jax.device_count('cpu')} (set "
                       f"XLA_FLAGS=--xla_force_host_platform_device_count={n} before JAX starts)")
    from jaxlab.train import metrics
    kind = jax.devices()[0].platform if name == "local" else "cpu"
    mem = _device_memory() if kind != "cpu" else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // n
    return Topology(name, kind, n, mem, metrics.peak_flops() / (n if kind == "cpu" else 1))
  raise ValueError(f"unknown topology {name!r}; expected a TPU type ({', '.join(TPU_TYPES)}), cpu-N or local")


def _device_memory() -> int:
  import jax
  stats = jax.devices()[0].memory_stats() or {}
  return int(stats.get("bytes_limit", 0))


def devices(topo: Topology) -> list:
  """The topology's devices: abstract TPU devices from libtpu's topology description, or this process's."""
  import jax
  if topo.platform != "tpu":
    return (jax.devices("cpu") if topo.name != "local" else jax.devices())[:topo.chips]
  from jax.experimental import topologies
  # compiling only, no chip is opened: another process holding libtpu's lock (any JAX process, where libtpu is
  # installed) must not stop it
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  try:
    desc = topologies.get_topology_desc(platform="tpu", topology_name=topo.tpu_topology, chip_config_name="default",
                                        chips_per_host_bounds=(2, 2, 1) if topo.chips >= 4 else (1, 1, 1),
                                        num_slices=1)
  except (RuntimeError, ValueError):
    import importlib.util
    if importlib.util.find_spec("libtpu") is None:
      raise OSError(f"planning for {topo.name} needs libtpu (not installed): pip install -e '.[tpu]'") from None
    raise
  return list(desc.devices)


def traced_flops(fn, *args, loop_trips: int | None = None) -> float:
  """FLOPs of matmuls and convolutions in `fn`'s traced program, each scan body counted times its length and each
  while loop's body `loop_trips` times (once if None: its trip count is not known before it runs)."""
  import jax
  return _jaxpr_flops(jax.make_jaxpr(fn)(*args).jaxpr, loop_trips or 1)


def _jaxpr_flops(jaxpr, trips: int = 1) -> float:
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      (contracting, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += 2.0 * math.prod(lhs[d] for d in contracting) * math.prod(eqn.outvars[0].aval.shape)
    elif name == "conv_general_dilated":
      rhs, out_dim = eqn.invars[1].aval.shape, eqn.params["dimension_numbers"].rhs_spec[0]  # the kernel's O axis
      total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(rhs) / rhs[out_dim]
    if name == "cond":  # one branch runs: the costliest is counted (an upper bound where the others run too)
      total += max(_jaxpr_flops(b.jaxpr, trips) for b in eqn.params["branches"])
      continue
    inner = [v for v in eqn.params.values() if hasattr(v, "jaxpr") or hasattr(v, "eqns")]
    inner += [b for v in eqn.params.values() if isinstance(v, tuple) for b in v if hasattr(b, "jaxpr")]
    for sub in inner:
      flops = _jaxpr_flops(sub.jaxpr if hasattr(sub, "jaxpr") else sub, trips)
      if name == "scan":
        flops *= eqn.params["length"]
      elif name == "while" and sub is eqn.params.get("body_jaxpr"):
        flops *= trips
      total += flops
  return total


def _memory(compiled) -> int:
  m = compiled.memory_analysis()
  if m is None:
    return 0
  return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes)


def _needed_bytes(message: str) -> int | None:
  """The bytes a RESOURCE_EXHAUSTED compile error says a program needs ("... (817.92G) exceeds ...")."""
  m = re.search(r"\(([\d.]+)([KMGT])\)\s*exceeds", message)
  return int(float(m.group(1)) * 1024 ** "KMGT".index(m.group(2)) * 1024) if m else None


def compile_workload(w: Workload, topo: Topology, mesh) -> dict:
  """One workload compiled for `topo`: the figures `plan` reports for it."""
  import jax
  ctx = jax.default_device(mesh.devices.flat[0]) if topo.platform == "tpu" else contextlib.nullcontext()
  with ctx:
    lowered = w.fn.lower(*w.args)
    cost = {}
    try:
      compiled = lowered.compile()
      per_chip = _memory(compiled)
      cost = compiled.cost_analysis() or {}
      cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    except Exception as e:  # noqa: BLE001  (XLA's RESOURCE_EXHAUSTED: the program cannot fit at all)
      per_chip = _needed_bytes(str(e))
      if per_chip is None:
        raise
    flops = traced_flops(w.fn, *w.args, loop_trips=w.loop_trips)
  seconds = flops / (topo.peak_flops_per_chip * topo.chips)
  # the cost model, each loop body once; it gives a negative optimal_seconds where it has no estimate
  if cost.get("optimal_seconds", 0) > 0 and cost.get("flops", 0) > 0:
    seconds = cost["optimal_seconds"] * max(1.0, flops / (cost["flops"] * topo.chips))
  return {"name": w.name, "kind": w.kind, "mesh": {k: int(v) for k, v in mesh.shape.items()},
          "bytes_per_chip": per_chip, "hbm_bytes_per_chip": topo.hbm_bytes_per_chip,
          "fits": per_chip <= topo.hbm_bytes_per_chip, "flops_per_step": flops,
          "analytic_flops_per_step": w.analytic_flops, "seconds_per_step": seconds, "steps": w.steps}


def plan(name: str, preset: str, topology_name: str, overrides=()) -> dict:
  """The plan of experiment `name` at `preset` on `topology_name`: the keys `--json` writes."""
  from experiments.runner import registry
  from jaxlab import sharding as shd
  workloads_fn = registry.workloads_of(registry.get(name))
  if workloads_fn is None:
    raise ValueError(f"{name} declares no workloads to plan (a `workloads(cfg, mesh)` in its run module)")
  cfg = registry.config_for(name, preset, overrides, required=False)
  topo = topology(topology_name)
  mesh = shd.make_mesh(getattr(cfg, "mesh", None), devices(topo))
  workloads = [compile_workload(w, topo, mesh) for w in workloads_fn(cfg, mesh)]
  hours = sum(w["steps"] * w["seconds_per_step"] for w in workloads) * topo.chips / 3600
  return {"experiment": name, "preset": preset, "topology": topo.name, "chips": topo.chips,
          "hbm_bytes_per_chip": topo.hbm_bytes_per_chip, "fits": all(w["fits"] for w in workloads),
          "chip_hours": hours, "workloads": workloads}


def _gb(b) -> str:
  return f"{b / GiB:.2f}"


def mfu(p: dict) -> float | None:
  """The cost model's MFU of a plan on a TPU slice: its FLOPs over (seconds x peak FLOP/s x chips); None elsewhere."""
  if p["topology"] not in _TPU or not p["workloads"]:
    return None
  seconds = sum(w["steps"] * w["seconds_per_step"] for w in p["workloads"])
  flops = sum(w["steps"] * w["flops_per_step"] for w in p["workloads"])
  util = flops / (seconds * topology(p["topology"]).peak_flops_per_chip * p["chips"]) if seconds else None
  return None if util is None or util > 1 - 1e-9 else util  # exactly 1: no cost-model seconds, counted at peak


def seconds_source(p: dict) -> str:
  """What a plan's seconds come from (its topology decides)."""
  return "the TPU cost model's seconds" if p["topology"] in _TPU else "seconds at peak FLOP/s (a lower bound)"


def table(p: dict) -> str:
  """The plan as a text table, one line per workload, then the experiment's totals."""
  if not p["workloads"]:
    return f"{p['experiment']} ({p['preset']}): no accelerator compute to plan"
  rows = [("workload", "kind", "mesh", "GiB/chip", "fits", "TFLOP/step", "analytic", "s/step", "steps")]
  for w in p["workloads"]:
    analytic = w["analytic_flops_per_step"]
    rows.append((w["name"], w["kind"], ",".join(f"{k}:{v}" for k, v in w["mesh"].items() if v > 1) or "1",
                 _gb(w["bytes_per_chip"]), "yes" if w["fits"] else "NO", f"{w['flops_per_step'] / 1e12:.4g}",
                 f"{analytic / 1e12:.4g}" if analytic else "-", f"{w['seconds_per_step']:.3g}", str(w["steps"])))
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  lines = ["  ".join(c.ljust(wd) for c, wd in zip(r, widths)).rstrip() for r in rows]
  util = mfu(p)
  lines.append(f"{p['experiment']} ({p['preset']}) on {p['topology']}: {p['chips']} chips, "
               f"{_gb(p['hbm_bytes_per_chip'])} GiB per chip, fits: {'yes' if p['fits'] else 'no'}, "
               f"{p['chip_hours']:.3g} chip-hours from {seconds_source(p)}"
               + (f", MFU {util:.0%}" if util is not None else ""))
  return "\n".join(lines)


def not_fitting(p: dict) -> str | None:
  """One line for the first workload that does not fit, or None."""
  for w in p["workloads"]:
    if not w["fits"]:
      return (f"{p['experiment']} ({p['preset']}): {w['name']} needs {_gb(w['bytes_per_chip'])} GiB per chip, a "
              f"{p['topology']} chip has {_gb(p['hbm_bytes_per_chip'])} GiB; {larger(p)}")
  return None


def next_slice(p: dict) -> str | None:
  """The smallest listed TPU slice of the plan's generation, larger than its own, with as much memory in all as its
  largest workload needs there (None: none, or not a TPU plan)."""
  if p["topology"] not in _TPU:
    return None
  gen = p["topology"].split("-")[0]
  need = max(w["bytes_per_chip"] for w in p["workloads"]) * p["chips"]
  bigger = [t for t in TPU_TYPES if t.startswith(gen + "-") and _TPU[t][1] * _TPU[t][2] * GiB >= need
            and _TPU[t][1] > p["chips"]]
  return bigger[0] if bigger else None


def larger(p: dict) -> str:
  """Which listed topologies of the same kind have more memory in all (the smallest first)."""
  if p["topology"] not in _TPU:
    return "plan it on a TPU type or more devices"
  gen, nxt = p["topology"].split("-")[0], next_slice(p)
  return (f"{nxt} is the smallest {gen} slice with that much memory in all (plan it there to check)" if nxt
          else f"no listed {gen} slice has that much memory in all")


def smallest_fitting(name: str, preset: str, topology_name: str, overrides=()) -> dict:
  """The plan on `topology_name`, or, on a TPU slice where it does not fit, on the next larger slices of its
  generation (`next_slice`) until one fits or none is left (the last plan, not fitting)."""
  p = plan(name, preset, topology_name, overrides)
  while not p["fits"] and (nxt := next_slice(p)) is not None:
    p = plan(name, preset, nxt, overrides)
  return p


def models(cfg) -> list[str]:
  """The checkpoints a config names by repo id (`registry.Hub` fields, nested configs included)."""
  from experiments.runner.overrides import Hub
  out = []
  for f in dataclasses.fields(cfg):
    v = getattr(cfg, f.name, None)
    if isinstance(v, Hub) and not v.startswith("datasets/"):
      out.append(str(v))
    elif dataclasses.is_dataclass(v) and not isinstance(v, type):
      out += models(v)
  return out


def plan_all(topology_name: str, preset: str = "full", names=None, log=print, cache: str | None = None,
             force: bool = False, cached_only: bool = False) -> dict:
  """Every paper experiment's plan at `preset` on the smallest slice, from `topology_name` up, on which it fits:
  {"topology", "preset", "plans": [plan + "paper", "models"], "errors": {name: one line}, "commits": the code that
  made the plans (`provenance.label`)}. With `cache` (a
  directory), each experiment's plan is kept there as it is made and read back for the same config and starting
  topology (unless `force`), so an interrupted `--all` goes on where it stopped; with `cached_only`, what the cache
  lacks is not planned but listed in "errors" as not planned yet."""
  import json
  from experiments.runner import provenance, registry
  from experiments.runner.overrides import config_dict
  plans, errors, commits = [], {}, set()
  code = provenance.current()  # the tree this invocation plans with (left unchanged while it runs)
  for name, exp in registry.experiments().items():
    if exp.paper is None or names and name not in names:
      continue
    cfg = registry.config_for(name, preset, required=False)
    kept = os.path.join(cache, f"{name}.{preset}.{topology_name}.json") if cache else None
    if kept and not force and os.path.exists(kept):
      with open(kept) as f:
        saved = json.load(f)
      if saved["config"] == config_dict(cfg):
        log(f"{name}: read back from {kept}")
        plans.append(saved["plan"])
        commits.add(provenance.label(saved["code"]))
        continue
    if cached_only:
      errors[name] = f"not yet (python -m experiments plan --all --only {name} --topology {topology_name})"
      continue
    log(f"planning {name} ({preset}) from {topology_name}")
    try:
      p = dict(smallest_fitting(name, preset, topology_name), paper=exp.paper, models=models(cfg))
    except Exception as e:  # noqa: BLE001  (one experiment that cannot be planned must not hide the others)
      errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
      log(f"  {errors[name]}")
      continue
    plans.append(p)
    commits.add(provenance.label(code))
    if kept:
      os.makedirs(cache, exist_ok=True)
      with open(kept, "w") as f:
        json.dump({"config": config_dict(cfg), "code": code, "plan": p}, f, indent=1)
    log(f"  {p['topology']}: fits {p['fits']}, {p['chip_hours']:.3g} chip-hours")
  return {"topology": topology_name, "preset": preset, "plans": plans, "errors": errors, "commits": sorted(commits)}


def scale_table(report: dict) -> str:
  """The "Paper scale" table of a `plan_all` report: per paper experiment its models, the slice it was planned on,
  per-chip GiB (its largest workload), whether it fits, chip-hours and the cost model's MFU."""
  lines = ["| paper | experiment | models | slice | GiB/chip | fits | chip-hours | MFU |",
           "|---|---|---|---|---|---|---|---|"]
  for p in sorted(report["plans"], key=lambda p: (p["paper"], p["experiment"])):
    if not p["workloads"]:
      lines.append(f"| {p['paper']} | {p['experiment']} | - | - | - | - | - | no accelerator compute |")
      continue
    util = mfu(p)
    lines.append(f"| {p['paper']} | {p['experiment']} | {', '.join(p['models']) or '-'} | {p['topology']} | "
                 f"{_gb(max(w['bytes_per_chip'] for w in p['workloads']))} | {'yes' if p['fits'] else 'no'} | "
                 f"{p['chip_hours']:.3g} | {f'{util:.0%}' if util is not None else '-'} |")
  lines += [f"| - | {name} | - | - | - | - | - | not planned: {err.replace('|', '/')} |"
            for name, err in sorted(report["errors"].items())]
  return "\n".join(lines)


def write_all(report: dict, root: str = "runs") -> str:
  """`root/plan.json` (the report) and `root/plan.md` (the scale table, then each plan's table); returns plan.md."""
  import json
  os.makedirs(root, exist_ok=True)
  with open(os.path.join(root, "plan.json"), "w") as f:
    json.dump(report, f, indent=1)
  path = os.path.join(root, "plan.md")
  body = [f"# Paper scale: full presets planned from {report['topology']}", "", scale_table(report), ""]
  body += [f"## {p['experiment']}\n\n```\n{table(p)}\n```\n" for p in report["plans"]]
  with open(path, "w") as f:
    f.write("\n".join(body))
  return path
