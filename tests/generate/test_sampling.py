"""jaxlab.generate.sample against transformers' generate (greedy), a full recompute (cache), HF's own
top-k/top-p warpers plus a NumPy re-implementation of them, brute-force stop-token truncation, and a trace
counter (no recompilation)."""
import numpy as np
import pytest
import torch
import transformers
from transformers.generation import logits_process as hf_lp

import jax
import jax.numpy as jnp

from jaxlab import hf
from jaxlab.generate import sample, trace_count, warp_logits
from jaxlab.models import transformer as tfm

V = 128
N = 32
PROMPTS = [[5, 17, 99, 3, 42, 7, 64], [8, 120, 33], [77, 2, 15, 90, 61]]


def _hf_model(family, tmp_path_factory):
  torch.manual_seed(0)
  common = dict(vocab_size=V, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, initializer_range=0.2,
                bos_token_id=None, eos_token_id=None, pad_token_id=0)
  if family == "llama":
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(tie_word_embeddings=False, **common))
  else:
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(tie_word_embeddings=True, **common))
    with torch.no_grad():
      for layer in model.model.layers:
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
          proj.bias.normal_(0.0, 0.2)
  model = model.float().eval()
  path = tmp_path_factory.mktemp(family)
  model.save_pretrained(path)
  cfg, params = hf.load(str(path))
  return model, cfg, params


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def hf_pair(request, tmp_path_factory):
  return _hf_model(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def tiny():
  cfg = tfm.Config.tiny(vocab_size=V, init_std=0.2, eos_token_id=None, pad_token_id=0)
  return cfg, tfm.init(cfg, jax.random.key(0))


def _hf_generate(model, prompts):
  t = max(len(p) for p in prompts)
  ids = torch.tensor([[0] * (t - len(p)) + p for p in prompts])
  mask = torch.tensor([[0] * (t - len(p)) + [1] * len(p) for p in prompts])
  with torch.no_grad():
    out = model.generate(ids, attention_mask=mask, max_new_tokens=N, min_new_tokens=N, do_sample=False,
                         pad_token_id=0, output_logits=True, return_dict_in_generate=True)
  return out.sequences[:, t:].numpy(), torch.stack(out.logits, 1).numpy()


@pytest.mark.parametrize("batch", ["one", "ragged"])
def test_greedy_matches_hf_generate(hf_pair, batch):
  model, cfg, params = hf_pair
  prompts = PROMPTS[:1] if batch == "one" else PROMPTS
  ref_tokens, ref_logits = _hf_generate(model, prompts)
  out = sample(params, cfg, prompts, N, return_logits=True)
  np.testing.assert_array_equal(np.asarray(out.tokens), ref_tokens)
  np.testing.assert_array_equal(np.asarray(out.lengths), [N] * len(prompts))
  np.testing.assert_allclose(np.asarray(out.logits), ref_logits, atol=1e-4, rtol=1e-4)


def test_cached_logits_equal_full_recompute(tiny):
  cfg, params = tiny
  out = sample(params, cfg, PROMPTS, N, return_logits=True)
  t = out.prompt_mask.shape[1]
  mask = jnp.concatenate([out.prompt_mask, jnp.ones((len(PROMPTS), N), jnp.int32)], axis=1)
  full = tfm.forward(params, out.sequences, cfg, attention_mask_BT=mask).logits
  np.testing.assert_allclose(np.asarray(out.logits), np.asarray(full[:, t - 1:-1]), atol=1e-5, rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(jnp.argmax(full[:, t - 1:-1], -1)))


def _truncate(tokens, stop, cap, pad=0):
  """Brute force: keep each row up to and including its first stop token, at most cap[i] tokens."""
  out, lengths = np.full_like(tokens, pad), []
  for i, row in enumerate(tokens):
    n = cap[i]
    hits = [j for j, tok in enumerate(row[:n]) if tok in stop]
    n = hits[0] + 1 if hits else n
    out[i, :n] = row[:n]
    lengths.append(n)
  return out, np.array(lengths)


def test_stop_tokens_stop_one_row_others_continue(tiny):
  cfg, params = tiny
  free = np.asarray(sample(params, cfg, PROMPTS, N).tokens)
  # eos (from the config) that only row 0 emits, and a stop token that only row 1 emits; row 2 runs on.
  eos = next(tok for tok in free[0][1:] if tok not in free[1] and tok not in free[2])
  stop = next(tok for tok in free[1][1:] if tok not in free[0] and tok not in free[2])
  out = sample(params, cfg.replace(eos_token_id=int(eos)), PROMPTS, N, stop_tokens=[int(stop)])
  ref, lengths = _truncate(free, {eos, stop}, [N] * 3)
  np.testing.assert_array_equal(np.asarray(out.tokens), ref)
  np.testing.assert_array_equal(np.asarray(out.lengths), lengths)
  assert lengths[0] < N and lengths[1] < N and lengths[2] == N


def test_max_length_caps_each_row(tiny):
  cfg, params = tiny
  free = np.asarray(sample(params, cfg, PROMPTS, N).tokens)
  max_length = 12
  out = sample(params, cfg, PROMPTS, N, max_length=max_length, pad_id=V - 1)
  ref, lengths = _truncate(free, set(), [min(N, max_length - len(p)) for p in PROMPTS], pad=V - 1)
  np.testing.assert_array_equal(np.asarray(out.tokens), ref)
  np.testing.assert_array_equal(np.asarray(out.lengths), lengths)


_CALLS = [0]


def _counting_forward(params, tokens_BT, cfg, **kw):
  jax.debug.callback(lambda: _CALLS.__setitem__(0, _CALLS[0] + 1))
  return tfm.forward(params, tokens_BT, cfg, **kw)


def test_decoding_stops_when_all_rows_are_done(tiny):
  cfg, params = tiny
  free = np.asarray(sample(params, cfg, PROMPTS, N).tokens)
  stop = {int(row[min(3 + i, N - 1)]) for i, row in enumerate(free)}
  _CALLS[0] = 0
  out = sample(params, cfg, PROMPTS, N, stop_tokens=sorted(stop), forward_fn=_counting_forward)
  jax.effects_barrier()
  ref, lengths = _truncate(free, stop, [N] * 3)
  np.testing.assert_array_equal(np.asarray(out.tokens), ref)
  assert lengths.max() < N
  assert _CALLS[0] == lengths.max()  # the prefill plus one forward per decoded token after the first


def test_top_k_one_equals_greedy_and_keys_are_deterministic(tiny):
  cfg, params = tiny
  greedy = np.asarray(sample(params, cfg, PROMPTS, N).tokens)
  topk1 = sample(params, cfg, PROMPTS, N, temperature=1.0, top_k=1, key=jax.random.key(3))
  np.testing.assert_array_equal(np.asarray(topk1.tokens), greedy)
  kw = dict(temperature=1.5, top_k=40, top_p=0.95)
  a = np.asarray(sample(params, cfg, PROMPTS, N, key=jax.random.key(1), **kw).tokens)
  b = np.asarray(sample(params, cfg, PROMPTS, N, key=jax.random.key(1), **kw).tokens)
  c = np.asarray(sample(params, cfg, PROMPTS, N, key=jax.random.key(2), **kw).tokens)
  np.testing.assert_array_equal(a, b)
  assert (a != c).any()


def _np_warp(x, temperature, top_k, top_p):
  """HF TemperatureLogitsWarper -> TopKLogitsWarper -> TopPLogitsWarper, in NumPy."""
  x = x.astype(np.float64) / temperature
  if top_k:
    kth = np.sort(x, -1)[:, -min(top_k, x.shape[-1])][:, None]
    x = np.where(x < kth, -np.inf, x)
  if top_p is not None:
    order = np.argsort(x, -1, kind="stable")
    s = np.take_along_axis(x, order, -1)
    p = np.exp(s - s.max(-1, keepdims=True))
    cum = np.cumsum(p / p.sum(-1, keepdims=True), -1)
    rm = cum <= 1 - top_p
    rm[:, -1] = False
    remove = np.zeros_like(rm)
    np.put_along_axis(remove, order, rm, -1)
    x = np.where(remove, -np.inf, x)
  return x


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, None, 0.9), (0.7, None, 0.5), (1.3, 20, 0.8),
                                                     (1.0, 5, None), (0.5, None, 0.0), (2.0, None, 1.0)])
