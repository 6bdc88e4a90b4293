"""jaxlab.generate.diffusion against a NumPy re-implementation of Fast-dLLM's llada/generate.py.

The oracle is written from the reference, independently of jaxlab: a float64 NumPy LLaDA forward over
LLaDA-named weights whose KV cache works like modeling_llada.py (un-rotated keys cached, prefix caches
concatenated, dual caches overwritten at `replace_position`), and the three generate loops (`generate`,
`generate_with_prefix_cache`, `generate_with_dual_cache`) run per row with batch size 1, as the reference is.
The model under test is the same weights written as a LLaDA checkpoint and read with `hf.load`.
Documented deviations are part of the oracle: the argmax skips [MASK], top-k ties go to the lower index, and
the reference's extra no-op forward after a block completed on its first cached step is counted separately.
"""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab import hf
from jaxlab.generate import diffusion
from jaxlab.hf import io, llada  # noqa: F401
from jaxlab.models import mdm

CFG = dict(model_type="llada", architectures=["LLaDAModelLM"], block_type="llama", layer_norm_type="rms",
           rope=True, activation_type="silu", rms_norm_eps=1e-5, max_sequence_length=64, d_model=32, n_heads=4,
           n_kv_heads=2, n_layers=2, mlp_hidden_size=48, vocab_size=24, embedding_size=24, weight_tying=False,
           include_qkv_bias=False, rope_theta=10000.0, mask_token_id=23, eos_token_id=22, pad_token_id=22)
MASK = CFG["mask_token_id"]
P, GEN = 4, 8


def _weights(seed=0):
  rng = np.random.RandomState(seed)
  d, hd, f, v = CFG["d_model"], CFG["d_model"] // CFG["n_heads"], CFG["mlp_hidden_size"], CFG["vocab_size"]
  kv = CFG["n_kv_heads"] * hd
  w = {"model.transformer.wte.weight": rng.standard_normal((v, d)),
       "model.transformer.ln_f.weight": 1 + 0.2 * rng.standard_normal(d),
       "model.transformer.ff_out.weight": 0.5 * rng.standard_normal((v, d))}
  for i in range(CFG["n_layers"]):
    p = f"model.transformer.blocks.{i}."
    for name, shape in [("q_proj", (d, d)), ("k_proj", (kv, d)), ("v_proj", (kv, d)), ("attn_out", (d, d)),
                        ("ff_proj", (f, d)), ("up_proj", (f, d)), ("ff_out", (d, f))]:
      w[p + name + ".weight"] = 0.4 * rng.standard_normal(shape)
    w[p + "attn_norm.weight"] = 1 + 0.2 * rng.standard_normal(d)
    w[p + "ff_norm.weight"] = 1 + 0.2 * rng.standard_normal(d)
  return {k: v.astype(np.float32) for k, v in w.items()}


# ----------------------------------------------------------------------------------- NumPy oracle

def _rms(x, w):
  return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + CFG["rms_norm_eps"]) * w


def _rope(x, pos):  # x [T, heads, hd], rotate-half layout
  hd = x.shape[-1]
  inv = 1.0 / CFG["rope_theta"] ** (np.arange(0, hd, 2) / hd)
  ang = np.concatenate([pos[:, None] * inv, pos[:, None] * inv], -1)[:, None, :]
  rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
  return x * np.cos(ang) + rot * np.sin(ang)


