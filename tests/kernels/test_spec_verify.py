"""spec_verify Pallas kernel (interpret mode on CPU) vs its pure-jnp reference, mask semantics, validation."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.spec_verify import BlockSizes, make_mask, spec_verify_attention, spec_verify_reference

TOL = {jnp.float32: (2e-5, 2e-5), jnp.bfloat16: (3e-2, 3e-2)}

# (B, T, H, G, K, S, n_branches, prefix_len, block_sizes, scale)
CASES = {
    "mha_full_prefix": (1, 32, 2, 2, 16, 32, 2, [32], BlockSizes.small(), None),
    "gqa_padded_multi_block": (2, 40, 4, 2, 24, 50, 4, [0, 37], BlockSizes.small(), 0.3),
    "gqa_default_blocks": (3, 24, 6, 2, 32, 20, 3, [20, 0, 7], None, None),
}


def _inputs(B, T, H, G, K, S, n_branches, prefix_len, dtype, seed=0):
  ks = jax.random.split(jax.random.PRNGKey(seed), 6)
  rnd = lambda k, shape: jax.random.normal(k, shape, jnp.float32).astype(dtype)
  branch_ids = jax.random.randint(ks[5], (B, T), 0, n_branches).at[:, :n_branches].set(jnp.arange(n_branches))
  return (rnd(ks[0], (B, T, H, K)), rnd(ks[1], (B, S, G, K)), rnd(ks[2], (B, S, G, K)),
          rnd(ks[3], (B, T, G, K)), rnd(ks[4], (B, T, G, K)), jnp.asarray(prefix_len, jnp.int32), branch_ids)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_kernel_matches_reference(case, dtype):
  B, T, H, G, K, S, nb, plen, bs, scale = CASES[case]
  args = _inputs(B, T, H, G, K, S, nb, plen, dtype)
  out = spec_verify_attention(*args, scale=scale, block_sizes=bs)
  ref = spec_verify_reference(*args, scale=scale)
  assert out.shape == (B, T, H, K) and out.dtype == dtype
  atol, rtol = TOL[dtype]
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_kernel_with_prefix_holes_and_hidden_keys(dtype):
  """A dual cache's excluded block inside the prefix, left padding, and query-only draft tokens (key id -1)."""
  B, T, H, G, K, S = 2, 24, 4, 2, 16, 40
  args = _inputs(B, T, H, G, K, S, 3, [40, 33], dtype, seed=2)
  valid = np.ones((B, S), bool)
  valid[0, 10:18] = False  # excluded block
  valid[1, :5] = False  # left padding
  key_ids = np.asarray(args[-1]).copy()
  key_ids[:, ::8] = -1  # each branch copy's first token is a query only
  kw = dict(prefix_valid_BS=jnp.asarray(valid), key_branch_ids_BT=jnp.asarray(key_ids))
  out = spec_verify_attention(*args, block_sizes=BlockSizes.small(), **kw)
  ref = spec_verify_reference(*args, **kw)
  atol, rtol = TOL[dtype]
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32), atol=atol, rtol=rtol)
  mask = np.asarray(make_mask(args[5], args[6], S, **kw))
  for b, t in itertools.product(range(B), range(T)):
    seen = [s for s in range(S) if s < [40, 33][b] and valid[b, s]]
    seen += [S + u for u in range(T) if key_ids[b, u] == int(args[6][b, t])]
    assert np.flatnonzero(mask[b, t]).tolist() == seen


def test_reference_matches_per_row_softmax():
  """The oracle itself, against an independent NumPy loop over rows and heads."""
  args = _inputs(2, 6, 4, 2, 8, 5, 2, [5, 2], jnp.float32, seed=1)
  q, kp, vp, kb, vb, plen, ids = (np.asarray(a) for a in args)
  ref = np.asarray(spec_verify_reference(*args))
  for b, t, h in itertools.product(range(2), range(6), range(4)):
    g = h // 2
    keys = [kp[b, s, g] for s in range(plen[b])] + [kb[b, u, g] for u in range(6) if ids[b, u] == ids[b, t]]
    vals = [vp[b, s, g] for s in range(plen[b])] + [vb[b, u, g] for u in range(6) if ids[b, u] == ids[b, t]]
    logits = np.stack(keys) @ q[b, t, h] / np.sqrt(8)
    w = np.exp(logits - logits.max())
    np.testing.assert_allclose(ref[b, t, h], (w / w.sum()) @ np.stack(vals), atol=1e-5, rtol=1e-5)


