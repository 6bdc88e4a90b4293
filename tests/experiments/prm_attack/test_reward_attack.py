"""experiments.prm_attack.reward_attack: the splice against a brute-force list construction of the reference's layouts, the
relaxed path against the discrete token path, the entropy schedules' closed forms, and an attack that raises a
tiny PRM's reward."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.models import heads, transformer as tfm
from experiments.prm_attack import reward_attack as ra

SEP = 7
K = 3


def _rows():
  rng = np.random.default_rng(0)
  lengths, q = np.array([9, 6, 11]), np.array([3, 2, 4])
  toks = rng.integers(10, 60, size=(3, 11))
  for r in range(3):
    toks[r, q[r] + 1::3] = SEP
    toks[r, lengths[r]:] = 0
  mask = (np.arange(11)[None] < lengths[:, None]).astype(np.int32)
  return toks, mask, q, lengths


def _brute(row, q, adv, position, kind):
  """(spliced tokens, scored step positions, final position) written out case by case."""
  sol_steps = [i for i in range(q, len(row)) if row[i] == SEP]
  if position == "end":
    seq = list(row) + list(adv) + [SEP]
    steps = sol_steps + [len(seq) - 1]
  elif kind == "step":
    seq = list(row[:q]) + list(adv) + [SEP] + list(row[q:]) + [SEP]
    steps = [q + len(adv)] + [i + len(adv) + 1 for i in sol_steps] + [len(seq) - 1]
  else:
    seq = list(row[:q]) + list(adv) + list(row[q:]) + [SEP]
    steps = [i + len(adv) for i in sol_steps] + [len(seq) - 1]
  return seq, steps, len(seq) - 1


@pytest.mark.parametrize("position", ra.POSITIONS)
@pytest.mark.parametrize("kind", heads.KINDS)
def test_splice_matches_the_layouts_written_out(position, kind):
  toks, mask, q, lengths = _rows()
  adv = np.array([61, 62, 63])
  lay = ra.layout(toks, mask, q, K, position, kind, SEP)
  spliced = ra.splice_tokens(toks, adv, SEP, lay)
  for r in range(3):
    seq, steps, last = _brute(toks[r, :lengths[r]], q[r], adv, position, kind)
    assert spliced[r, :len(seq)].tolist() == seq and lay.mask_BS[r].sum() == len(seq)
    assert np.flatnonzero(lay.steps_BS[r]).tolist() == steps and lay.last_B[r] == last


def _prm(kind, seed=0):
  cfg = tfm.Config.tiny()
  lm = tfm.init(cfg, jax.random.key(seed))
  hcfg = heads.Config(kind=kind, d_model=cfg.d_model, init_std=0.3)
  return cfg, lm, hcfg, heads.init(hcfg, jax.random.key(seed + 1))


@pytest.mark.parametrize("position", ra.POSITIONS)
@pytest.mark.parametrize("kind", heads.KINDS)
def test_one_hot_relaxation_equals_the_discrete_tokens(position, kind):
  cfg, lm, hcfg, hp = _prm(kind)
  toks, mask, q, _ = _rows()
  adv = np.array([61, 62, 63])
  table = lm["embed"]["embedding"]
  logits = 1e4 * jax.nn.one_hot(adv, table.shape[0])
  adv_KD = ra.relaxed_embeddings(logits, table, jax.random.key(3), tau=1.0)
  np.testing.assert_array_equal(np.asarray(adv_KD), np.asarray(table[adv]))
  lay = ra.layout(toks, mask, q, K, position, kind, SEP)
  relaxed = ra.rewards(lm, cfg, hp, hcfg, ra.splice_embeddings(jnp.take(table, toks, axis=0), adv_KD, table[SEP],
                                                               lay), lay)
  discrete = ra.discrete_rewards(lm, cfg, hp, hcfg, toks, mask, q, adv, SEP, position)
  np.testing.assert_allclose(np.asarray(relaxed), np.asarray(discrete), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("schedule", ra.SCHEDULES)
def test_entropy_weight_schedules(schedule):
  cfg = ra.Config(steps=11, schedule=schedule, entropy_start=1e-4, entropy_end=0.1)
  w = np.array([float(ra.entropy_weight(cfg, i)) for i in range(11)])
  p = np.arange(11) / 10
  want = {"cosine": 1e-4 + (0.1 - 1e-4) * (1 - np.cos(np.pi * p)) / 2, "linear": 1e-4 + (0.1 - 1e-4) * p,
          "exponential": 1e-4 * 1000.0 ** p, "constant": np.full(11, 1e-4)}[schedule]
  np.testing.assert_allclose(w, want, rtol=1e-5)


@pytest.mark.parametrize("kind", heads.KINDS)
def test_attack_raises_the_reward(kind):
  cfg, lm, hcfg, hp = _prm(kind, seed=2)
  toks, mask, q, _ = _rows()
  res = ra.attack(ra.Config(n_tokens=2, steps=40, lr=0.1), lm, cfg, hp, hcfg, toks, mask, q, SEP)
  assert res.relaxed_BN.shape == (3, 40) and res.tokens_K.shape == (2,)
  assert res.relaxed_BN[:, -5:].mean() > res.relaxed_BN[:, :5].mean()
  best = ra.discrete_rewards(lm, cfg, hp, hcfg, toks, mask, q, res.tokens_K, SEP)
  np.testing.assert_allclose(float(np.mean(best)), res.discrete_BN.mean(0).max(), rtol=1e-5)


def test_bad_rows_are_refused():
  toks, mask, q, _ = _rows()
  with pytest.raises(ValueError, match="right-padded"):
    ra.layout(toks, mask[:, ::-1], q, K, "end", "step", SEP)
  with pytest.raises(ValueError, match="question lengths"):
    ra.layout(toks, mask, q + 20, K, "end", "step", SEP)
  with pytest.raises(ValueError, match="position must be one of"):
    ra.Config(position="start")
