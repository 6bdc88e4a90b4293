"""PIC and PICL: PIC against a NumPy top-K KL on random logits, zero for equal distributions, no gradient into the
clean side (on logits and through a model's params), and PICL at lambda 0 equal to DPO + NLL computed with
jaxlab.losses' functions and re-derived in NumPy from the model's logits."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab import losses
from jaxlab.models import transformer as tfm
from experiments.pia import picl

CFG = tfm.Config.tiny(vocab_size=48, d_model=32, n_heads=2, n_kv_heads=1, d_ff=64, init_std=0.3,
                      eos_token_id=None, pad_token_id=0)
T = 20
_fwd = jax.jit(lambda p, x: tfm.forward(p, x, CFG).logits)


def fwd(p, x):
  return _fwd(p, jnp.asarray(x))


def _np_log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _np_topk_kl(clean, persona, mask, k):
  """The reference's per-row KL: top-k mask from the clean logits, full-vocab softmaxes, mean over valid tokens."""
  out = []
  for c, q, m in zip(clean.astype(np.float64), persona.astype(np.float64), mask):
    rows = []
    for t in np.flatnonzero(m):
      thresh = np.sort(c[t])[::-1][k - 1]
      lp, lq = _np_log_softmax(c[t]), _np_log_softmax(q[t])
      rows.append(np.sum(np.where(c[t] >= thresh, np.exp(lp) * (lp - lq), 0.0)))
    out.append(np.sum(rows) / len(rows) if rows else 0.0)
  return np.array(out)


def test_top_k_kl_matches_numpy_on_random_logits():
  rng = np.random.default_rng(0)
  clean = rng.normal(size=(3, 5, 200)).astype(np.float32) * 3
  persona = rng.normal(size=(3, 5, 200)).astype(np.float32) * 3
  mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
  for k in (1, 7, 100, 200, 500):
    kl, count = picl.top_k_kl(clean, persona, mask, k)
    np.testing.assert_allclose(kl, _np_topk_kl(clean, persona, mask, min(k, 200)), rtol=2e-5, atol=1e-6)
    np.testing.assert_array_equal(count, [3, 5, 0])
  # a tie at the k-th value keeps both tokens
  tie = np.array([[[3.0, 1.0, 1.0, 0.0]]], np.float32)
  kl, _ = picl.top_k_kl(tie, np.zeros_like(tie), np.ones((1, 1)), 2)
  np.testing.assert_allclose(kl, _np_topk_kl(tie, np.zeros_like(tie), np.ones((1, 1)), 2), rtol=1e-6)
  full, _ = picl.top_k_kl(clean, persona, mask, 200)
  part, _ = picl.top_k_kl(clean, persona, mask, 7)
  assert np.all(np.asarray(full)[:2] > 0) and not np.allclose(full, part)


def test_pic_is_zero_for_equal_distributions_and_blind_to_the_clean_side():
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 4, 64)) * 2
  kl, _ = picl.top_k_kl(x, x, jnp.ones((2, 4)), 100)
  np.testing.assert_allclose(kl, 0.0, atol=1e-6)
  y = jax.random.normal(jax.random.PRNGKey(1), (2, 4, 64))

  def pic(clean, persona):
    kl, cnt = picl.top_k_kl(clean, persona, jnp.ones((2, 4)), 10)
    return picl.pic_term(kl, cnt, jnp.ones(2, bool))[0]

  g_clean, g_persona = jax.grad(pic, argnums=(0, 1))(x, y)
  assert float(jnp.max(jnp.abs(g_clean))) == 0.0
  assert float(jnp.max(jnp.abs(g_persona))) > 1e-4


def _rows(seed, n, lo, hi):
  rng = np.random.default_rng(seed)
  return [rng.integers(2, CFG.vocab_size, size=int(rng.integers(lo, hi))).tolist() for _ in range(n)]


def _batch(params, same_prompts=False):
  clean = _rows(1, 3, 2, 5)
  persona = clean if same_prompts else [_rows(9, 1, 3, 6)[0] + c for c in clean]
  chosen, rejected = _rows(2, 3, 2, 6), _rows(3, 3, 2, 6)
  b = picl.picl_batch(persona, clean, chosen, rejected, T, sft_prompts=_rows(4, 2, 2, 5),
                      sft_completions=_rows(5, 2, 2, 7), has_persona=[True, True, False])
  ref = tfm.init(CFG, jax.random.PRNGKey(7))
  c, r = jax.jit(lambda p, x: losses.pair_logprobs(p, CFG, x))(ref, b)
  return dict(b, ref_chosen_logp=np.asarray(c), ref_rejected_logp=np.asarray(r)), (persona, clean, chosen)


@pytest.fixture(scope="module")
def params():
  return tfm.init(CFG, jax.random.PRNGKey(0))


def test_batch_indices_point_at_the_response_on_both_sides(params):
  b, (persona, clean, chosen) = _batch(params)
  for i, c in enumerate(chosen):
    n = len(c)
    assert b["response_mask"][i].sum() == n
    np.testing.assert_array_equal(b["chosen_targets"][i, b["persona_index"][i, :n]], c)
    np.testing.assert_array_equal(b["clean_inputs"][i, b["clean_index"][i, :n] + 1], c)
    assert b["persona_index"][i, 0] == len(persona[i]) - 1 and b["clean_index"][i, 0] == len(clean[i]) - 1
  with pytest.raises(ValueError, match="found 1, 2, 1, 1"):
    picl.picl_batch([[1]], [[1], [2]], [[3]], [[4]], T)


