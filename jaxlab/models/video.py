"""Video encoder of STLLM (Spatio-Temporal LLM, arXiv 2507.05258): every frame through a ViT (arXiv 2010.11929),
its patch tokens selected as LLaVA selects them (`multimodal.VitFeatures`), optionally average-pooled over the
patch grid (LLaVA-Video's 2x2 spatial pooling), plus a temporal position per frame: a learned table or the
sinusoidal encoding of arXiv 1706.03762 (PE[f, 2i] = sin(f / 10000^(2i/E)), PE[f, 2i+1] = cos(...)). The
tokens of all frames are concatenated frame-major.

Axes: B batch, F frames, H/W image, C channels, P patch tokens per frame, E width.
"""
from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import choices
from jaxlab.models import multimodal as mm
from jaxlab.models import vit
from jaxlab.nn import axes, layers

Temporal = Literal["learned", "sinusoidal", "none"]
TEMPORAL = choices.values(Temporal)


@dataclasses.dataclass(frozen=True)
class Config:
  features: mm.VitFeatures = mm.VitFeatures()
  n_frames: int = 4
  temporal: Temporal = "learned"
  spatial_pool: int = 1  # average-pool stride over the patch grid (1: none)
  init_std: float = 0.02
  param_dtype: layers.DType = "float32"

  def __post_init__(self):
    def bad(msg):
      raise ValueError(f"video.Config: {msg}")
    if self.n_frames <= 0:
      bad(f"n_frames must be positive, found {self.n_frames}")
    layers.check_dtype_names(self, bad, names=("param_dtype",))
    choices.check(self, bad, nested=False)
    if self.temporal == "sinusoidal" and self.width % 2:
      bad(f"the sinusoidal temporal position needs an even width, found {self.width}")
    g = self.features.vision.grid
    if self.spatial_pool <= 0 or g % self.spatial_pool:
      bad(f"spatial_pool must be a positive divisor of the patch grid ({g}), found {self.spatial_pool}")
    if self.spatial_pool > 1 and self.features.n_tokens != self.features.vision.n_patches:
      bad("spatial_pool > 1 pools the patch grid: the features must be the patches only (feature_select='default', "
          "no register tokens)")

  @property
  def width(self) -> int:
    return self.features.width

  @property
  def tokens_per_frame(self) -> int:
    return self.features.n_tokens // self.spatial_pool ** 2

  @property
  def n_tokens(self) -> int:
    return self.n_frames * self.tokens_per_frame

  def replace(self, **kw) -> "Config":
    return dataclasses.replace(self, **kw)


PRESETS: dict[str, Config] = {
    "tiny": Config(),
    "tiny-sinusoidal": Config(temporal="sinusoidal"),
    # STLLM's frames: SigLIP-so400m/14 at 384 (LLaVA-Video), the penultimate layer's 27x27 patches, unpooled (the
    # reference downsamples 27x27 to 14x14, which no integer-stride average does); 16 frames is a run choice.
    "stllm-siglip": Config(features=mm.VitFeatures(vision=vit.PRESETS["siglip-so400m-14-384"], feature_layers=(-2,),
                                                   feature_select="full"), n_frames=16),
}

# Logical axes: the ViT's, and "temporal", a lookup table per frame like a position embedding.
AXES = vit.AXES + axes.rules((r"temporal", ("pos", "embed"), "pos"))


def sinusoidal(n: int, d: int) -> np.ndarray:
  """[n, d] float32: the sine / cosine position encoding, even columns sine, odd columns cosine."""
  f = np.arange(n, dtype=np.float64)[:, None] / 10000.0 ** (np.arange(0, d, 2, dtype=np.float64) / d)
  out = np.zeros((n, d))
  out[:, 0::2], out[:, 1::2] = np.sin(f), np.cos(f)
  return out.astype(np.float32)


def init(cfg: Config, key) -> dict:
  """{"vision": ViT params[, "temporal": [F, E]]}."""
  kv, kt = jax.random.split(key)
  params = {"vision": mm.VIT.init(cfg.features, kv)}
  if cfg.temporal == "learned":
    params["temporal"] = layers.normal(kt, (cfg.n_frames, cfg.width), cfg.init_std, jnp.dtype(cfg.param_dtype))
  return params


def param_axes(cfg: Config):
  """Logical axis names of every parameter, as a tree shaped like `init(cfg, key)`."""
  return axes.logical_axes(jax.eval_shape(lambda: init(cfg, jax.random.key(0))), AXES)


def temporal_position(params, cfg: Config):
  """[F, E]: the position added to every token of frame f (zeros with temporal='none')."""
  if cfg.temporal == "learned":
    return params["temporal"]
  if cfg.temporal == "sinusoidal":
    return jnp.asarray(sinusoidal(cfg.n_frames, cfg.width))
  return jnp.zeros((cfg.n_frames, cfg.width), jnp.float32)


def forward(params, frames_BFHWC, cfg: Config):
  """[B, F * P, E]: the frames' patch tokens with their frame's temporal position, frame-major."""
  v = cfg.features.vision
  want = (cfg.n_frames, v.image_size, v.image_size, v.channels)
  if frames_BFHWC.ndim != 5 or tuple(frames_BFHWC.shape[1:]) != want:
    raise ValueError(f"frames must be [B, {', '.join(map(str, want))}] (channels last), found "
                     f"{tuple(frames_BFHWC.shape)}")
  b, f = frames_BFHWC.shape[:2]
  x = mm.vit_features(params["vision"], frames_BFHWC.reshape(b * f, *want[1:]), cfg.features)  # [BF, P, E]
  s = cfg.spatial_pool
  if s > 1:
    g, e = v.grid // s, x.shape[-1]
    x = x.reshape(b * f, g, s, g, s, e).mean(axis=(2, 4)).reshape(b * f, g * g, e)
  x = x.reshape(b, f, -1, x.shape[-1]) + temporal_position(params, cfg).astype(x.dtype)[None, :, None]
  return x.reshape(b, -1, x.shape[-1])


VIDEO = mm.Encoder(init=init, forward=forward, width=lambda c: c.width, n_tokens=lambda c: c.n_tokens, axes=AXES)
