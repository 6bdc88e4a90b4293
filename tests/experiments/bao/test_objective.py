"""experiments.bao.objective: BAO's penalized turn rewards against hand computations on hand-made trajectories, and its
advantages equal to UserRL's (`experiments.bao.turns`, itself checked against a NumPy transcription) on the
hand-penalized rewards."""
import numpy as np
import pytest

from experiments.bao import objective as bao
from experiments.bao import turns


def test_penalized_rewards_by_hand():
  reg = bao.Regularizers(user_weight=0.1, info_penalty=0.2, think_budget=20, think_weight=1.0)
  # three probes without feedback, then a right answer; 30 tokens over a budget of 20: (30 - 20) / 20 = 0.5
  got = bao.penalized_rewards([0, 0, 0, 1], [1, 1, 1, 0], [0, 0, 0, 1], 30, reg)
  np.testing.assert_allclose(got, [-0.1, -0.3, -0.3, 0.5], atol=1e-12)
  # a user turn with feedback breaks the run; a non-user turn too
  flags = bao.info_seeking_flags([1, 1, 1, 0, 1, 1], [0, 1, 0, 0, 0, 0])
  np.testing.assert_array_equal(flags, [0, 0, 0, 0, 0, 1])
  np.testing.assert_array_equal(bao.info_seeking_flags([1, 1, 1], [0, 0, 0]), [0, 1, 1])
  # within budget, no budget, or no regularizer at all: the rewards unchanged
  assert bao.overthinking(20, 20) == 0.0 and bao.overthinking(500, 0) == 0.0
  assert bao.overthinking(45, 30) == pytest.approx(0.5)
  assert bao.penalized_rewards([0, 1], [1, 0], [0, 1], 999, bao.Regularizers()) == [0.0, 1.0]
  assert bao.penalized_rewards([], [], [], 5, reg) == []


def test_advantages_equal_userrl_advantages_of_the_hand_penalized_rewards():
  rng = np.random.default_rng(0)
  reg = bao.Regularizers(user_weight=0.05, info_penalty=0.1, think_budget=12, think_weight=0.5)
  n_turns = [3, 1, 4, 2, 5, 2]
  rewards = [rng.choice([0.0, 0.0, 0.5, 1.0], size=n).tolist() for n in n_turns]
  user = [rng.random(n) < 0.6 for n in n_turns]
  feedback = [np.asarray(r) > 0 for r in rewards]
  lengths = [rng.integers(1, 6, size=n) for n in n_turns]
  tokens = [int(x.sum()) for x in lengths]
  width = max(tokens)
  idx = np.full((len(n_turns), width), -1, np.int32)
  for b, ls in enumerate(lengths):
    idx[b, :tokens[b]] = np.repeat(np.arange(len(ls)), ls)
  mask = (idx >= 0).astype(np.int32)
  groups = np.arange(len(n_turns)) // 3
  hand = []
  for r, u, f, t in zip(rewards, user, feedback, tokens):
    s = [0.0] + [float(u[k] and u[k - 1] and not f[k] and not f[k - 1]) for k in range(1, len(r))]
    p = [r[k] - 0.05 * u[k] - 0.1 * s[k] for k in range(len(r))]
    p[-1] -= 0.5 * max(0, t - 12) / 12
    hand.append(p)
  for credit in (turns.TurnCredit(), turns.TurnCredit(credit="R2G", score="R2G"), turns.TurnCredit(credit="EM")):
    want = turns.turn_advantages(*turns.pad_rewards(hand), idx, mask, groups, credit)
    got = bao.advantages(rewards, user, feedback, tokens, idx, mask, groups, reg, credit)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)
  plain = turns.turn_advantages(*turns.pad_rewards(rewards), idx, mask, groups)
  np.testing.assert_allclose(np.asarray(bao.advantages(rewards, user, feedback, tokens, idx, mask, groups,
                                                       bao.Regularizers())), np.asarray(plain), atol=1e-6)


def test_fewer_user_turns_win_only_under_the_user_penalty():
  # a group of two equally successful trajectories: one asks the user twice, the other never
  rewards, user, feedback = [[0, 0, 1], [0, 0, 1]], [[1, 1, 0], [0, 0, 0]], [[0, 0, 1], [0, 0, 1]]
  idx = np.array([[0, 1, 2], [0, 1, 2]], np.int32)
  mask = np.ones_like(idx)
  grpo = bao.advantages(rewards, user, feedback, [3, 3], idx, mask, [0, 0], bao.Regularizers())
  assert np.all(np.asarray(grpo) == 0)
  adv = np.asarray(bao.advantages(rewards, user, feedback, [3, 3], idx, mask, [0, 0], bao.Regularizers(0.1, 0.1)))
  assert np.all(adv[0] < 0) and np.all(adv[1] > 0)


@pytest.mark.parametrize("kw,match", [(dict(user_weight=-1.0), "user_weight must be >= 0, found -1.0"),
                                      (dict(think_budget=-3), "think_budget must be >= 0 \\(0: off\\), found -3")])
def test_bad_regularizers_are_one_line_errors(kw, match):
  with pytest.raises(ValueError, match=match) as e:
    bao.Regularizers(**kw)
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match="one entry per turn"):
    bao.penalized_rewards([0, 1], [1], [0, 1], 3, bao.Regularizers())