def test_picl_at_lambda_zero_is_dpo_plus_nll(params):
  b, _ = _batch(params)
  got, w, _ = jax.jit(picl.picl_loss_fn(CFG, beta=0.1, alpha=0.1, lam=0.0))(params, b, None)
  pair_keys = {k: b[k] for k in ("chosen_inputs", "chosen_targets", "chosen_mask", "rejected_inputs",
                                 "rejected_targets", "rejected_mask", "ref_chosen_logp", "ref_rejected_logp")}
  dpo_sum, pairs, _ = jax.jit(losses.dpo_loss_fn(CFG, beta=0.1))(params, pair_keys, None)
  logits = fwd(params, b["sft_inputs"])
  seq, cnt = losses.sequence_logprobs(logits, b["sft_targets"], b["sft_mask"])
  want = (dpo_sum + 0.1 * jnp.sum(-seq / cnt)) / (pairs + 2)
  assert float(w) == 5.0
  np.testing.assert_allclose(got / w, want, rtol=1e-5)

  def np_seq(inputs, targets, mask):
    lp = _np_log_softmax(np.asarray(fwd(params, inputs), np.float64))
    tok = np.take_along_axis(lp, targets[..., None], -1)[..., 0]
    return (tok * mask).sum(1), mask.sum(1)

  c, _ = np_seq(b["chosen_inputs"], b["chosen_targets"], b["chosen_mask"])
  r, _ = np_seq(b["rejected_inputs"], b["rejected_targets"], b["rejected_mask"])
  h = 0.1 * ((c - b["ref_chosen_logp"]) - (r - b["ref_rejected_logp"]))
  s, n = np_seq(b["sft_inputs"], b["sft_targets"], b["sft_mask"])
  np_loss = (np.sum(np.log1p(np.exp(-h))) + 0.1 * np.sum(-s / n)) / 5
  np.testing.assert_allclose(float(got / w), np_loss, rtol=1e-5)


def test_picl_pic_term_through_the_model(params):
  b, _ = _batch(params)
  lam = 2.0
  with_pic = jax.jit(picl.picl_loss_fn(CFG, lam=lam, top_k=10))
  base = jax.jit(picl.picl_loss_fn(CFG, lam=0.0))
  (l1, w1, st), (l0, _, _) = with_pic(params, b, None), base(params, b, None)
  assert float(st["pic_rows"]) == 2.0 and float(st["pic"]) > 0
  np.testing.assert_allclose((l1 - l0) / w1, lam * st["pic"], rtol=1e-5)
  # NumPy PIC from the model's logits at the batch's indices, the third pair (no persona) left out
  pers = np.asarray(fwd(params, b["chosen_inputs"]))
  clean = np.asarray(fwd(params, b["clean_inputs"]))
  take = lambda x, idx: np.take_along_axis(x, idx[..., None], 1)
  kl = _np_topk_kl(take(clean, b["clean_index"]), take(pers, b["persona_index"]), b["response_mask"], 10)
  np.testing.assert_allclose(float(st["pic"]), kl[:2].mean(), rtol=1e-4)
  # gradient: the clean forward is a constant target
  frozen_clean = fwd(params, b["clean_inputs"])

  def pic_only(p, clean_logits=None):
    cl = tfm.forward(p, b["clean_inputs"], CFG).logits if clean_logits is None else clean_logits
    pl = tfm.forward(p, b["chosen_inputs"], CFG).logits
    kl, cnt = picl.top_k_kl(jnp.take_along_axis(cl, b["clean_index"][..., None], 1),
                            jnp.take_along_axis(pl, b["persona_index"][..., None], 1), b["response_mask"], 10)
    return picl.pic_term(kl, cnt, b["has_persona"])[0]

  g_live = jax.jit(jax.grad(pic_only))(params)
  g_const = jax.jit(jax.grad(pic_only))(params, frozen_clean)
  for a, c in zip(jax.tree_util.tree_leaves(g_live), jax.tree_util.tree_leaves(g_const)):
    np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-6)
  # same prompts on both sides: PIC is zero
  same, _ = _batch(params, same_prompts=True)
  _, _, st_same = with_pic(params, dict(same, has_persona=np.ones(3, bool)), None)
  assert abs(float(st_same["pic"])) < 1e-6


def test_picl_training_reduces_pic(params):
  b, _ = _batch(params)
  terms = picl.picl_loss_fn(CFG, lam=1.0, top_k=10)

  @jax.jit
  def step(p):
    g = jax.grad(lambda q: terms(q, b, None)[0] / terms(q, b, None)[1])(p)
    return jax.tree_util.tree_map(lambda x, y: x - 0.05 * y, p, g), terms(p, b, None)[2]["pic"]

  p, pic0 = step(params)
  for _ in range(30):
    p, pic = step(p)
  assert float(pic) < 0.7 * float(pic0)
