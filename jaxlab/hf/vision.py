"""HF <-> jaxlab for vision encoders (CLIP, SigLIP, DINOv2 with and without registers) and LLaVA.

Tensor names are those transformers 5 writes with `save_pretrained`: `CLIPVisionModel` / `SiglipVisionModel`
without a prefix, `Dinov2Model` with its legacy names (`encoder.layer.{i}.attention.attention.query`), and
`LlavaForConditionalGeneration` as `vision_tower.*`, `multi_modal_projector.*`, `language_model.model.*`,
`language_model.lm_head.*`. Full CLIP / SigLIP checkpoints (model_type "clip" / "siglip", e.g.
openai/clip-vit-large-patch14-336) load as their vision tower, `vision_model.*`, ignoring the text tower.
Keys a config.json leaves out take the transformers config defaults.

The checkpoint layout of a `vit.Config` follows from its architecture fields (`layout`): layer scale means
DINOv2, no class token SigLIP, otherwise CLIP; `vision_config_from_hf` sets the fields of each layout.
"""
from __future__ import annotations

import dataclasses

from jaxlab.hf import decoder
from jaxlab.hf.spec import Family, Tensor
from jaxlab.models import transformer as tfm
from jaxlab.models import vit, vlm

# transformers' config defaults, for the keys old config.json files omit.
CLIP_DEFAULTS = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                     num_channels=3, image_size=224, patch_size=32, hidden_act="quick_gelu", layer_norm_eps=1e-5,
                     initializer_range=0.02)
SIGLIP_DEFAULTS = dict(CLIP_DEFAULTS, patch_size=16, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6,
                       vision_use_head=True)
DINOV2_DEFAULTS = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, mlp_ratio=4, num_channels=3,
                       image_size=224, patch_size=14, hidden_act="gelu", layer_norm_eps=1e-6, qkv_bias=True,
                       layerscale_value=1.0, use_swiglu_ffn=False, use_mask_token=True, initializer_range=0.02,
                       num_register_tokens=0)
LLAMA_DEFAULTS = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32, hidden_act="silu", max_position_embeddings=2048, rms_norm_eps=1e-6,
                      rope_theta=10000.0, initializer_range=0.02, tie_word_embeddings=False)
LLAVA_DEFAULTS = dict(image_token_index=32000, projector_hidden_act="gelu", vision_feature_select_strategy="default",
                      vision_feature_layer=-2, multimodal_projector_bias=True)
_ACT_FROM_HF = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "quick_gelu": "quick_gelu",
                "relu": "relu", "silu": "silu"}
_ACT_TO_HF = {"gelu_tanh": "gelu_pytorch_tanh"}
VISION_MODEL_TYPES = {"clip": "clip_vision_model", "siglip": "siglip_vision_model", "dinov2": "dinov2"}


def layout(cfg: vit.Config) -> str:
  """The checkpoint layout ("clip", "siglip" or "dinov2") that `cfg`'s architecture is saved and loaded in."""
  if cfg.layer_scale:
    return "dinov2"
  return "clip" if cfg.cls_token else "siglip"


def _act(name: str) -> str:
  if name not in _ACT_FROM_HF:
    raise NotImplementedError(f"activation {name!r} is not supported; expected one of {sorted(_ACT_FROM_HF)}")
  return _ACT_FROM_HF[name]


def _common(c: dict) -> dict:
  return dict(image_size=c["image_size"], patch_size=c["patch_size"], channels=c["num_channels"],
              d_model=c["hidden_size"], n_layers=c["num_hidden_layers"], n_heads=c["num_attention_heads"],
              activation=_act(c["hidden_act"]), norm_eps=c["layer_norm_eps"],
              init_std=c.get("initializer_range", 0.02))


