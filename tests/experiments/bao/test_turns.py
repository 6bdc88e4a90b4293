"""Turn-level credit against a NumPy transcription of UserRL's definitions, on random trajectories.

The oracle below is written from SalesforceAIResearch/UserRL, verl/trainer/ppo/core_algos.py:
`compute_turn_credits` (credit and score modes) and `compute_grpo_multiturn_advantage` (tokens, group
baseline, rescaling), looping over trajectories and tokens as the reference does, in float64.
"""
import math
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.bao import turns


def ref_turn_credits(rewards, gamma, credit, score):
  if score == "R2G":
    s = 0.0
    for i, r in enumerate(rewards[::-1]):
      s = r if i == 0 else r + gamma * s
  else:
    s = round(sum(rewards) / len(rewards), 4) if rewards else 0.0
  if credit == "Equalized":
    c = [1.0 for _ in rewards]
  elif credit == "R2G":
    c = [0.0] * len(rewards)
    for i, r in enumerate(rewards[::-1]):
      c[i] = r if i == 0 else r + gamma * c[i - 1]
    c = c[::-1]
  else:
    c = [round(0.5 + 0.5 * (1 - math.exp(-2.0 * r)) / (1 - math.exp(-2.0)), 4) for r in rewards]
  return c, s


def ref_advantages(histories, boundaries, mask, index, gamma, credit, score, by_std, eps=1e-6):
  bsz, seq_len = mask.shape
  adv = np.zeros((bsz, seq_len))
  scores = []
  for b in range(bsz):
    c, s = ref_turn_credits(histories[b], gamma, credit, score)
    scores.append(s)
    starts = list(np.where(boundaries[b] == 1)[0]) or [0]
    starts.append(seq_len)
    for t in range(len(starts) - 1):
      if t < len(c):
        adv[b, starts[t]:starts[t + 1]] = c[t]
  adv = adv * mask
  by_group = defaultdict(list)
  for i in range(bsz):
    by_group[index[i]].append(scores[i])
  mean = {g: (0.0 if len(v) == 1 else np.mean(v)) for g, v in by_group.items()}
  std = {g: (1.0 if len(v) == 1 else np.std(v, ddof=1)) for g, v in by_group.items()}
  for b in range(bsz):
    g = index[b]
    f = (scores[b] - mean[g]) / (std[g] + eps) if by_std else scores[b] - mean[g]
    total = adv[b].sum()
    adv[b] = adv[b] * (f * np.count_nonzero(adv[b]) / total) if total != 0 else 0.0
  return adv, np.asarray(scores)


