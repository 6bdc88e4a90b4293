"""GaLore: gradient low-rank projection (Zhao et al., arXiv 2403.03507), as an optax transform.

Each projected matrix gradient G (seen in the PyTorch [out, in] orientation) is projected to rank r, Adam runs in
the projected space, and the normalized step is projected back and multiplied by `scale` (alpha):
- proj_type "std": if out >= in, R = G Q^T with Q = Vh[:r] (the fan-in side is compressed, "right"), else
  R = Q^T G with Q = U[:, :r] ("left"); "right"/"left" force one side. Q comes from the SVD of the current
  gradient at steps t with t % update_proj_gap == 0 (t counted from 0); the Adam moments persist across refreshes.
  SVD signs are fixed so that each singular vector's largest-magnitude entry is positive.
- Adam in the reference form: sqrt(1 - b2^t)/(1 - b1^t) * m / (sqrt(v) + eps), eps 1e-6 (their default).
- Weight decay as the reference applies it, after the step: p <- (p - lr d)(1 - lr wd).
Projected by default: matrices with two dims besides the stacked "layers" axes and no "vocab" axis (the reference
targets the attention and MLP linears); embeddings, the LM head and vectors get the same Adam unprojected.
Stacked layers [L, in, out] are projected per layer. Defaults: rank 128, update_proj_gap 200, scale 0.25.
"""
from __future__ import annotations

from typing import Callable, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxlab import choices
from jaxlab.nn.axes import Rules
from jaxlab.optim.scale import ParamInfo, ScalarOrSchedule, label_tree, param_info, scale_by_adam_ref

ProjType = Literal["std", "left", "right"]
PROJ_TYPES = choices.values(ProjType)


def is_low_rank_target(info: ParamInfo) -> bool:
  """The default target of low-rank methods: hidden matrices (two core dims, no vocab axis)."""
  return len(info.core) == 2 and "vocab" not in info.core


def to_out_in(x, info: ParamInfo):
  """The trailing matrix of `x` in the [out, in] orientation (leading stacked dims kept)."""
  return jnp.swapaxes(x, -1, -2) if info.fan_in == x.ndim - 2 else x


def choose_side(out: int, fan_in: int, proj_type: str) -> str:
  """"right" compresses the fan-in side (R = G Q^T), "left" the fan-out side (R = Q^T G)."""
  if proj_type == "std":
    return "right" if out >= fan_in else "left"
  return proj_type


def _fix_signs(vecs, axis: int):
  idx = jnp.argmax(jnp.abs(vecs), axis=axis, keepdims=True)
  return vecs * jnp.sign(jnp.take_along_axis(vecs, idx, axis=axis))


def svd_projector(g_oi, rank: int, side: str):
  """Q from the SVD of g [..., out, in]: Vh[:r] ([..., r, in]) for "right", U[:, :r] ([..., out, r]) for "left"."""
  u, _, vh = jnp.linalg.svd(g_oi.astype(jnp.float32), full_matrices=False)
  if side == "right":
    return _fix_signs(vh[..., :rank, :], axis=-1)
  return _fix_signs(u[..., :, :rank], axis=-2)


def project(g_oi, q, side: str):
  return g_oi @ jnp.swapaxes(q, -1, -2) if side == "right" else jnp.swapaxes(q, -1, -2) @ g_oi


def project_back(r, q, side: str):
  return r @ q if side == "right" else q @ r


def unzip(like, tree_of_tuples, n: int):
  """n trees shaped like `like` from a tree (shaped like `like`) of n-tuples."""
  treedef = jax.tree.structure(like)
  cols = list(zip(*treedef.flatten_up_to(tree_of_tuples))) or [()] * n
  return tuple(treedef.unflatten(c) for c in cols)


class GaLoreState(NamedTuple):
  count: jax.Array
  proj: optax.Updates
  mu: optax.Updates
  nu: optax.Updates


def _shapes(x, info: ParamInfo, rank: int, proj_type: str):
  out, fin = x.shape[-2:][::-1] if info.fan_in == x.ndim - 2 else x.shape[-2:]
  side = choose_side(out, fin, proj_type)
  r = min(rank, out, fin)
  lead = x.shape[:-2]
  q = (*lead, r, fin) if side == "right" else (*lead, out, r)
  low = (*lead, out, r) if side == "right" else (*lead, r, fin)
  return side, r, q, low


