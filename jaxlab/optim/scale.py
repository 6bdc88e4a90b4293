"""SCALE: Stochastic Column-normAlized Last-layer momEntum (Glentis et al., arXiv 2506.16659).

SGD on column-normalized gradients, momentum only on the last layer, AdamW on vectors:
- matrices: u = g / max(rms(g over the fan-in axis), 1e-8), i.e. every output unit's incoming gradient divided by
  its RMS; for the token embedding [V, D] the fan-in axis is "vocab" (one scale per hidden unit). No state.
  Stacked layers [L, ...] are normalized per layer (the "layers" axes are never reduced over).
- last layer (default: the untied `lm_head/kernel`): EMA momentum m <- beta m + (1 - beta) g, then the same
  normalization of m. With tied embeddings there is no lm_head; the table `embed/embedding` is then the last
  layer and gets the momentum, keeping the embedding's normalization axis ("vocab"). (The reference code groups a
  tied table with the other matrices, i.e. no momentum; pass `last_layer=lambda path: False` for that.)
- vectors (one dim after removing stacked "layers" axes: norm gains, biases): AdamW at adam_lr, following the
  learning-rate schedule: adam_lr_t = lr_t * adam_lr / peak_lr. The reference's Adam form is kept:
  sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps).
- decoupled weight decay p <- p (1 - lr wd) - lr u on every group (with the group's learning rate).

Matrix vs vector and the fan-in axis come from the params' logical axis rules (`axes=tfm.AXES`, see
`jaxlab.nn.axes`), so any param tree whose paths the rules cover works. The bottom-up rungs of the paper's study
are the variants `sgd` (raw gradient on matrices), `sgd_colnorm` (normalized, no momentum), `colnorm_momentum`
(momentum on every matrix) and `scale`; all keep AdamW on vectors so they differ only in how matrices are
treated.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxlab.nn import axes as axes_lib

ScalarOrSchedule = optax.ScalarOrSchedule
LAST_LAYER_PATTERNS = (r"(^|.*/)lm_head/kernel$", r"(^|.*/)embed/embedding$")  # in order of preference


@dataclasses.dataclass(frozen=True)
class ParamInfo:
  """How an optimizer sees one parameter: `core` are the logical names after the leading "layers" axes."""
  path: str
  names: tuple[str, ...]
  fan_in: int | None  # absolute axis index
  n_layers: int

  @property
  def core(self) -> tuple[str, ...]:
    return self.names[self.n_layers:]

  @property
  def is_matrix(self) -> bool:
    return len(self.core) >= 2


def param_info(params, axes: axes_lib.Rules):
  """Tree of `ParamInfo` shaped like `params`, from their logical axis rules `axes`; matrices need a fan-in axis."""
  axes_lib.require(axes, "param_info")
  def one(p, x):
    path = axes_lib.path_str(p)
    ax = axes.lookup(path, x.ndim)
    n_layers = 0
    while n_layers < len(ax.names) and ax.names[n_layers] == axes_lib.LAYERS:
      n_layers += 1
    fan_in = None if ax.fan_in is None else ax.names.index(ax.fan_in)
    info = ParamInfo(path, ax.names, fan_in, n_layers)
    if info.is_matrix and fan_in is None:
      raise ValueError(f"matrix parameter {path!r} (axes {ax.names}) has no fan-in axis; give its axis rule one "
                       "(the third entry of a jaxlab.nn.axes.rules spec)")
    return info
  return jax.tree_util.tree_map_with_path(one, params)


def _is_info(x) -> bool:
  return isinstance(x, ParamInfo)


def label_tree(params, fn: Callable[[ParamInfo], str], axes: axes_lib.Rules):
  """Tree of string labels (for `optax.partition`), computed from each leaf's `ParamInfo`."""
  return jax.tree.map(fn, param_info(params, axes), is_leaf=_is_info)


