"""Device meshes, logical-axis sharding rules, placing params and batches, multi-process start-up.

Implements the GSPMD way of sharding (arXiv:2105.04663) with named logical axes mapped to the mesh axes
("data", "fsdp", "tensor"): data parallelism, fully sharded data parallelism (ZeRO-3, arXiv:1910.02054) and
Megatron tensor parallelism (arXiv:1909.08053), or FSDP and tensor parallelism together. Every parameter's
dims carry logical names, given by the model family's axis rules (`axes=tfm.AXES`, see `jaxlab.nn.axes`); a
strategy is a short rule table from logical names to mesh axes, and XLA inserts the collectives.

Rules: a logical name maps to None (replicated), one mesh axis, or a tuple of mesh axes. A dim whose size
is not divisible by the product of its mesh axes keeps the longest prefix of those axes that divides it
(often none: the dim is replicated), so small vocabularies or few heads still place on 8 devices. Scalars
(step counters, PRNG keys) are always replicated.
"""
from __future__ import annotations

import functools
import logging
import math
import os
import re
from typing import Literal

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab import choices
from jaxlab.nn import axes as axes_lib

log = logging.getLogger(__name__)

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

_COMMON = (("batch", BATCH_AXES), ("seq", None), ("layers", None), ("qk_norm", None), ("head_dim", None),
           ("patch", None), ("pos", None), ("rank", None), ("classes", None),
           ("kron_r1", None), ("kron_in", None), ("kron_out", None), ("kron_r2", None),
           ("conv_width", None), ("conv_in", None))
RULES = {
    "dp": (("vocab", None), ("embed", None), ("q_heads", None), ("kv_heads", None), ("heads", None),
           ("mlp", None)) + _COMMON,
    "fsdp": (("vocab", None), ("embed", "fsdp"), ("q_heads", None), ("kv_heads", None), ("heads", None),
             ("mlp", None)) + _COMMON,
    "tp": (("vocab", "tensor"), ("embed", None), ("q_heads", "tensor"), ("kv_heads", "tensor"),
           ("heads", "tensor"), ("mlp", "tensor")) + _COMMON,
    "fsdp_tp": (("vocab", "tensor"), ("embed", "fsdp"), ("q_heads", "tensor"), ("kv_heads", "tensor"),
                ("heads", "tensor"), ("mlp", "tensor")) + _COMMON,
}
Strategy = Literal["dp", "fsdp", "tp", "fsdp_tp"]  # the names of RULES, as a config field's type
choices.same(RULES, Strategy)


# ---------------------------------------------------------------------------------------------- mesh

def mesh_sizes(spec: str | None, n: int | None) -> dict[str, int]:
  """Axis sizes of a mesh spec (see `make_mesh`) over `n` devices; with `n=None` only the syntax is checked
  (so configs can validate a spec before JAX has started; the axis taking the remaining devices is then 1)."""
  sizes = dict.fromkeys(MESH_AXES, 1)
  if spec is None or not spec.strip():
    sizes["data"] = 1 if n is None else n
  else:
    seen, rest = set(), None
    for part in (p.strip() for p in spec.split(",")):
      if not part:
        continue
      name, _, size = (s.strip() for s in part.partition(":"))
      if name not in MESH_AXES:
        raise ValueError(f"mesh spec {spec!r}: unknown axis {name!r}, expected one of {MESH_AXES}")
      if name in seen:
        raise ValueError(f"mesh spec {spec!r}: axis {name!r} given twice")
      seen.add(name)
      try:
        value = int(size) if size else -1
      except ValueError:
        raise ValueError(f"mesh spec {spec!r}: size of {name!r} must be an integer, found {size!r}") from None
      if value == -1:
        if rest is not None:
          raise ValueError(f"mesh spec {spec!r}: only one axis may take the remaining devices (-1)")
        rest = name
      elif value < 1:
        raise ValueError(f"mesh spec {spec!r}: size of {name!r} must be >= 1 or -1, found {value}")
      else:
        sizes[name] = value
    known = math.prod(sizes.values())
    if n is None:
      return sizes
    if rest is not None:
      if n % known:
        raise ValueError(f"mesh spec {spec!r}: {n} devices are not divisible by the fixed sizes ({known})")
      sizes[rest] = n // known
    if math.prod(sizes.values()) != n:
      raise ValueError(f"mesh spec {spec!r} asks for {math.prod(sizes.values())} devices ({sizes}), "
                       f"found {n} devices")
  return sizes


