"""Shared-prefix KV reuse (jaxlab.generate.prefix): generating after a prefilled prefix equals generating from the
whole prompt, token for token with logits allclose; so does a prefix extended turn by turn, a per-row prefix and a
max_length cap; a prompt that does not extend its prefix is refused."""
import numpy as np
import pytest

import jax

from jaxlab.generate import prefix as prefix_lib
from jaxlab.generate import sample
from jaxlab.models import transformer as tfm

V = 128
N = 12
SYSTEM = [3, 9, 27, 81, 50, 17, 44, 101, 6, 66, 12, 90, 31, 7]


@pytest.fixture(scope="module")
def tiny():
  cfg = tfm.Config.tiny(vocab_size=V, init_std=0.2, eos_token_id=None, pad_token_id=0)
  return cfg, tfm.init(cfg, jax.random.key(0))


def _same(a, b, **kw):
  np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
  np.testing.assert_array_equal(np.asarray(a.lengths), np.asarray(b.lengths))
  np.testing.assert_array_equal(np.asarray(a.sequences), np.asarray(b.sequences))
  np.testing.assert_array_equal(np.asarray(a.prompt_mask), np.asarray(b.prompt_mask))
  np.testing.assert_allclose(np.asarray(a.logits), np.asarray(b.logits), atol=1e-4, rtol=1e-4)


def test_shared_prefix_equals_whole_prompt(tiny):
  cfg, params = tiny
  prompts = [SYSTEM + [5, 17, 99], SYSTEM + [8], SYSTEM + [77, 2, 15, 90, 61, 4]]
  pc = prefix_lib.prefill(params, cfg, SYSTEM)
  cached = sample(params, cfg, prompts, N, prefix=pc, return_logits=True, return_logprobs=True)
  whole = sample(params, cfg, prompts, N, return_logits=True, return_logprobs=True)
  _same(cached, whole)
  np.testing.assert_allclose(np.asarray(cached.logprobs), np.asarray(whole.logprobs), atol=1e-4)


def test_array_prompt_and_max_length(tiny):
  cfg, params = tiny
  rows = [SYSTEM + [5, 17, 99], SYSTEM + [8]]
  t = max(map(len, rows))
  toks = np.array([[0] * (t - len(r)) + r for r in rows], np.int32)
  mask = np.array([[0] * (t - len(r)) + [1] * len(r) for r in rows], np.int32)
  pc = prefix_lib.prefill(params, cfg, SYSTEM)
  kw = dict(prompt_mask=mask, max_length=len(SYSTEM) + 6, return_logits=True)
  cached, whole = sample(params, cfg, toks, N, prefix=pc, **kw), sample(params, cfg, toks, N, **kw)
  _same(cached, whole)
  assert list(np.asarray(cached.lengths)) == [3, 5]


def test_extended_prefix_turn_by_turn(tiny):
  """A conversation: each turn's prompt is the last prompt, its answer and a new message; the prefix grows by
  prefilling only the new tokens, in a cache with room to spare (one compiled program for every turn)."""
  cfg, params = tiny
  prompt, pc = list(SYSTEM) + [5, 6], None
  for turn in range(3):
    if pc is None:
      pc = prefix_lib.prefill(params, cfg, prompt[:-1], capacity=128)
    else:
      pc = prefix_lib.prefill(params, cfg, prompt[:-1], prefix=pc, capacity=128)
    assert pc.capacity == 128
    cached = sample(params, cfg, prompt, N, prefix=pc, return_logits=True)
    whole = sample(params, cfg, prompt, N, return_logits=True)
    _same(cached, whole)
    prompt = prompt + [int(t) for t in np.asarray(whole.tokens[0])] + [11 + turn, 12, 13]


def test_per_row_prefixes(tiny):
  cfg, params = tiny
  heads = [SYSTEM, SYSTEM[:5] + [1, 2]]
  prompts = [heads[0] + [40, 41], heads[1] + [42]]
  pc = prefix_lib.prefill(params, cfg, heads)
  _same(sample(params, cfg, prompts, N, prefix=pc, return_logits=True),
        sample(params, cfg, prompts, N, return_logits=True))


def test_prompt_must_extend_prefix(tiny):
  cfg, params = tiny
  pc = prefix_lib.prefill(params, cfg, SYSTEM)
  with pytest.raises(ValueError, match="must extend its prefix"):
    sample(params, cfg, [SYSTEM[:-1] + [1, 2]], N, prefix=pc)
  with pytest.raises(ValueError, match="must extend its prefix"):
    sample(params, cfg, [SYSTEM], N, prefix=pc)
  with pytest.raises(ValueError, match="default forward"):
    sample(params, cfg, [SYSTEM + [1]], N, prefix=pc, forward_fn=tfm.forward)