def adam_learning_rate(learning_rate: ScalarOrSchedule, adam_lr, peak_lr) -> ScalarOrSchedule:
  """lr_t * adam_lr / peak_lr (peak_lr defaults to a numeric learning_rate; required with a schedule)."""
  if adam_lr is None:
    return learning_rate
  if callable(learning_rate):
    if peak_lr is None:
      raise ValueError("learning_rate is a schedule: pass peak_lr= (its maximum) so that adam_lr follows the "
                       "same schedule as lr_t * adam_lr / peak_lr")
    return lambda count: learning_rate(count) * (adam_lr / peak_lr)
  return learning_rate * (adam_lr / (learning_rate if peak_lr is None else peak_lr))


class AdamRefState(NamedTuple):
  count: jax.Array
  mu: optax.Updates
  nu: optax.Updates


def scale_by_adam_ref(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> optax.GradientTransformation:
  """Adam direction as the PyTorch reference optimizers write it: sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps)."""
  def init_fn(params):
    zeros = lambda p: jnp.zeros_like(p)
    return AdamRefState(jnp.zeros([], jnp.int32), jax.tree.map(zeros, params), jax.tree.map(zeros, params))

  def update_fn(updates, state, params=None):
    del params
    count = optax.safe_increment(state.count)
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state.nu, updates)
    t = count.astype(jnp.float32)
    step = jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    out = jax.tree.map(lambda m, v: (step * m / (jnp.sqrt(v) + eps)).astype(m.dtype), mu, nu)
    return out, AdamRefState(count, mu, nu)

  return optax.GradientTransformation(init_fn, update_fn)


def column_normalize(g, fan_in: int, eps: float = 1e-8):
  """g divided by its RMS over the fan-in axis (one scale per output unit), computed in fp32."""
  g32 = g.astype(jnp.float32)
  rms = jnp.sqrt(jnp.mean(jnp.square(g32), axis=fan_in, keepdims=True))
  return (g32 / jnp.maximum(rms, eps)).astype(g.dtype)


def scale_by_column_norm(eps: float = 1e-8, *, axes: axes_lib.Rules) -> optax.GradientTransformation:
  """Stateless per-output-unit RMS normalization of every (matrix) leaf over its fan-in axis (from `axes`)."""
  def update_fn(updates, state, params=None):
    del params
    infos = param_info(updates, axes)
    return jax.tree.map(lambda g, i: column_normalize(g, i.fan_in, eps), updates, infos), state
  return optax.GradientTransformation(optax.init_empty_state, update_fn)


