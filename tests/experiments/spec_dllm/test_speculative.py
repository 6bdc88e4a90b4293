"""experiments.spec_dllm.speculative: in its exact regime it reproduces jaxlab.generate.diffusion token for token
(vanilla and threshold targets, no cache / prefix / dual cache, with inter-block lookahead where that is
exact) with fewer forward evaluations whenever drafts are accepted; "confident" acceptance decodes fully and
commits, token by token, only what the target rule allows (checked by replaying each row's trajectory)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.generate import diffusion
from experiments.spec_dllm import speculative
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


@functools.partial(jax.jit, static_argnums=1)
def _predictions(params, cfg, x_L):
  """(argmax token, its confidence) per position of one state: the logits a state's step decides from."""
  valid = jnp.ones((1, x_L.shape[0]), bool)
  out = mdm.forward(params, x_L[None], cfg, positions_BT=diffusion.positions(valid), attention_mask_BT=valid)
  tok, conf = diffusion.predict(out.logits, cfg.mask_token_id)
  return tok[0], conf[0]


def _replay_confident(params, cfg, prompt, tokens, commits, *, block, threshold, lookahead=1):
  """Replays one row of a "confident" decode (no cache, accept_threshold = threshold) from its output and
  step_commits; returns the tokens committed against the target rule (empty: every token was allowed) and how
  many were drafted.

  Per iteration: from the state's logits, the target's own step (the threshold rule on the current block), then
  the next `commits - that step` positions of the draft ranking (masked window positions, earlier blocks first,
  then stale confidence), holding their stale argmax. A drafted token was accepted from some node of the draft
  tree, a state holding a prefix of that ranking: it is allowed when, under such a state's logits, it is the
  argmax and either has confidence >= threshold or is the threshold rule's own choice in that state's active
  block (its top-1 where nothing crosses the threshold).
  """
  mask, p, eps = cfg.mask_token_id, len(prompt), 1e-5
  x = np.concatenate([prompt, np.full(len(tokens) - p, mask)]).astype(np.int32)
  n_blocks, where, bad, drafted_n = (len(tokens) - p) // block, np.arange(len(tokens)), [], 0
  preds = functools.lru_cache(maxsize=None)(
      lambda state: tuple(map(np.asarray, _predictions(params, cfg, jnp.asarray(np.frombuffer(state, np.int32))))))

  def threshold_step(state, tok, conf, lo, hi):  # the target rule on [lo, hi): >= threshold, else its top-1
    masked = (state == mask) & (where >= lo) & (where < hi)
    top = np.argmax(np.where(masked, conf, -np.inf))
    return masked & ((conf >= threshold) | (where == top))

  def allowed(state, pos, window_end):
    tok, conf = preds(state.tobytes())
    if tok[pos] != tokens[pos]:
      return False
    if conf[pos] >= threshold - eps:
      return True
    active = next(b for b in range(p, window_end, block) if (state[b:b + block] == mask).any())
    return bool(threshold_step(state, tok, conf, active, active + block)[pos])

  for i, row in enumerate(commits.reshape(n_blocks, block + 1)):
    start = p + i * block
    window = min(1 + lookahead, n_blocks - i)
    lo, hi = start, start + window * block
    for c in row[row >= 0]:
      tok, conf = preds(x.tobytes())
      step = threshold_step(x, tok, conf, start, start + block)
      bad += [f"target step at {q}" for q in np.flatnonzero(step) if tok[q] != tokens[q]]
      x1 = np.where(step, tok, x)
      masked1 = (x1 == mask) & (where >= lo) & (where < hi)
      key = np.where(masked1, conf + np.float32(2.0) * (window - (where - lo) // block), -np.inf).astype(np.float32)
      drafted = np.argsort(-key, kind="stable")[:c - step.sum()]
      assert c >= step.sum() and masked1[drafted].all(), (c, step.sum())
      for j, q in enumerate(drafted):
        states = [np.where(np.isin(where, drafted[:m]), tokens, x1) for m in range(j + 1)]
        if tok[q] != tokens[q] or not any(allowed(s, q, hi) for s in states):
          bad.append(f"drafted token {tokens[q]} at {q}")
      drafted_n += len(drafted)
      x = np.where(np.isin(where, drafted), tokens, x1)
    if (x[start:start + block] == mask).any():
      bad.append(f"block {i} left incomplete")
  return bad + ([] if (x == tokens).all() else ["replayed tokens differ from the output"]), drafted_n


def test_confident_mode_commits_only_what_the_target_rule_allows(model):
  cfg, params, prompts = model
  kw = dict(steps=GEN, gen_length=GEN, block_length=6, threshold=0.5)
  fast = diffusion.generate(params, cfg, prompts, **kw)
  got = speculative.generate(params, cfg, prompts, acceptance="confident", **kw)
  toks = np.asarray(got.tokens)
  assert not (toks == cfg.mask_token_id).any()
  assert (got.step_commits.clip(0).sum(1) == GEN).all() and (got.step_commits != 0).all()
  assert got.nfe.mean() <= fast.nfe.mean() and (toks[:, :P] == prompts).all()
  drafted = 0
  for r in range(len(prompts)):
    bad, n = _replay_confident(params, cfg, prompts[r], toks[r], got.step_commits[r], block=6, threshold=0.5)
    assert bad == [], (r, bad)
    drafted += n
  assert drafted > 0  # drafts were accepted, so the check above judged some
  # the replay does fail: a committed token the model never predicts there is caught
  r, q = 0, P + 1
  wrong = toks[r].copy()
  wrong[q] = (wrong[q] + 1) % (cfg.vocab_size - 2)
  assert _replay_confident(params, cfg, prompts[r], wrong, got.step_commits[r], block=6, threshold=0.5)[0]


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
