"""`python -m experiments plan NAME --topology T`: a preset's compute, compiled ahead of time for a slice, before it is
rented: per chip bytes, whether it fits, FLOPs and chip-hours.

An experiment that can be planned registers `plan=`: `(cfg, mesh) -> [Workload]`, the jitted functions its run calls
(train step, evaluation, generation step, ...) built by the same code the run uses, with every argument abstract
(`jax.ShapeDtypeStruct`s carrying their shardings: no weights, nothing allocated) and how many times the run calls
each. `plan` builds the preset's mesh over the topology's devices, lowers and compiles each workload for them, and
reads the compiler's `memory_analysis` (argument + output + temporary bytes, less donated buffers, per chip) and
`cost_analysis`.

Topologies: Cloud TPU accelerator types (`v5e-8`, `v5p-64`, `v6e-16`, `v4-8`, ...; needs libtpu, `pip install -e
'.[tpu]'`), `cpu-N` (N virtual CPU devices; HBM is the host's memory split N ways), or `local` (this machine's
devices). FLOPs: XLA's `cost_analysis` counts a loop's body once (a `lax.scan` over 16 layers counts one), so
`flops_per_step` is counted on the traced program that is compiled, each scan's body times its length (matmuls and
convolutions); `seconds_per_step` is that count at the chips' peak FLOP/s (100% MFU: a lower bound), and
`chip_hours` sums steps x seconds x chips.
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
  """
  name: str
  kind: str
  fn: Any
  args: tuple
  steps: int
  analytic_flops: float | None = None


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
  try:
    desc = topologies.get_topology_desc(platform="tpu", topology_name=topo.tpu_topology, chip_config_name="default",
                                        chips_per_host_bounds=(2, 2, 1) if topo.chips >= 4 else (1, 1, 1),
                                        num_slices=1)
  except (RuntimeError, ValueError) as e:
    if "libtpu" in str(e).lower() or "tpu" in str(e).lower() and "not found" in str(e).lower():
      raise OSError(f"planning for {topo.name} needs libtpu (not installed): pip install -e '.[tpu]'") from None
    raise
  return list(desc.devices)


def traced_flops(fn, *args) -> float:
  """FLOPs of matmuls and convolutions in `fn`'s traced program, each scan body counted times its length (a
  while loop's body once: its trip count is not known before it runs)."""
  import jax
  return _jaxpr_flops(jax.make_jaxpr(fn)(*args).jaxpr)


def _jaxpr_flops(jaxpr) -> float:
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      (contracting, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += 2.0 * math.prod(lhs[d] for d in contracting) * math.prod(eqn.outvars[0].aval.shape)
    elif name == "conv_general_dilated":
      rhs = eqn.invars[1].aval.shape
      total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(rhs) / rhs[0]
    inner = [v for v in eqn.params.values() if hasattr(v, "jaxpr") or hasattr(v, "eqns")]
    inner += [b for v in eqn.params.values() if isinstance(v, tuple) for b in v if hasattr(b, "jaxpr")]
    for sub in inner:
      body = sub.jaxpr if hasattr(sub, "jaxpr") else sub
      flops = _jaxpr_flops(body)
      if name == "scan":
        flops *= eqn.params["length"]
      elif name == "cond":
        flops /= max(1, len(eqn.params["branches"]))  # the branches' mean: one of them runs
      total += flops
  return total


def batch(mesh, shapes: dict) -> dict:
  """Abstract host batch placed as `jaxlab.sharding.shard_batch` places it: name -> ((shape), dtype) becomes
  ShapeDtypeStructs with the leading (batch) dimension over the mesh's batch axes."""
  import jax
  from jaxlab import sharding as shd
  return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=shd.batch_sharding(mesh)) for k, (shape, dtype) in
          shapes.items()}


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
    try:
      per_chip = _memory(lowered.compile())
    except Exception as e:  # noqa: BLE001  (XLA's RESOURCE_EXHAUSTED: the program cannot fit at all)
      per_chip = _needed_bytes(str(e))
      if per_chip is None:
        raise
    flops = traced_flops(w.fn, *w.args)
  seconds = flops / (topo.peak_flops_per_chip * topo.chips)
  return {"name": w.name, "kind": w.kind, "mesh": {k: int(v) for k, v in mesh.shape.items()},
          "bytes_per_chip": per_chip, "hbm_bytes_per_chip": topo.hbm_bytes_per_chip,
          "fits": per_chip <= topo.hbm_bytes_per_chip, "flops_per_step": flops,
          "analytic_flops_per_step": w.analytic_flops, "seconds_per_step": seconds, "steps": w.steps}


