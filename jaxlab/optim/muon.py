"""Muon: momentum orthogonalized by Newton-Schulz (Jordan et al. 2024; Liu et al., arXiv 2502.16982).

Hidden matrices (two dims besides the stacked "layers" axes, no "vocab" axis) get Nesterov momentum (beta 0.95),
orthogonalized by 5 quintic Newton-Schulz steps (coefficients 3.4445, -4.7750, 2.0315, after scaling to unit
Frobenius norm) and rescaled by sqrt(max(1, fan_out / fan_in)); embeddings, the LM head and vectors get AdamW.
The fan-in (reduction) axis comes from the params' logical axis rules and stacked layers are orthogonalized
separately. Uses `optax.contrib.muon` when the installed optax has it (with per-parameter dimension numbers),
otherwise an equivalent implementation in this file.
"""
from __future__ import annotations

import inspect
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxlab.optim.galore import is_low_rank_target
from jaxlab.nn.axes import Rules
from jaxlab.optim.scale import ParamInfo, ScalarOrSchedule, label_tree, param_info

NS_COEFFS = (3.4445, -4.7750, 2.0315)


def _optax_muon():
  fn = getattr(getattr(optax, "contrib", None), "muon", None)
  if fn is None or "muon_weight_dimension_numbers" not in inspect.signature(fn).parameters:
    return None
  return fn


def _to_in_out(x, info: ParamInfo):
  return jnp.swapaxes(x, -1, -2) if info.fan_in == x.ndim - 1 else x


def orthogonalize(x_io, ns_steps: int = 5, eps: float = 1e-8):
  """Newton-Schulz approximation of U V^T for x [..., in, out] (each leading index separately)."""
  x = x_io.astype(jnp.float32)
  wide = x.shape[-2] > x.shape[-1]
  if wide:
    x = jnp.swapaxes(x, -1, -2)
  x = x / (jnp.linalg.norm(x, axis=(-2, -1), keepdims=True) + eps)
  c0, c1, c2 = NS_COEFFS
  for _ in range(ns_steps):
    a = x @ jnp.swapaxes(x, -1, -2)
    x = c0 * x + (c1 * a + c2 * a @ a) @ x
  return jnp.swapaxes(x, -1, -2) if wide else x


class MuonState(NamedTuple):
  count: jax.Array
  mu: optax.Updates


def scale_by_muon(beta: float = 0.95, ns_steps: int = 5, eps: float = 1e-8, nesterov: bool = True, *,
                  axes: Rules) -> optax.GradientTransformation:
  """Orthogonalized (Nesterov) momentum with the width rescaling, for every leaf it sees (`axes`: the params'
  logical axis rules)."""
  def init_fn(params):
    return MuonState(jnp.zeros([], jnp.int32), jax.tree.map(jnp.zeros_like, params))

  def update_fn(updates, state, params=None):
    del params
    count = optax.safe_increment(state.count)
    mu = jax.tree.map(lambda m, g: beta * m + (1 - beta) * g, state.mu, updates)
    t = count.astype(jnp.float32)
    if nesterov:
      hat = jax.tree.map(lambda m, g: beta * m / (1 - beta ** (t + 1)) + (1 - beta) * g / (1 - beta ** t), mu, updates)
    else:
      hat = jax.tree.map(lambda m: m / (1 - beta ** t), mu)

    def one(h, info):
      x = _to_in_out(h, info)
      fan_in, fan_out = x.shape[-2:]
      o = orthogonalize(x, ns_steps, eps) * jnp.sqrt(jnp.maximum(1.0, fan_out / fan_in))
      return _to_in_out(o, info).astype(h.dtype)

    return jax.tree.map(one, hat, param_info(hat, axes)), MuonState(count, mu)

  return optax.GradientTransformation(init_fn, update_fn)


def muon(learning_rate: ScalarOrSchedule, *, axes: Rules, beta: float = 0.95, ns_steps: int = 5,
         nesterov: bool = True, weight_decay: float = 0.0, adam_lr: ScalarOrSchedule | None = None,
         adam_b1: float = 0.9, adam_b2: float = 0.999, eps: float = 1e-8, adam_weight_decay: float = 0.0,
         implementation: str = "auto") -> optax.GradientTransformation:
  """Muon on hidden matrices, AdamW elsewhere.

  Args:
    learning_rate: Muon learning rate, a float or an optax schedule.
    axes: the params' logical axis rules (e.g. `tfm.AXES`): which leaves are matrices, and their fan-in axes.
    beta: momentum coefficient; nesterov: Nesterov momentum (also used by the AdamW part, as optax does).
    ns_steps: Newton-Schulz iterations.
    weight_decay: decoupled weight decay on Muon params (times the learning rate).
    adam_lr: AdamW learning rate (None: learning_rate); adam_b1, adam_b2, eps, adam_weight_decay: its settings.
    implementation: "optax" (optax.contrib.muon), "jaxlab" (this file) or "auto" (optax when available).
  """
  if implementation not in ("auto", "optax", "jaxlab"):
    raise ValueError(f"implementation must be 'auto', 'optax' or 'jaxlab', found {implementation!r}")
  adam_lr = learning_rate if adam_lr is None else adam_lr
  optax_muon = _optax_muon()
  if implementation == "optax" and optax_muon is None:
    raise ValueError("the installed optax has no optax.contrib.muon with muon_weight_dimension_numbers")
  if implementation != "jaxlab" and optax_muon is not None:
    dims = optax.contrib.MuonDimensionNumbers

    def dim_numbers(params):
      def one(info: ParamInfo):
        if not is_low_rank_target(info):
          return None
        out_axis = info.n_layers + (1 - (info.fan_in - info.n_layers))
        return dims(reduction_axis=info.fan_in, output_axis=out_axis)
      return jax.tree.map(one, param_info(params, axes), is_leaf=lambda x: isinstance(x, ParamInfo))

    return optax_muon(learning_rate, ns_steps=ns_steps, beta=beta, eps=eps, weight_decay=weight_decay,
                      nesterov=nesterov, adam_b1=adam_b1, adam_b2=adam_b2, adam_weight_decay=adam_weight_decay,
                      adam_learning_rate=adam_lr, muon_weight_dimension_numbers=dim_numbers)
  labels = lambda params: label_tree(params, lambda i: "muon" if is_low_rank_target(i) else "adam", axes)
  return optax.partition({
      "muon": optax.chain(scale_by_muon(beta, ns_steps, eps, nesterov, axes=axes),
                          optax.add_decayed_weights(weight_decay), optax.scale_by_learning_rate(learning_rate)),
      "adam": optax.adamw(adam_lr, b1=adam_b1, b2=adam_b2, eps=eps, weight_decay=adam_weight_decay,
                          nesterov=nesterov),
  }, labels)