def test_warpers_match_hf_and_numpy(temperature, top_k, top_p):
  x = np.random.default_rng(0).normal(0, 2, (16, 100)).astype(np.float32)
  got = np.asarray(warp_logits(jnp.asarray(x), temperature, top_k, top_p))
  ref = _np_warp(x, temperature, top_k, top_p)
  procs = [hf_lp.TemperatureLogitsWarper(temperature)]
  procs += [hf_lp.TopKLogitsWarper(top_k)] if top_k else []
  procs += [hf_lp.TopPLogitsWarper(top_p)] if top_p is not None else []
  hf_ref = hf_lp.LogitsProcessorList(procs)(None, torch.tensor(x)).numpy()
  np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
  np.testing.assert_array_equal(np.isinf(got), np.isinf(hf_ref))
  keep = np.isfinite(ref)
  assert keep.sum(-1).min() >= 1
  np.testing.assert_allclose(got[keep], ref[keep], rtol=1e-5)


def test_sampled_frequencies_follow_warped_distribution(tiny):
  cfg, params = tiny
  b, temperature, top_k, top_p = 4096, 2.0, 12, 0.7
  out = sample(params, cfg, [PROMPTS[0]] * b, 1, temperature=temperature, top_k=top_k, top_p=top_p,
               key=jax.random.key(7), return_logits=True)
  logits = np.asarray(out.logits[:1, 0])
  probs = np.exp(_np_warp(logits, temperature, top_k, top_p))[0]
  probs /= probs.sum()
  assert 2 < (probs > 0).sum() < top_k  # both filters bite
  counts = np.bincount(np.asarray(out.tokens[:, 0]), minlength=V)
  assert counts[probs == 0].sum() == 0
  sigma = np.sqrt(b * probs * (1 - probs))
  np.testing.assert_array_less(np.abs(counts - b * probs), 5 * sigma + 1)