def plan(name: str, preset: str, topology_name: str, overrides=()) -> dict:
  """The plan of experiment `name` at `preset` on `topology_name`: the keys `--json` writes."""
  from experiments.runner import registry
  from jaxlab import sharding as shd
  exp = registry.get(name)
  if exp.plan is None:
    raise ValueError(f"{name} declares no workloads to plan (Experiment(plan=...)); plannable: "
                     f"{sorted(n for n, e in registry.experiments().items() if e.plan is not None)}")
  cfg = registry.config_for(name, preset, overrides, required=False)
  topo = topology(topology_name)
  mesh = shd.make_mesh(getattr(cfg, "mesh", None), devices(topo))
  workloads = [compile_workload(w, topo, mesh) for w in exp.plan(cfg, mesh)]
  hours = sum(w["steps"] * w["seconds_per_step"] for w in workloads) * topo.chips / 3600
  return {"experiment": name, "preset": preset, "topology": topo.name, "chips": topo.chips,
          "hbm_bytes_per_chip": topo.hbm_bytes_per_chip, "fits": all(w["fits"] for w in workloads),
          "chip_hours": hours, "workloads": workloads}


def _gb(b) -> str:
  return f"{b / GiB:.2f}"


def table(p: dict) -> str:
  """The plan as a text table, one line per workload, then the experiment's totals."""
  rows = [("workload", "kind", "mesh", "GiB/chip", "fits", "TFLOP/step", "analytic", "s/step @peak", "steps")]
  for w in p["workloads"]:
    analytic = w["analytic_flops_per_step"]
    rows.append((w["name"], w["kind"], ",".join(f"{k}:{v}" for k, v in w["mesh"].items() if v > 1) or "1",
                 _gb(w["bytes_per_chip"]), "yes" if w["fits"] else "NO", f"{w['flops_per_step'] / 1e12:.4g}",
                 f"{analytic / 1e12:.4g}" if analytic else "-", f"{w['seconds_per_step']:.3g}", str(w["steps"])))
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  lines = ["  ".join(c.ljust(wd) for c, wd in zip(r, widths)).rstrip() for r in rows]
  lines.append(f"{p['experiment']} ({p['preset']}) on {p['topology']}: {p['chips']} chips, "
               f"{_gb(p['hbm_bytes_per_chip'])} GiB per chip, fits: {'yes' if p['fits'] else 'no'}, "
               f"{p['chip_hours']:.3g} chip-hours at peak FLOP/s (a lower bound)")
  return "\n".join(lines)


def not_fitting(p: dict) -> str | None:
  """One line for the first workload that does not fit, or None."""
  for w in p["workloads"]:
    if not w["fits"]:
      return (f"{p['experiment']} ({p['preset']}): {w['name']} needs {_gb(w['bytes_per_chip'])} GiB per chip, a "
              f"{p['topology']} chip has {_gb(p['hbm_bytes_per_chip'])} GiB; {larger(p)}")
  return None


def larger(p: dict) -> str:
  """Which listed topologies of the same kind have more memory in all (the smallest first)."""
  if p["topology"] not in _TPU:
    return "plan it on a TPU type or more devices"
  gen = p["topology"].split("-")[0]
  need = max(w["bytes_per_chip"] for w in p["workloads"]) * p["chips"]
  bigger = [t for t in TPU_TYPES if t.startswith(gen + "-") and _TPU[t][1] * _TPU[t][2] * GiB >= need
            and _TPU[t][1] > p["chips"]]
  return (f"{bigger[0]} is the smallest {gen} slice with that much memory in all (plan it there to check)" if bigger
          else f"no listed {gen} slice has that much memory in all")
