"""APOLLO: SGD-like memory, AdamW-level performance (Zhu et al., arXiv 2412.05270), as an optax transform.

For each projected matrix gradient G (in the PyTorch [out, in] orientation):
- R = G P^T with a random Gaussian P [r, in] (entries N(0, 1/r)) when out >= in, else R = P^T G with P [out, r];
  P is redrawn every update_proj_gap steps (from `seed`, the leaf and the refresh index; only the seed is state).
- Adam moments on R give N = m / (sqrt(v) + eps); the channel-wise scaling factor is
  s = ||N||/(||R|| + 1e-8) over the compressed side (one factor per output row when out >= in, per input column
  otherwise); scale_type "tensor" (APOLLO-Mini) uses Frobenius norms, one factor per matrix.
- The update is G * s, passed through the norm-growth limiter of Fira (arXiv 2410.01623): from the second step
  on, if ||G s|| grows by more than `norm_growth_limit` (1.01) over the previous (limited) norm it is rescaled to
  that bound; then multiplied by sqrt(scale) and by the Adam bias correction sqrt(1 - b2^t)/(1 - b1^t).
- Weight decay after the step: p <- (p - lr d)(1 - lr wd); other params get the reference-form AdamW.
Defaults follow the reference README: rank 256, update_proj_gap 200, scale 1, channel (APOLLO-Mini: rank 1,
scale 128, tensor). Stacked layers [L, in, out] are projected, scaled and limited per layer.
"""
from __future__ import annotations

import functools
from typing import Callable, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxlab import choices
from jaxlab.optim.galore import choose_side, is_low_rank_target, project, step_then_decay, to_out_in, unzip
from jaxlab.nn.axes import Rules
from jaxlab.optim.scale import ParamInfo, ScalarOrSchedule, label_tree, param_info, scale_by_adam_ref

ScaleType = Literal["channel", "tensor"]
SCALE_TYPES = choices.values(ScaleType)


def random_projection(seed: int, leaf_index: int, refresh, shape, rank: int):
  """The Gaussian projection (entries N(0, 1/rank)) of one leaf for one refresh period."""
  key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), leaf_index), refresh)
  return jax.random.normal(key, shape, jnp.float32) / jnp.sqrt(jnp.float32(rank))


def _layout(shape, info: ParamInfo, rank: int):
  out, fin = shape[-2:][::-1] if info.fan_in == len(shape) - 2 else shape[-2:]
  side = choose_side(out, fin, "std")
  r = min(rank, out, fin)
  lead = tuple(shape[:-2])
  p = (*lead, r, fin) if side == "right" else (*lead, out, r)
  low = (*lead, out, r) if side == "right" else (*lead, r, fin)
  return side, r, p, low


class ApolloState(NamedTuple):
  count: jax.Array
  mu: optax.Updates
  nu: optax.Updates
  norm: optax.Updates  # previous limited update norm, one per matrix (per stacked layer)


