"""Weight-only int8 / bf16 kernels (jaxlab.generate.quant) against closed forms computed in NumPy from the
stored integers, scales and offsets (per output channel and per group, each scheme), GGML-style Q4_1 / Q8_0
blocks reproduced, the plain fp32 forward on the dequantized weights, and a full recompute."""
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
    if x.bits == 4:  # byte k of each 32-input block: input k in the low nibble, k + 16 in the high one
      b = np.asarray(x.w_OI).reshape(*x.w_OI.shape[:-1], -1, 16)
      w = np.concatenate([b & 15, b >> 4], axis=-1).reshape(*x.w_OI.shape[:-1], -1).astype(np.float32)
    if x.scale_OG is not None:
      g = w.shape[-1] // x.scale_OG.shape[-1]
      w = w * np.repeat(np.asarray(x.scale_OG), g, axis=-1)
      if x.zero_OG is not None:
        w = w + np.repeat(np.asarray(x.zero_OG), g, axis=-1)
    return jnp.asarray(np.swapaxes(w, -1, -2))
  return jax.tree.map(deq, qparams, is_leaf=lambda x: isinstance(x, quant.QKernel))


def test_int8_kernel_closed_form():
  w = np.random.default_rng(0).normal(0, 0.3, (3, 40, 24)).astype(np.float32)
  w[1, :, 5] = 0.0  # an all-zero output channel must not divide by zero
  qk = quant.quantize_kernel(w, "int8")
  q, scale = np.asarray(qk.w_OI), np.asarray(qk.scale_OG)[..., 0]
  assert q.dtype == np.int8 and q.shape == (3, 24, 40) and qk.shape == (3, 40, 24) and qk.group == 40
  amax = np.abs(w).max(axis=1)
  np.testing.assert_allclose(scale, np.where(amax > 0, amax / 127, 1.0), rtol=1e-6)
  np.testing.assert_array_equal(q, np.clip(np.round(np.swapaxes(w, 1, 2) / scale[..., None]), -127, 127))
  assert np.abs(q).max() == 127
  err = np.abs(np.asarray(qk.dequantize()) - w)
  assert (err <= scale[:, None, :] / 2 + 1e-7).all()


def _numpy_groups(w_IO, group, scheme):
  """NumPy oracle: (q [O, I], scale [O, G], zero [O, G] or None) of quantize_kernel(w, "int8", group, scheme)."""
  w = w_IO.T.astype(np.float64).reshape(w_IO.shape[1], -1, group)
  amax = np.abs(w).max(-1)
  s_sym = np.where(amax > 0, amax / 127, 1.0)
  q_sym = np.clip(np.round(w / s_sym[..., None]), -127, 127)
  lo, hi = w.min(-1), w.max(-1)
  s_asym = np.where(hi > lo, (hi - lo) / 255, 1.0)
  q_asym = np.clip(np.round((w - lo[..., None]) / s_asym[..., None]), 0, 255)
  if scheme == "sym":
    return q_sym.reshape(w_IO.T.shape), s_sym, None
  if scheme == "best":
    err_sym = ((q_sym * s_sym[..., None] - w) ** 2).sum(-1)
    sym = err_sym < ((q_asym * s_asym[..., None] + lo[..., None] - w) ** 2).sum(-1)
    q_asym = np.where(sym[..., None], q_sym + 128, q_asym)
    s_asym, lo = np.where(sym, s_sym, s_asym), np.where(sym, -128 * s_sym, lo)
  return q_asym.reshape(w_IO.T.shape), s_asym, lo


