"""jaxlab.generate.speculative: in its exact regime it reproduces jaxlab.generate.diffusion token for token
(vanilla and threshold targets, no cache / prefix / dual cache, with inter-block lookahead where that is
exact) with fewer forward evaluations whenever drafts are accepted; "confident" acceptance decodes fully."""
import jax
import numpy as np
import pytest

from jaxlab.generate import diffusion, speculative
from jaxlab.models import mdm

GEN, P = 12, 4


@pytest.fixture(scope="module")
def model():
  cfg = mdm.Config(vocab_size=24, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48,
                   max_position_embeddings=64, mask_token_id=23, eos_token_id=22)
  params = mdm.init(cfg, jax.random.key(0))
  # Peaky logits (weights ~0.4 instead of 0.02): confidences spread over (0, 1) and thresholds are crossed.
  params = jax.tree.map(lambda a: a * 20.0 if a.ndim >= 2 else a, params)
  prompts = np.random.RandomState(0).randint(0, 22, (3, P)).astype(np.int32)
  return cfg, params, prompts


EXACT = [  # (steps, block_length, threshold, cache, lookahead)
    (GEN, 6, None, None, 1),
    (GEN // 2, 6, None, None, 0),
    (GEN, 4, 0.5, None, 2),
    (GEN, 6, 0.5, "prefix", 0),
    (GEN, 12, None, "prefix", 0),
    (GEN, 6, 0.5, "dual", 1),  # a dual cache never looks ahead
]


@pytest.mark.parametrize("steps,block,threshold,cache,lookahead", EXACT)
def test_exact_mode_reproduces_the_sampler(model, steps, block, threshold, cache, lookahead):
  cfg, params, prompts = model
  kw = dict(steps=steps, gen_length=GEN, block_length=block, threshold=threshold, cache=cache)
  ref = diffusion.generate(params, cfg, prompts, **kw)
  got = speculative.generate(params, cfg, prompts, acceptance="exact", lookahead=lookahead, **kw)
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(ref.tokens))
  assert (got.nfe <= ref.nfe).all()
  assert (got.step_commits.clip(0).sum(1) == GEN).all()


@pytest.mark.parametrize("cache", [None, "dual"])
def test_kernel_verification_reproduces_the_sampler(model, cache):
  """Verification attention through the Pallas kernel (interpreted on CPU) decodes the same tokens."""
  cfg, params, prompts = model
  kw = dict(steps=GEN, gen_length=GEN, block_length=6, threshold=0.5, cache=cache)
  ref = diffusion.generate(params, cfg, prompts, **kw)
  dense = speculative.generate(params, cfg, prompts, attention="dense", **kw)
  got = speculative.generate(params, cfg, prompts, attention="kernel", **kw)
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(ref.tokens))
  np.testing.assert_array_equal(got.nfe, dense.nfe)


def test_exact_mode_saves_forwards(model):
  cfg, params, prompts = model
  kw = dict(steps=GEN, gen_length=GEN, block_length=6, threshold=0.5)
  ref = diffusion.generate(params, cfg, prompts, **kw)
  got = speculative.generate(params, cfg, prompts, acceptance="exact", **kw)
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(ref.tokens))
  assert got.nfe.sum() < ref.nfe.sum() and got.forwards < ref.forwards
  assert (got.tokens_per_step > ref.tokens_per_step).any()


def test_tree_depth_bounds_the_steps_per_verification(model):
  """One token per step and a single draft node (a chain of depth 1): every verification advances the
  target by at most two steps (its free step plus one accepted draft), so NFE >= target NFE / 2."""
  cfg, params, prompts = model
  kw = dict(steps=GEN, gen_length=GEN, block_length=GEN, threshold=None)
  ref = diffusion.generate(params, cfg, prompts, **kw)
  got = speculative.generate(params, cfg, prompts, acceptance="exact", strata=(0.0,), **kw)
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(ref.tokens))
  assert (got.nfe <= ref.nfe).all() and (got.nfe >= -(-ref.nfe // 2)).all()
  assert (got.step_commits[got.step_commits >= 0] <= 2).all()


def test_confident_mode_commits_only_what_the_target_rule_allows(model):
  cfg, params, prompts = model
  kw = dict(steps=GEN, gen_length=GEN, block_length=6, threshold=0.5)
  fast = diffusion.generate(params, cfg, prompts, **kw)
  got = speculative.generate(params, cfg, prompts, acceptance="confident", **kw)
  toks = np.asarray(got.tokens)
  assert not (toks == cfg.mask_token_id).any()
  assert (got.step_commits.clip(0).sum(1) == GEN).all() and (got.step_commits != 0).all()
  assert got.nfe.mean() <= fast.nfe.mean() and (toks[:, :P] == prompts).all()


def test_validation(model):
  cfg, params, prompts = model
  kw = dict(steps=GEN, gen_length=GEN, block_length=6)
  with pytest.raises(ValueError, match="acceptance"):
    speculative.generate(params, cfg, prompts, acceptance="greedy", **kw)
  with pytest.raises(ValueError, match="strata"):
    speculative.generate(params, cfg, prompts, strata=(0.2, 0.8), **kw)
  with pytest.raises(ValueError, match="lookahead"):
    speculative.generate(params, cfg, prompts, lookahead=-1, **kw)
  with pytest.raises(ValueError, match="attention"):
    speculative.generate(params, cfg, prompts, attention="flash", **kw)