def np_forward(w, x, past=None, replace=None):
  """One row: x [T] -> (logits [T, V], present per layer (k, v) [S, G, hd] before rotation)."""
  w = {k: v.astype(np.float64) for k, v in w.items()}
  h, hd = w["model.transformer.wte.weight"][x], CFG["d_model"] // CFG["n_heads"]
  present = []
  for i in range(CFG["n_layers"]):
    p = f"model.transformer.blocks.{i}."
    xn = _rms(h, w[p + "attn_norm.weight"])
    q = (xn @ w[p + "q_proj.weight"].T).reshape(len(x), -1, hd)
    k = (xn @ w[p + "k_proj.weight"].T).reshape(len(x), -1, hd)
    v = (xn @ w[p + "v_proj.weight"].T).reshape(len(x), -1, hd)
    q_end = None
    if past is not None:
      pk, pv = past[i]
      if replace is None:
        k, v = np.concatenate([pk, k]), np.concatenate([pv, v])
      else:
        pk[replace], pv[replace] = k, v
        k, v, q_end = pk, pv, replace[-1] + 1
    present.append((k, v))
    s = len(k)
    q_end = s if q_end is None else q_end
    qr, kr = _rope(q, np.arange(q_end - len(x), q_end, dtype=np.float64)), _rope(k, np.arange(s, dtype=np.float64))
    rep = q.shape[1] // k.shape[1]
    kr, vv = np.repeat(kr, rep, axis=1), np.repeat(v, rep, axis=1)
    a = np.einsum("thd,shd->hts", qr, kr) / np.sqrt(hd)
    a = np.exp(a - a.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    o = np.einsum("hts,shd->thd", a, vv).reshape(len(x), -1)
    h = h + o @ w[p + "attn_out.weight"].T
    xn = _rms(h, w[p + "ff_norm.weight"])
    g = xn @ w[p + "ff_proj.weight"].T
    h = h + (g / (1 + np.exp(-g)) * (xn @ w[p + "up_proj.weight"].T)) @ w[p + "ff_out.weight"].T
  h = _rms(h, w["model.transformer.ln_f.weight"])
  return h @ w["model.transformer.ff_out.weight"].T, present


def _transfer(logits, mask_index, x, k, threshold):
  """get_transfer_index at temperature 0 with low-confidence remasking."""
  l = logits.copy()
  l[:, MASK] = -np.inf
  x0 = l.argmax(-1)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  conf = np.where(mask_index, p[np.arange(len(x0)), x0], -np.inf)
  x0 = np.where(mask_index, x0, x)
  n = int(mask_index.sum()) if threshold is not None else int(k)
  order = np.argsort(-conf, kind="stable")[:n]
  sel = np.zeros(len(x), bool)
  sel[order] = True
  if threshold is not None:
    sel[order[1:][conf[order[1:]] < threshold]] = False
  return x0, sel


def oracle(w, prompt, steps, block_length, threshold=None, cache=None):
  """Fast-dLLM's generate / generate_with_prefix_cache / generate_with_dual_cache for one row.

  Returns (tokens, nfe, noop) where noop counts forwards that could not commit anything.
  """
  x = np.concatenate([prompt, np.full(GEN, MASK)])
  nb = GEN // block_length
  spb = steps // nb
  nfe = noop = 0
  for b in range(nb):
    s, e = len(prompt) + b * block_length, len(prompt) + (b + 1) * block_length
    base, rem = divmod(block_length, spb)
    ks = [base + (j < rem) for j in range(spb)]
    i = 0
    if cache is not None:
      logits, past = np_forward(w, x)
      nfe += 1
      mi = x == MASK
      mi[e:] = False
      x0, sel = _transfer(logits, mi, x, ks[0], threshold)
      x[sel] = x0[sel]
      past = [(k[:s].copy(), v[:s].copy()) for k, v in past] if cache == "prefix" else past
      i = 1
    while True:
      if cache is not None and not (x[s:e] == MASK).any():
        noop += 1  # the reference's loop body runs once more before checking
      nfe += 1
      if cache is None:
        mi = x == MASK
        mi[e:] = False
        x0, sel = _transfer(np_forward(w, x)[0], mi, x, ks[min(i, spb - 1)], threshold)
        x[sel] = x0[sel]
      else:
        lo, hi = (s, len(x)) if cache == "prefix" else (s, e)
        mi = x[lo:hi] == MASK
        mi[e - lo:] = False
        if cache == "prefix":
          logits, _ = np_forward(w, x[lo:hi], past=past)
        else:
          logits, _ = np_forward(w, x[lo:hi], past=past, replace=np.arange(s, e))
        x0, sel = _transfer(logits, mi, x[lo:hi], ks[min(i, spb - 1)], threshold)
        x[lo:hi][sel] = x0[sel]
      i += 1
      if not (x[s:e] == MASK).any():
        break
  return x, nfe, noop


# ----------------------------------------------------------------------------------------- tests

@pytest.fixture(scope="module")
def model(tmp_path_factory):
  w = _weights()
  path = str(tmp_path_factory.mktemp("llada_tiny"))
  io.write_dir(path, w, 2**30)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(CFG, f)
  cfg, params = hf.load(path)
  prompts = np.random.RandomState(1).randint(0, 22, (2, P)).astype(np.int32)
  return w, cfg, params, prompts


CASES = [  # (steps, block_length, threshold, cache)
    (GEN, 4, None, None),  # one token per step
    (4, 4, None, None),  # two per step, two blocks
    (GEN, GEN, None, "prefix"),
    (4, 4, None, "dual"),
    (GEN, 4, 0.6, None),
    (GEN, 4, 0.6, "prefix"),
    (GEN, 4, 0.6, "dual"),
]


@pytest.mark.parametrize("steps,block,threshold,cache", CASES)
def test_matches_fast_dllm_oracle(model, steps, block, threshold, cache):
  w, cfg, params, prompts = model
  out = diffusion.generate(params, cfg, prompts, steps=steps, gen_length=GEN, block_length=block,
                           threshold=threshold, cache=cache)
  for r in range(len(prompts)):
    want, nfe, noop = oracle(w, prompts[r].copy(), steps, block, threshold, cache)
    np.testing.assert_array_equal(np.asarray(out.tokens[r]), want, err_msg=f"row {r}")
    assert out.nfe[r] == nfe - noop
  assert (out.step_commits.clip(0).sum(1) == GEN).all()
  if threshold is None:
    assert (out.nfe == steps).all()
    k = GEN // steps
    assert set(out.step_commits[out.step_commits >= 0].tolist()) == {k}
  else:
    assert out.step_commits.max() > 1  # the threshold really committed several tokens at once somewhere


def test_unreachable_threshold_is_vanilla_one_token_per_step(model):
  _, cfg, params, prompts = model
  for cache in (None, "dual"):
    thr = diffusion.generate(params, cfg, prompts, steps=2, gen_length=GEN, block_length=4, threshold=1.01,
                             cache=cache)
    van = diffusion.generate(params, cfg, prompts, steps=GEN, gen_length=GEN, block_length=4, cache=cache)
    np.testing.assert_array_equal(np.asarray(thr.tokens), np.asarray(van.tokens))
    assert (thr.nfe == GEN).all() and set(thr.step_commits[thr.step_commits >= 0].tolist()) == {1}


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cache_refreshed_every_step_equals_no_cache(model, cache):
  _, cfg, params, prompts = model
  ref = diffusion.generate(params, cfg, prompts, steps=GEN, gen_length=GEN, block_length=4, threshold=0.6)
  got = diffusion.generate(params, cfg, prompts, steps=GEN, gen_length=GEN, block_length=4, threshold=0.6,
                           cache=cache, refresh_every=1)
  stale = diffusion.generate(params, cfg, prompts, steps=GEN, gen_length=GEN, block_length=4, threshold=0.6,
                             cache=cache)
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(ref.tokens))
  np.testing.assert_array_equal(got.nfe, ref.nfe)
  assert got.forwards == ref.forwards and stale.forwards > 0


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cached_region_with_fresh_cache_equals_full_forward(cache, shift):
  """With a context cache built from the very same tokens, a cached step computes the full forward's logits."""
  cfg = mdm.Config.tiny(shift_logits=shift)
  params = mdm.init(cfg, jax.random.key(3))
  x = jax.random.randint(jax.random.key(4), (2, 12), 0, 64)
  valid = jnp.ones((2, 12), bool).at[1, :2].set(False)  # left padding in row 1
  pos = diffusion.positions(valid)
  start, length = 6, (12 - 6 if cache == "prefix" else 4)
  lead = int(shift)
  sl = slice(start - lead, start + length)

  @jax.jit
  def both(params, x):
    full = mdm.forward(params, x, cfg, positions_BT=pos, attention_mask_BT=valid).logits
    _, c = diffusion.refresh_cache(params, cfg, x, valid, pos, length + lead)
    ctx = diffusion.exclude(c, start, length)
    got = diffusion.region_logits(params, cfg, ctx, x[:, None, sl], pos[:, sl], valid[:, sl], lead)[:, 0]
    return full[:, start:start + length], got

  want, got = both(params, x)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("cache", [None, "prefix", "dual"])
