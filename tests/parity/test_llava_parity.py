"""The LLaVA VLM (CLIP vision tower + MLP connector + Llama) against transformers' LlavaForConditionalGeneration.

Tiny random HF models are written with `save_pretrained` and read with `jaxlab.hf.load`; logits and the LM's
hidden states must equal HF's in fp32 with several images spread over the batch rows (transformers fills image
tokens in row-major order), for the "default" (class token dropped) and "full" strategies, a single feature
layer and a concatenated list of them. `jaxlab.hf.save` output must load in `from_pretrained`.
"""
import json
import os

import jax
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers

from jaxlab import hf
from jaxlab.models import vlm

ATOL = 1e-4
IMG = 5  # image token id
VISION = dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, image_size=16, patch_size=4)
TEXT = dict(model_type="llama", vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6)

forward = jax.jit(vlm.forward, static_argnames=("cfg", "capture"))


def make_llava(seed=0, vision=None, **kw):
  cfg = transformers.LlavaConfig(vision_config={**VISION, **(vision or {})}, text_config=TEXT,
                                 image_token_index=IMG, **kw)
  cfg._attn_implementation = "eager"
  torch.manual_seed(seed)
  model = transformers.LlavaForConditionalGeneration(cfg)
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=g)
      p.copy_(1.0 + 0.3 * noise if "norm" in name else 0.15 * noise)
  return model.eval()


def batch(per_image: int, seed=0):
  """Row 0 holds two images, row 1 one image, between random text tokens (never the image id)."""
  rs = np.random.RandomState(seed)
  text = lambda n: list(rs.randint(IMG + 1, TEXT["vocab_size"], n))
  rows = [text(2) + [IMG] * per_image + text(3) + [IMG] * per_image + text(4),
          text(5) + [IMG] * per_image + text(per_image + 4)]
  toks = np.asarray(rows, np.int32)
  px = rs.randn(3, VISION["image_size"], VISION["image_size"], 3).astype(np.float32)
  return toks, px


def hf_run(model, toks, px):
  with torch.no_grad():
    return model(input_ids=torch.as_tensor(toks, dtype=torch.long),
                 pixel_values=torch.as_tensor(px.transpose(0, 3, 1, 2)), output_hidden_states=True, use_cache=False)


def check_parity(cfg, params, model, seed=0):
  toks, px = batch(cfg.tokens_per_image, seed)
  out = forward(params, toks, px, cfg=cfg, capture=("hidden_states",))
  ref = hf_run(model, toks, px)
  np.testing.assert_allclose(np.asarray(out.logits), ref.logits.numpy(), atol=ATOL, rtol=0)
  want_h = np.stack([h.numpy() for h in ref.hidden_states])
  np.testing.assert_allclose(np.asarray(out.lm.hidden_states), want_h, atol=ATOL, rtol=0)
  np.testing.assert_array_equal(np.asarray(out.image_mask_BT), toks == IMG)
  return out


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
  model = make_llava()
  path = str(tmp_path_factory.mktemp("llava"))
  model.save_pretrained(path)
  cfg, params = hf.load(path)
  return model, path, cfg, params


def test_config(llava):
  _, _, cfg, params = llava
  assert hf.vision.layout(cfg.vision) == "clip" and cfg.vision.n_layers == 2 and cfg.text.d_model == 64
  assert (cfg.image_token_id, cfg.feature_layers, cfg.feature_select) == (IMG, (-2,), "default")
  assert cfg.tokens_per_image == 16 and cfg.vision_layers_used == 1
  assert params["connector"]["fc1"]["kernel"].shape == (32, 64)


def test_logits_and_hidden_states_match_hf(llava):
  model, _, cfg, params = llava
  out = check_parity(cfg, params, model)
  assert out.image_features.shape == (3, 16, 64)


def test_full_strategy_matches_hf(llava, tmp_path):
  _, path, _, _ = llava
  dst = str(tmp_path / "full")
  os.makedirs(dst)
  for name in os.listdir(path):
    if name != "config.json":
      os.symlink(os.path.join(path, name), os.path.join(dst, name))
  with open(os.path.join(path, "config.json")) as f:
    d = json.load(f)
  d["vision_feature_select_strategy"] = "full"
  with open(os.path.join(dst, "config.json"), "w") as f:
    json.dump(d, f)
  cfg, params = hf.load(dst)
  assert cfg.feature_select == "full" and cfg.tokens_per_image == 17
  model = transformers.LlavaForConditionalGeneration.from_pretrained(dst, attn_implementation="eager").eval()
  check_parity(cfg, params, model, seed=1)


def test_feature_layer_list_without_bias_matches_hf(tmp_path):
  model = make_llava(seed=3, vision_feature_layer=[0, -1], multimodal_projector_bias=False,
                     projector_hidden_act="gelu")
  model.save_pretrained(str(tmp_path))
  cfg, params = hf.load(str(tmp_path))
  assert cfg.feature_layers == (0, -1) and not cfg.connector_bias and "bias" not in params["connector"]["fc1"]
  assert params["connector"]["fc1"]["kernel"].shape == (64, 64)
  check_parity(cfg, params, model, seed=2)


def test_saved_checkpoint_loads_in_transformers(llava, fresh_dir):
  model, _, cfg, params = llava
  hf.save(fresh_dir, cfg, params)
  back = transformers.LlavaForConditionalGeneration.from_pretrained(fresh_dir, attn_implementation="eager").eval()
  toks, px = batch(cfg.tokens_per_image, seed=4)
  np.testing.assert_allclose(hf_run(back, toks, px).logits.numpy(), hf_run(model, toks, px).logits.numpy(),
                             atol=1e-6, rtol=0)
  cfg2, params2 = hf.load(fresh_dir)
  assert cfg2 == cfg
  jax.tree.map(np.testing.assert_array_equal, params2, params)
  hf.save(fresh_dir, cfg, params, dtype=ml_dtypes.bfloat16, overwrite=True)
  cfg3, params3 = hf.load(fresh_dir)
  assert cfg3.vision.param_dtype == cfg3.text.param_dtype == "bfloat16" and cfg3 == cfg.replace(param_dtype="bfloat16")
  assert {x.dtype for x in jax.tree.leaves(params3)} == {np.dtype(ml_dtypes.bfloat16)}


def test_vision_tower_deeper_than_lm(tmp_path):
  model = make_llava(seed=5, vision={"num_hidden_layers": 3})
  model.save_pretrained(str(tmp_path))
  cfg, params = hf.load(str(tmp_path))
  assert cfg.vision.n_layers == 3 and params["vision"]["layers"]["attn"]["q"]["kernel"].shape[0] == 3
  check_parity(cfg, params, model, seed=6)