@pytest.mark.parametrize("scheme", quant.SCHEMES)
@pytest.mark.parametrize("group", [8, 32])
def test_int8_groups_closed_form(group, scheme):
  rng = np.random.default_rng(3)
  w = (rng.normal(0, 0.3, (64, 24)) + rng.normal(0, 0.2, (1, 24))).astype(np.float32)  # offsets: asym helps
  w[:, 7] = 0.0
  qk = quant.quantize_kernel(w, "int8", group=group, scheme=scheme)
  q_ref, s_ref, z_ref = _numpy_groups(w, group, scheme)
  assert qk.group == group and qk.scale_OG.shape == (24, 64 // group)
  assert qk.w_OI.dtype == (np.int8 if scheme == "sym" else np.uint8)
  np.testing.assert_allclose(np.asarray(qk.scale_OG), s_ref, rtol=1e-6)
  assert (z_ref is None) == (qk.zero_OG is None)
  if z_ref is not None:
    np.testing.assert_allclose(np.asarray(qk.zero_OG), z_ref, rtol=1e-6, atol=1e-7)
  # Rounding can land on the other side of a .5 in float32: at most one level apart, and rarely.
  diff = np.abs(np.asarray(qk.w_OI, np.int32) - q_ref)
  assert diff.max() <= 1 and (diff > 0).mean() < 0.01
  err = np.abs(np.asarray(qk.dequantize()) - w)
  assert (err <= np.repeat(np.asarray(qk.scale_OG), group, axis=1).T / 2 + 1e-6).all()
  sym_err = np.abs(np.asarray(quant.quantize_kernel(w, "int8", group=group, scheme="sym").dequantize()) - w)
  if scheme != "sym":  # min-max and the per-group best are no worse than absmax here (squared error)
    assert (err ** 2).sum() <= (sym_err ** 2).sum() + 1e-9


def test_int8_best_reproduces_ggml_blocks():
  """Blocks of 32 inputs as GGML stores them: Q4_1 (d * q + m, q in 0..15) and Q8_0 (d * q, |q| <= 127)."""
  rng = np.random.default_rng(4)
  d = rng.uniform(0.01, 0.02, (16, 2))
  q4 = rng.integers(0, 16, (16, 2, 32))
  q4[..., 0], q4[..., 1] = 0, 15  # the block's min and max are on the grid, as Q4_1's min-max fit makes them
  q8 = rng.integers(-127, 128, (16, 2, 32))
  q8[..., 0] = 127
  for w_OGJ in (d[..., None] * q4 + rng.uniform(-0.1, 0.0, (16, 2, 1)), d[..., None] * q8):
    w = w_OGJ.reshape(16, 64).T.astype(np.float32)
    err = np.abs(np.asarray(quant.quantize_kernel(w, "int8", group=32, scheme="best").dequantize()) - w)
    assert err.max() < 4 * np.finfo(np.float32).eps * np.abs(w).max()


@pytest.mark.parametrize("mode", ["int8", "bf16"])
@pytest.mark.parametrize("reduce_rows", [0, 8])  # 8: rows 1 and 8 take the multiply-reduce path, 40 the dot
@pytest.mark.parametrize("rows", [1, 8, 40])
def test_kernel_matmul_equals_dequantized_product(mode, rows, reduce_rows, monkeypatch):
  monkeypatch.setattr(quant, "REDUCE_ROWS", reduce_rows)
  rng = np.random.default_rng(1)
  w, x = rng.normal(0, 0.3, (64, 48)).astype(np.float32), rng.normal(0, 1, (rows, 64)).astype(np.float32)
  for group, scheme in ((0, "sym"), (16, "sym"), (16, "asym"), (32, "best")):
    qk = quant.quantize_kernel(w, mode, group=group, scheme=scheme)
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


@pytest.mark.parametrize("mode", ["int8", "int4", "bf16"])
def test_forward_equals_fp32_forward_on_dequantized_weights(model, mode):
  cfg, params = model
  q = quant.quantize(params, mode)
  assert "lm_head" in q and isinstance(q["lm_head"]["kernel"], quant.QKernel)
  assert quant.weight_bytes(q) < quant.weight_bytes(params) * {"int8": 0.6, "int4": 0.5, "bf16": 0.75}[mode]
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 128, (2, 24)), jnp.int32)
  ref = tfm.forward(_dequantized_params(q), tokens, cfg).logits
  for reduce_rows, t in ((0, 24), (0, 3), (8, 3)):  # dense dot (48 and 6 rows), multiply-reduce (6 rows)
    quant.REDUCE_ROWS, saved = reduce_rows, quant.REDUCE_ROWS
    try:
      got = tfm.forward(q, tokens[:, :t], cfg).logits
    finally:
      quant.REDUCE_ROWS = saved
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref[:, :t]), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("mode", ["int8", "int4", "bf16"])
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
    quant.quantize(params, "int3")
  with pytest.raises(ValueError, match="int4 groups"):
    quant.quantize(params, "int4", group=16)
  with pytest.raises(ValueError, match="weights must be one of"):
    sample(params, cfg, PROMPTS, 4, weights="fp16")


