"""Geometry and entropy of residual updates, and the attention interventions, after the "lost in attention"
study of residual updates in LVLMs (ICML 2026; no arXiv id or public code known: formulas as in
experiments/lost_in_attention/README.md, short name lost_in_attention).

For a module update X' = X + dX (X: S tokens x H dims):
  eRank(X) = exp(entropy of p), p = sigma / sum(sigma) over the singular values above the rank tolerance
             (eRank(0) = 0);
  dS  = |eRank(X') - eRank(X)| / min(S, H);
  dD  = (||(I - P_col(X)) X'||_F + ||X' (I - P_row(X))||_F) / (2 ||X'||_F)   (0 when X' = 0);
  RID = dS + dD, in [0, 2];
  TME(X) = mean_t entropy_j(P_tj), P_tj proportional to (x~_t . x~_j + 1) / 2 (rows L2-normalized; j runs over
           all tokens including t; a zero row counts as cosine 0 to everything);
  MixIG = TME(X') - TME(X).
P_col/P_row project onto the spans of the left/right singular vectors whose singular value exceeds
`rtol * sigma_max`; the default rtol = max(S, H) * eps(float32) is NumPy's `matrix_rank` convention.

In a jaxlab transformer (`capture=("hidden_states", "attn_updates", "mlp_updates")`) the attention update of
layer l acts on X = hidden_states[l] (the residual entering the layer) and the MLP update on
X = hidden_states[l] + attn_updates[l]; `module_metrics` computes all metrics for both, per layer and example.

Interventions (`jaxlab.models.transformer.Intervention` factories and a params transform): Gaussian noise in
place of the attention update (NoiseDelta), Gaussian Q/K/V weights (NoiseQKV), predefined attention weights.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.models import transformer as tfm

METRICS = ("erank_in", "erank_out", "delta_s", "delta_d", "rid", "tme_in", "tme_out", "mixig")


def _svd(x, rtol):
  u, s, vt = jnp.linalg.svd(x.astype(jnp.float32), full_matrices=False)
  if rtol is None:
    rtol = max(x.shape) * float(jnp.finfo(jnp.float32).eps)
  keep = s > rtol * s[0]
  return u, jnp.where(keep, s, 0.0), vt, keep


def _erank_from_s(s):
  total = jnp.sum(s)
  p = s / jnp.where(total > 0, total, 1.0)
  h = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0))
  return jnp.where(total > 0, jnp.exp(h), 0.0)


def erank(x_SH, rtol: float | None = None):
  """Effective rank: exp of the entropy of the normalized singular values (0 for a zero matrix)."""
  return _erank_from_s(_svd(x_SH, rtol)[1])


def delta_s(x_SH, x_new_SH, rtol: float | None = None):
  """|eRank(X') - eRank(X)| / min(S, H)."""
  return jnp.abs(erank(x_new_SH, rtol) - erank(x_SH, rtol)) / min(x_SH.shape)


def delta_d(x_SH, x_new_SH, rtol: float | None = None):
  """Share of X' outside X's column and row spaces (0 when X' lies in both)."""
  u, _, vt, keep = _svd(x_SH, rtol)
  return _delta_d(u, vt, keep, x_new_SH.astype(jnp.float32))


def _delta_d(u, vt, keep, y):
  uk, vk = u * keep, vt.T * keep
  off_col = y - uk @ (uk.T @ y)
  off_row = y - (y @ vk) @ vk.T
  ny = jnp.linalg.norm(y)
  num = jnp.linalg.norm(off_col) + jnp.linalg.norm(off_row)
  return jnp.where(ny > 0, num / (2 * jnp.where(ny > 0, ny, 1.0)), 0.0)


def rid(x_SH, x_new_SH, rtol: float | None = None):
  """RID = dS + dD."""
  return delta_s(x_SH, x_new_SH, rtol) + delta_d(x_SH, x_new_SH, rtol)


def tme(x_SH, eps: float = 1e-12):
  """Token-mixing entropy: mean over tokens t of the entropy of P_t. ∝ (cos(x_t, x_j) + 1) / 2."""
  x = x_SH.astype(jnp.float32)
  x = x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)
  a = (x @ x.T + 1.0) / 2.0
  a = jnp.clip(a, 0.0, None)
  p = a / jnp.sum(a, axis=-1, keepdims=True)
  h = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0), axis=-1)
  return jnp.mean(h)


