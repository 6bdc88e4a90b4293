"""Multi-head attention with grouped KV heads, boolean masks and a KV cache.

Axes: B batch, T query positions, S key positions, H query heads, G kv heads (H = G*R), K head dim, P cache
slots. Masks are boolean, True = may attend. Softmax runs in fp32; a row with no allowed key yields zeros.
The KV cache is stored head-major, [P, B, G, S, K]: a slot is then [B, G, S, K], the layout the batched
(b, g) score and value matmuls read directly, so decoding does not transpose the whole cache every step.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

NEG_INF = -1e30  # finite, so fully masked rows give a uniform softmax that we then zero out


def causal_mask(q_pos_BT, k_pos_BS, window: int | None = None):
  """[B, T, S]: key position <= query position (and within `window` positions when given)."""
  ok = k_pos_BS[:, None, :] <= q_pos_BT[:, :, None]
  if window is not None:
    ok &= q_pos_BT[:, :, None] - k_pos_BS[:, None, :] < window
  return ok


def attention(q_BTHK, k_BSGK, v_BSGK, mask_BTS=None, *, scale: float | None = None,
              weights_hook: Callable | None = None, heads_major: bool = False, transposed: bool = False):
  """Returns (out [B,T,H,K], weights [B,H,T,S] fp32).

  Args:
    mask_BTS: boolean [B, T, S] (or broadcastable), True where attention is allowed; None = all allowed.
    weights_hook: optional fn(weights_BHTS) -> weights_BHTS applied after the softmax (interventions).
    heads_major: keys and values are given as [B, G, S, K] (a cache slot) instead of [B, S, G, K].
    transposed: keys are given as [B, G, S, K] and values as [B, G, K, S]: the layouts XLA's CPU matmuls read
      in place when a few queries attend to many keys (a decoding step); other layouts get copied every call.
  """
  b, t, h, k = q_BTHK.shape
  g = k_BSGK.shape[1] if heads_major or transposed else k_BSGK.shape[2]
  s = k_BSGK.shape[2] if heads_major or transposed else k_BSGK.shape[1]
  if h % g:
    raise ValueError(f"query heads ({h}) must be a multiple of kv heads ({g})")
  ks = "bgsk" if heads_major or transposed else "bsgk"
  vs = "bgks" if transposed else ks
  scale = k ** -0.5 if scale is None else scale
  q = q_BTHK.reshape(b, t, g, h // g, k)
  logits = jnp.einsum(f"btgrk,{ks}->bgrts", q, k_BSGK, preferred_element_type=jnp.float32) * scale
  if mask_BTS is not None:
    m = jnp.broadcast_to(mask_BTS, (b, t, s))[:, None, None]
    logits = jnp.where(m, logits, NEG_INF)
  w = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  if mask_BTS is not None:
    w = jnp.where(m, w, 0.0)
  w = w.reshape(b, h, t, -1)
  if weights_hook is not None:
    w = weights_hook(w)
  wg = w.reshape(b, g, h // g, t, -1).astype(v_BSGK.dtype)
  out = jnp.einsum(f"bgrts,{vs}->btgrk", wg, v_BSGK).reshape(b, t, h, k)
  return out, w


def blockwise_attention(q_BTHK, k_BSGK, v_BSGK, *, block: int = 128, scale: float | None = None):
  """Unmasked attention [B, T, H, K], the same softmax as `attention`, computed `block` queries at a time.

  Each step of a lax.map holds one [B, H, block, S] score tile instead of all [B, H, T, S] at once, so for long
  sequences (Whisper's 1500 encoder frames) the scores stay in cache: on CPU about 3x faster than `attention`.
  Queries are zero-padded to a multiple of `block`; the padded rows are dropped. Grouped KV heads are repeated.
  """
  b, t, h, d = q_BTHK.shape
  g = k_BSGK.shape[2]
  if h % g:
    raise ValueError(f"query heads ({h}) must be a multiple of kv heads ({g})")
  scale = d ** -0.5 if scale is None else scale
  n = -(-t // block)
  q = jnp.pad(q_BTHK * jnp.asarray(scale, q_BTHK.dtype), ((0, 0), (0, n * block - t), (0, 0), (0, 0)))
  q_NBHCK = q.reshape(b, n, block, h, d).transpose(1, 0, 3, 2, 4)
  k_BHKS = jnp.repeat(k_BSGK, h // g, axis=2).transpose(0, 2, 3, 1)  # transposed once, not per block
  v_BHSK = jnp.swapaxes(jnp.repeat(v_BSGK, h // g, axis=2), 1, 2)

  def one(q_BHCK):
    s = jnp.einsum("bhck,bhks->bhcs", q_BHCK, k_BHKS, preferred_element_type=jnp.float32)
    return jnp.einsum("bhcs,bhsk->bhck", jax.nn.softmax(s, axis=-1).astype(v_BHSK.dtype), v_BHSK)

  o_NBHCK = jax.lax.map(one, q_NBHCK)
  return o_NBHCK.transpose(1, 0, 3, 2, 4).reshape(b, n * block, h, d)[:, :t]


def init_cache(n_slots: int, batch: int, max_len: int, kv_heads: int, head_dim: int, dtype=jnp.float32):
  """An empty KV cache: k/v [P, B, G, S, K], one slot per executed layer position; `pos` [B, S] = -1 marks
  empty or padded entries; `index` is where the next keys are written."""
  shape = (n_slots, batch, kv_heads, max_len, head_dim)
  return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype),
          "pos": jnp.full((batch, max_len), -1, jnp.int32), "index": jnp.zeros((), jnp.int32)}


def cache_write(k_PBGSK, v_PBGSK, k_BTGK, v_BTGK, slot, index):
  """Writes T new keys/values into cache slot `slot` at offset `index`, updating the stacked cache in place
  (a loop carry, so XLA writes only the new entries instead of copying the slot). With `slot=None` the cache is
  one layer's, [B, G, S, K]: its update is then the array attention reads, where a slot's slice of a stacked
  cache is a second user that XLA:CPU serves with its own copy of the whole slot every step."""
  z = jnp.zeros((), jnp.int32)
  at = (z, z, jnp.asarray(index, jnp.int32), z)
  k_new, v_new = jnp.swapaxes(k_BTGK, 1, 2).astype(k_PBGSK.dtype), jnp.swapaxes(v_BTGK, 1, 2).astype(v_PBGSK.dtype)
  if slot is not None:
    at, k_new, v_new = (jnp.asarray(slot, jnp.int32), *at), k_new[None], v_new[None]
  return jax.lax.dynamic_update_slice(k_PBGSK, k_new, at), jax.lax.dynamic_update_slice(v_PBGSK, v_new, at)