def make_mesh(spec: str | None = None, devices=None) -> jax.sharding.Mesh:
  """A mesh with axes ("data", "fsdp", "tensor"), every axis present (size 1 where not asked for).

  Args:
    spec: "data:2,fsdp:2,tensor:2"; one size may be -1 (or omitted: "fsdp") for "all remaining devices".
      The sizes must multiply to the device count. None puts every device on "data".
    devices: devices to use (default: all global devices, `jax.devices()`).
  """
  devices = list(jax.devices() if devices is None else devices)
  sizes = mesh_sizes(spec, len(devices))
  shape = tuple(sizes[a] for a in MESH_AXES)
  axis_types = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
  try:
    return jax.make_mesh(shape, MESH_AXES, axis_types, devices=devices)
  except (ValueError, NotImplementedError, AssertionError) as e:  # shapes the physical topology cannot tile
    log.warning("mesh %s does not tile the device topology (%s); using devices in order", sizes, e)
    return jax.sharding.Mesh(np.asarray(devices, dtype=object).reshape(shape), MESH_AXES,
                             axis_types=axis_types)


# --------------------------------------------------------------------------------------------- rules

@functools.lru_cache(maxsize=64)
def _rule_table(rules: tuple) -> dict[str, tuple[str, ...]]:
  table: dict[str, tuple[str, ...]] = {}
  for entry in rules:
    if len(entry) != 2 or not isinstance(entry[0], str):
      raise ValueError(f"a rule is (logical name, mesh axis | tuple of mesh axes | None), found {entry!r}")
    name, target = entry
    target = () if target is None else (target,) if isinstance(target, str) else tuple(target)
    if name in table and table[name] != target:
      raise ValueError(f"conflicting sharding rules for logical axis {name!r}: {table[name] or None} and "
                       f"{target or None}")
    if len(set(target)) != len(target):
      raise ValueError(f"sharding rule for {name!r} repeats a mesh axis: {target}")
    table[name] = target
  return table


def _as_rules(rules) -> tuple:
  if isinstance(rules, str):
    if rules not in RULES:
      raise ValueError(f"unknown sharding strategy {rules!r}, expected one of {sorted(RULES)}")
    return RULES[rules]
  return tuple(tuple(tuple(x) if isinstance(x, list) else x for x in rule) for rule in rules)


def logical_to_spec(names, rules, *, shape=None, mesh=None, path: str | None = None) -> P:
  """The PartitionSpec of an array whose dims have logical `names`.

  Args:
    names: one logical name per dim.
    rules: a rule table (tuple of (logical name, mesh axes)) or a strategy name in RULES.
    shape: the array's shape; with `mesh`, dims not divisible by their mesh axes fall back as described
      in the module docstring.
    mesh: the mesh the spec is for (checks the rule's axes exist and sizes divide).
    path: the parameter's path, named in errors.
  """
  table = _rule_table(_as_rules(rules))
  where = f" (parameter {path!r})" if path else ""
  mesh_axes = tuple(mesh.axis_names) if mesh is not None else MESH_AXES
  targets = []
  for name in names:
    if name not in table:
      raise KeyError(f"no sharding rule for logical axis {name!r}{where}; rules cover {sorted(table)}")
    for ax in table[name]:
      if ax not in mesh_axes:
        raise ValueError(f"rule {name!r} -> {ax!r}{where}: mesh has axes {mesh_axes}")
    targets.append(table[name])
  used = [ax for t in targets for ax in t]
  for ax in set(used):
    if used.count(ax) > 1:
      clash = [n for n, t in zip(names, targets) if ax in t]
      raise ValueError(f"conflicting sharding rules{where}: dims {clash} all map to mesh axis {ax!r}")
  entries = []
  for i, target in enumerate(targets):
    if shape is not None and mesh is not None:
      k = len(target)
      while k and shape[i] % math.prod(mesh.shape[a] for a in target[:k]):
        k -= 1
      target = target[:k]
    entries.append(None if not target else target[0] if len(target) == 1 else target)
  return P(*entries)


def _map_params(fn, params, rules, mesh, axes, what):
  axes_lib.require(axes, what)
  def one(p, x):
    shape = tuple(x.shape) if hasattr(x, "shape") else np.shape(x)
    if not shape:
      return fn(P())
    path = axes_lib.path_str(p)
    names = axes.lookup(path, len(shape)).names
    return fn(logical_to_spec(names, rules, shape=shape, mesh=mesh, path=path))
  return jax.tree_util.tree_map_with_path(one, params)


def param_specs(params, rules, mesh=None, *, axes: axes_lib.Rules):
  """Tree of PartitionSpecs for a param tree (arrays or ShapeDtypeStructs).

  Args:
    params: the param tree.
    rules: a rule table or a strategy name in RULES.
    mesh: when given, non-divisible dims fall back to fewer mesh axes (module docstring).
    axes: the logical axis rules of the params (`jaxlab.nn.axes.Rules`, e.g. `tfm.AXES`).
  """
  return _map_params(lambda s: s, params, rules, mesh, axes, "param_specs")