def test_branch_region_through_the_kernel_equals_the_dense_mask(cache, shift):
  """N branch copies of a region: the Pallas verification kernel (prefix holes from padding and the dual
  cache's excluded block, hidden lead keys) gives the dense-mask logits."""
  cfg = mdm.Config.tiny(shift_logits=shift)
  params = mdm.init(cfg, jax.random.key(5))
  n, start = 3, 6
  x = jax.random.randint(jax.random.key(6), (2, 12), 0, 64)
  valid = jnp.ones((2, 12), bool).at[1, :2].set(False)
  pos = diffusion.positions(valid)
  length = 12 if cache is None else (12 - start if cache == "prefix" else 4)
  lead = int(shift) if cache else 0
  begin = 0 if cache is None else start - lead
  sl = slice(begin, begin + length + lead)
  toks = jnp.stack([x[:, sl]] + [jax.random.randint(jax.random.key(7 + i), x[:, sl].shape, 0, 64)
                                 for i in range(n - 1)], axis=1)

  def region(kernel):
    ctx = None
    if cache:
      _, c = diffusion.refresh_cache(params, cfg, x, valid, pos, n * (length + lead))
      ctx = diffusion.exclude(c, start, length)
    return diffusion.region_logits(params, cfg, ctx, toks, pos[:, sl], valid[:, sl], lead, kernel=kernel)

  dense, fused = jax.jit(lambda: region(False))(), jax.jit(lambda: region(True))()
  assert fused.shape == (2, n, length, cfg.vocab_size)
  np.testing.assert_allclose(np.asarray(fused), np.asarray(dense), atol=2e-5, rtol=1e-5)