def test_head_options_and_per_kernel_group_fallback(model):
  cfg, params = model  # d_model 64 (groups of 32 fit), d_ff 176 (they do not: the down kernel gets row scales)
  q = quant.quantize(params, "int8", group=32, scheme="sym")
  assert q["layers"]["attn"]["q"]["kernel"].group == 32 and q["layers"]["mlp"]["down"]["kernel"].group == 176
  keep = quant.quantize(params, "int8", head="fp32")
  if cfg.tie_embeddings:
    assert "lm_head" not in keep
  else:
    assert not isinstance(keep["lm_head"]["kernel"], quant.QKernel)
    np.testing.assert_array_equal(np.asarray(keep["lm_head"]["kernel"]), np.asarray(params["lm_head"]["kernel"]))
  half = quant.quantize(params, "int8", head="bf16")["lm_head"]["kernel"]
  assert half.w_OI.dtype == jnp.bfloat16 and half.scale_OG is None
  tokens = jnp.asarray(np.random.default_rng(5).integers(0, 128, (2, 9)), jnp.int32)
  for qp in (keep, quant.quantize(params, "int8", head="bf16")):
    ref = tfm.forward(_dequantized_params(qp), tokens, cfg).logits
    np.testing.assert_allclose(np.asarray(tfm.forward(qp, tokens, cfg).logits), np.asarray(ref), atol=2e-5, rtol=1e-4)
  with pytest.raises(ValueError, match="scheme must be one of"):
    quant.quantize(params, "int8", scheme="nf4")


def test_int4_closed_form_packing_and_q4_1_blocks():
  rng = np.random.default_rng(6)
  w = rng.normal(0, 0.3, (64, 24)).astype(np.float32)
  qk = quant.quantize_kernel(w, "int4", group=32)
  assert qk.bits == 4 and qk.w_OI.dtype == jnp.uint8 and qk.w_OI.shape == (24, 32) and qk.shape == (64, 24)
  w_OGJ = w.T.reshape(24, 2, 32)
  lo, hi = w_OGJ.min(-1), w_OGJ.max(-1)
  s = (hi - lo) / 15
  q = np.clip(np.round((w_OGJ - lo[..., None]) / s[..., None]), 0, 15)
  np.testing.assert_allclose(np.asarray(qk.scale_OG), s, rtol=1e-6)
  b = np.asarray(qk.w_OI).reshape(24, 2, 16)
  np.testing.assert_array_equal(np.concatenate([b & 15, b >> 4], axis=-1), q)  # codes in Q4_1's byte order
  np.testing.assert_allclose(np.asarray(_dequantized_params({"k": qk})["k"]).T.reshape(24, 2, 32),
                             q * s[..., None] + lo[..., None], atol=1e-6)
  np.testing.assert_allclose(np.asarray(qk.dequantize()), np.asarray(_dequantized_params({"k": qk})["k"]), rtol=1e-6)
  d = rng.uniform(0.01, 0.02, (16, 2))  # a Q4_1 block: 16 levels from its min; int4 gets it back to float rounding
  q4 = rng.integers(0, 16, (16, 2, 32))
  q4[..., 0], q4[..., 1] = 0, 15
  w_q4 = (d[..., None] * q4 + rng.uniform(-0.1, 0.0, (16, 2, 1))).reshape(16, 64).T.astype(np.float32)
  err = np.abs(np.asarray(quant.quantize_kernel(w_q4, "int4", group=32).dequantize()) - w_q4)
  assert err.max() < 4 * np.finfo(np.float32).eps * np.abs(w_q4).max()


@pytest.mark.parametrize("rows", [1, 8, 40])  # 1 and 8 rows: the CPU kernel; 40: the dequantized dot
def test_int4_matmul_and_tree(model, rows):
  rng = np.random.default_rng(7)
  w, x = rng.normal(0, 0.3, (64, 48)).astype(np.float32), rng.normal(0, 1, (rows, 64)).astype(np.float32)
  for group in (32, 64):
    qk = quant.quantize_kernel(w, "int4", group=group)
    ref = x.astype(np.float64) @ np.asarray(_dequantized_params({"k": qk})["k"], np.float64)
    np.testing.assert_allclose(np.asarray(jax.jit(lambda x, k: x @ k)(jnp.asarray(x), qk)), ref, atol=1e-5, rtol=1e-5)
  cfg, params = model  # d_ff 176: the down kernel's inputs are no 32-blocks, so it is int8
  q = quant.quantize(params, "int4")
  assert q["layers"]["attn"]["q"]["kernel"].bits == 4 and q["layers"]["mlp"]["down"]["kernel"].bits == 8
  assert q["lm_head"]["kernel"].bits == 8 and q["lm_head"]["kernel"].group == 32  # quant.INT4's head: int8
