"""ViT encoders (CLIP, SigLIP, DINOv2 with and without registers) against transformers' vision models.

Each family is a tiny random HF model written with `save_pretrained` and read with `jaxlab.hf.load`; the last
hidden state, the pooled output, every hidden state and every attention map must equal HF's in fp32, and
`jaxlab.hf.save` output must load in `from_pretrained` with the same outputs.
"""
import types

import jax
import numpy as np
import pytest
import torch
import transformers

import jaxlab.hf.vision  # noqa: F401  (hf.vision.layout)
from jaxlab import hf
from jaxlab.models import vit

ATOL = 1e-4
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=16, patch_size=4)
HF_MODELS = {
    "clip": (transformers.CLIPVisionConfig, transformers.CLIPVisionModel, dict(intermediate_size=48)),
    # 18 is not a multiple of 4: the strided patch conv drops the last 2 rows and columns
    "siglip": (transformers.SiglipVisionConfig, transformers.SiglipVisionModel,
               dict(intermediate_size=48, image_size=18)),
    "siglip_nohead": (transformers.SiglipVisionConfig, transformers.SiglipVisionModel,
                      dict(intermediate_size=48, vision_use_head=False)),
    "dinov2": (transformers.Dinov2Config, transformers.Dinov2Model, dict(mlp_ratio=2, layerscale_value=0.5)),
    "dinov2_reg": (transformers.Dinov2WithRegistersConfig, transformers.Dinov2WithRegistersModel,
                   dict(mlp_ratio=2, num_register_tokens=3, patch_size=4)),
}


forward = jax.jit(vit.forward, static_argnames=("cfg", "capture", "n_layers"))
BOTH = ("hidden_states", "attn_weights")


def random_params(cfg, scale=1.0, seed=0):
  """Random values in the tree `vit.init` builds (no compile, and no leaf hides behind a 0 or 1)."""
  rs = np.random.RandomState(seed)
  shapes = jax.eval_shape(lambda: vit.init(cfg, jax.random.key(0)))
  return jax.tree.map(lambda s: (scale * rs.randn(*s.shape)).astype(s.dtype), shapes)


