"""Group advantages against NumPy, rollouts (G samples per prompt in one batch, stop strings cut on decoded text,
log-probs equal to a teacher-forced forward), and GRPO's first update equal to the policy-gradient estimator on
a tiny model."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jaxlab import losses
from jaxlab.models import transformer as tfm
from jaxlab.rl import GRPOConfig, as_batch, group_advantages, sample_rollout, truncate_at_stop_strings
from jaxlab.rl.rollout import PromptCycle

V = 32


@pytest.fixture(scope="module")
def tiny():
  cfg = tfm.Config.tiny(vocab_size=V, d_model=32, n_heads=2, n_kv_heads=1, d_ff=64, init_std=0.3,
                        eos_token_id=None, pad_token_id=0)
  return cfg, tfm.init(cfg, jax.random.key(0))


def decode(tokens):
  return "".join(chr(ord("a") + t % 26) for t in tokens)


def test_group_advantages_match_numpy():
  r = np.random.default_rng(0).normal(size=12).astype(np.float32)
  g = r.reshape(3, 4)
  want = (g - g.mean(1, keepdims=True)) / (g.std(1, ddof=1, keepdims=True) + 1e-4)
  np.testing.assert_allclose(np.asarray(group_advantages(r, 4)), want.reshape(-1), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(group_advantages(r, 4, "none")), (g - g.mean(1, keepdims=True)).reshape(-1),
                             rtol=1e-5, atol=1e-7)
  np.testing.assert_array_equal(np.asarray(group_advantages(np.ones(4), 2)), np.zeros(4))  # no signal, no update
  with pytest.raises(ValueError):
    group_advantages(r, 5)
  with pytest.raises(ValueError, match="group_size"):
    GRPOConfig(group_size=1)
  with pytest.raises(ValueError, match="aggregation"):
    GRPOConfig(aggregation="mean")


def test_stop_strings_cut_at_the_completing_token():
  tokens = np.array([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 0, 0]])  # "abcdef", "hijk"
  mask = np.array([[1] * 6, [1, 1, 1, 1, 0, 0]])
  logp = -np.ones((2, 6), np.float32) * mask
  t, m, lp = truncate_at_stop_strings(tokens, mask, logp, decode, ["cd", "zz"], pad_id=0)
  np.testing.assert_array_equal(m, [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0]])
  np.testing.assert_array_equal(t[0], [0, 1, 2, 3, 0, 0])
  np.testing.assert_array_equal(lp[0], [-1, -1, -1, -1, 0, 0])


def test_rollout_samples_groups_in_one_batch_with_teacher_forced_logprobs(tiny):
  cfg, params = tiny
  prompts = [[3, 4, 5, 6], [7, 8]]
  ro = sample_rollout(params, cfg, prompts, [{"id": 0}, {"id": 1}], group_size=4, max_new_tokens=10,
                      key=jax.random.key(1), temperature=1.0, stop_strings=["e"], decode=decode)
  assert ro.tokens.shape == (8, 10) and ro.prompt.shape == (8, 4)
  assert [e["id"] for e in ro.examples] == [0] * 4 + [1] * 4
  np.testing.assert_array_equal(ro.prompt[4:, 2:], [[7, 8]] * 4)
  assert len({tuple(r) for r in ro.tokens[:4].tolist()}) > 1  # the group's samples differ
  for text, m in zip(ro.texts, ro.completion_mask):
    assert text.count("e") <= 1 and ("e" not in text or text.endswith("e")) and len(text) == m.sum()
  logp, _ = losses.completion_logprobs(params, cfg, jnp.asarray(ro.prompt), jnp.asarray(ro.prompt_mask),
                                       jnp.asarray(ro.tokens), 1.0)
  np.testing.assert_allclose(ro.logp, np.asarray(logp) * ro.completion_mask, atol=1e-5)


def test_continuous_rollout_rows_are_their_own_samples_with_teacher_forced_logprobs(tiny):
  """With slots < B each row is what `sample` draws for it alone from `fold_in(key, row)`, stop tokens and
  strings applied, and its log-probs are a teacher-forced forward's (0 outside the completion)."""
  cfg, params = tiny
  prompts, key = [[3, 4, 5, 6], [7, 8], [9]], jax.random.key(2)
  ro = sample_rollout(params, cfg, prompts, [{"id": i} for i in range(3)], group_size=4, max_new_tokens=12,
                      key=key, temperature=0.9, stop_tokens=(5,), stop_strings=["k"], decode=decode, slots=3)
  assert ro.tokens.shape == (12, 12) and ro.prompt.shape[0] == 12
  for i, prompt in enumerate([p for p in prompts for _ in range(4)]):
    alone = sample_rollout(params, cfg, [prompt], [{}], group_size=1, max_new_tokens=12, key=jax.random.fold_in(key, i),
                           temperature=0.9, stop_tokens=(5,), stop_strings=["k"], decode=decode)
    n = int(alone.completion_mask[0].sum())
    assert ro.texts[i] == alone.texts[0] and int(ro.completion_mask[i].sum()) == n
    np.testing.assert_array_equal(ro.tokens[i, :n], alone.tokens[0, :n])
    np.testing.assert_allclose(ro.logp[i, :n], alone.logp[0, :n], atol=1e-5)
    assert ro.prompt[i][ro.prompt_mask[i] > 0].tolist() == prompt
  assert len(set(ro.texts[:4])) > 1 and min(ro.completion_mask.sum(1)) < 12  # samples differ, some stop early
  logp, _ = losses.completion_logprobs(params, cfg, jnp.asarray(ro.prompt), jnp.asarray(ro.prompt_mask),
                                       jnp.asarray(ro.tokens), 0.9)
  np.testing.assert_allclose(ro.logp, np.asarray(logp) * ro.completion_mask, atol=1e-5)
  with pytest.raises(ValueError, match="take only weights= of the sample arguments, found \\['forward_fn'\\]"):
    sample_rollout(params, cfg, prompts, [{}] * 3, group_size=2, max_new_tokens=4, key=key, slots=2, forward_fn=None)
  with pytest.raises(ValueError, match="rollout_slots must be >= 0"):
    GRPOConfig(rollout_slots=-1)