def test_second_call_with_same_shapes_does_not_recompile(tiny):
  cfg, params = tiny
  sample(params, cfg, PROMPTS, N, temperature=1.5, top_k=40, top_p=0.95, key=jax.random.key(0))
  n = trace_count()
  other = [[1, 2, 3, 4, 5, 6, 7], [9, 9, 9], [4, 3, 2, 1, 0]]  # same shapes, other values everywhere
  out = sample(params, cfg, other, N, temperature=0.5, top_k=40, top_p=0.5, key=jax.random.key(1), max_length=20,
               pad_id=7)
  assert trace_count() == n
  assert out.tokens.shape == (3, N)
  sample(params, cfg, PROMPTS, N + 1, temperature=1.5, top_k=40, top_p=0.95, key=jax.random.key(0))
  assert trace_count() == n + 1


def test_input_validation(tiny):
  cfg, params = tiny
  with pytest.raises(ValueError, match="PRNG key"):
    sample(params, cfg, PROMPTS, 4, temperature=1.0)
  with pytest.raises(ValueError, match="real token"):
    sample(params, cfg, np.ones((2, 3), np.int32), 4, prompt_mask=np.array([[1, 1, 1], [0, 0, 0]]))
  with pytest.raises(ValueError, match=r"\[0, 128\)"):
    sample(params, cfg, [[1, 200]], 4)
