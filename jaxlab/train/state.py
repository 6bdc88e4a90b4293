"""Train state: params, optimizer state, step and PRNG key as one pytree, built directly in a sharded layout.

Following the GSPMD recipe (arXiv 2105.04663): shapes come from `jax.eval_shape`, shardings from the logical
rules of `jaxlab.sharding`, and params and optimizer state are created by jitted functions whose outputs are
already sharded, so no device ever holds the full state. Optimizer-state leaves that mirror a parameter (Adam
moments) take that parameter's sharding; scalars, counters and unknown leaves are replicated. The key is a raw
uint32[2] PRNG key so every checkpoint format can store it.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab import sharding as shd
from jaxlab.nn import axes as axes_lib


class TrainState(NamedTuple):
  params: Any
  opt_state: Any
  step: Any  # int32 scalar: number of optimizer updates applied
  rng: Any  # uint32[2] raw PRNG key, advanced every step


def create(params, tx: optax.GradientTransformation, seed: int = 0) -> TrainState:
  """An unsharded train state at step 0 (for tests and single-device runs)."""
  return TrainState(params, tx.init(params), jnp.zeros((), jnp.int32), jax.random.PRNGKey(seed))


def _leaf_spec(path, x, rules, mesh, axes) -> P:
  shape = tuple(x.shape)
  if not shape:
    return P()
  name = axes_lib.path_str(path)
  try:
    names = axes.lookup(name, len(shape)).names
  except (KeyError, ValueError):
    return P()
  return shd.logical_to_spec(names, rules, shape=shape, mesh=mesh, path=name)


def tree_shardings(tree, mesh, rules, *, axes: axes_lib.Rules):
  """NamedShardings for any tree whose leaves sit under parameter paths (named by the axis rules `axes`); other
  leaves are replicated."""
  axes_lib.require(axes, "tree_shardings")
  return jax.tree_util.tree_map_with_path(lambda p, x: NamedSharding(mesh, _leaf_spec(p, x, rules, mesh, axes)),
                                          tree)


def state_shardings(state: TrainState, mesh, rules, *, axes: axes_lib.Rules) -> TrainState:
  """Shardings of a TrainState (of arrays or ShapeDtypeStructs): params by the rules and the params' axis rules
  `axes`, opt state likewise."""
  rep = NamedSharding(mesh, P())
  return TrainState(shd.param_shardings(state.params, mesh, rules, axes=axes),
                    tree_shardings(state.opt_state, mesh, rules, axes=axes), rep, rep)


def abstract_state(init_params: Callable[[Any], Any], tx: optax.GradientTransformation, mesh=None,
                   rules="dp", *, axes: axes_lib.Rules | None = None) -> TrainState:
  """ShapeDtypeStructs of the state (with shardings when `mesh` is given, by the params' axis rules `axes`): a
  target for restoring."""
  def build(key):
    return create(init_params(key), tx)
  shapes = jax.eval_shape(build, jax.random.PRNGKey(0))
  if mesh is None:
    return shapes
  shardings = state_shardings(shapes, mesh, rules, axes=axes_lib.require(axes, "abstract_state on a mesh"))
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


def init_state(init_params: Callable[[Any], Any], tx: optax.GradientTransformation, seed: int = 0, mesh=None,
               rules="dp", *, axes: axes_lib.Rules | None = None) -> TrainState:
  """A fresh train state; on a mesh every leaf is created in its sharded layout.

  Args:
    init_params: key -> param tree (e.g. `lambda k: tfm.init(cfg, k)`).
    tx: the optimizer.
    seed: seeds the params (key `PRNGKey(seed)`) and the state's rng stream (a different fold).
    mesh: a device mesh from `jaxlab.sharding.make_mesh`; None places everything on the default device.
    rules: a sharding strategy name (`jaxlab.sharding.RULES`) or rule table.
    axes: the params' logical axis rules (e.g. `tfm.AXES`); needed with `mesh`.
  """
  pkey = jax.random.PRNGKey(seed)
  if mesh is None:
    params = jax.jit(init_params)(pkey)
  else:
    params = shd.sharded_init(init_params, mesh, rules, pkey, axes=axes_lib.require(axes, "init_state on a mesh"))
  return state_from_params(params, tx, seed, mesh, rules, axes=axes)


def state_from_params(params, tx: optax.GradientTransformation, seed: int = 0, mesh=None,
                      rules="dp", *, axes: axes_lib.Rules | None = None) -> TrainState:
  """A fresh train state around already initialized (and, on a mesh, already sharded) `params`: step 0, the
  optimizer's initial state in its sharded layout (by the params' axis rules `axes`, needed with `mesh`), and
  the rng stream `init_state` gives for `seed`."""
  rkey = jax.random.fold_in(jax.random.PRNGKey(seed), 1)
  if mesh is None:
    return TrainState(params, jax.jit(tx.init)(params), jnp.zeros((), jnp.int32), rkey)
  axes_lib.require(axes, "state_from_params on a mesh")
  opt_shapes = jax.eval_shape(tx.init, params)
  opt_state = jax.jit(tx.init, out_shardings=tree_shardings(opt_shapes, mesh, rules, axes=axes))(params)
  rep = NamedSharding(mesh, P())
  step = jax.device_put(jnp.zeros((), jnp.int32), rep)
  return TrainState(params, opt_state, step, jax.device_put(rkey, rep))


def place(state: TrainState, mesh, rules, *, axes: axes_lib.Rules) -> TrainState:
  """An existing (host or differently sharded) state moved onto `mesh` by `rules` and the params' axis rules."""
  return jax.device_put(state, state_shardings(state, mesh, rules, axes=axes))


def as_train_state(tree) -> TrainState:
  """A TrainState from a restored checkpoint tree (a TrainState, or the dict orbax returns without a target)."""
  if isinstance(tree, TrainState):
    return tree
  if isinstance(tree, dict) and set(tree) == set(TrainState._fields):
    return TrainState(**tree)
  if isinstance(tree, (tuple, list)) and len(tree) == len(TrainState._fields):
    return TrainState(*tree)
  raise TypeError(f"expected a train state with fields {TrainState._fields}, found {type(tree).__name__}")


def to_host(tree):
  """A tree of NumPy arrays (fully replicated or addressable values)."""
  return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)