def test_left_padded_row_decodes_like_the_unpadded_prompt(model):
  _, cfg, params, prompts = model
  padded = np.concatenate([np.zeros((1, 2), np.int32), prompts[:1]], axis=1)
  pm = np.concatenate([np.zeros((1, 2)), np.ones((1, P))], axis=1)
  a = diffusion.generate(params, cfg, prompts[:1], steps=GEN, gen_length=GEN, block_length=4, threshold=0.6)
  b = diffusion.generate(params, cfg, padded, steps=GEN, gen_length=GEN, block_length=4, threshold=0.6,
                         prompt_mask=pm)
  np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens)[:, 2:])


def test_random_remasking_and_temperature(model):
  _, cfg, params, prompts = model
  kw = dict(steps=4, gen_length=GEN, block_length=4)
  a = diffusion.generate(params, cfg, prompts, remasking="random", temperature=1.0, key=jax.random.key(0), **kw)
  b = diffusion.generate(params, cfg, prompts, remasking="random", temperature=1.0, key=jax.random.key(0), **kw)
  c = diffusion.generate(params, cfg, prompts, remasking="random", temperature=1.0, key=jax.random.key(1), **kw)
  np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
  assert (np.asarray(a.tokens) != np.asarray(c.tokens)).any()
  assert not (np.asarray(a.tokens) == MASK).any() and (a.nfe == 4).all()


def test_validation_errors(model):
  _, cfg, params, prompts = model
  with pytest.raises(ValueError, match="multiple of block_length"):
    diffusion.generate(params, cfg, prompts, steps=4, gen_length=GEN, block_length=3)
  with pytest.raises(ValueError, match="multiple of the number of blocks"):
    diffusion.generate(params, cfg, prompts, steps=3, gen_length=GEN, block_length=4)
  with pytest.raises(ValueError, match="cache must be"):
    diffusion.generate(params, cfg, prompts, steps=4, gen_length=GEN, block_length=4, cache="both")
  with pytest.raises(ValueError, match="PRNG key"):
    diffusion.generate(params, cfg, prompts, steps=4, gen_length=GEN, block_length=4, temperature=0.5)