def test_first_unclipped_update_is_the_policy_gradient(tiny):
  cfg, params = tiny
  ro = sample_rollout(params, cfg, [[3, 4, 5], [9, 2, 1]], [{}, {}], group_size=3, max_new_tokens=6,
                      key=jax.random.key(2), temperature=0.7, stop_tokens=[5])
  adv = group_advantages(np.arange(6, dtype=np.float32) % 4, 3)
  batch = as_batch(ro, adv)

  def grpo(p, rule):
    s, w, _ = losses.grpo_loss_fn(cfg, aggregation=rule, max_len=6, temperature=0.7, clip_low=0.2,
                               clip_high=0.28)(p, batch, None)
    return s / w

  def reinforce(p, rule):
    logp, _ = losses.completion_logprobs(p, cfg, batch["prompt"], batch["prompt_mask"], batch["tokens"], 0.7)
    s, w = losses.aggregate(-jnp.asarray(adv)[:, None] * logp, batch["completion_mask"], rule, 6)
    return s / w
  grads = jax.jit(lambda p: {r: (jax.grad(grpo)(p, r), jax.grad(reinforce)(p, r)) for r in losses.AGGREGATIONS})
  for rule, (g1, g2) in grads(params).items():
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=1e-4 * float(np.abs(b).max()) + 1e-9,
                                 err_msg=rule)


def test_prompt_cycle_positions():
  src = PromptCycle([{"prompt": [i + 1]} for i in range(3)], 2)
  assert src.prompts(next(src)) == [[1], [2]]
  state = src.get_state()
  assert src.prompts(next(src)) == [[3], [1]]
  src.set_state(state)
  assert src.prompts(next(src)) == [[3], [1]]