def scale_by_apollo(rank: int = 256, update_proj_gap: int = 200, scale: float = 1.0,
                    scale_type: ScaleType = "channel", b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
                    norm_growth_limit: float | None = 1.01, seed: int = 0, *,
                    axes: Rules) -> optax.GradientTransformation:
  """The APOLLO direction (before the learning rate) for every leaf it sees (all must be 2-D + stacked); `axes`
  are the params' logical axis rules."""
  if scale_type not in SCALE_TYPES:
    raise ValueError(f"scale_type must be one of {SCALE_TYPES}, found {scale_type!r}")
  if rank < 1 or update_proj_gap < 1:
    raise ValueError(f"rank and update_proj_gap must be >= 1, found {rank} and {update_proj_gap}")

  def init_fn(params):
    infos = param_info(params, axes)
    low = lambda x, i: jnp.zeros(_layout(x.shape, i, rank)[3], x.dtype)
    mu = jax.tree.map(low, params, infos)
    norm = jax.tree.map(lambda x: jnp.zeros(x.shape[:-2], jnp.float32), params)
    return ApolloState(jnp.zeros([], jnp.int32), mu, jax.tree.map(jnp.zeros_like, mu), norm)

  def update_fn(updates, state, params=None):
    del params
    infos = param_info(updates, axes)
    count = optax.safe_increment(state.count)
    t = count.astype(jnp.float32)
    step = jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    leaves = jax.tree.leaves(updates)
    index = jax.tree.unflatten(jax.tree.structure(updates), range(len(leaves)))

    def one(g, m, v, prev, info, i):
      side, r, p_shape, _ = _layout(g.shape, info, rank)
      g_oi = to_out_in(g, info).astype(jnp.float32)
      proj = random_projection(seed, i, state.count // update_proj_gap, p_shape, r)
      low = project(g_oi, proj, side)
      m = b1 * m + (1 - b1) * low.astype(m.dtype)
      v = b2 * v + (1 - b2) * jnp.square(low).astype(v.dtype)
      n = m.astype(jnp.float32) / (jnp.sqrt(v.astype(jnp.float32)) + eps)
      if scale_type == "tensor":
        fro = functools.partial(jnp.linalg.norm, axis=(-2, -1), keepdims=True)
        factor = fro(n) / (fro(low) + 1e-8)
      else:
        axis = -1 if side == "right" else -2
        factor = (jnp.linalg.norm(n, axis=axis, keepdims=True)
                  / (jnp.linalg.norm(low, axis=axis, keepdims=True) + 1e-8))
      scaled = g_oi * factor
      norm = jnp.linalg.norm(scaled, axis=(-2, -1))
      if norm_growth_limit is not None:
        limiter = jnp.maximum(norm / (prev + 1e-8), norm_growth_limit) / norm_growth_limit
        limiter = jnp.where(state.count > 0, limiter, 1.0)
        scaled = scaled / limiter[..., None, None]
        norm = norm / limiter
      d = to_out_in(scaled * (jnp.sqrt(jnp.asarray(scale, jnp.float32)) * step), info)
      return d.astype(g.dtype), m, v, norm

    out = jax.tree.map(one, updates, state.mu, state.nu, state.norm, infos, index)
    d, m, v, norm = unzip(updates, out, 4)
    return d, ApolloState(count, m, v, norm)

  return optax.GradientTransformation(init_fn, update_fn)


def apollo(learning_rate: ScalarOrSchedule, *, axes: Rules, rank: int = 256, update_proj_gap: int = 200,
           scale: float = 1.0, scale_type: str = "channel", b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
           weight_decay: float = 0.0, norm_growth_limit: float | None = 1.01, seed: int = 0,
           project: Callable[[ParamInfo], bool] | None = None) -> optax.GradientTransformation:
  """APOLLO-AdamW over any param tree its axis rules cover.

  Args:
    learning_rate: a float or an optax schedule.
    axes: the params' logical axis rules (e.g. `tfm.AXES`): which leaves are matrices, and their fan-in axes.
    rank: rank r of the random projection (clipped to the matrix's smaller side).
    update_proj_gap: T, steps between redraws of the projection.
    scale: the update is multiplied by sqrt(scale) (reference semantics).
    scale_type: "channel" (APOLLO) or "tensor" (APOLLO-Mini).
    b1, b2, eps: Adam hyperparameters (reference form, eps added to sqrt(v)).
    weight_decay: applied after the step, p <- (p - lr d)(1 - lr wd).
    norm_growth_limit: gamma of the norm-growth limiter; None disables it.
    seed: seed of the random projections.
    project: predicate on `ParamInfo` choosing projected params (default: hidden matrices, no vocab axis).
  """
  project = project or is_low_rank_target
  labels = lambda params: label_tree(params, lambda i: "low_rank" if project(i) else "adam", axes)
  return optax.chain(
      optax.partition({"low_rank": scale_by_apollo(rank, update_proj_gap, scale, scale_type, b1, b2, eps,
                                                   norm_growth_limit, seed, axes=axes),
                       "adam": scale_by_adam_ref(b1, b2, eps)}, labels),
      step_then_decay(learning_rate, weight_decay))


def apollo_mini(learning_rate: ScalarOrSchedule, *, axes: Rules, **kw) -> optax.GradientTransformation:
  """APOLLO-Mini: rank 1, tensor-wise scaling, scale 128 (override any of them through kw)."""
  return apollo(learning_rate, axes=axes, **{"rank": 1, "scale_type": "tensor", "scale": 128.0, **kw})