def scale_by_galore(rank: int = 128, update_proj_gap: int = 200, scale: float = 0.25,
                    proj_type: ProjType = "std", b1: float = 0.9, b2: float = 0.999,
                    eps: float = 1e-6, *, axes: Rules) -> optax.GradientTransformation:
  """The GaLore direction (before the learning rate) for every leaf it sees (all must be 2-D + stacked); `axes`
  are the params' logical axis rules."""
  if proj_type not in PROJ_TYPES:
    raise ValueError(f"proj_type must be one of {PROJ_TYPES}, found {proj_type!r}")
  if rank < 1 or update_proj_gap < 1:
    raise ValueError(f"rank and update_proj_gap must be >= 1, found {rank} and {update_proj_gap}")

  def init_fn(params):
    infos = param_info(params, axes)
    def zeros(x, info, which):
      shape = _shapes(x, info, rank, proj_type)[2 if which == "q" else 3]
      return jnp.zeros(shape, jnp.float32 if which == "q" else x.dtype)
    mk = lambda which: jax.tree.map(lambda x, i: zeros(x, i, which), params, infos)
    return GaLoreState(jnp.zeros([], jnp.int32), mk("q"), mk("low"), mk("low"))

  def update_fn(updates, state, params=None):
    del params
    infos = param_info(updates, axes)
    count = optax.safe_increment(state.count)
    t = count.astype(jnp.float32)
    step = jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    refresh = state.count % update_proj_gap == 0

    def one(g, q, m, v, info):
      side, r, _, _ = _shapes(g, info, rank, proj_type)
      g_oi = to_out_in(g, info).astype(jnp.float32)
      q = jax.lax.cond(refresh, lambda: svd_projector(g_oi, r, side), lambda: q)
      low = project(g_oi, q, side)
      m = b1 * m + (1 - b1) * low.astype(m.dtype)
      v = b2 * v + (1 - b2) * jnp.square(low).astype(v.dtype)
      n = m.astype(jnp.float32) / (jnp.sqrt(v.astype(jnp.float32)) + eps)
      d = to_out_in(scale * step * project_back(n, q, side), info)
      return d.astype(g.dtype), q, m, v

    d, q, m, v = unzip(updates, jax.tree.map(one, updates, state.proj, state.mu, state.nu, infos), 4)
    return d, GaLoreState(count, q, m, v)

  return optax.GradientTransformation(init_fn, update_fn)


def step_then_decay(learning_rate: ScalarOrSchedule, weight_decay: float) -> optax.GradientTransformation:
  """u = -lr d, then weight decay on the stepped params, as the reference AdamW does: p_new = (p - lr d)(1 - lr wd)."""
  def init_fn(params):
    del params
    return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None):
    lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
    u = jax.tree.map(lambda d: (-lr * d).astype(d.dtype), updates)
    if not (isinstance(weight_decay, (int, float)) and weight_decay == 0):
      if params is None:
        raise ValueError("weight decay needs params: call update(updates, state, params)")
      u = jax.tree.map(lambda u, p: (u - lr * weight_decay * (p + u)).astype(p.dtype), u, params)
    return u, optax.ScaleByScheduleState(count=optax.safe_increment(state.count))

  return optax.GradientTransformation(init_fn, update_fn)


def galore(learning_rate: ScalarOrSchedule, *, axes: Rules, rank: int = 128, update_proj_gap: int = 200,
           scale: float = 0.25, proj_type: str = "std", b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
           weight_decay: float = 0.0,
           project: Callable[[ParamInfo], bool] | None = None) -> optax.GradientTransformation:
  """GaLore-AdamW over any param tree its axis rules cover.

  Args:
    learning_rate: a float or an optax schedule.
    axes: the params' logical axis rules (e.g. `tfm.AXES`): which leaves are matrices, and their fan-in axes.
    rank: projection rank r (clipped to the matrix's smaller side).
    update_proj_gap: T, steps between SVD refreshes of the projector.
    scale: alpha, multiplies the back-projected step.
    proj_type: "std" (compress the smaller side; fan-in when out >= in), "right" (fan-in side) or "left".
    b1, b2, eps: Adam hyperparameters (reference form, eps added to sqrt(v)).
    weight_decay: applied after the step, p <- (p - lr d)(1 - lr wd).
    project: predicate on `ParamInfo` choosing projected params (default `is_low_rank_target`).
  """
  project = project or is_low_rank_target
  labels = lambda params: label_tree(params, lambda i: "low_rank" if project(i) else "adam", axes)
  return optax.chain(
      optax.partition({"low_rank": scale_by_galore(rank, update_proj_gap, scale, proj_type, b1, b2, eps,
                                                   axes=axes),
                       "adam": scale_by_adam_ref(b1, b2, eps)}, labels),
      step_then_decay(learning_rate, weight_decay))