def test_make_mask_brute_force():
  plen = jnp.array([0, 3, 4])
  ids = jnp.array([[0, 1, 0, 2, 1], [1, 1, 1, 1, 1], [3, 0, 3, 0, 5]])
  mask = np.asarray(make_mask(plen, ids, 4))
  assert mask.shape == (3, 5, 9) and mask.dtype == bool
  for b, t, j in itertools.product(range(3), range(5), range(9)):
    want = j < int(plen[b]) if j < 4 else int(ids[b, t]) == int(ids[b, j - 4])
    assert mask[b, t, j] == want, (b, t, j)


def test_branches_and_stale_prefix_are_invisible():
  B, T, H, G, K, S = 2, 32, 2, 1, 16, 32
  q, kp, vp, kb, vb, plen, _ = _inputs(B, T, H, G, K, S, 2, [9, 32], jnp.float32, seed=2)
  ids = jnp.tile(jnp.array([0, 1, 2, 1]), (B, T // 4))
  run = lambda *a: np.asarray(spec_verify_attention(*a, block_sizes=BlockSizes.small()))
  base = run(q, kp, vp, kb, vb, plen, ids)

  in_b1 = np.asarray(ids == 1)[:, :, None, None]
  noise = 100.0 * jax.random.normal(jax.random.PRNGKey(3), kb.shape)
  pert = run(q, kp, vp, jnp.where(in_b1, kb + noise, kb), jnp.where(in_b1, vb - noise, vb), plen, ids)
  others = ~np.asarray(ids == 1)
  np.testing.assert_array_equal(pert[others], base[others])
  assert not np.allclose(pert[~others], base[~others])

  stale = np.arange(S)[None, :, None, None] >= np.asarray(plen)[:, None, None, None]
  pert = run(q, jnp.where(stale, 1e3, kp), jnp.where(stale, -1e3, vp), kb, vb, plen, ids)
  np.testing.assert_array_equal(pert, base)
  pert = run(q, kp, vp * 2.0, kb, vb, plen, ids)
  assert not np.allclose(pert, base)


BAD = {
    "rank": (lambda a: (a[0][0],) + a[1:], "q_BTHK must have rank 4"),
    "batch": (lambda a: (a[0], a[1][:1]) + a[2:], "k_prefix_BSGK must have shape"),
    "head_dim": (lambda a: a[:3] + (a[3][..., :4],) + a[4:], "k_block_BTGK must have shape"),
    "kv_heads": (lambda a: a[:4] + (jnp.concatenate([a[4]] * 2, axis=2),) + a[5:], "v_block_BTGK"),
    "heads_not_multiple": (lambda a: (jnp.concatenate([a[0], a[0][:, :, :1]], axis=2),) + a[1:],
                           "multiple of kv heads"),
    "value_dtype": (lambda a: a[:2] + (a[2].astype(jnp.bfloat16),) + a[3:], "dtype of q_BTHK"),
    "int_queries": (lambda a: (a[0].astype(jnp.int32),) + a[1:], "floating point"),
    "prefix_len_shape": (lambda a: a[:5] + (a[5][None],) + a[6:], r"prefix_len_B must have shape \(2,\)"),
    "branch_ids_shape": (lambda a: a[:6] + (a[6][:, :-1],), r"branch_ids_BT must have shape \(2, 8\)"),
    "branch_ids_dtype": (lambda a: a[:6] + (a[6].astype(jnp.float32),), "integer dtype"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_inputs_raise(name):
  args = _inputs(2, 8, 4, 2, 16, 8, 2, [3, 8], jnp.float32)
  mutate, msg = BAD[name]
  with pytest.raises(ValueError, match=msg):
    spec_verify_attention(*mutate(args))
  with pytest.raises(ValueError, match=msg):
    spec_verify_reference(*mutate(args))


@pytest.mark.parametrize("kwargs", [dict(block_q=24), dict(block_k=8), dict(block_k_prefix=0)])
def test_bad_block_sizes(kwargs):
  with pytest.raises(ValueError, match="power of two >= 16"):
    BlockSizes(**kwargs)