def param_shardings(params_or_shapes, mesh, rules, *, axes: axes_lib.Rules):
  """Tree of NamedShardings on `mesh` for a param tree (arrays or ShapeDtypeStructs) with axis rules `axes`."""
  return _map_params(lambda s: NamedSharding(mesh, s), params_or_shapes, rules, mesh, axes, "param_shardings")


def shard_params(params, mesh, rules, *, axes: axes_lib.Rules):
  """`params` placed on `mesh` by `rules` (every process passes the same full values); `axes` names their dims."""
  return jax.device_put(params, param_shardings(params, mesh, rules, axes=axes))


def _split_static(args):
  def is_array(x):
    return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct))
  dynamic = [bool(leaves) and all(map(is_array, leaves)) for leaves in map(jax.tree.leaves, args)]
  def call(fn, dyn):
    it = iter(dyn)
    return fn(*(next(it) if d else a for a, d in zip(args, dynamic)))
  return [a for a, d in zip(args, dynamic) if d], call


def sharded_shapes(init_fn, mesh, rules, *args, axes: axes_lib.Rules):
  """ShapeDtypeStructs (with their shardings) of `init_fn(*args)`: an abstract target for restoring."""
  dyn, call = _split_static(args)
  shapes = jax.eval_shape(lambda *d: call(init_fn, d), *dyn)
  shardings = param_shardings(shapes, mesh, rules, axes=axes)
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


def sharded_init(init_fn, mesh, rules, *args, axes: axes_lib.Rules):
  """`init_fn(*args)` computed directly into its sharded layout (never materialized on one device).

  Args:
    init_fn: returns a param tree; args that are not arrays (configs) are passed through as constants.
    mesh: the device mesh.
    rules: a rule table or a strategy name in RULES.
    *args: arguments of `init_fn`, e.g. (cfg, key).
    axes: the logical axis rules of the params (e.g. `tfm.AXES`).
  """
  dyn, call = _split_static(args)
  shapes = jax.eval_shape(lambda *d: call(init_fn, d), *dyn)
  shardings = param_shardings(shapes, mesh, rules, axes=axes)
  return jax.jit(lambda *d: call(init_fn, d), out_shardings=shardings)(*dyn)


# --------------------------------------------------------------------------------------------- batch

def batch_sharding(mesh) -> NamedSharding:
  """Leading (batch) dim over ("data", "fsdp"), every other dim replicated."""
  return NamedSharding(mesh, P(BATCH_AXES))


def rows_sharding(mesh, shape) -> NamedSharding:
  """The sharding of an array of `shape`: its leading (row) dim over the batch axes when they divide it, else
  replicated (a pass over fewer rows than batch shards runs each row on every chip of its group)."""
  n = math.prod(mesh.shape[a] for a in BATCH_AXES)
  return NamedSharding(mesh, P(BATCH_AXES) if shape and shape[0] % n == 0 else P())


def shard_rows(tree, mesh):
  """Host arrays placed on `mesh` by `rows_sharding` (single process); unchanged without a mesh."""
  if mesh is None:
    return tree
  return jax.tree.map(lambda x: jax.device_put(x, rows_sharding(mesh, np.shape(x))), tree)


def abstract_rows(shapes: dict, mesh) -> dict:
  """name -> (shape, dtype) as the ShapeDtypeStructs `shard_rows` gives such arrays on `mesh`."""
  return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=rows_sharding(mesh, shape)) for k, (shape, dtype) in
          shapes.items()}


