"""GRPO, DPO, IPO and SFT losses against NumPy re-derivations (values and gradients, float64 closed forms), the
plain policy-gradient estimator GRPO reduces to, DPO's beta -> 0 limit, and completion-only SFT masks."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jaxlab import losses
from jaxlab.models import transformer as tfm

B, N = 6, 9
LO, HI = 0.2, 0.28


def _data(seed=0):
  rng = np.random.default_rng(seed)
  old = rng.normal(-2.0, 1.0, (B, N))
  logp = old + rng.normal(0.0, 0.5, (B, N))  # ratios far outside [1 - LO, 1 + HI] on both sides
  ref = old + rng.normal(0.0, 0.3, (B, N))
  adv = rng.normal(0.0, 1.0, B)
  lengths = rng.integers(1, N + 1, B)
  lengths[0] = N
  mask = (np.arange(N)[None] < lengths[:, None]).astype(np.float64)
  return logp, old, ref, adv, mask


def _numpy_grpo(logp, old, ref, adv, mask, beta, rule, max_len):
  """Loss and d loss / d logp: l = -min(rA, clip(r)A) + beta k3; the clipped branch has zero gradient."""
  r = np.exp(logp - old)
  a = adv[:, None]
  unclipped, clipped = r * a, np.clip(r, 1 - LO, 1 + HI) * a
  takes_clipped = clipped < unclipped
  inside = (r >= 1 - LO) & (r <= 1 + HI)
  l = -np.minimum(unclipped, clipped)
  dl = np.where(takes_clipped & ~inside, 0.0, -a * r)
  d = ref - logp
  l = l + beta * (np.exp(d) - d - 1)
  dl = dl + beta * (1 - np.exp(d))
  if rule == "seq_mean":
    w = mask / mask.sum(1, keepdims=True) / B
  elif rule == "token_mean":
    w = mask / mask.sum()
  else:
    w = mask / (B * max_len)
  return np.sum(l * w), dl * w


@pytest.mark.parametrize("rule", losses.AGGREGATIONS)
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_grpo_loss_and_gradient_match_numpy(rule, beta):
  logp, old, ref, adv, mask = _data()
  want, want_grad = _numpy_grpo(logp, old, ref, adv, mask, beta, rule, N)

  def f(lp):
    s, w, stats = losses.grpo_objective(lp, jnp.asarray(old, jnp.float32), jnp.asarray(adv, jnp.float32),
                                        jnp.asarray(mask), ref_logp_BN=jnp.asarray(ref, jnp.float32), beta=beta,
                                        clip_low=LO, clip_high=HI, aggregation=rule, max_len=N)
    return s / w, stats
  (got, stats), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logp, jnp.float32))
  np.testing.assert_allclose(float(got), want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-4, atol=1e-7)
  r = np.exp(logp - old)
  low = (r < 1 - LO) & (adv[:, None] < 0)
  high = (r > 1 + HI) & (adv[:, None] > 0)
  assert (low * mask).sum() > 0 and (high * mask).sum() > 0  # clipping active on both sides
  np.testing.assert_allclose(float(stats["clip_low"]), (low * mask).sum() / mask.sum(), rtol=1e-6)
  np.testing.assert_allclose(float(stats["clip_high"]), (high * mask).sum() / mask.sum(), rtol=1e-6)
  np.testing.assert_allclose(float(stats["clip_frac"]), ((low | high) * mask).sum() / mask.sum(), rtol=1e-6)
  d = ref - logp
  kl = ((np.exp(d) - d - 1) * mask).sum() / mask.sum() if beta else 0.0
  np.testing.assert_allclose(float(stats["kl"]), kl, rtol=1e-5, atol=1e-8)


def test_grpo_without_reference_needs_none_and_rejects_missing_reference_with_beta():
  logp, old, _, adv, mask = _data(1)
  s, w, _ = losses.grpo_objective(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask))
  assert np.isfinite(float(s / w))
  with pytest.raises(ValueError, match="ref_logp"):
    losses.grpo_objective(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask), beta=0.1)
  with pytest.raises(ValueError, match="max_len"):
    losses.aggregate(jnp.asarray(logp), jnp.asarray(mask), "constant")


@pytest.mark.parametrize("rule", losses.AGGREGATIONS)
def test_one_step_unclipped_grpo_is_the_policy_gradient_estimator(rule):
  # First update on a fresh batch: old log-probs are the current ones, so ratio = 1 and no clip is active.
  logp, _, _, adv, mask = _data(2)
  lp = jnp.asarray(logp, jnp.float32)

  def grpo(x):
    s, w, _ = losses.grpo_objective(x, jax.lax.stop_gradient(x), jnp.asarray(adv, jnp.float32), jnp.asarray(mask),
                                    clip_low=LO, clip_high=HI, aggregation=rule, max_len=N)
    return s / w

  def reinforce(x):
    s, w = losses.aggregate(-jnp.asarray(adv, jnp.float32)[:, None] * x, jnp.asarray(mask), rule, N)
    return s / w
  np.testing.assert_allclose(np.asarray(jax.grad(grpo)(lp)), np.asarray(jax.grad(reinforce)(lp)), rtol=1e-6,
                             atol=1e-8)


def _numpy_dpo(c, r, rc, rr, beta):
  h = (c - rc) - (r - rr)
  loss = np.log1p(np.exp(-beta * h))
  s = 1.0 / (1.0 + np.exp(beta * h))  # d loss / d h = -beta * sigmoid(-beta h)
  return loss, -beta * s


def test_dpo_and_ipo_match_numpy():
  rng = np.random.default_rng(3)
  c, r, rc, rr = (rng.normal(-20, 3, 5) for _ in range(4))
  nc, nr = rng.integers(3, 12, 5).astype(np.float64), rng.integers(3, 12, 5).astype(np.float64)
  for beta in (0.1, 0.5):
    want, dh = _numpy_dpo(c, r, rc, rr, beta)
    f = lambda x, y, beta=beta: jnp.sum(losses.dpo_loss(x, y, rc, rr, beta))
    got = losses.dpo_loss(*(jnp.asarray(x, jnp.float32) for x in (c, r, rc, rr)), beta)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)
    gc, gr = jax.grad(f, argnums=(0, 1))(jnp.asarray(c, jnp.float32), jnp.asarray(r, jnp.float32))
    np.testing.assert_allclose(np.asarray(gc), dh, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(gr), -dh, rtol=1e-4)
    for lens in ((None, None), (nc, nr)):
      dc = (c - rc) / (lens[0] if lens[0] is not None else 1.0)
      dr = (r - rr) / (lens[1] if lens[1] is not None else 1.0)
      want_ipo = (dc - dr - 1 / (2 * beta)) ** 2
      got = losses.ipo_loss(*(jnp.asarray(x, jnp.float32) for x in (c, r, rc, rr)), beta, *lens)
      np.testing.assert_allclose(np.asarray(got), want_ipo, rtol=1e-4)


def test_dpo_beta_to_zero_limit():
  # As beta -> 0: loss = log 2 - beta h / 2 + O((beta h)^2) and grad / beta -> -1/2 dh (a linear margin objective).
  rng = np.random.default_rng(4)
  c, r, rc, rr = (rng.normal(-20, 3, 4) for _ in range(4))
  h = (c - rc) - (r - rr)
  for beta in (1e-2, 1e-3, 1e-4):
    loss = np.asarray(losses.dpo_loss(*(jnp.asarray(x, jnp.float32) for x in (c, r, rc, rr)), beta), np.float64)
    np.testing.assert_allclose(loss, np.log(2.0) - beta * h / 2, atol=np.max(np.abs(beta * h)) ** 2 / 8 + 1e-6)
    g = jax.grad(lambda x, beta=beta: jnp.sum(losses.dpo_loss(x, r, rc, rr, beta)))(jnp.asarray(c, jnp.float32))
    np.testing.assert_allclose(np.asarray(g) / beta, -0.5 + beta * h / 4, atol=np.max(np.abs(beta * h)) ** 2 / 8 + 1e-5)


@pytest.fixture(scope="module")
def tiny():
  cfg = tfm.Config.tiny(vocab_size=32, d_model=32, n_heads=2, n_kv_heads=1, d_ff=64, init_std=0.3)
  return cfg, tfm.init(cfg, jax.random.key(0))


def test_sft_mask_leaves_prompt_tokens_out(tiny):
  cfg, params = tiny
  from jaxlab.rl import sft_batch
  prompts, completions = [[3, 4, 5, 6], [7, 8]], [[9, 10], [11, 12, 13, 14]]
  batch = sft_batch(prompts, completions, 8, pad_id=0)
  np.testing.assert_array_equal(batch["loss_mask"], [[0, 0, 0, 1, 1, 0, 0, 0], [0, 1, 1, 1, 1, 0, 0, 0]])
  np.testing.assert_array_equal(batch["targets"][batch["loss_mask"] == 1], [9, 10, 11, 12, 13, 14])
  loss_fn = losses.sft_loss_fn(cfg)
  s, w, _ = loss_fn(params, batch, None)
  assert float(w) == 6
  # Changing prompt targets (or anything after the completion) changes nothing; changing a completion does.
  other = dict(batch, targets=np.where(batch["loss_mask"] == 1, batch["targets"], 31))
  np.testing.assert_array_equal(np.asarray(loss_fn(params, other, None)[0]), np.asarray(s))
  changed = dict(batch, targets=np.where(batch["loss_mask"] == 1, 30, batch["targets"]))
  assert float(loss_fn(params, changed, None)[0]) != float(s)
  logits = tfm.forward(params, batch["inputs"], cfg).logits
  logp = np.asarray(losses.token_logprobs(logits, batch["targets"]))
  np.testing.assert_allclose(float(s), -(logp * batch["loss_mask"]).sum(), rtol=1e-5)
  with pytest.raises(ValueError, match="loss_mask"):
    loss_fn(params, {"inputs": batch["inputs"], "targets": batch["targets"]}, None)


def test_dpo_loss_fn_matches_numpy_on_a_tiny_model(tiny):
  cfg, params = tiny
  from jaxlab.rl import pair_batch, reference_logprobs
  prompts, chosen, rejected = [[3, 4, 5], [6, 7]], [[8, 9, 10], [11]], [[12], [13, 14, 15, 16]]
  ref_params = tfm.init(cfg, jax.random.key(1))
  (batch,) = reference_logprobs(ref_params, cfg, [pair_batch(prompts, chosen, rejected, 8)])

  def seq_logp(p, side):
    logits = tfm.forward(p, batch[f"{side}_inputs"], cfg).logits
    lp = np.asarray(losses.token_logprobs(logits, batch[f"{side}_targets"]), np.float64)
    m = batch[f"{side}_mask"]
    return (lp * m).sum(1), (lp * m).sum(), m.sum()
  rc, _, _ = seq_logp(ref_params, "chosen")
  rr, _, _ = seq_logp(ref_params, "rejected")
  np.testing.assert_allclose(batch["ref_chosen_logp"], rc, rtol=1e-5)
  np.testing.assert_allclose(batch["ref_rejected_logp"], rr, rtol=1e-5)
  c, c_sum, c_n = seq_logp(params, "chosen")
  r, _, _ = seq_logp(params, "rejected")
  beta, alpha = 0.3, 0.7
  dpo, _ = _numpy_dpo(c, r, rc, rr, beta)
  s, w, _ = losses.dpo_loss_fn(cfg, beta=beta, alpha=alpha)(params, batch, None)
  np.testing.assert_allclose(float(s / w), dpo.mean() + alpha * (-c_sum / c_n), rtol=1e-5)
  s, w, _ = losses.dpo_loss_fn(cfg, beta=beta, kind="ipo")(params, batch, None)
  nc, nr = batch["chosen_mask"].sum(1), batch["rejected_mask"].sum(1)
  ipo = ((c - rc) / nc - (r - rr) / nr - 1 / (2 * beta)) ** 2
  np.testing.assert_allclose(float(s / w), ipo.mean(), rtol=1e-5)


def test_dpo_trains_through_the_microbatched_train_step(tiny):
  import optax
  from jaxlab.rl import pair_batch, reference_logprobs
  from jaxlab.train import state as st
  from jaxlab.train import step as sp
  cfg, params = tiny
  prompts, chosen, rejected = [[3, 4], [5, 6, 7], [8], [9, 10]], [[11], [12, 13], [14, 15], [16]], [[17, 18], [19],
                                                                                                  [20], [21, 22]]
  (batch,) = reference_logprobs(params, cfg, [pair_batch(prompts, chosen, rejected, 6)])
  tx = optax.sgd(0.5)
  lf = losses.dpo_loss_fn(cfg, beta=0.5)
  full = jax.jit(sp.make_train_step(lf, tx))(st.create(params, tx), batch)[1]
  step = jax.jit(sp.make_train_step(lf, tx, microbatches=2))
  state, m = step(st.create(params, tx), batch)
  np.testing.assert_allclose(float(m["loss"]), np.log(2.0), rtol=1e-6)  # policy == reference at the start
  np.testing.assert_allclose(float(m["grad_norm"]), float(full["grad_norm"]), rtol=1e-5)
  for _ in range(3):
    state, m = step(state, batch)
  assert float(m["loss"]) < np.log(2.0) - 1e-3