def _last_layer_paths(params, last_layer) -> set[str]:
  paths = [axes_lib.path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  if last_layer is not None:
    return {p for p in paths if last_layer(p)}
  for pattern in LAST_LAYER_PATTERNS:
    found = {p for p in paths if re.match(pattern, p)}
    if found:
      return found
  return set()


def _column_family(learning_rate, *, normalize: bool, momentum_on: str, adam_lr, peak_lr, momentum,
                   weight_decay, b1, b2, eps, last_layer, axes) -> optax.GradientTransformation:
  axes_lib.require(axes, "the SCALE optimizer family")

  def labels(params):
    last = _last_layer_paths(params, last_layer) if momentum_on == "last" else set()
    def one(info: ParamInfo) -> str:
      if not info.is_matrix:
        return "vector"
      if momentum_on == "all" or info.path in last:
        return "momentum"
      return "matrix"
    return label_tree(params, one, axes)

  norm = [scale_by_column_norm(axes=axes)] if normalize else []
  tail = [optax.add_decayed_weights(weight_decay), optax.scale_by_learning_rate(learning_rate)]
  transforms = {
      "matrix": optax.chain(*norm, *tail),
      "vector": optax.chain(scale_by_adam_ref(b1, b2, eps), optax.add_decayed_weights(weight_decay),
                            optax.scale_by_learning_rate(adam_learning_rate(learning_rate, adam_lr, peak_lr))),
  }
  if momentum_on != "none":
    transforms["momentum"] = optax.chain(optax.ema(momentum, debias=False), *norm, *tail)
  return optax.partition(transforms, labels)


def scale(learning_rate: ScalarOrSchedule, *, axes: axes_lib.Rules, adam_lr: float | None = None,
          peak_lr: float | None = None, momentum: float = 0.9, weight_decay: float = 0.0, b1: float = 0.9,
          b2: float = 0.999, eps: float = 1e-8,
          last_layer: Callable[[str], bool] | None = None) -> optax.GradientTransformation:
  """SCALE: column-normalized SGD on matrices, EMA momentum on the last layer only, AdamW on vectors.

  Args:
    learning_rate: matrix learning rate, a float or an optax schedule.
    axes: the params' logical axis rules (e.g. `tfm.AXES`): which leaves are matrices, and their fan-in axes.
    adam_lr: peak learning rate of the AdamW on vectors (None: the same as learning_rate).
    peak_lr: the schedule's maximum, needed when learning_rate is a schedule and adam_lr is given
      (the vector learning rate is lr_t * adam_lr / peak_lr, as in the reference).
    momentum: EMA coefficient beta of the last-layer momentum.
    weight_decay: decoupled weight decay (p <- p (1 - lr wd)) for every group.
    b1, b2, eps: AdamW hyperparameters for vectors.
    last_layer: predicate on a '/'-joined param path choosing the momentum param(s); default: paths ending in
      `lm_head/kernel`, or `embed/embedding` when the tree has no lm_head (tied embeddings).
  """
  return _column_family(learning_rate, normalize=True, momentum_on="last", adam_lr=adam_lr, peak_lr=peak_lr,
                        momentum=momentum, weight_decay=weight_decay, b1=b1, b2=b2, eps=eps, last_layer=last_layer,
                        axes=axes)


def colnorm_momentum(learning_rate: ScalarOrSchedule, *, axes: axes_lib.Rules, adam_lr: float | None = None,
                     peak_lr: float | None = None, momentum: float = 0.9, weight_decay: float = 0.0,
                     b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> optax.GradientTransformation:
  """Column-normalized EMA momentum on every matrix, AdamW on vectors (Args as in `scale`)."""
  return _column_family(learning_rate, normalize=True, momentum_on="all", adam_lr=adam_lr, peak_lr=peak_lr,
                        momentum=momentum, weight_decay=weight_decay, b1=b1, b2=b2, eps=eps, last_layer=None,
                        axes=axes)


def sgd_colnorm(learning_rate: ScalarOrSchedule, *, axes: axes_lib.Rules, adam_lr: float | None = None,
                peak_lr: float | None = None, weight_decay: float = 0.0, b1: float = 0.9, b2: float = 0.999,
                eps: float = 1e-8) -> optax.GradientTransformation:
  """Column-normalized SGD without momentum on matrices, AdamW on vectors (Args as in `scale`)."""
  return _column_family(learning_rate, normalize=True, momentum_on="none", adam_lr=adam_lr, peak_lr=peak_lr,
                        momentum=0.0, weight_decay=weight_decay, b1=b1, b2=b2, eps=eps, last_layer=None,
                        axes=axes)


def sgd(learning_rate: ScalarOrSchedule, *, axes: axes_lib.Rules, adam_lr: float | None = None,
        peak_lr: float | None = None, weight_decay: float = 0.0, b1: float = 0.9, b2: float = 0.999,
        eps: float = 1e-8) -> optax.GradientTransformation:
  """Plain SGD on matrices, AdamW on vectors (Args as in `scale`)."""
  return _column_family(learning_rate, normalize=False, momentum_on="none", adam_lr=adam_lr, peak_lr=peak_lr,
                        momentum=0.0, weight_decay=weight_decay, b1=b1, b2=b2, eps=eps, last_layer=None,
                        axes=axes)
