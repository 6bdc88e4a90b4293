"""Vision Transformer encoders (ViT, arXiv 2010.11929) in the CLIP, SigLIP and DINOv2 configurations.

One pre-norm encoder; a family is a config: CLIP (arXiv 2103.00020) adds a class token, a LayerNorm on the
embeddings and a LayerNorm on the pooled class token, with quick-GELU; SigLIP (arXiv 2303.15343) has no class
token, GELU-tanh, a final LayerNorm on the sequence and an optional attention-pooling head (MAP); DINOv2
(arXiv 2304.07193) has a class token, per-channel layer scale on both branches, GELU, a final LayerNorm and
optional register tokens (arXiv 2309.16588). Position embeddings are not interpolated: images must have the
config's size.

Pixels are channels-last, [B, H, W, C] (a transformers `pixel_values` tensor is [B, C, H, W]: transpose it).
The patch kernel is the convolution's [D, C, p, p]; the class token and position table are [D] and [S, D], or
[1, 1, D] and [1, S, D] with `unit_dims` (DINOv2's shapes), so checkpoints load without reshaping; which
checkpoint layout a config reads and writes is `jaxlab.hf.vision`'s business. Blocks are stacked on a leading
`layers` axis under lax.scan.

Axes: B batch, H/W image, C channels, p patch, S sequence (class + registers + patches), D model, F mlp,
N heads, K head dim, L layers.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Literal, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from jaxlab import choices
from jaxlab.models import transformer as tfm
from jaxlab.nn import attention as attn_lib
from jaxlab.nn import axes, layers

CAPTURES = ("hidden_states", "attn_weights")


@dataclasses.dataclass(frozen=True)
class Config:
  image_size: int = 32
  patch_size: int = 8
  channels: int = 3
  d_model: int = 64
  n_layers: int = 2
  n_heads: int = 4
  d_ff: int = 128
  activation: layers.Activation = "quick_gelu"
  norm_eps: float = 1e-5
  cls_token: bool = True
  n_registers: int = 0  # DINOv2 register tokens, placed after the class token
  patch_bias: bool = False
  qkv_bias: bool = True
  pre_norm: bool = True  # LayerNorm on the embeddings (CLIP)
  final_norm: Literal["pooled", "sequence", "none"] = "pooled"  # "pooled": CLIP's, on the pooled class token;
  # "sequence": SigLIP's and DINOv2's, on every token
  pool: Literal["cls", "map", "none"] = "cls"  # "map": SigLIP's attention-pooling head
  layer_scale: bool = False  # DINOv2 per-channel scales on the attention and MLP outputs
  layer_scale_init: float = 1.0
  mask_token: bool = False  # DINOv2 checkpoints carry a (here unused) mask token
  unit_dims: bool = False  # class token [1, 1, D] and position table [1, S, D] (DINOv2) instead of [D], [S, D]
  init_std: float = 0.02
  param_dtype: layers.DType = "float32"
  dtype: layers.DType = "float32"
  remat: bool = False

  def __post_init__(self):
    def bad(msg):
      raise ValueError(f"vit.Config: {msg}")
    for name in ("image_size", "patch_size", "channels", "d_model", "n_layers", "n_heads", "d_ff"):
      if getattr(self, name) <= 0:
        bad(f"{name} must be positive, found {getattr(self, name)}")
    if self.patch_size > self.image_size:
      bad(f"patch_size ({self.patch_size}) must not exceed image_size ({self.image_size})")
    if self.d_model % self.n_heads:
      bad(f"n_heads ({self.n_heads}) must divide d_model ({self.d_model})")
    layers.check_dtype_names(self, bad)
    choices.check(self, bad, nested=False)
    if self.pool == "cls" and not self.cls_token:
      bad("pool='cls' needs cls_token=True")
    if self.final_norm == "pooled" and self.pool != "cls":
      bad(f"final_norm='pooled' normalizes the pooled class token and needs pool='cls', found {self.pool!r}")
    if self.n_registers < 0 or (self.n_registers and not self.cls_token):
      bad(f"register tokens follow the class token: need cls_token=True and n_registers >= 0, found "
          f"cls_token={self.cls_token}, n_registers={self.n_registers}")

  @property
  def kdim(self) -> int:
    return self.d_model // self.n_heads

  @property
  def grid(self) -> int:
    return self.image_size // self.patch_size

  @property
  def n_patches(self) -> int:
    return self.grid ** 2

  @property
  def seq_len(self) -> int:
    """Tokens the encoder outputs per image: class token, registers, patches."""
    return int(self.cls_token) + self.n_registers + self.n_patches

  @classmethod
  def tiny(cls, family: str = "clip", **kw) -> "Config":
    return dataclasses.replace(PRESETS[f"{family}-tiny"], **kw)

  def replace(self, **kw) -> "Config":
    return dataclasses.replace(self, **kw)


def clip_config(**kw) -> Config:
  return Config(**{**dict(activation="quick_gelu", norm_eps=1e-5, cls_token=True, patch_bias=False, pre_norm=True,
                          final_norm="pooled", pool="cls"), **kw})


def siglip_config(**kw) -> Config:
  return Config(**{**dict(activation="gelu_tanh", norm_eps=1e-6, cls_token=False, patch_bias=True, pre_norm=False,
                          final_norm="sequence", pool="map"), **kw})


def dinov2_config(**kw) -> Config:
  return Config(**{**dict(activation="gelu", norm_eps=1e-6, cls_token=True, patch_bias=True, pre_norm=False,
                          final_norm="sequence", pool="cls", layer_scale=True, mask_token=True,
                          unit_dims=True), **kw})


_TINY = dict(image_size=32, patch_size=8, d_model=64, n_layers=2, n_heads=4, d_ff=128)
PRESETS: dict[str, Config] = {
    "clip-tiny": clip_config(**_TINY),
    "siglip-tiny": siglip_config(**_TINY),
    "dinov2-tiny": dinov2_config(**_TINY),
    "clip-vit-b-16": clip_config(image_size=224, patch_size=16, d_model=768, n_layers=12, n_heads=12, d_ff=3072),
    "clip-vit-l-14": clip_config(image_size=224, patch_size=14, d_model=1024, n_layers=24, n_heads=16, d_ff=4096),
    "clip-vit-l-14-336": clip_config(image_size=336, patch_size=14, d_model=1024, n_layers=24, n_heads=16,
                                     d_ff=4096),
    "siglip-base-16-224": siglip_config(image_size=224, patch_size=16, d_model=768, n_layers=12, n_heads=12,
                                        d_ff=3072),
    "siglip-so400m-14-384": siglip_config(image_size=384, patch_size=14, d_model=1152, n_layers=27, n_heads=16,
                                          d_ff=4304),
    "dinov2-small": dinov2_config(image_size=518, patch_size=14, d_model=384, n_layers=12, n_heads=6, d_ff=1536),
    "dinov2-base": dinov2_config(image_size=518, patch_size=14, d_model=768, n_layers=12, n_heads=12, d_ff=3072),
    "dinov2-large": dinov2_config(image_size=518, patch_size=14, d_model=1024, n_layers=24, n_heads=16, d_ff=4096),
    "dinov2-base-reg": dinov2_config(image_size=518, patch_size=14, d_model=768, n_layers=12, n_heads=12,
                                     d_ff=3072, n_registers=4),
}

# Logical axes of every parameter: the block names shared with the decoder (attn/q, mlp/up, norms) are
# transformer's, then the ViT-only params. The patch kernel keeps the convolution layout [D, C, p, p] (its fan-in
# spans three axes, so none is named); the singleton leading dims of `unit_dims` tables are named "layers".
AXES = tfm.AXES + axes.rules(
    (r"patch_embed/kernel", ("embed", "patch", "patch", "patch"), None),
    (r"patch_embed/bias", ("embed",), None),
    (r"(cls_token|mask_token|head/probe)", ("embed",), None),
    (r"(pos_embed|register_tokens)", ("pos", "embed"), "pos"),  # lookup tables, like a token embedding
    (r"(pre_norm|head/norm)/(scale|bias)", ("embed",), None),
    (r"(attn_layer_scale|mlp_layer_scale)", ("embed",), None),
    (r"attn/qkv/kernel", ("embed", "q_heads"), "embed"),
    (r"attn/qkv/bias", ("q_heads",), None),
)


def init(cfg: Config, key) -> dict:
  """Random params: normal(0, init_std) matrices and tables, unit norm scales, zero biases."""
  dt = jnp.dtype(cfg.param_dtype)
  d, f, L, std = cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.init_std
  ks = iter(jax.random.split(key, 16))
  lin = lambda i, o, bias, stack=(L,): layers.linear_init(next(ks), i, o, bias=bias, std=std, dtype=dt,
                                                          stack=stack)
  ln = lambda stack=(L,): layers.norm_init(d, bias=True, dtype=dt, stack=stack)
  unit = cfg.unit_dims
  pe = {"kernel": layers.normal(next(ks), (d, cfg.channels, cfg.patch_size, cfg.patch_size), std, dt)}
  if cfg.patch_bias:
    pe["bias"] = jnp.zeros((d,), dt)
  block = {"attn_norm": ln(), "mlp_norm": ln(),
           "attn": {n: lin(d, d, cfg.qkv_bias or n == "o") for n in "qkvo"},
           "mlp": layers.mlp_init(next(ks), d, f, gated=False, bias=True, std=std, dtype=dt, stack=(L,))}
  if cfg.layer_scale:
    block["attn_layer_scale"] = jnp.full((L, d), cfg.layer_scale_init, dt)
    block["mlp_layer_scale"] = jnp.full((L, d), cfg.layer_scale_init, dt)
  params = {"patch_embed": pe, "layers": block,
            "pos_embed": layers.normal(next(ks), ((1,) if unit else ()) + (cfg.seq_len - cfg.n_registers, d),
                                       std, dt)}
  if cfg.cls_token:
    params["cls_token"] = layers.normal(next(ks), (1, 1, d) if unit else (d,), std, dt)
  if cfg.n_registers:
    params["register_tokens"] = layers.normal(next(ks), (1, cfg.n_registers, d), std, dt)
  if cfg.mask_token:
    params["mask_token"] = jnp.zeros((1, d), dt)
  if cfg.pre_norm:
    params["pre_norm"] = ln(())
  if cfg.final_norm != "none":
    params["final_norm"] = ln(())
  if cfg.pool == "map":
    params["head"] = {"probe": layers.normal(next(ks), (1, 1, d), std, dt), "norm": ln(()),
                      "attn": {"qkv": lin(d, 3 * d, True, ()), "o": lin(d, d, True, ())},
                      "mlp": layers.mlp_init(next(ks), d, f, gated=False, bias=True, std=std, dtype=dt)}
  return params


def param_axes(cfg: Config):
  """Logical axis names of every parameter, as a tree shaped like `init(cfg, key)`."""
  return axes.logical_axes(jax.eval_shape(lambda: init(cfg, jax.random.key(0))), AXES)


class Output(NamedTuple):
  last_hidden_state: Any  # [B, S, D]; after the final norm when final_norm == "sequence"
  pooled: Any = None  # [B, D]: the (normalized) class token, the MAP head's output, or None
  hidden_states: Any = None  # [L+1, B, S, D]; 0 = embeddings (after pre_norm), l = output of block l
  attn_weights: Any = None  # [L, B, N, S, S]


def embed(params, pixels_BHWC, cfg: Config):
  """Patch embeddings with class token, position embeddings and registers: [B, S, D]."""
  b, h, w, c = pixels_BHWC.shape
  if (h, w, c) != (cfg.image_size, cfg.image_size, cfg.channels):
    raise ValueError(f"pixels must be [B, {cfg.image_size}, {cfg.image_size}, {cfg.channels}] (channels last), "
                     f"found {tuple(pixels_BHWC.shape)}")
  dt, d, g, p = jnp.dtype(cfg.dtype), cfg.d_model, cfg.grid, cfg.patch_size
  x = pixels_BHWC[:, :g * p, :g * p].astype(dt).reshape(b, g, p, g, p, c)  # a strided conv drops the remainder
  x = jnp.einsum("bipjqc,dcpq->bijd", x, params["patch_embed"]["kernel"].astype(dt)).reshape(b, g * g, d)
  if "bias" in params["patch_embed"]:
    x = x + params["patch_embed"]["bias"].astype(dt)
  if cfg.cls_token:
    cls = jnp.broadcast_to(params["cls_token"].reshape(1, 1, d).astype(dt), (b, 1, d))
    x = jnp.concatenate([cls, x], axis=1)
  x = x + params["pos_embed"].reshape(-1, d).astype(dt)
  if cfg.n_registers:
    reg = jnp.broadcast_to(params["register_tokens"].reshape(1, -1, d).astype(dt), (b, cfg.n_registers, d))
    x = jnp.concatenate([x[:, :1], reg, x[:, 1:]], axis=1)
  if cfg.pre_norm:
    x = layers.layer_norm(params["pre_norm"], x, cfg.norm_eps)
  return x


def _mha(q_BTD, k_BSD, v_BSD, n_heads):
  b, t, d = q_BTD.shape
  k = d // n_heads
  out, w = attn_lib.attention(q_BTD.reshape(b, t, n_heads, k), k_BSD.reshape(b, -1, n_heads, k),
                              v_BSD.reshape(b, -1, n_heads, k))
  return out.reshape(b, t, d), w


def _block(p, x_BSD, cfg: Config):
  dt, eps = jnp.dtype(cfg.dtype), cfg.norm_eps
  h = layers.layer_norm(p["attn_norm"], x_BSD, eps)
  q, k, v = (layers.linear(p["attn"][n], h, dt) for n in "qkv")
  a, w = _mha(q, k, v, cfg.n_heads)
  a = layers.linear(p["attn"]["o"], a, dt)
  if cfg.layer_scale:
    a = a * p["attn_layer_scale"].astype(dt)
  x_BSD = x_BSD + a
  m = layers.mlp(p["mlp"], layers.layer_norm(p["mlp_norm"], x_BSD, eps), cfg.activation, dt)
  if cfg.layer_scale:
    m = m * p["mlp_layer_scale"].astype(dt)
  return x_BSD + m, w


def _map_head(p, x_BSD, cfg: Config):
  """SigLIP's multihead attention pooling: a learned probe attends over the sequence, then a residual MLP."""
  dt, d = jnp.dtype(cfg.dtype), cfg.d_model
  probe = jnp.broadcast_to(p["probe"].reshape(1, 1, d).astype(dt), (x_BSD.shape[0], 1, d))
  kern, bias = p["attn"]["qkv"]["kernel"].astype(dt), p["attn"]["qkv"]["bias"].astype(dt)
  proj = lambda x, i: x @ kern[:, i * d:(i + 1) * d] + bias[i * d:(i + 1) * d]
  a, _ = _mha(proj(probe, 0), proj(x_BSD, 1), proj(x_BSD, 2), cfg.n_heads)
  a = layers.linear(p["attn"]["o"], a, dt)
  y = a + layers.mlp(p["mlp"], layers.layer_norm(p["norm"], a, cfg.norm_eps), cfg.activation, dt)
  return y[:, 0]


