"""Continuous batching (jaxlab.generate.continuous): every request gets the tokens `sample` gives it alone, greedy
and sampled, stop tokens included, while fewer slots than requests are refilled as sequences finish and the ring
index wraps; two programs are compiled whatever the request mix; a ring too small is refused."""
import numpy as np
import pytest

import jax

from jaxlab.generate import continuous
from jaxlab.generate import sample
from jaxlab.models import transformer as tfm

V = 96


@pytest.fixture(scope="module")
def tiny():
  cfg = tfm.Config.tiny(vocab_size=V, init_std=0.2, eos_token_id=None, pad_token_id=0)
  return cfg, tfm.init(cfg, jax.random.key(0))


def _prompts(n, seed=0):
  rs = np.random.RandomState(seed)
  return [rs.randint(1, V, rs.randint(1, 32)).tolist() for _ in range(n)]  # one prompt bucket: 32


def _alone(cfg, params, prompt, n, stop=(), **kw):
  out = sample(params, cfg, [prompt], n, stop_tokens=stop, **kw)
  return np.asarray(out.tokens[0, :int(out.lengths[0])]).tolist()


def test_greedy_requests_equal_their_own_generation(tiny):
  cfg, params = tiny
  prompts, stats = _prompts(12), {}
  got = continuous.generate(params, cfg, prompts, 10, slots=2, stats=stats)
  assert got == [_alone(cfg, params, p, 10) for p in prompts]
  # 12 requests through 2 slots: each slot refilled 5 times, the ring (32 + 10 positions) wrapped around
  assert stats == {"admitted": 12, "steps": 6 * 9} and stats["steps"] > 42


def test_stop_tokens_end_a_request_and_free_its_slot(tiny):
  cfg, params = tiny
  prompts = _prompts(5, seed=1)
  free = [_alone(cfg, params, p, 12) for p in prompts]
  stop = (free[0][3], free[2][5])  # tokens the greedy outputs reach: requests end early, at different steps
  got = continuous.generate(params, cfg, prompts, 12, slots=2, stop_tokens=stop)
  assert got == [_alone(cfg, params, p, 12, stop=stop) for p in prompts]
  assert len(got[0]) <= 4 and len(got[2]) <= 6 and got[0][-1] in stop


def test_sampled_requests_draw_their_own_key_stream(tiny):
  cfg, params = tiny
  prompts, key = _prompts(5, seed=2), jax.random.key(7)
  got = continuous.generate(params, cfg, prompts, 8, slots=2, temperature=0.8, top_k=20, key=key)
  want = [_alone(cfg, params, p, 8, temperature=0.8, top_k=20, key=jax.random.fold_in(key, i))
          for i, p in enumerate(prompts)]
  assert got == want


def test_compiles_one_step_and_one_prefill_per_bucket(tiny):
  cfg, params = tiny
  prompts = [[5] * 3, [7] * 30, [9] * 4, [11] * 20, [13] * 2]  # buckets 32, 32, 32, 32, 32
  continuous._step.clear_cache(), continuous._admit.clear_cache()
  continuous.generate(params, cfg, prompts, 6, slots=2)
  assert continuous._step._cache_size() == 1 and continuous._admit._cache_size() == 1


def test_bad_requests_are_one_line_errors(tiny):
  cfg, params = tiny
  for kw, match in [({"capacity": 20}, "does not fit a ring of 20 positions"), ({"slots": 0}, "must be >= 1"),
                    ({"temperature": 0.5}, "needs a PRNG key")]:
    with pytest.raises(ValueError, match=match) as e:
      continuous.generate(params, cfg, [[1, 2, 3]], 8, **kw)
    assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match="non-empty prompts"):
    continuous.generate(params, cfg, [[1], []], 4)


def test_sharded_params_give_the_same_tokens(tiny):
  from jaxlab import sharding
  cfg, params = tiny
  prompts = _prompts(5, seed=3)
  mesh = sharding.make_mesh("fsdp:4,tensor:2")
  placed = sharding.shard_params(params, mesh, "fsdp_tp", axes=tfm.AXES)
  assert continuous.generate(placed, cfg, prompts, 6, slots=2) == continuous.generate(params, cfg, prompts, 6, slots=2)
