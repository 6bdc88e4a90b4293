"""Decoder-LM families (llama, mistral, qwen2, qwen3, olmo2) against their transformers (PyTorch) models.

Each family is a tiny random HF model written with `save_pretrained` and read with `jaxlab.hf.load`; logits,
hidden states and attention weights must equal HF's in fp32. Rope variants are exercised in both config
spellings (`rope_theta` + `rope_scaling`, and `rope_parameters`), and `jaxlab.hf.save` output must load in
`from_pretrained` with the same logits.
"""
import copy
import json
import os

import jax
import numpy as np
import pytest
import torch
import transformers

from jaxlab import hf
from jaxlab.models import transformer as tfm
from jaxlab.nn.rope import Rope

ATOL = 1e-4
CAPTURE = ("hidden_states", "attn_weights")


def load_hf(path: str):
  return transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()


def hf_logits(model, tokens, **kw) -> np.ndarray:
  with torch.no_grad():
    return model(torch.as_tensor(np.asarray(tokens)), use_cache=False, **kw).logits.float().numpy()


def tokens(batch: int, length: int, seed: int = 0, vocab: int = 128) -> np.ndarray:
  return np.random.RandomState(seed).randint(0, vocab, (batch, length)).astype(np.int32)


def copy_with_config(src: str, dst: str, edit) -> str:
  """A copy of checkpoint `src` whose config.json is `edit(config_dict)` (the tensors are symlinked)."""
  os.makedirs(dst)
  for name in os.listdir(src):
    if name != "config.json":
      os.symlink(os.path.join(src, name), os.path.join(dst, name))
  with open(os.path.join(src, "config.json")) as f:
    d = json.load(f)
  with open(os.path.join(dst, "config.json"), "w") as f:
    json.dump(edit(d), f, indent=2)
  return dst


forward = jax.jit(tfm.forward, static_argnames=("cfg", "program", "capture", "intervention"))


def _run(f, toks, mask=None, cfg=None, **kw):
  """jaxlab forward with a padding mask and captures (one compiled shape serves the per-family tests)."""
  mask = np.ones_like(toks) if mask is None else mask
  return forward(f.params, np.asarray(toks), cfg=cfg or f.cfg, attention_mask_BT=mask, capture=CAPTURE, **kw)


def test_config_carries_family_features(decoder_family):
  c, mt = decoder_family.cfg, decoder_family.model_type
  assert (c.vocab_size, c.d_model, c.n_layers, c.n_heads, c.kv_heads) == (128, 64, 2, 4, 2)
  assert c.sliding_window == (5 if mt == "mistral" else None)
  assert (c.qkv_bias, c.o_bias) == ((True, False) if mt == "qwen2" else (False, False))
  assert c.qk_norm == {"qwen3": "head", "olmo2": "full"}.get(mt, "none")
  assert c.post_norm == (mt == "olmo2")
  assert c.kdim == (24 if mt == "qwen3" else 16)
  assert c.norm_eps == decoder_family.model.config.rms_norm_eps
  assert not c.tie_embeddings and "lm_head" in decoder_family.params


def test_logits_match_hf(decoder_family):
  toks = tokens(2, 12, seed=1)
  got = np.asarray(_run(decoder_family, toks).logits)
  np.testing.assert_allclose(got, hf_logits(decoder_family.model, toks), atol=ATOL, rtol=0)
  if decoder_family.model_type == "mistral":  # the window (5 < 12 tokens) really changes the result
    full = np.asarray(_run(decoder_family, toks, cfg=decoder_family.cfg.replace(sliding_window=None)).logits)
    assert np.abs(full - got).max() > 1e-3


def test_tied_logits_match_hf(tied_decoder_family):
  assert tied_decoder_family.cfg.tie_embeddings and "lm_head" not in tied_decoder_family.params
  toks = tokens(2, 12, seed=2)
  want = hf_logits(tied_decoder_family.model, toks)
  np.testing.assert_allclose(np.asarray(_run(tied_decoder_family, toks).logits), want, atol=ATOL, rtol=0)


def test_hidden_states_and_attention_weights_match_hf(decoder_family):
  toks = tokens(2, 12, seed=3)
  out = _run(decoder_family, toks)
  with torch.no_grad():
    ref = decoder_family.model(torch.as_tensor(toks), use_cache=False, output_hidden_states=True,
                               output_attentions=True)
  want_h = np.stack([h.numpy() for h in ref.hidden_states])
  want_w = np.stack([w.numpy() for w in ref.attentions])
  assert out.hidden_states.shape == want_h.shape and out.attn_weights.shape == want_w.shape
  np.testing.assert_allclose(np.asarray(out.hidden_states), want_h, atol=ATOL, rtol=0)
  np.testing.assert_allclose(np.asarray(out.attn_weights), want_w, atol=1e-5, rtol=0)


def test_left_padding_matches_hf_and_unpadded(decoder_family):
  toks = tokens(2, 12, seed=4)
  plain = np.asarray(_run(decoder_family, toks).logits)
  pads = 4
  toks[1, pads:] = toks[0, :-pads]  # row 1 = row 0's first 8 tokens after 4 pads (with junk ids)
  mask = np.ones_like(toks)
  mask[1, :pads] = 0
  got = np.asarray(_run(decoder_family, toks, mask).logits)
  pos = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  want = hf_logits(decoder_family.model, toks, attention_mask=torch.as_tensor(mask),
                   position_ids=torch.as_tensor(pos, dtype=torch.long))
  real = mask.astype(bool)
  np.testing.assert_allclose(got[real], want[real], atol=ATOL, rtol=0)
  np.testing.assert_allclose(got[1, pads:], plain[0, :-pads], atol=1e-5, rtol=0)