def forward(params, pixels_BHWC, cfg: Config, *, capture: Sequence[str] = (), n_layers: int | None = None) -> Output:
  """Encodes images.

  Args:
    pixels_BHWC: normalized images, channels last, of the config's image size.
    capture: any of "hidden_states" (the embeddings and every block's output, HF `hidden_states`) and
      "attn_weights" (every block's attention weights).
    n_layers: run only the first `n_layers` blocks (e.g. when only an earlier layer's features are used);
      the final norm and pooling then apply to that block's output.
  """
  unknown = set(capture) - set(CAPTURES)
  if unknown:
    raise ValueError(f"unknown capture {sorted(unknown)}; expected a subset of {CAPTURES}")
  n = cfg.n_layers if n_layers is None else n_layers
  if not 0 <= n <= cfg.n_layers:
    raise ValueError(f"n_layers must be in [0, {cfg.n_layers}], found {n_layers}")
  x = embed(params, pixels_BHWC, cfg)
  lp = jax.tree.map(lambda a: a[:n], params["layers"]) if n != cfg.n_layers else params["layers"]

  def body(x, p):
    x, w = _block(p, x, cfg)
    ys = {"hidden_states": x, "attn_weights": w}
    return x, {k: v for k, v in ys.items() if k in capture}

  if cfg.remat:
    body = jax.checkpoint(body, prevent_cse=False)
  x_last, ys = jax.lax.scan(body, x, lp)
  hs = jnp.concatenate([x[None], ys["hidden_states"]], axis=0) if "hidden_states" in capture else None
  last = x_last
  if cfg.final_norm == "sequence":
    last = layers.layer_norm(params["final_norm"], x_last, cfg.norm_eps)
  pooled = None
  if cfg.pool == "cls":
    pooled = last[:, 0]
    if cfg.final_norm == "pooled":
      pooled = layers.layer_norm(params["final_norm"], pooled, cfg.norm_eps)
  elif cfg.pool == "map":
    pooled = _map_head(params["head"], last, cfg)
  return Output(last_hidden_state=last, pooled=pooled, hidden_states=hs, attn_weights=ys.get("attn_weights"))