def mixig(x_SH, x_new_SH):
  """MixIG = TME(X') - TME(X)."""
  return tme(x_new_SH) - tme(x_SH)


def update_metrics(x_SH, dx_SH, rtol: float | None = None) -> dict:
  """Every metric of METRICS for the update X -> X + dX (one SVD of X, one of X')."""
  x = x_SH.astype(jnp.float32)
  y = x + dx_SH.astype(jnp.float32)
  u, s, vt, keep = _svd(x, rtol)
  e_in, e_out = _erank_from_s(s), erank(y, rtol)
  ds = jnp.abs(e_out - e_in) / min(x.shape)
  dd = _delta_d(u, vt, keep, y)
  t_in, t_out = tme(x), tme(y)
  return {"erank_in": e_in, "erank_out": e_out, "delta_s": ds, "delta_d": dd, "rid": ds + dd,
          "tme_in": t_in, "tme_out": t_out, "mixig": t_out - t_in}


def module_metrics(resid_LBTD, attn_LBTD, mlp_LBTD, *, tokens: Sequence[int] | None = None,
                   rtol: float | None = None) -> dict:
  """Metrics of the attention and MLP updates of every layer and example.

  Args:
    resid_LBTD: residual stream entering each layer (hidden_states[:-1] in the HF convention).
    attn_LBTD, mlp_LBTD: what attention and the MLP add to the residual stream.
    tokens: positions forming X (e.g. the image tokens); None = all.
  Returns:
    {"attention": {metric: [L, B]}, "ffn": {metric: [L, B]}}.
  """
  if not resid_LBTD.shape == attn_LBTD.shape == mlp_LBTD.shape:
    raise ValueError(f"residual, attention and MLP tensors must share [L,B,T,D], found {resid_LBTD.shape}, "
                     f"{attn_LBTD.shape}, {mlp_LBTD.shape}")
  sel = (lambda a: a) if tokens is None else (lambda a: a[:, :, np.asarray(tokens)])
  x, a, m = sel(resid_LBTD), sel(attn_LBTD), sel(mlp_LBTD)
  fn = jax.jit(jax.vmap(jax.vmap(lambda x, d: update_metrics(x, d, rtol))))
  return {"attention": fn(x, a), "ffn": fn(x + a, m)}


def metrics_from_output(out: tfm.Output, **kw) -> dict:
  """`module_metrics` from a transformer Output captured with hidden_states, attn_updates and mlp_updates."""
  if out.hidden_states is None or out.attn_updates is None or out.mlp_updates is None:
    raise ValueError("forward must capture ('hidden_states', 'attn_updates', 'mlp_updates')")
  return module_metrics(out.hidden_states[:-1], out.attn_updates, out.mlp_updates, **kw)


# ------------------------------------------------------------------------------------------ interventions


def _in_layers(layer, layers):
  return True if layers is None else jnp.isin(layer, jnp.asarray(list(layers), jnp.int32))


