"""Rotary embeddings (arXiv 2104.09864) and their scalings against transformers' own rope functions.

Oracles: `transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS` (and LlamaRotaryEmbedding for the default
variant and for cos/sin), HF's `apply_rotary_pos_emb`, the closed-form default frequencies, and the
relative-position property of rotary attention scores.
"""
import os

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

from jaxlab.nn import rope as rope_lib  # noqa: E402
from jaxlab.nn.rope import Rope  # noqa: E402

transformers.logging.set_verbosity_error()

HEAD_DIM, MAX_POS = 32, 64
# rope_parameters dicts as a transformers-5 config.json spells them (rope_theta inside).
VARIANTS = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "default_theta500": {"rope_type": "default", "rope_theta": 500.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "linear_partial": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0, "partial_rotary_factor": 0.5},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 3.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 256},
    "yarn_mscale": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "beta_fast": 16.0,
                    "beta_slow": 2.0, "mscale": 0.707, "mscale_all_dim": 1.0,
                    "original_max_position_embeddings": 128},
    "yarn_attn_factor": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "attention_factor": 0.8,
                         "truncate": False, "original_max_position_embeddings": 64},
}


def _hf_config(params: dict):
  return transformers.LlamaConfig(vocab_size=16, hidden_size=HEAD_DIM * 4, num_attention_heads=4,
                                  head_dim=HEAD_DIM, max_position_embeddings=MAX_POS,
                                  rope_parameters=dict(params))


def _hf_inv_freq(params: dict, seq_len=None):
  cfg = _hf_config(params)
  if params["rope_type"] == "default":
    inv, scale = modeling_llama.LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)
  else:
    inv, scale = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, None, seq_len=seq_len)
  return inv.numpy(), float(scale)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_inv_freq_matches_transformers(name):
  params = VARIANTS[name]
  inv, scale = rope_lib.inv_freq(Rope.from_hf(params), HEAD_DIM, MAX_POS)
  want_inv, want_scale = _hf_inv_freq(params)
  assert inv.shape == want_inv.shape
  np.testing.assert_allclose(np.asarray(inv), want_inv, rtol=2e-6, atol=0)
  assert scale == pytest.approx(want_scale, rel=1e-6)


@pytest.mark.parametrize("seq_len", [10, MAX_POS, 3 * MAX_POS + 5])
def test_dynamic_inv_freq_matches_transformers_at_seq_len(seq_len):
  params = VARIANTS["dynamic"]
  inv, _ = rope_lib.inv_freq(Rope.from_hf(params), HEAD_DIM, MAX_POS, seq_len=seq_len)
  want, _ = _hf_inv_freq(params, seq_len=torch.tensor(seq_len))
  np.testing.assert_allclose(np.asarray(inv), want, rtol=2e-6)
  base, _ = rope_lib.inv_freq(Rope(), HEAD_DIM, MAX_POS)
  if seq_len > MAX_POS:  # actually rescaled: every frequency but the first is lowered
    assert np.all(np.asarray(inv)[1:] < np.asarray(base)[1:] * (1 - 1e-3))
  else:
    np.testing.assert_allclose(np.asarray(inv), np.asarray(base), rtol=1e-6)


def test_default_inv_freq_closed_form():
  inv, scale = rope_lib.inv_freq(Rope(theta=1234.0), HEAD_DIM, MAX_POS)
  want = 1234.0 ** (-np.arange(0, HEAD_DIM, 2, dtype=np.float64) / HEAD_DIM)
  np.testing.assert_allclose(np.asarray(inv), want, rtol=1e-6)
  assert scale == 1.0


def test_llama3_variant_hits_every_band():
  """The llama3 test variant is only a real check if some frequencies are kept, smoothed and divided."""
  p = VARIANTS["llama3"]
  inv, _ = rope_lib.inv_freq(Rope.from_hf(p), HEAD_DIM, MAX_POS)
  base, _ = rope_lib.inv_freq(Rope(theta=p["rope_theta"]), HEAD_DIM, MAX_POS)
  ratio = np.asarray(base) / np.asarray(inv)
  assert np.any(np.isclose(ratio, 1.0)) and np.any(np.isclose(ratio, p["factor"]))
  assert np.any((ratio > 1.01) & (ratio < p["factor"] - 0.01))


