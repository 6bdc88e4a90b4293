"""Properties of the decoder LM (jaxlab.models.transformer) that need no reference implementation.

Oracles: full recomputation (for cached decoding), gradients (causality), eager execution (jit), params stacked
in program order (layer programs), the residual-stream identity (captures), NumPy (interventions).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.models import transformer as tfm

BASE = tfm.Config.tiny(vocab_size=128, d_ff=96, init_std=0.15)
CONFIGS = {
    "llama": BASE,
    "window": BASE.replace(sliding_window=3),
    "olmo2": BASE.replace(post_norm=True, qk_norm="full"),
    "qwen3": BASE.replace(qk_norm="head", head_dim=24, qkv_bias=True),
}
forward = jax.jit(tfm.forward, static_argnames=("cfg", "program", "capture", "intervention"))


@functools.lru_cache(maxsize=None)
def _params(cfg, seed=0):
  """Random params shaped like init(): matrices N(0, init_std), norm scales near 1, nonzero biases."""
  shapes = jax.eval_shape(lambda: tfm.init(cfg, jax.random.key(0)))
  rng = np.random.RandomState(seed)

  def fill(path, leaf):
    name = jax.tree_util.keystr(path)
    z = rng.standard_normal(leaf.shape)
    val = 1.0 + 0.3 * z if "norm" in name else (0.1 if "bias" in name else cfg.init_std) * z
    return jnp.asarray(val, leaf.dtype)

  return jax.tree_util.tree_map_with_path(fill, shapes)


def _tokens(b, t, seed=0):
  return np.random.RandomState(seed).randint(0, BASE.vocab_size, (b, t)).astype(np.int32)


def _decode(params, cfg, toks, mask, prefill, program=None):
  """Prefill `prefill` tokens into a fresh cache, then feed the rest one at a time; logits [B, T, V]."""
  b, t = toks.shape
  cache = tfm.init_cache(cfg, b, t, program=program)
  out = forward(params, toks[:, :prefill], cfg=cfg, attention_mask_BT=mask[:, :prefill], cache=cache,
                program=program)
  logits = [out.logits]
  for i in range(prefill, t):
    out = forward(params, toks[:, i:i + 1], cfg=cfg, attention_mask_BT=mask[:, i:i + 1], cache=out.cache,
                  program=program)
    logits.append(out.logits)
  assert int(out.cache["index"]) == t
  return np.concatenate([np.asarray(x) for x in logits], axis=1)


@pytest.mark.parametrize("name", ["llama", "window", "olmo2"])
def test_cached_decoding_equals_full_recompute(name):
  cfg = CONFIGS[name]
  params = _params(cfg)
  toks = _tokens(2, 10, seed=1)
  mask = np.ones_like(toks)
  mask[1, :3] = 0  # left padding in the prompt
  full = np.asarray(forward(params, toks, cfg=cfg, attention_mask_BT=mask).logits)
  got = _decode(params, cfg, toks, mask, prefill=5)
  real = mask.astype(bool)
  np.testing.assert_allclose(got[real], full[real], atol=2e-5, rtol=0)


def test_cached_decoding_with_repeating_program():
  cfg, program = BASE, (0, 1, 1, 0)
  params = _params(cfg)
  toks = _tokens(2, 9, seed=2)
  mask = np.ones_like(toks)
  full = np.asarray(forward(params, toks, cfg=cfg, program=program).logits)
  np.testing.assert_allclose(_decode(params, cfg, toks, mask, prefill=4, program=program), full, atol=2e-5)
  with pytest.raises(ValueError, match="slots"):
    forward(params, toks, cfg=cfg, program=program, cache=tfm.init_cache(cfg, 2, 9))


@pytest.mark.parametrize("causal", [True, False])
def test_causality_through_gradients(causal):
  cfg = CONFIGS["olmo2"].replace(causal=causal)
  params = _params(cfg)
  t = 7
  emb = jax.random.normal(jax.random.key(3), (1, t, cfg.d_model))
  r = jax.random.normal(jax.random.key(4), (cfg.vocab_size,))
  dummy = jnp.zeros((1, t), jnp.int32)
  jac = jax.jit(jax.jacrev(lambda e: tfm.forward(params, dummy, cfg, inputs_embeds_BTD=e).logits[0] @ r))(emb)
  dep = np.asarray(jnp.abs(jac[:, 0]).sum(-1))  # [t, s]: how much logits[t] move with embeddings[s]
  upper = np.triu(np.ones((t, t), bool), k=1)
  assert np.all(dep[~upper] > 1e-6)
  if causal:
    assert np.all(dep[upper] == 0.0)
  else:
    assert np.all(dep[upper] > 1e-6)


def test_jit_equals_eager():
  cfg = CONFIGS["qwen3"]
  params = _params(cfg)
  toks = _tokens(2, 6, seed=5)
  capture = ("hidden_states", "attn_updates", "mlp_updates", "attn_weights")
  jitted = forward(params, toks, cfg=cfg, capture=capture)
  with jax.disable_jit():
    eager = tfm.forward(params, toks, cfg, capture=capture)
  for name in ("logits",) + capture:
    np.testing.assert_allclose(np.asarray(getattr(jitted, name)), np.asarray(getattr(eager, name)),
                               atol=1e-5, rtol=0, err_msg=name)


def _stacked_in_program_order(params, cfg, program):
  p = dict(params, layers=jax.tree.map(lambda a: a[np.asarray(program)], params["layers"]))
  return p, cfg.replace(n_layers=len(program))


@pytest.mark.parametrize("program", [(0, 1), (1,), (0, 0, 1)])
def test_layer_program_equals_layers_run_by_hand(program):
  cfg = CONFIGS["olmo2"]
  params = _params(cfg)
  toks = _tokens(2, 8, seed=6)
  capture = ("hidden_states", "attn_weights")
  got = forward(params, toks, cfg=cfg, program=program, capture=capture)
  p2, cfg2 = _stacked_in_program_order(params, cfg, program)
  want = forward(p2, toks, cfg=cfg2, capture=capture)
  assert got.hidden_states.shape[0] == len(program) + 1
  for name in ("logits",) + capture:
    np.testing.assert_allclose(np.asarray(getattr(got, name)), np.asarray(getattr(want, name)), atol=1e-6)
  if program == (0, 1):
    plain = forward(params, toks, cfg=cfg).logits
    np.testing.assert_allclose(np.asarray(got.logits), np.asarray(plain), atol=1e-6)


def _rms(x, scale, eps):
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


@pytest.mark.parametrize("name", ["llama", "olmo2"])
def test_captured_updates_sum_to_residual_stream(name):
  cfg = CONFIGS[name]
  params = _params(cfg)
  toks = _tokens(2, 8, seed=7)
  out = forward(params, toks, cfg=cfg, capture=("hidden_states", "attn_updates", "mlp_updates"))
  hs, a, m = (np.asarray(x, np.float64) for x in (out.hidden_states, out.attn_updates, out.mlp_updates))
  emb = np.asarray(params["embed"]["embedding"], np.float64)[toks]
  np.testing.assert_allclose(hs[0], emb, atol=1e-6)
  resid = emb + np.concatenate([np.zeros_like(emb)[None], np.cumsum(a + m, axis=0)])  # [P+1, B, T, D]
  np.testing.assert_allclose(hs[:-1], resid[:-1], atol=1e-4)
  final = _rms(resid[-1], np.asarray(params["final_norm"]["scale"], np.float64), cfg.norm_eps)
  np.testing.assert_allclose(hs[-1], final, atol=1e-4)
  np.testing.assert_allclose(np.asarray(out.logits), final @ np.asarray(params["lm_head"]["kernel"]), atol=1e-4)


def test_attn_update_hooks():
  cfg = BASE
  params = _params(cfg)
  toks = _tokens(2, 8, seed=8)
  plain = np.asarray(forward(params, toks, cfg=cfg).logits)
  keep = tfm.Intervention(attn_update=lambda u, layer: u)
  np.testing.assert_allclose(np.asarray(forward(params, toks, cfg=cfg, intervention=keep).logits), plain,
                             atol=1e-6)
  zero = tfm.Intervention(attn_update=lambda u, layer: jnp.zeros_like(u))
  no_o = jax.tree.map(lambda x: x, params)
  no_o["layers"]["attn"]["o"]["kernel"] = jnp.zeros_like(params["layers"]["attn"]["o"]["kernel"])
  want = np.asarray(forward(no_o, toks, cfg=cfg).logits)
  np.testing.assert_allclose(np.asarray(forward(params, toks, cfg=cfg, intervention=zero).logits), want,
                             atol=1e-6)
  assert np.abs(want - plain).max() > 1e-3
  zero_l1 = tfm.Intervention(attn_update=lambda u, layer: jnp.where(layer == 1, 0.0, u))
  no_o1 = jax.tree.map(lambda x: x, params)
  no_o1["layers"]["attn"]["o"]["kernel"] = params["layers"]["attn"]["o"]["kernel"].at[1].set(0.0)
  np.testing.assert_allclose(np.asarray(forward(params, toks, cfg=cfg, intervention=zero_l1).logits),
                             np.asarray(forward(no_o1, toks, cfg=cfg).logits), atol=1e-6)


def _uniform_causal(w_BHTS, layer):
  t, s = w_BHTS.shape[-2:]
  tri = jnp.tril(jnp.ones((t, s), w_BHTS.dtype))
  return jnp.broadcast_to(tri / tri.sum(-1, keepdims=True), w_BHTS.shape)


def test_uniform_attention_hook_matches_numpy():
  cfg = BASE.replace(n_layers=1, qkv_bias=True)
  params = _params(cfg)
  toks = _tokens(2, 6, seed=9)
  out = forward(params, toks, cfg=cfg, intervention=tfm.Intervention(attn_weights=_uniform_causal),
                capture=("attn_weights",))
  p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
  lp = jax.tree.map(lambda x: x[0], p["layers"])
  h, g, k, eps = cfg.n_heads, cfg.kv_heads, cfg.kdim, cfg.norm_eps
  x = p["embed"]["embedding"][toks]
  hn = _rms(x, lp["attn_norm"]["scale"], eps)
  v = (hn @ lp["attn"]["v"]["kernel"] + lp["attn"]["v"]["bias"]).reshape(2, 6, g, k)
  v = np.repeat(v, h // g, axis=2)  # query head i reads kv head i // (h // g)
  mean_v = np.cumsum(v, axis=1) / np.arange(1, 7)[None, :, None, None]
  x = x + mean_v.reshape(2, 6, h * k) @ lp["attn"]["o"]["kernel"]
  hn = _rms(x, lp["mlp_norm"]["scale"], eps)
  gate = hn @ lp["mlp"]["gate"]["kernel"]
  x = x + (gate / (1 + np.exp(-gate)) * (hn @ lp["mlp"]["up"]["kernel"])) @ lp["mlp"]["down"]["kernel"]
  want = _rms(x, p["final_norm"]["scale"], eps) @ p["lm_head"]["kernel"]
  np.testing.assert_allclose(np.asarray(out.logits), want, atol=1e-4)
  tri = np.tril(np.ones((6, 6))) / np.arange(1, 7)[:, None]
  np.testing.assert_allclose(np.asarray(out.attn_weights[0]), np.broadcast_to(tri, (2, h, 6, 6)), atol=1e-7)


def test_bf16_compute_close_to_fp32():
  cfg = CONFIGS["qwen3"]
  params = _params(cfg)
  toks = _tokens(2, 8, seed=10)
  ref = np.asarray(forward(params, toks, cfg=cfg).logits)
  for cfg16, p16 in [(cfg.replace(dtype="bfloat16"), params),
                     (cfg.replace(dtype="bfloat16", param_dtype="bfloat16"),
                      jax.tree.map(lambda x: x.astype(jnp.bfloat16), params))]:
    out = forward(p16, toks, cfg=cfg16).logits
    assert out.dtype == jnp.bfloat16
    err = np.abs(np.asarray(out, np.float32) - ref).max()
    assert err < 0.05 * np.abs(ref).max(), err


def test_bad_configs_raise_at_construction():
  with pytest.raises(ValueError, match=r"n_heads \(5\) must divide d_model \(64\)"):
    tfm.Config(d_model=64, n_heads=5)
  with pytest.raises(ValueError, match=r"n_kv_heads \(3\) must divide n_heads \(4\)"):
    tfm.Config(d_model=64, n_heads=4, n_kv_heads=3)
  with pytest.raises(ValueError, match="n_kv_heads"):
    BASE.replace(n_kv_heads=3)
  assert tfm.Config(d_model=64, n_heads=5, head_dim=16).kdim == 16  # explicit head_dim lifts the constraint


@pytest.mark.parametrize("field,value", [("n_kv_heads", -1), ("n_kv_heads", 0), ("head_dim", -2), ("head_dim", 0)])
def test_nonpositive_head_sizes_raise(field, value):
  with pytest.raises(ValueError, match=field):
    BASE.replace(**{field: value})


def test_bad_forward_arguments_raise():
  params = _params(BASE)
  toks = _tokens(1, 4)
  with pytest.raises(ValueError, match=r"\[0, 2\)"):
    tfm.forward(params, toks, BASE, program=[0, 2])
  with pytest.raises(ValueError, match="unknown capture"):
    tfm.forward(params, toks, BASE, capture=("attn_probs",))