def vision_config_from_hf(d: dict) -> vit.Config:
  """A vit.Config from a CLIP / SigLIP vision or DINOv2 config dict (full CLIP / SigLIP: their vision_config)."""
  mt = d.get("model_type")
  if mt in ("clip", "siglip"):
    return vision_config_from_hf({"model_type": f"{mt}_vision_model", **(d.get("vision_config") or {})})
  if mt == "clip_vision_model":
    c = {**CLIP_DEFAULTS, **d}
    return vit.clip_config(**_common(c), d_ff=c["intermediate_size"])
  if mt == "siglip_vision_model":
    c = {**SIGLIP_DEFAULTS, **d}
    return vit.siglip_config(**_common(c), d_ff=c["intermediate_size"],
                             pool="map" if c["vision_use_head"] else "none")
  if mt in ("dinov2", "dinov2_with_registers"):
    c = {**DINOV2_DEFAULTS, **({"patch_size": 16, "num_register_tokens": 4} if mt != "dinov2" else {}), **d}
    if c["use_swiglu_ffn"]:
      raise NotImplementedError(f"{mt}: use_swiglu_ffn=true (DINOv2-giant's SwiGLU MLP) is not supported")
    return vit.dinov2_config(**_common(c), d_ff=int(c["hidden_size"] * c["mlp_ratio"]), qkv_bias=c["qkv_bias"],
                             layer_scale_init=c["layerscale_value"], n_registers=c["num_register_tokens"],
                             mask_token=bool(c["use_mask_token"]) or mt != "dinov2")
  raise ValueError(f"unknown vision model_type {mt!r}; expected clip(_vision_model), siglip(_vision_model), "
                   "dinov2 or dinov2_with_registers")


def _require(cfg: vit.Config, want: dict):
  bad = [f"{k}={getattr(cfg, k)!r} (needs {v!r})" for k, v in want.items() if getattr(cfg, k) != v]
  if bad:
    raise ValueError(f"vit.Config in the {layout(cfg)} layout is not a transformers "
                     f"{VISION_MODEL_TYPES[layout(cfg)]}: " + "; ".join(bad))