def randomize_(model, seed: int):
  """Every parameter random (norm scales around 1), so no mapping hides behind 1s and 0s."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=g)
      p.copy_(1.0 + 0.3 * noise if "norm" in name else 0.15 * noise)
  return model


def make_hf(name: str, seed: int = 0):
  cfg_cls, model_cls, extra = HF_MODELS[name]
  torch.manual_seed(seed)
  model = model_cls(cfg_cls(**{**SMALL, **extra}, attn_implementation="eager"))
  return randomize_(model, seed).eval()


def pixels(n: int, size: int, seed: int = 0) -> np.ndarray:
  return np.random.RandomState(seed).randn(n, size, size, 3).astype(np.float32)


def hf_run(model, px_BHWC):
  with torch.no_grad():
    return model(torch.as_tensor(px_BHWC.transpose(0, 3, 1, 2)), output_hidden_states=True,
                 output_attentions=True)


@pytest.fixture(scope="module", params=list(HF_MODELS))
def fam(request, tmp_path_factory):
  model = make_hf(request.param, seed=len(request.param))
  path = str(tmp_path_factory.mktemp(request.param))
  model.save_pretrained(path)
  cfg, params = hf.load(path)
  yield types.SimpleNamespace(name=request.param, model=model, path=path, cfg=cfg, params=params)


def _check(out, ref, cfg):
  np.testing.assert_allclose(np.asarray(out.last_hidden_state), ref.last_hidden_state.numpy(), atol=ATOL, rtol=0)
  if ref.pooler_output is None:
    assert out.pooled is None
  else:
    np.testing.assert_allclose(np.asarray(out.pooled), ref.pooler_output.numpy(), atol=ATOL, rtol=0)
  want_h = np.stack([h.numpy() for h in ref.hidden_states])
  assert out.hidden_states.shape == want_h.shape == (cfg.n_layers + 1, 2, cfg.seq_len, cfg.d_model)
  np.testing.assert_allclose(np.asarray(out.hidden_states), want_h, atol=ATOL, rtol=0)
  want_w = np.stack([w.numpy() for w in ref.attentions])
  np.testing.assert_allclose(np.asarray(out.attn_weights), want_w, atol=1e-5, rtol=0)


def test_config_carries_family_features(fam):
  c, n = fam.cfg, fam.name
  assert (c.d_model, c.n_layers, c.n_heads, c.d_ff) == (32, 2, 4, 64 if n.startswith("dinov2") else 48)
  assert hf.vision.layout(c) == n.split("_")[0]
  assert c.cls_token == (not n.startswith("siglip"))
  assert c.pre_norm == (n == "clip") and c.layer_scale == n.startswith("dinov2")
  assert c.pool == {"clip": "cls", "siglip": "map", "siglip_nohead": "none"}.get(n, "cls")
  assert c.n_registers == (3 if n == "dinov2_reg" else 0)
  assert c.activation == {"clip": "quick_gelu", "siglip": "gelu_tanh", "siglip_nohead": "gelu_tanh"}.get(n, "gelu")


def test_outputs_match_hf(fam):
  px = pixels(2, fam.cfg.image_size, seed=1)
  out = forward(fam.params, px, cfg=fam.cfg, capture=BOTH)
  _check(out, hf_run(fam.model, px), fam.cfg)


def test_saved_checkpoint_loads_in_transformers(fam, fresh_dir):
  hf.save(fresh_dir, fam.cfg, fam.params)
  model = transformers.AutoModel.from_pretrained(fresh_dir, attn_implementation="eager").eval()
  assert type(model) is type(fam.model)
  px = pixels(2, fam.cfg.image_size, seed=3)
  got, want = hf_run(model, px), hf_run(fam.model, px)
  np.testing.assert_allclose(got.last_hidden_state.numpy(), want.last_hidden_state.numpy(), atol=1e-6, rtol=0)
  if want.pooler_output is not None:
    np.testing.assert_allclose(got.pooler_output.numpy(), want.pooler_output.numpy(), atol=1e-6, rtol=0)
  cfg2, params2 = hf.load(fresh_dir)
  assert cfg2 == fam.cfg
  jax.tree.map(np.testing.assert_array_equal, params2, fam.params)


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_full_clip_and_siglip_checkpoints_load_as_vision_tower(kind, tmp_path):
  if kind == "clip":
    c = transformers.CLIPConfig(vision_config={**SMALL, "intermediate_size": 48},
                                text_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                                 num_attention_heads=4, vocab_size=99), projection_dim=16)
    model = transformers.CLIPModel(c)
  else:
    c = transformers.SiglipConfig(vision_config={**SMALL, "intermediate_size": 48},
                                  text_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                                   num_attention_heads=4, vocab_size=99))
    model = transformers.SiglipModel(c)
  randomize_(model, 5).eval()
  model.save_pretrained(str(tmp_path))
  cfg, params = hf.load(str(tmp_path))
  assert hf.vision.layout(cfg) == kind
  model.vision_model.config._attn_implementation = "eager"
  px = pixels(2, 16, seed=4)
  out = forward(params, px, cfg=cfg, capture=BOTH)
  _check(out, hf_run(model.vision_model, px), cfg)


def test_truncated_forward_equals_hidden_state():
  cfg = vit.Config.tiny("dinov2", n_layers=3)
  params = random_params(cfg, scale=0.2)
  px = pixels(2, cfg.image_size)
  full = forward(params, px, cfg=cfg, capture=("hidden_states",))
  part = forward(params, px, cfg=cfg, capture=("hidden_states",), n_layers=1)
  np.testing.assert_allclose(np.asarray(part.hidden_states), np.asarray(full.hidden_states[:2]), atol=1e-6)
  assert not np.allclose(np.asarray(full.hidden_states[1]), np.asarray(full.hidden_states[2]), atol=1e-3)
  with pytest.raises(ValueError, match="n_layers"):
    vit.forward(params, px, cfg, n_layers=4)


@pytest.mark.parametrize("family", ["clip", "siglip", "dinov2"])
def test_init_save_load_round_trip(family, fresh_dir):
  cfg = vit.Config.tiny(family, n_registers=2 if family == "dinov2" else 0)
  params = random_params(cfg)
  hf.save(fresh_dir, cfg, params)
  cfg2, params2 = hf.load(fresh_dir)
  assert cfg2 == cfg
  jax.tree.map(np.testing.assert_array_equal, params2, params)


def test_errors_name_expected_and_found(fresh_dir):
  cfg = vit.Config.tiny("clip")
  params = jax.eval_shape(lambda: vit.init(cfg, jax.random.key(0)))
  with pytest.raises(ValueError, match=r"pixels must be \[B, 32, 32, 3\].*found \(1, 3, 32, 32\)"):
    vit.forward(params, np.zeros((1, 3, 32, 32), np.float32), cfg)
  bad = cfg.replace(pre_norm=False)
  with pytest.raises(ValueError, match="pre_norm=False"):
    hf.save(fresh_dir, bad, params)
  with pytest.raises(ValueError, match="pool='cls' needs cls_token"):
    vit.Config.tiny("siglip", pool="cls")