@pytest.mark.parametrize("name", ["default", "linear", "llama3", "yarn_mscale"])
def test_cos_sin_and_apply_match_hf(name):
  params = VARIANTS[name]
  cfg = _hf_config(params)
  emb = modeling_llama.LlamaRotaryEmbedding(cfg)
  rng = np.random.RandomState(0)
  pos = np.stack([np.arange(20), rng.randint(0, 500, 20)]).astype(np.int64)
  x = rng.randn(2, 20, 3, HEAD_DIM).astype(np.float32)  # [B, T, H, K]
  cos_t, sin_t = emb(torch.tensor(x), torch.tensor(pos))
  cos, sin = rope_lib.cos_sin(Rope.from_hf(params), HEAD_DIM, MAX_POS, jnp.asarray(pos))
  np.testing.assert_allclose(np.asarray(cos), cos_t.numpy(), atol=2e-5)
  np.testing.assert_allclose(np.asarray(sin), sin_t.numpy(), atol=2e-5)
  xt = torch.tensor(x).transpose(1, 2)  # HF rotates [B, H, T, K]
  want, _ = modeling_llama.apply_rotary_pos_emb(xt, xt, cos_t, sin_t)
  got = rope_lib.apply(jnp.asarray(x), cos, sin)
  np.testing.assert_allclose(np.asarray(got), want.transpose(1, 2).numpy(), atol=5e-5)


def test_partial_rotary_leaves_tail_untouched():
  rope = Rope(partial_rotary_factor=0.5)
  pos = jnp.arange(7)[None]
  cos, sin = rope_lib.cos_sin(rope, HEAD_DIM, MAX_POS, pos)
  assert cos.shape == (1, 7, HEAD_DIM // 2)
  x = jnp.asarray(np.random.RandomState(1).randn(1, 7, 2, HEAD_DIM).astype(np.float32))
  y = rope_lib.apply(x, cos, sin)
  np.testing.assert_array_equal(np.asarray(y[..., HEAD_DIM // 2:]), np.asarray(x[..., HEAD_DIM // 2:]))
  full_cos, full_sin = rope_lib.cos_sin(Rope(), HEAD_DIM // 2, MAX_POS, pos)
  np.testing.assert_allclose(np.asarray(y[..., :HEAD_DIM // 2]),
                             np.asarray(rope_lib.apply(x[..., :HEAD_DIM // 2], full_cos, full_sin)), atol=1e-6)


def test_scores_depend_only_on_relative_position():
  rng = np.random.RandomState(2)
  q = jnp.asarray(rng.randn(1, 1, 1, HEAD_DIM).astype(np.float32))
  k = jnp.asarray(rng.randn(1, 1, 1, HEAD_DIM).astype(np.float32))

  def score(m, n):
    cq, sq = rope_lib.cos_sin(Rope(), HEAD_DIM, MAX_POS, jnp.array([[m]]))
    ck, sk = rope_lib.cos_sin(Rope(), HEAD_DIM, MAX_POS, jnp.array([[n]]))
    return float(jnp.sum(rope_lib.apply(q, cq, sq) * rope_lib.apply(k, ck, sk)))

  for m, n, shift in [(5, 2, 11), (0, 9, 40), (30, 30, 7)]:
    assert score(m, n) == pytest.approx(score(m + shift, n + shift), abs=1e-4)
  assert abs(score(5, 2) - score(5, 3)) > 1e-3
  assert score(4, 4) == pytest.approx(float(jnp.sum(q * k)), abs=1e-4)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_hf_dict_round_trip_and_both_spellings(name):
  params = dict(VARIANTS[name])
  rope = Rope.from_hf(params)
  assert Rope.from_hf(rope.to_hf()) == rope
  assert rope.type == params["rope_type"] and rope.theta == params["rope_theta"]
  old = {("type" if name == "linear" else "rope_type"): params["rope_type"]}
  old.update({k: v for k, v in params.items() if k not in ("rope_type", "rope_theta")})
  assert Rope.from_hf(old, theta=params["rope_theta"]) == rope


def test_unknown_rope_type_raises():
  with pytest.raises(ValueError, match="longrope"):
    Rope.from_hf({"rope_type": "longrope", "factor": 2.0})