# (rope_parameters without rope_theta, extra top-level config keys); the test sequence has 24 tokens.
ROPES = {
    "default": ({"rope_type": "default"}, {}),
    "linear": ({"rope_type": "linear", "factor": 4.0}, {}),
    "dynamic": ({"rope_type": "dynamic", "factor": 2.0}, {"max_position_embeddings": 16}),
    "llama3": ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32}, {}),
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}, {}),
}
THETA = {"yarn": 100.0}  # a small base puts several yarn frequencies inside the interpolation ramp


def _rope_config(d, name, spelling):
  rope, extra = ROPES[name]
  theta = THETA.get(name, 20000.0)
  d = {k: v for k, v in d.items() if k not in ("rope_parameters", "rope_scaling", "rope_theta")}
  d.update(extra)
  if spelling == "rope_parameters":
    d["rope_parameters"] = {**rope, "rope_theta": theta}
  else:
    old = dict(rope)
    if name == "linear":  # the oldest configs say "type"
      old["type"] = old.pop("rope_type")
    d["rope_theta"] = theta
    d["rope_scaling"] = None if name == "default" else old
  return d


@pytest.mark.parametrize("spelling", ["rope_parameters", "rope_scaling"])
@pytest.mark.parametrize("name", list(ROPES))
def test_rope_variants_match_hf(llama_ckpt, tmp_path, name, spelling):
  path = copy_with_config(llama_ckpt.path, str(tmp_path / name), lambda d: _rope_config(d, name, spelling))
  cfg, params = hf.load(path)
  assert cfg.rope.type == name and cfg.rope.theta == THETA.get(name, 20000.0)
  toks = tokens(2, 24, seed=5)
  got = np.asarray(forward(params, toks, cfg=cfg).logits)
  np.testing.assert_allclose(got, hf_logits(load_hf(path), toks), atol=ATOL, rtol=0)
  plain = np.asarray(forward(params, toks, cfg=cfg.replace(rope=Rope(theta=cfg.rope.theta))).logits)
  assert (np.abs(plain - got).max() > 1e-3) == (name != "default")  # the variant actually rescales


def _check_saved_loads_in_transformers(f, path):
  hf.save(path, f.cfg, f.params)
  model = load_hf(path)
  assert type(model) is type(f.model)
  head_dim = lambda c: getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
  assert head_dim(model.config) == head_dim(f.model.config)
  for key in ("sliding_window", "tie_word_embeddings", "num_key_value_heads", "rms_norm_eps"):
    assert getattr(model.config, key, None) == getattr(f.model.config, key, None), key
  toks = tokens(2, 10, seed=6)
  np.testing.assert_allclose(hf_logits(model, toks), hf_logits(f.model, toks), atol=1e-6, rtol=0)


def test_saved_checkpoint_loads_in_transformers(decoder_family, fresh_dir):
  _check_saved_loads_in_transformers(decoder_family, fresh_dir)


def test_saved_tied_checkpoint_loads_in_transformers(tied_decoder_family, fresh_dir):
  _check_saved_loads_in_transformers(tied_decoder_family, fresh_dir)


@pytest.mark.parametrize("name", ["linear", "dynamic", "llama3", "yarn"])
def test_saved_rope_variant_loads_in_transformers(llama_ckpt, fresh_dir, name):
  rope, extra = ROPES[name]
  cfg = llama_ckpt.cfg.replace(rope=Rope.from_hf(rope, THETA.get(name, 20000.0)), **extra)
  hf.save(fresh_dir, cfg, llama_ckpt.params)
  assert hf.load(fresh_dir)[0] == cfg
  toks = tokens(2, 24, seed=7)
  got = np.asarray(forward(llama_ckpt.params, toks, cfg=cfg).logits)
  np.testing.assert_allclose(got, hf_logits(load_hf(fresh_dir), toks), atol=ATOL, rtol=0)


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
def test_saved_activation_loads_in_transformers(llama_ckpt, fresh_dir, activation):
  cfg = llama_ckpt.cfg.replace(activation=activation)
  hf.save(fresh_dir, cfg, llama_ckpt.params)
  toks = tokens(2, 12, seed=9)
  got = np.asarray(forward(llama_ckpt.params, toks, cfg=cfg).logits)
  np.testing.assert_allclose(got, hf_logits(load_hf(fresh_dir), toks), atol=ATOL, rtol=0)
  assert hf.load(fresh_dir)[0] == cfg


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_pytorch_tanh", "relu"])
def test_hf_activation_names_load(llama_ckpt, tmp_path, hidden_act):
  path = copy_with_config(llama_ckpt.path, str(tmp_path / hidden_act), lambda d: {**d, "hidden_act": hidden_act})
  cfg, params = hf.load(path)
  toks = tokens(2, 12, seed=9)
  got = np.asarray(forward(params, toks, cfg=cfg).logits)
  np.testing.assert_allclose(got, hf_logits(load_hf(path), toks), atol=ATOL, rtol=0)


@pytest.mark.parametrize("program", [(0, 0, 1), (1,), (1, 0)])
def test_layer_program_matches_hf_with_reordered_layers(llama_ckpt, program):
  model = copy.deepcopy(llama_ckpt.model)
  model.model.layers = torch.nn.ModuleList([model.model.layers[i] for i in program])
  model.config.num_hidden_layers = len(program)
  if getattr(model.config, "layer_types", None):
    model.config.layer_types = [model.config.layer_types[i] for i in program]
  toks = tokens(2, 12, seed=8)
  got = np.asarray(forward(llama_ckpt.params, toks, cfg=llama_ckpt.cfg, program=program).logits)
  np.testing.assert_allclose(got, hf_logits(model, toks), atol=ATOL, rtol=0)