def random_batch(rng, bsz=24, max_turns=15, seq_len=96, grid=True):
  """Trajectories of 0..max_turns turns; each turn a response span then an observation span (masked out),
  a few prompt tokens before the first turn; prompt-major groups of 4 plus two singleton groups."""
  n_turns = rng.integers(0, max_turns + 1, size=bsz)
  n_turns[:3] = [0, 1, max_turns]
  histories = [list(rng.integers(0, 11, size=n) / 10.0) if grid else list(rng.random(n)) for n in n_turns]
  histories[4] = histories[5] = histories[6] = histories[7] = [0.0, 0.5, 1.0]  # a group of equal scores
  boundaries = np.zeros((bsz, seq_len), np.int32)
  mask = np.zeros((bsz, seq_len), np.float32)
  for b, n in enumerate(n_turns):
    pos = int(rng.integers(0, 4))
    for _ in range(n):
      if pos >= seq_len:
        break
      boundaries[b, pos] = 1
      resp = int(rng.integers(1, 5))
      mask[b, pos:pos + resp] = 1
      pos += resp + int(rng.integers(0, 3))
  index = list(np.arange(bsz - 2) // 4) + [100, 101]
  return histories, boundaries, mask, np.asarray(index)


@pytest.mark.parametrize("credit", turns.CREDITS)
@pytest.mark.parametrize("score", turns.SCORES)
@pytest.mark.parametrize("by_std", [True, False])
def test_advantages_match_the_reference_transcription(credit, score, by_std):
  rng = np.random.default_rng([turns.CREDITS.index(credit), turns.SCORES.index(score), int(by_std)])
  histories, boundaries, mask, index = random_batch(rng)
  cfg = turns.TurnCredit(credit=credit, score=score, scale_by_std=by_std)
  want, want_scores = ref_advantages(histories, boundaries, mask, index, 0.8, credit, score, by_std)
  rewards, n = turns.pad_rewards(histories, width=15)
  credits, scores = turns.turn_credits(rewards, n, cfg)
  np.testing.assert_allclose(scores, want_scores, atol=1e-6)
  for b, h in enumerate(histories):
    np.testing.assert_allclose(credits[b, :len(h)], ref_turn_credits(h, 0.8, credit, score)[0], atol=1e-6)
    assert np.all(np.asarray(credits[b, len(h):]) == 0)
  fn = jax.jit(lambda *a: turns.turn_advantages(*a, cfg))
  got = fn(rewards, n, turns.turn_index_from_boundaries(boundaries), mask, index)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert np.all(np.asarray(got)[mask == 0] == 0) and np.all(np.asarray(got)[4:8] == 0)
  assert np.abs(want).max() > 0.1  # the batch exercises non-trivial advantages


@pytest.mark.parametrize("credit", ["R2G", "Equalized"])
def test_unrounded_modes_on_continuous_rewards_and_other_gamma(credit):
  rng = np.random.default_rng(7)
  histories, boundaries, mask, index = random_batch(rng, grid=False)
  cfg = turns.TurnCredit(gamma=0.6, credit=credit, score="R2G")
  want, _ = ref_advantages(histories, boundaries, mask, index, 0.6, credit, "R2G", True)
  rewards, n = turns.pad_rewards(histories)
  got = turns.turn_advantages(rewards, n, turns.turn_index_from_boundaries(boundaries), mask, index, cfg)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_group_of_one_keeps_its_score_and_equal_scores_give_zero():
  f = turns.group_normalize(jnp.array([0.7, 0.3, 0.3, 0.3, 0.2, 0.6]), jnp.array([5, 1, 1, 1, 2, 2]))
  np.testing.assert_allclose(f[0], 0.7 / (1 + 1e-6), rtol=1e-6)
  np.testing.assert_array_equal(f[1:4], 0.0)
  np.testing.assert_allclose(f[4:], [-0.2 / (np.sqrt(0.08) + 1e-6), 0.2 / (np.sqrt(0.08) + 1e-6)], rtol=1e-5)


def test_token_index_edges():
  idx = turns.turn_index_from_boundaries(jnp.array([[0, 1, 0, 1, 0], [0, 0, 0, 0, 0]]))
  np.testing.assert_array_equal(idx, [[-1, 0, 0, 1, 1], [0, 0, 0, 0, 0]])
  tok = turns.token_credits(jnp.array([[2.0, 3.0], [5.0, 0.0]]), jnp.array([[-1, 0, 1, 2, 1], [0, 0, 1, 0, 0]]),
                            jnp.array([[1, 1, 1, 1, 0], [1, 0, 1, 1, 1]]))
  np.testing.assert_array_equal(tok, [[0, 2, 3, 0, 0], [5, 0, 0, 5, 5]])


def test_bad_modes_and_shapes_are_refused():
  with pytest.raises(ValueError, match="credit must be one of"):
    turns.TurnCredit(credit="equalized")
  with pytest.raises(ValueError, match="score must be one of"):
    turns.TurnCredit(score="Mean")
  with pytest.raises(ValueError, match="width must be >= the longest trajectory"):
    turns.pad_rewards([[1.0, 0.0, 1.0]], width=2)
  with pytest.raises(ValueError, match=r"turn_index and mask must be \[B, L\]"):
    turns.turn_advantages(np.zeros((2, 3)), np.array([1, 1]), np.zeros((2, 4), int), np.ones((2, 5)), [0, 0])
  assert set(turns.PRESETS) == {"equalized-sum", "equalized-r2g", "r2g-sum", "r2g-r2g", "em-sum", "em-r2g"}
