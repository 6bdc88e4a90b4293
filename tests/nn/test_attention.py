"""Attention variants against a brute-force softmax attention written out in NumPy (float64).

Oracle: softmax(q k^T * scale) v per head, computed with NumPy; `attention` in every key/value layout it
accepts and `blockwise_attention` (query blocks under lax.map) must both equal it.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.nn import attention as attn_lib


def _brute(q_BTHK, k_BSGK, v_BSGK, scale=None, mask_BTS=None):
  q, k, v = (np.asarray(x, np.float64) for x in (q_BTHK, k_BSGK, v_BSGK))
  r = q.shape[2] // k.shape[2]
  k, v = np.repeat(k, r, axis=2), np.repeat(v, r, axis=2)
  s = np.einsum("bthk,bshk->bhts", q, k) * (q.shape[-1] ** -0.5 if scale is None else scale)
  if mask_BTS is not None:
    s = np.where(np.asarray(mask_BTS)[:, None], s, -np.inf)
  w = np.exp(s - s.max(-1, keepdims=True))
  return np.einsum("bhts,bshk->bthk", w / w.sum(-1, keepdims=True), v)


def _qkv(b=2, t=37, s=53, h=4, g=2, k=8, seed=0):
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.normal(size=shape) * 2, jnp.float32) for shape in ((b, t, h, k), (b, s, g, k), (b, s, g, k)))


@pytest.mark.parametrize("h,g,block", [(4, 4, 16), (4, 2, 16), (6, 1, 37), (4, 4, 64)])
def test_blockwise_equals_brute_force(h, g, block):
  q, k, v = _qkv(t=53, s=53, h=h, g=g)  # 53 queries: never a multiple of the block, so padding is exercised
  got = jax.jit(lambda q, k, v: attn_lib.blockwise_attention(q, k, v, block=block))(q, k, v)
  np.testing.assert_allclose(np.asarray(got), _brute(q, k, v), atol=1e-5, rtol=1e-5)
  scaled = attn_lib.blockwise_attention(q, k, v, block=block, scale=0.3)
  np.testing.assert_allclose(np.asarray(scaled), _brute(q, k, v, scale=0.3), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("t", [1, 5])
def test_attention_layouts_equal_brute_force(t):
  q, k, v = _qkv(t=t)
  mask = np.tril(np.ones((t, 53), bool), k=40)[None].repeat(2, 0)
  want = _brute(q, k, v, mask_BTS=mask)
  default, _ = attn_lib.attention(q, k, v, mask)
  heads_major, _ = attn_lib.attention(q, jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), mask, heads_major=True)
  transposed, _ = attn_lib.attention(q, jnp.swapaxes(k, 1, 2), v.transpose(0, 2, 3, 1), mask, transposed=True)
  for got in (default, heads_major, transposed):
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)


def test_blockwise_rejects_bad_head_grouping():
  q, k, v = _qkv(h=4, g=3)
  with pytest.raises(ValueError, match="multiple of kv heads"):
    attn_lib.blockwise_attention(q, k, v)
