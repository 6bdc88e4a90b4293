"""Weight-only int8 / bf16 kernels (jaxlab.generate.quant) against closed forms computed in NumPy from the
stored integers and scales, the plain fp32 forward on the dequantized weights, and a full recompute."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jaxlab.generate import quant, sample
from jaxlab.models import transformer as tfm

PROMPTS = [[5, 17, 99, 3, 42, 7, 64], [8, 120, 33], [77, 2, 15, 90, 61]]


def _dequantized_params(qparams):
  """The fp32 param tree a quantized one approximates (kernels [.., in, out] rebuilt in NumPy)."""
  def deq(x):
    if not isinstance(x, quant.QKernel):
      return x
    w = np.asarray(x.w_OI, np.float32)
    if x.scale_O is not None:
      w = w * np.asarray(x.scale_O)[..., None]
    return jnp.asarray(np.swapaxes(w, -1, -2))
  return jax.tree.map(deq, qparams, is_leaf=lambda x: isinstance(x, quant.QKernel))


def test_int8_kernel_closed_form():
  w = np.random.default_rng(0).normal(0, 0.3, (3, 40, 24)).astype(np.float32)
  w[1, :, 5] = 0.0  # an all-zero output channel must not divide by zero
  qk = quant.quantize_kernel(w, "int8")
  q, scale = np.asarray(qk.w_OI), np.asarray(qk.scale_O)
  assert q.dtype == np.int8 and q.shape == (3, 24, 40) and qk.shape == (3, 40, 24)
  amax = np.abs(w).max(axis=1)
  np.testing.assert_allclose(scale, np.where(amax > 0, amax / 127, 1.0), rtol=1e-6)
  np.testing.assert_array_equal(q, np.clip(np.round(np.swapaxes(w, 1, 2) / scale[..., None]), -127, 127))
  assert np.abs(q).max() == 127
  err = np.abs(np.asarray(qk.dequantize()) - w)
  assert (err <= scale[:, None, :] / 2 + 1e-7).all()


@pytest.mark.parametrize("mode", ["int8", "bf16"])
@pytest.mark.parametrize("reduce_rows", [0, 8])  # 8: rows 1 and 8 take the multiply-reduce path, 40 the dot
@pytest.mark.parametrize("rows", [1, 8, 40])
def test_kernel_matmul_equals_dequantized_product(mode, rows, reduce_rows, monkeypatch):
  monkeypatch.setattr(quant, "REDUCE_ROWS", reduce_rows)
  rng = np.random.default_rng(1)
  w, x = rng.normal(0, 0.3, (64, 48)).astype(np.float32), rng.normal(0, 1, (rows, 64)).astype(np.float32)
  qk = quant.quantize_kernel(w, mode)
  ref = x.astype(np.float64) @ np.asarray(_dequantized_params({"k": qk})["k"], np.float64)
  got = jax.jit(lambda x, k: x @ k)(jnp.asarray(x), qk)
  assert got.shape == (rows, 48) and got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), ref, atol=1e-5, rtol=1e-5)
  if mode == "bf16":
    np.testing.assert_array_equal(np.asarray(qk.w_OI), np.asarray(jnp.asarray(w.T).astype(jnp.bfloat16)))


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def model(request):
  cfg = tfm.Config.tiny(vocab_size=128, init_std=0.2, eos_token_id=None, pad_token_id=0,
                        tie_embeddings=request.param)
  return cfg, tfm.init(cfg, jax.random.key(0))


@pytest.mark.parametrize("mode", ["int8", "bf16"])
def test_forward_equals_fp32_forward_on_dequantized_weights(model, mode):
  cfg, params = model
  q = quant.quantize(params, mode)
  assert "lm_head" in q and isinstance(q["lm_head"]["kernel"], quant.QKernel)
  assert quant.weight_bytes(q) < quant.weight_bytes(params) * (0.6 if mode == "int8" else 0.75)
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 128, (2, 24)), jnp.int32)
  ref = tfm.forward(_dequantized_params(q), tokens, cfg).logits
  for reduce_rows, t in ((0, 24), (0, 3), (8, 3)):  # dense dot (48 and 6 rows), multiply-reduce (6 rows)
    quant.REDUCE_ROWS, saved = reduce_rows, quant.REDUCE_ROWS
    try:
      got = tfm.forward(q, tokens[:, :t], cfg).logits
    finally:
      quant.REDUCE_ROWS = saved
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref[:, :t]), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("mode", ["int8", "bf16"])
def test_quantized_sampling_cached_equals_full_recompute(model, mode):
  cfg, params = model
  q = quant.quantize(params, mode)
  n = 24
  out = sample(params, cfg, PROMPTS, n, weights=mode, return_logits=True)
  t = out.prompt_mask.shape[1]
  mask = jnp.concatenate([out.prompt_mask, jnp.ones((len(PROMPTS), n), jnp.int32)], axis=1)
  full = tfm.forward(_dequantized_params(q), out.sequences, cfg, attention_mask_BT=mask).logits[:, t - 1:-1]
  np.testing.assert_allclose(np.asarray(out.logits), np.asarray(full), atol=5e-5, rtol=1e-4)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(jnp.argmax(full, -1)))
  again = sample(q, cfg, PROMPTS, n)  # pre-quantized params are used as given
  np.testing.assert_array_equal(np.asarray(again.tokens), np.asarray(out.tokens))


def test_modes_are_validated(model):
  cfg, params = model
  assert quant.quantize(params, "fp32") is params
  with pytest.raises(ValueError, match="weights mode"):
    quant.quantize(params, "int4")
  with pytest.raises(ValueError, match="weights must be one of"):
    sample(params, cfg, PROMPTS, 4, weights="fp16")