def noise_update(key, *, layers: Sequence[int] | None = None, std: float | None = None,
                 mix: float = 1.0) -> tfm.Intervention:
  """Gaussian noise in place of the attention update: u' = (1 - mix) u + mix n (mix = 1: replacement).

  Args:
    key: PRNG key; each layer draws with `fold_in(key, layer)`.
    layers: layer indices to modify (None: all).
    std: per-element standard deviation of n; None: n has the norm of u at each token (a random direction).
    mix: 1 replaces the update; 0 leaves the model unchanged.
  """
  def fn(u_BTD, layer):
    n = jax.random.normal(jax.random.fold_in(key, layer), u_BTD.shape, jnp.float32)
    u = u_BTD.astype(jnp.float32)
    if std is None:
      n = n * jnp.linalg.norm(u, axis=-1, keepdims=True) / jnp.maximum(jnp.linalg.norm(n, axis=-1, keepdims=True),
                                                                         1e-12)
    else:
      n = n * std
    return jnp.where(_in_layers(layer, layers), (1.0 - mix) * u + mix * n, u).astype(u_BTD.dtype)
  return tfm.Intervention(attn_update=fn)


def gaussian_qkv(params, key, layers: Sequence[int], *, std: float | None = None,
                 which: Sequence[str] = ("q", "k", "v")) -> dict:
  """Params with the q/k/v kernels of `layers` replaced by Gaussian draws (biases and norms kept).

  Args:
    layers: layer indices (into the stacked `layers` axis).
    std: standard deviation of the draws; None: each replaced matrix's own standard deviation.
    which: the projections to replace.
  """
  attn = dict(params["layers"]["attn"])
  n_layers = attn["q"]["kernel"].shape[0]
  idx = np.asarray(sorted(set(layers)), np.int32)
  if idx.size and (idx.min() < 0 or idx.max() >= n_layers):
    raise ValueError(f"layers must lie in [0, {n_layers}), found {list(layers)}")
  for i, name in enumerate(which):
    if name not in ("q", "k", "v"):
      raise ValueError(f"which must name q, k or v, found {name!r}")
    w = attn[name]["kernel"]
    sd = jnp.std(w[idx].astype(jnp.float32), axis=(1, 2), keepdims=True) if std is None else std
    draw = (jax.random.normal(jax.random.fold_in(key, i), (len(idx),) + w.shape[1:], jnp.float32) * sd)
    attn[name] = {**attn[name], "kernel": w.at[idx].set(draw.astype(w.dtype))}
  return {**params, "layers": {**params["layers"], "attn": attn}}


def causal_uniform(t: int, s: int | None = None) -> np.ndarray:
  """[T, S] weights: query i attends uniformly to keys 0 .. i + S - T."""
  s = t if s is None else s
  m = np.tril(np.ones((t, s), np.float32), k=s - t)
  return m / m.sum(-1, keepdims=True)


def fixed_attention(pattern="uniform_causal", *, layers: Sequence[int] | None = None) -> tfm.Intervention:
  """Predefined attention weights in place of the softmax pattern.

  Args:
    pattern: "uniform_causal" (`causal_uniform`), "uniform" (uniform over the keys the model's mask allows, i.e.
      where the softmax weight is > 0: respects padding and sliding windows), or an array [T, S], [H, T, S] or
      [B, H, T, S] broadcast to the weights.
    layers: layer indices to modify (None: all).
  """
  if isinstance(pattern, str) and pattern not in ("uniform_causal", "uniform"):
    raise ValueError(f"pattern must be 'uniform_causal', 'uniform' or an array, found {pattern!r}")

  def fn(w_BHTS, layer):
    t, s = w_BHTS.shape[-2:]
    if isinstance(pattern, str) and pattern == "uniform_causal":
      new = jnp.asarray(causal_uniform(t, s))
    elif isinstance(pattern, str):
      allowed = (w_BHTS > 0).astype(jnp.float32)
      new = allowed / jnp.maximum(allowed.sum(-1, keepdims=True), 1.0)
    else:
      new = jnp.asarray(pattern, jnp.float32)
      if new.ndim < 2 or new.shape[-2:] != (t, s):
        raise ValueError(f"pattern must end in [T, S] = [{t}, {s}], found {new.shape}")
    new = jnp.broadcast_to(new, w_BHTS.shape)
    return jnp.where(_in_layers(layer, layers), new, w_BHTS).astype(w_BHTS.dtype)
  return tfm.Intervention(attn_weights=fn)