def shard_batch(batch, mesh):
  """A tree of process-local host arrays -> global arrays, batch dim over ("data", "fsdp").

  Each process passes its own rows (the global batch is the concatenation over processes in process
  order); in a single process this is the whole batch. Scalars are replicated.
  """
  sharding = batch_sharding(mesh)
  n_shards = math.prod(mesh.shape[a] for a in BATCH_AXES)

  def one(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:  # already a global array
      return jax.device_put(x, sharding if x.ndim else NamedSharding(mesh, P()))
    x = np.asarray(x)
    if x.ndim == 0:
      return jax.device_put(x, NamedSharding(mesh, P()))
    global_b = x.shape[0] * jax.process_count()
    if global_b % n_shards:
      raise ValueError(f"global batch {global_b} is not divisible by data*fsdp = {n_shards} "
                       f"(mesh {dict(mesh.shape)})")
    return jax.make_array_from_process_local_data(sharding, x)
  return jax.tree.map(one, batch)


def process_rows(batch):
  """This process's rows of a global host batch, the part `shard_batch` expects from it.

  Every process holds the whole batch; process i keeps the i-th of `process_count` equal contiguous slices. In a
  single process this is the batch unchanged. Scalars are kept whole.
  """
  n, i = jax.process_count(), jax.process_index()
  if n == 1:
    return batch

  def one(x):
    x = np.asarray(x)
    if x.ndim == 0:
      return x
    if x.shape[0] % n:
      raise ValueError(f"a batch of {x.shape[0]} rows does not split into equal parts over {n} processes")
    k = x.shape[0] // n
    return x[i * k:(i + 1) * k]
  return jax.tree.map(one, batch)


def to_numpy(x) -> np.ndarray:
  """The whole value of `x` as a NumPy array on every process (all-gathered when it spans several)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(x)


# --------------------------------------------------------------------------------------- multi-process

_TPU_ENV = ("TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES", "CLOUD_TPU_TASK_ID", "TPU_WORKER_ID",
            "MEGASCALE_COORDINATOR_ADDRESS")


def _first_slurm_host(nodelist: str) -> str:
  """First host of a SLURM host list: 'gpu[003-004,9],cpu1' -> 'gpu003'."""
  depth, end = 0, len(nodelist)
  for i, ch in enumerate(nodelist):
    depth += (ch == "[") - (ch == "]")
    if ch == "," and depth == 0:
      end = i
      break
  return re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[,-]", m.group(1))[0], nodelist[:end])


def initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None, *, local_device_ids=None,
                           timeout_s: int = 300) -> tuple[int, int]:
  """Starts multi-process JAX (call before any other JAX use); returns (process id, process count).

  Sources, first match wins: the arguments; env JAXLAB_COORDINATOR ("host:port"), JAXLAB_NUM_PROCESSES,
  JAXLAB_PROCESS_ID (e.g. several CPU processes on one machine; CPU collectives use gloo); SLURM
  (SLURM_NTASKS, SLURM_PROCID, coordinator = JAXLAB_COORDINATOR or the first host of SLURM_STEP_NODELIST
  on port JAXLAB_COORDINATOR_PORT or one derived from SLURM_JOB_ID); Cloud TPU env vars (jax auto-detects
  everything). A single process is a no-op; a second call returns the first call's result.

  Args:
    coordinator_address: "host:port" of process 0's coordination service.
    num_processes: total number of processes.
    process_id: this process's index in [0, num_processes).
    local_device_ids: restricts this process to these local devices (e.g. one GPU per process).
    timeout_s: how long to wait for all processes to connect.
  """
  if jax.distributed.is_initialized():
    return jax.process_index(), jax.process_count()
  env = os.environ
  coordinator = coordinator_address or env.get("JAXLAB_COORDINATOR")
  if num_processes is None and env.get("JAXLAB_NUM_PROCESSES"):
    num_processes = int(env["JAXLAB_NUM_PROCESSES"])
  if process_id is None and env.get("JAXLAB_PROCESS_ID"):
    process_id = int(env["JAXLAB_PROCESS_ID"])
  if num_processes is None and "SLURM_NTASKS" in env and "SLURM_PROCID" in env:
    num_processes, process_id = int(env["SLURM_NTASKS"]), int(env["SLURM_PROCID"])
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if coordinator is None and nodelist and num_processes > 1:
      port = env.get("JAXLAB_COORDINATOR_PORT") or str(int(env.get("SLURM_JOB_ID", "0")) % 4096 + 61440)
      coordinator = f"{_first_slurm_host(nodelist)}:{port}"
  if num_processes is None and any(v in env for v in _TPU_ENV):
    hosts = env.get("TPU_WORKER_HOSTNAMES") or env.get("TPU_PROCESS_ADDRESSES") or ""
    if "," not in hosts and hosts:
      return 0, 1
    jax.distributed.initialize(initialization_timeout=timeout_s)
    return jax.process_index(), jax.process_count()
  if num_processes is None or num_processes == 1:
    return 0, 1
  if coordinator is None or process_id is None:
    raise ValueError(f"{num_processes} processes need a coordinator address and a process id, found "
                     f"coordinator={coordinator!r}, process_id={process_id!r} (set JAXLAB_COORDINATOR and "
                     "JAXLAB_PROCESS_ID)")
  if not 0 <= process_id < num_processes:
    raise ValueError(f"process id must be in [0, {num_processes}), found {process_id}")
  try:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  except AttributeError:  # a jax without the option (CPU collectives built in)
    pass
  jax.distributed.initialize(coordinator, num_processes, process_id, local_device_ids=local_device_ids,
                             initialization_timeout=timeout_s)
  return process_id, num_processes
