"""The default decode path of `sample` (split layers, unrolled, one KV cache per layer: `layer_list_forward`)
gives the same tokens as the stacked layer scan over `transformer.forward` it replaced, and its logits and
log-probs to float rounding (XLA may fuse the unrolled layers' elementwise ops differently), across the config
flags that change the forward (GQA, MQA, qk norm, biases, post-norm, sliding window, tied head) and with int8
/ bf16 weights."""
import numpy as np
import pytest

import jax

from jaxlab.generate import quant, sample, sampling
from jaxlab.models import transformer as tfm

PROMPTS = [[5, 17, 99, 3, 42, 7, 64], [8, 120, 33], [77, 2, 15, 90, 61]]
CONFIGS = {
    "gqa": dict(n_kv_heads=2),
    "qwen3": dict(qk_norm="head", qkv_bias=True, tie_embeddings=True),
    "olmo2": dict(qk_norm="full", post_norm=True),
    "window": dict(sliding_window=4, n_kv_heads=1),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_default_path_equals_stacked_scan(name):
  cfg = tfm.Config.tiny(vocab_size=128, init_std=0.2, eos_token_id=None, pad_token_id=0, **CONFIGS[name])
  params = tfm.init(cfg, jax.random.key(1))
  modes = ["fp32", "int8"] if name in ("gqa", "qwen3") else ["fp32"]
  for mode in modes:
    kw = dict(weights=mode, return_logits=True, return_logprobs=True)
    new = sample(params, cfg, PROMPTS, 12, **kw)
    old = sample(params, cfg, PROMPTS, 12, forward_fn=tfm.forward, init_cache_fn=tfm.init_cache, **kw)
    np.testing.assert_array_equal(np.asarray(new.tokens), np.asarray(old.tokens))
    np.testing.assert_allclose(np.asarray(new.logits), np.asarray(old.logits), atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(new.logprobs), np.asarray(old.logprobs), atol=2e-5, rtol=1e-5)


def test_sampled_tokens_equal_and_split_layers_shapes():
  cfg = tfm.Config.tiny(vocab_size=128, init_std=0.2, eos_token_id=None, pad_token_id=0)
  params = quant.quantize(tfm.init(cfg, jax.random.key(2)), "bf16")
  split = sampling.split_layers(params)
  assert len(split["layers"]) == cfg.n_layers
  k0 = split["layers"][1]["attn"]["q"]["kernel"]
  assert isinstance(k0, quant.QKernel) and k0.w_OI.shape == params["layers"]["attn"]["q"]["kernel"].w_OI.shape[1:]
  key = jax.random.key(3)
  new = sample(params, cfg, PROMPTS, 10, temperature=0.8, top_p=0.9, key=key)
  old = sample(params, cfg, PROMPTS, 10, temperature=0.8, top_p=0.9, key=key, forward_fn=tfm.forward,
               init_cache_fn=tfm.init_cache)
  np.testing.assert_array_equal(np.asarray(new.tokens), np.asarray(old.tokens))