def vision_config_to_hf(cfg: vit.Config) -> dict:
  d = {"hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
       "num_channels": cfg.channels, "image_size": cfg.image_size, "patch_size": cfg.patch_size,
       "hidden_act": _ACT_TO_HF.get(cfg.activation, cfg.activation), "layer_norm_eps": cfg.norm_eps,
       "initializer_range": cfg.init_std, "attention_dropout": 0.0}
  common = dict(n_registers=0, qkv_bias=True, layer_scale=False, mask_token=False, unit_dims=False)
  kind = layout(cfg)
  if kind == "clip":
    _require(cfg, dict(common, cls_token=True, patch_bias=False, pre_norm=True, final_norm="pooled", pool="cls"))
    return {"architectures": ["CLIPVisionModel"], "model_type": "clip_vision_model", **d,
            "intermediate_size": cfg.d_ff}
  if kind == "siglip":
    if cfg.pool not in ("map", "none"):
      raise ValueError(f"a SigLIP vision model pools with its head or not at all; found pool={cfg.pool!r}")
    _require(cfg, dict(common, cls_token=False, patch_bias=True, pre_norm=False, final_norm="sequence"))
    return {"architectures": ["SiglipVisionModel"], "model_type": "siglip_vision_model", **d,
            "intermediate_size": cfg.d_ff, "vision_use_head": cfg.pool == "map"}
  _require(cfg, dict(cls_token=True, patch_bias=True, pre_norm=False, final_norm="sequence", pool="cls",
                     layer_scale=True, unit_dims=True))
  if cfg.d_ff % cfg.d_model:
    raise ValueError(f"DINOv2 sizes its MLP as hidden_size * mlp_ratio (an integer); found d_ff={cfg.d_ff}, "
                     f"d_model={cfg.d_model}")
  d = {**d, "mlp_ratio": cfg.d_ff // cfg.d_model, "qkv_bias": cfg.qkv_bias,
       "layerscale_value": cfg.layer_scale_init, "use_swiglu_ffn": False, "drop_path_rate": 0.0,
       "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
  if cfg.n_registers:
    if not cfg.mask_token:
      raise ValueError("dinov2_with_registers checkpoints always hold a mask token; set mask_token=True")
    return {"architectures": ["Dinov2WithRegistersModel"], "model_type": "dinov2_with_registers", **d,
            "num_register_tokens": cfg.n_registers}
  return {"architectures": ["Dinov2Model"], "model_type": "dinov2", **d, "use_mask_token": cfg.mask_token}


def vision_tensors(cfg: vit.Config, prefix: str = "", root: tuple[str, ...] = ()) -> list[Tensor]:
  T = lambda hf, path, tr=False: Tensor(prefix + hf, root + path, tr)
  lin = lambda hf, path, bias=True: [T(hf + ".weight", path + ("kernel",), True)] + (
      [T(hf + ".bias", path + ("bias",))] if bias else [])
  ln = lambda hf, path: [T(hf + ".weight", path + ("scale",)), T(hf + ".bias", path + ("bias",))]
  if layout(cfg) == "dinov2":
    E, L = "embeddings.", "encoder.layer.{i}."
    out = [T(E + "cls_token", ("cls_token",)), T(E + "position_embeddings", ("pos_embed",)),
           T(E + "patch_embeddings.projection.weight", ("patch_embed", "kernel")),
           T(E + "patch_embeddings.projection.bias", ("patch_embed", "bias"))]
    out += [T(E + "mask_token", ("mask_token",))] if cfg.mask_token else []
    out += [T(E + "register_tokens", ("register_tokens",))] if cfg.n_registers else []
    for hf, n in (("query", "q"), ("key", "k"), ("value", "v")):
      out += lin(f"{L}attention.attention.{hf}", ("layers", "attn", n), cfg.qkv_bias)
    out += lin(f"{L}attention.output.dense", ("layers", "attn", "o"))
    out += ln(L + "norm1", ("layers", "attn_norm")) + ln(L + "norm2", ("layers", "mlp_norm"))
    out += [T(L + "layer_scale1.lambda1", ("layers", "attn_layer_scale")),
            T(L + "layer_scale2.lambda1", ("layers", "mlp_layer_scale"))]
    out += lin(L + "mlp.fc1", ("layers", "mlp", "up")) + lin(L + "mlp.fc2", ("layers", "mlp", "down"))
    return out + ln("layernorm", ("final_norm",))
  E, L = "embeddings.", "encoder.layers.{i}."
  out = [T(E + "patch_embedding.weight", ("patch_embed", "kernel")),
         T(E + "position_embedding.weight", ("pos_embed",))]
  out += [T(E + "patch_embedding.bias", ("patch_embed", "bias"))] if cfg.patch_bias else []
  out += [T(E + "class_embedding", ("cls_token",))] if cfg.cls_token else []
  out += ln("pre_layrnorm", ("pre_norm",)) if cfg.pre_norm else []
  for n in "qkv":
    out += lin(f"{L}self_attn.{n}_proj", ("layers", "attn", n))
  out += lin(L + "self_attn.out_proj", ("layers", "attn", "o"))
  out += ln(L + "layer_norm1", ("layers", "attn_norm")) + ln(L + "layer_norm2", ("layers", "mlp_norm"))
  out += lin(L + "mlp.fc1", ("layers", "mlp", "up")) + lin(L + "mlp.fc2", ("layers", "mlp", "down"))
  out += ln("post_layernorm", ("final_norm",)) if cfg.final_norm != "none" else []
  if cfg.pool == "map":
    H = "head."
    out += [T(H + "probe", ("head", "probe")),
            T(H + "attention.in_proj_weight", ("head", "attn", "qkv", "kernel"), True),
            T(H + "attention.in_proj_bias", ("head", "attn", "qkv", "bias"))]
    out += lin(H + "attention.out_proj", ("head", "attn", "o")) + ln(H + "layernorm", ("head", "norm"))
    out += lin(H + "mlp.fc1", ("head", "mlp", "up")) + lin(H + "mlp.fc2", ("head", "mlp", "down"))
  return out


def _vision_family(model_types, prefix="", ignore=()) -> Family:
  return Family(model_types=model_types, config_cls=vit.Config, config_from_hf=vision_config_from_hf,
                config_to_hf=vision_config_to_hf, tensors=lambda c: vision_tensors(c, prefix), init=vit.init,
                n_layers=lambda c: c.n_layers, ignore=("position_ids",) + ignore)


# ------------------------------------------------------------------------------------------------ LLaVA

def _text_config_from_hf(t: dict) -> tfm.Config:
  mt = t.get("model_type", "llama")
  base = LLAMA_DEFAULTS if mt == "llama" else {}
  return decoder.config_from_hf({**base, **t, "model_type": mt})


def llava_config_from_hf(d: dict) -> vlm.Config:
  c = {**LLAVA_DEFAULTS, **d}
  layer = c["vision_feature_layer"]
  return vlm.Config(
      vision=vision_config_from_hf(c["vision_config"]), text=_text_config_from_hf(c.get("text_config") or {}),
      image_token_id=c.get("image_token_id", c["image_token_index"]),
      feature_layers=tuple(layer) if isinstance(layer, (list, tuple)) else (layer,),
      feature_select=c["vision_feature_select_strategy"], connector_activation=_act(c["projector_hidden_act"]),
      connector_bias=bool(c["multimodal_projector_bias"]))


def llava_config_to_hf(cfg: vlm.Config) -> dict:
  if cfg.connector_dim != cfg.text.d_model:
    raise ValueError(f"LLaVA's projector width is the text width ({cfg.text.d_model}); found connector_dim="
                     f"{cfg.connector_dim}")
  text = decoder.config_to_hf(cfg.text)
  text.pop("architectures", None)
  layers = cfg.feature_layers
  return {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
          "vision_config": vision_config_to_hf(cfg.vision), "text_config": text,
          "image_token_index": cfg.image_token_id, "image_token_id": cfg.image_token_id,
          "image_seq_length": cfg.tokens_per_image,
          "vision_feature_layer": layers[0] if len(layers) == 1 else list(layers),
          "vision_feature_select_strategy": cfg.feature_select,
          "projector_hidden_act": _ACT_TO_HF.get(cfg.connector_activation, cfg.connector_activation),
          "multimodal_projector_bias": cfg.connector_bias, "tie_word_embeddings": cfg.text.tie_embeddings}


def _with_layers(t: Tensor, n: int, family_n: int) -> Tensor:
  """The vision tower's per-layer tensors carry their own depth (it may differ from the LM's)."""
  if "{i}" not in t.hf or n == family_n:
    return t
  return dataclasses.replace(t, n_layers=n)


def _text_name(name: str) -> str:
  return "language_model." + name  # model.* -> language_model.model.*, lm_head.* -> language_model.lm_head.*


def llava_tensors(cfg: vlm.Config) -> list[Tensor]:
  out = [_with_layers(t, cfg.vision.n_layers, cfg.text.n_layers)
         for t in vision_tensors(cfg.vision, "vision_tower.", ("vision",))]
  out += [Tensor(_text_name(t.hf), ("lm",) + t.path, t.transpose) for t in decoder.tensors(cfg.text)]
  for hf, n in (("linear_1", "fc1"), ("linear_2", "fc2")):
    out.append(Tensor(f"multi_modal_projector.{hf}.weight", ("connector", n, "kernel"), True))
    if cfg.connector_bias:
      out.append(Tensor(f"multi_modal_projector.{hf}.bias", ("connector", n, "bias")))
  return out


LLAVA = Family(model_types=("llava",), config_cls=vlm.Config, config_from_hf=llava_config_from_hf,
               config_to_hf=llava_config_to_hf, tensors=llava_tensors, init=vlm.init,
               n_layers=lambda c: c.text.n_layers, ignore=("rotary_emb.inv_freq", "position_ids"),
               redundant=lambda c: ("language_model.lm_head.weight",) if c.text.tie_embeddings else ())
# Full CLIP / SigLIP checkpoints load as their vision tower; listed first so saving picks the vision models.
FULL_CLIP = _vision_family(("clip", "siglip"), "vision_model.",
                           ("text_model.", "text_projection", "visual_projection", "logit_scale", "logit_bias"))
VISION = _vision_family(("clip_vision_model", "siglip_vision_model", "dinov2", "dinov2_with_registers"))
FAMILIES = (FULL_CLIP, VISION, LLAVA)  # in this order in jaxlab.hf.FAMILIES (the last match wins)
