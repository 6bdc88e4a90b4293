"""`sample(..., return_logprobs=True)`: per-token log-probs of the sampled tokens equal a teacher-forced forward
over the sampled sequence under `log_softmax(logits / temperature)`; the completion mask covers `lengths`."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jaxlab.generate import sample
from jaxlab.models import transformer as tfm

V = 64
N = 12
PROMPTS = [[5, 17, 9, 3, 42, 7], [8, 12, 33], [7, 2, 15, 60]]


@pytest.fixture(scope="module")
def tiny():
  cfg = tfm.Config.tiny(vocab_size=V, init_std=0.2, eos_token_id=None, pad_token_id=0)
  return cfg, tfm.init(cfg, jax.random.key(0))


def _teacher_forced(params, cfg, out, temperature):
  b, t = out.prompt_mask.shape
  mask = jnp.concatenate([out.prompt_mask, jnp.ones((b, N), jnp.int32)], axis=1)
  logits = tfm.forward(params, out.sequences, cfg, attention_mask_BT=mask).logits[:, t - 1:-1]
  logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
  return np.asarray(jnp.take_along_axis(logp, out.tokens[..., None], axis=-1)[..., 0])


@pytest.mark.parametrize("temperature,top_k", [(0.0, None), (0.7, None), (1.3, 8)])
def test_logprobs_equal_teacher_forced_forward(tiny, temperature, top_k):
  cfg, params = tiny
  free = np.asarray(sample(params, cfg, PROMPTS, N, temperature=temperature, top_k=top_k,
                           key=jax.random.key(3)).tokens)
  stop = int(free[1][4])  # row 1 stops at or before its 5th token; the others may run on
  out = sample(params, cfg, PROMPTS, N, temperature=temperature, top_k=top_k, key=jax.random.key(3),
               stop_tokens=[stop], return_logprobs=True)
  lengths = np.asarray(out.lengths)
  assert lengths[1] <= 5
  mask = np.asarray(out.completion_mask)
  np.testing.assert_array_equal(mask, np.arange(N)[None, :] < lengths[:, None])
  ref = _teacher_forced(params, cfg, out, temperature if temperature else 1.0)
  lp = np.asarray(out.logprobs)
  np.testing.assert_allclose(lp * mask, ref * mask, atol=1e-5, rtol=1e-5)
  assert np.all(lp[mask == 0] == 0.0) and np.all(lp[mask == 1] <= 0.0)


def test_logprobs_are_off_by_default(tiny):
  cfg, params = tiny
  out = sample(params, cfg, PROMPTS, 4)
  assert out.logprobs is None
  np.testing.assert_array_equal(np.asarray(out.completion_mask), np.ones((3, 4), np.int32))
