"""A `flax.nnx` view of any jaxlab model, so Flax code (`nnx.Optimizer`, `nnx.jit`, `nnx.split`) can train it.

`Model` is an `nnx.Module` that holds a jaxlab param dict as it is: the same nested dict, each array wrapped in
an `nnx.Param` (no copy, no other layout), and whose `__call__` runs the model's own `forward` on those arrays.
It is generic over an (init, forward, cfg) triple following the jaxlab convention `init(cfg, key)`,
`forward(params, x, cfg, **kw)` (`jaxlab.models.transformer`, `encoder`, `vit`); `decoder` is the shortcut for
the transformer LM. `to_params` goes back to the plain param dict, e.g. for `jaxlab.hf.save` or
`jaxlab.generate.sample`; `from_params` wraps existing params, e.g. from `jaxlab.hf.load`.

Sharding: a model built with its family's axis rules (`axes=tfm.AXES`; `decoder` passes them) gives every
`nnx.Param` whose path they cover its logical axes (`jaxlab.nn.axes`) as `out_sharding` metadata (e.g.
("layers", "embed", "q_heads")), created with `eager_sharding=False` so no mesh is needed to build the module;
optimizer states built by `nnx.Optimizer` inherit the names. Two ways to place a model on a mesh:
  - jaxlab's rules (the same placement as jaxlab's train state, non-divisible dims falling back as
    `jaxlab.sharding` describes): `shard(model, mesh, "fsdp")`, or build sharded params first with
    `jaxlab.sharding.sharded_init(tfm.init, mesh, "fsdp", cfg, key, axes=tfm.AXES)` and wrap them with
    `from_params`.
  - Flax's own: `with flax.linen.logical_axis_rules(jaxlab.sharding.RULES["fsdp"]):
    specs = nnx.get_partition_spec(nnx.state(model))` maps the names to mesh axes (no divisibility fallback).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
from flax import nnx

from jaxlab import sharding as shd
from jaxlab.models import transformer as tfm
from jaxlab.nn import axes as axes_lib


def _is_var(x) -> bool:
  return isinstance(x, nnx.Variable)


def _wrap(path, x, axes: axes_lib.Rules | None) -> nnx.Param:
  if axes is None:
    return nnx.Param(x)
  try:
    names = axes.lookup(axes_lib.path_str(path), x.ndim).names
  except KeyError:  # a param the rules do not cover: a plain Param, no sharding metadata
    return nnx.Param(x)
  return nnx.Param(x, out_sharding=names, eager_sharding=False)


class Model(nnx.Module):
  """A jaxlab model as an `nnx.Module`: `params` is the jaxlab param dict with `nnx.Param` leaves.

  Calling it runs `forward(params, x, cfg, *args, **kw)` on the current param values, so it returns
  whatever the jaxlab forward returns (a transformer's `Output`, with `.logits`).

  Args:
    params: a jaxlab param dict (arrays; they are wrapped, not copied).
    forward: the model's `forward(params, x, cfg, ...)`.
    cfg: the model's (frozen, hashable) config; kept static in the module's graph definition.
    axes: the params' logical axis rules (e.g. `tfm.AXES`): they name each Param's dims and let `shard` place
      them; None for plain Params.
  """

  def __init__(self, params, forward: Callable, cfg: Any, axes: axes_lib.Rules | None = None):
    if not isinstance(params, dict):
      raise TypeError(f"params must be a jaxlab param dict, found {type(params).__name__}")
    bad = [l for l in jax.tree.leaves(params, is_leaf=_is_var) if _is_var(l) or not hasattr(l, "ndim")]
    if bad:
      raise TypeError(f"params must hold arrays only, found a leaf of type {type(bad[0]).__name__}")
    self.params = nnx.data(jax.tree_util.tree_map_with_path(lambda p, x: _wrap(p, x, axes), params))
    self.forward_fn = forward
    self.cfg = cfg
    self.axes = axes

  def __call__(self, x, *args, **kw):
    return self.forward_fn(to_params(self), x, self.cfg, *args, **kw)


def from_params(params, forward: Callable, cfg: Any, axes: axes_lib.Rules | None = None) -> Model:
  """A `Model` around existing params (e.g. `cfg, params = jaxlab.hf.load(path)`), `axes` as in `Model`.

  The model shares the arrays with `params`: do not also pass them to a step that donates its input (jaxlab's
  `jit_train_step`), which would delete the model's buffers.
  """
  return Model(params, forward, cfg, axes)


def create(init: Callable, forward: Callable, cfg: Any, key, axes: axes_lib.Rules | None = None) -> Model:
  """A `Model` with fresh params `init(cfg, key)`.

  Args:
    init: the model's `init(cfg, key)`.
    forward: the model's `forward(params, x, cfg, ...)`.
    cfg: the model config.
    key: a PRNG key.
    axes: the model family's axis rules (e.g. `tfm.AXES`), as in `Model`.
  """
  return Model(init(cfg, key), forward, cfg, axes)


def decoder(cfg: tfm.Config, key=None, *, params=None) -> Model:
  """The transformer LM (`jaxlab.models.transformer`) as a `Model`: fresh params from `key`, or `params`.

  Args:
    cfg: the transformer config.
    key: PRNG key for `tfm.init`; ignored when `params` is given.
    params: existing transformer params (e.g. from `jaxlab.hf.load`).
  """
  if params is None:
    if key is None:
      raise ValueError("decoder needs a key (fresh params) or params (existing ones)")
    params = tfm.init(cfg, key)
  return Model(params, tfm.forward, cfg, tfm.AXES)


def to_params(model):
  """The plain jaxlab param dict of a `Model`, or of its `nnx.State` (`nnx.split(model)[1]`, `nnx.state(model)`).

  The leaves are the arrays the model holds now, not copies (after an `nnx.jit` call or an optimizer update,
  the buffers that transform wrote back).
  """
  if isinstance(model, Model):
    return jax.tree.map(lambda v: v.get_value(), model.params, is_leaf=_is_var)
  if isinstance(model, nnx.State):
    tree = nnx.to_pure_dict(model)
    if set(tree) != {"params"}:
      raise ValueError(f"expected the state of a nnx_bridge.Model (one key 'params'), found keys {sorted(tree)}")
    return tree["params"]
  raise TypeError(f"expected a nnx_bridge.Model or its nnx.State, found {type(model).__name__}")


def shard(model: Model, mesh, rules) -> Model:
  """Places `model`'s params on `mesh` in place (and returns it), by jaxlab's logical-axis `rules`.

  Args:
    model: the model (built with its axis rules); build its optimizer after sharding so the optimizer state
      follows.
    mesh: a mesh from `jaxlab.sharding.make_mesh`.
    rules: a strategy name in `jaxlab.sharding.RULES` or a rule table.
  """
  placed = shd.shard_params(to_params(model), mesh, rules, axes=axes_lib.require(model.axes, "nnx_bridge.shard"))
  jax.tree.map(lambda v, x: v.set_value(x), model.params, placed, is_leaf=_is_var)
  return model
