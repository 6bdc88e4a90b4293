"""The Q-Former aligner of STLLM (Spatio-Temporal LLM, arXiv 2507.05258), the BLIP-2 querying transformer
(arXiv 2301.12597) as InstructBLIP configures it: learned latent queries, optionally followed by projected
video-patch features and text embeddings as extra queries, pass through BERT-style post-norm layers of
self-attention over all queries, cross-attention to the point-cloud features (every `cross_every`-th layer,
counting from the first) and an MLP; the first `n_latents` outputs are projected to the LM width as a prefix.
`ALIGNER` is the whole STLLM-Aligner as one encoder: `jaxlab.models.pointcloud` features (with their ray
encoding) as the cross-attended keys, `jaxlab.models.video` tokens as the extra video queries.

Every query token takes the query path of transformers' `Blip2QFormerLayer` (STLLM passes all of them as
`query_embeds`), so cross-attention and the query MLP apply to the video and text queries too. Layers are
stacked on a leading `layers` axis and run under lax.scan in groups of `cross_every` (the first of each group
has cross-attention, whose params are stacked on their own leading axis).

Axes: B batch, Q queries (K latents + V video + T text), S point features, E point width, X video / text width,
D Q-Former width, F mlp, H heads, O output (LM) width, L layers, G layer groups.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxlab import choices
from jaxlab.models import multimodal as mm
from jaxlab.models import pointcloud
from jaxlab.models import transformer as tfm
from jaxlab.models import video as video_lib
from jaxlab.nn import attention as attn_lib
from jaxlab.nn import axes, layers


@dataclasses.dataclass(frozen=True)
class Config:
  d_model: int = 32
  n_layers: int = 2
  n_heads: int = 4
  d_ff: int = 64
  encoder_width: int = 16  # E: width of the point features cross-attended to
  cross_every: int = 2  # InstructBLIP's cross_attention_frequency
  n_latents: int = 32
  out_width: int = 48  # O: the LM width of the prefix
  video_width: int = 0  # X of projected video-patch queries (0: none)
  text_width: int = 0  # X of projected text-embedding queries (0: none)
  activation: layers.Activation = "gelu"
  norm_eps: float = 1e-12
  init_std: float = 0.02
  param_dtype: layers.DType = "float32"
  dtype: layers.DType = "float32"

  def __post_init__(self):
    def bad(msg):
      raise ValueError(f"qformer.Config: {msg}")
    for name in ("d_model", "n_layers", "n_heads", "d_ff", "encoder_width", "cross_every", "n_latents",
                 "out_width"):
      if getattr(self, name) <= 0:
        bad(f"{name} must be positive, found {getattr(self, name)}")
    for name in ("video_width", "text_width"):
      if getattr(self, name) < 0:
        bad(f"{name} must be >= 0 (0: no such queries), found {getattr(self, name)}")
    if self.d_model % self.n_heads:
      bad(f"n_heads ({self.n_heads}) must divide d_model ({self.d_model})")
    if self.n_layers % self.cross_every:
      bad(f"cross_every ({self.cross_every}) must divide n_layers ({self.n_layers})")
    layers.check_dtype_names(self, bad)
    choices.check(self, bad, nested=False)

  @property
  def n_groups(self) -> int:
    return self.n_layers // self.cross_every

  @classmethod
  def tiny(cls, **kw) -> "Config":
    return dataclasses.replace(PRESETS["tiny"], **kw)

  def replace(self, **kw) -> "Config":
    return dataclasses.replace(self, **kw)


PRESETS: dict[str, Config] = {
    "tiny": Config(),
    "tiny-video-text": Config(video_width=24, text_width=24),
    # STLLM-Aligner: InstructBlipQFormerConfig(num_hidden_layers=6, encoder_hidden_size=768) defaults, 32 latents,
    # video and text queries projected from the Qwen2-7B width, prefix in the same width.
    "stllm": Config(d_model=768, n_layers=6, n_heads=12, d_ff=3072, encoder_width=768, cross_every=2,
                    n_latents=32, out_width=3584, video_width=3584, text_width=3584),
}

AXES = tfm.AXES + axes.rules(
    (r"query_norm/(scale|bias)", ("embed",), None),
    (r"(video_proj|text_proj)/kernel", ("patch", "embed"), "patch"),  # outside features in, like patch pixels
    (r"(video_proj|text_proj)/bias", ("embed",), None),
    (r"out_proj/kernel", ("mlp", "embed"), "mlp"),  # Q-Former width -> LM width, like the connector's fc2
    (r"out_proj/bias", ("embed",), None),
    (r"latents", ("pos", "embed"), "pos"),
)


def init(cfg: Config, key) -> dict:
  """Random params: normal(0, init_std) matrices and latents, unit norm scales, zero biases."""
  dt = jnp.dtype(cfg.param_dtype)
  d, e, f, L, G, std = cfg.d_model, cfg.encoder_width, cfg.d_ff, cfg.n_layers, cfg.n_groups, cfg.init_std
  ks = iter(jax.random.split(key, 16))
  lin = lambda i, o, stack: layers.linear_init(next(ks), i, o, bias=True, std=std, dtype=dt, stack=stack)
  ln = lambda stack=(): layers.norm_init(d, bias=True, dtype=dt, stack=stack)
  params = {
      "latents": layers.normal(next(ks), (cfg.n_latents, d), std, dt),
      "query_norm": ln(),
      "layers": {"attn": {n: lin(d, d, (L,)) for n in "qkvo"}, "attn_norm": ln((L,)),
                 "mlp": layers.mlp_init(next(ks), d, f, gated=False, bias=True, std=std, dtype=dt, stack=(L,)),
                 "mlp_norm": ln((L,))},
      "cross": {"attn": {"q": lin(d, d, (G,)), "k": lin(e, d, (G,)), "v": lin(e, d, (G,)), "o": lin(d, d, (G,))},
                "attn_norm": ln((G,))},
      "out_proj": lin(d, cfg.out_width, ()),
  }
  if cfg.video_width:
    params["video_proj"] = lin(cfg.video_width, d, ())
  if cfg.text_width:
    params["text_proj"] = lin(cfg.text_width, d, ())
  return params


def param_axes(cfg: Config):
  """Logical axis names of every parameter, as a tree shaped like `init(cfg, key)`."""
  return axes.logical_axes(jax.eval_shape(lambda: init(cfg, jax.random.key(0))), AXES)


def _attend(p, x_BQD, kv_BSX, mask_BS, cfg: Config):
  """Post-norm attention sublayer: LayerNorm(x + o(attn(q(x), k(kv), v(kv))))."""
  dt, h, kd = jnp.dtype(cfg.dtype), cfg.n_heads, cfg.d_model // cfg.n_heads
  b, q_len, _ = x_BQD.shape
  q = layers.linear(p["attn"]["q"], x_BQD, dt).reshape(b, q_len, h, kd)
  k = layers.linear(p["attn"]["k"], kv_BSX, dt).reshape(b, -1, h, kd)
  v = layers.linear(p["attn"]["v"], kv_BSX, dt).reshape(b, -1, h, kd)
  a, _ = attn_lib.attention(q, k, v, None if mask_BS is None else mask_BS[:, None, :])
  a = layers.linear(p["attn"]["o"], a.reshape(b, q_len, -1), dt)
  return layers.layer_norm(p["attn_norm"], x_BQD + a, cfg.norm_eps)


def _ffn(p, x_BQD, cfg: Config):
  m = layers.mlp(p["mlp"], x_BQD, cfg.activation, jnp.dtype(cfg.dtype))
  return layers.layer_norm(p["mlp_norm"], x_BQD + m, cfg.norm_eps)


class Output(NamedTuple):
  prefix_BKO: Any  # [B, K, O]: the first K outputs in the LM width
  hidden_BQD: Any  # [B, Q, D]: every query's last hidden state
  query_mask_BQ: Any  # [B, Q] bool: the queries that were attended to (latents always)


def _extra(params, name, x, mask, width, b, dt):
  if x is None:
    return None
  if not width:
    raise ValueError(f"{name} queries given, but the config has {name}_width=0; set {name}_width to their width")
  if x.ndim != 3 or x.shape[0] != b or x.shape[-1] != width:
    raise ValueError(f"{name} queries must be [B={b}, n, {width}], found {tuple(x.shape)}")
  m = jnp.ones(x.shape[:2], bool) if mask is None else jnp.asarray(mask).astype(bool)
  return layers.linear(params[f"{name}_proj"], x, dt), m


def forward(params, points_BSE, cfg: Config, *, points_mask_BS=None, video_BVX=None, video_mask_BV=None,
            text_BTX=None, text_mask_BT=None) -> Output:
  """Runs the Q-Former.

  Args:
    points_BSE: the point-cloud features cross-attended to (positional encoding already added).
    points_mask_BS: True on real points (None: all real); padded points are never attended to.
    video_BVX, video_mask_BV: optional video-patch features, projected to extra queries, and their mask.
    text_BTX, text_mask_BT: optional text embeddings, projected to extra queries, and their mask.
  """
  if points_BSE.ndim != 3 or points_BSE.shape[-1] != cfg.encoder_width:
    raise ValueError(f"point features must be [B, S, {cfg.encoder_width}], found {tuple(points_BSE.shape)}")
  dt, b = jnp.dtype(cfg.dtype), points_BSE.shape[0]
  parts = [(jnp.broadcast_to(params["latents"].astype(dt)[None], (b, cfg.n_latents, cfg.d_model)),
            jnp.ones((b, cfg.n_latents), bool))]
  for extra in (_extra(params, "video", video_BVX, video_mask_BV, cfg.video_width, b, dt),
                _extra(params, "text", text_BTX, text_mask_BT, cfg.text_width, b, dt)):
    if extra is not None:
      parts.append(extra)
  x = jnp.concatenate([p[0] for p in parts], axis=1)
  qmask = jnp.concatenate([p[1] for p in parts], axis=1)
  x = layers.layer_norm(params["query_norm"], x, cfg.norm_eps)
  kv = points_BSE.astype(dt)
  pmask = None if points_mask_BS is None else jnp.asarray(points_mask_BS).astype(bool)
  n = cfg.cross_every
  grouped = jax.tree.map(lambda a: a.reshape(cfg.n_groups, n, *a.shape[1:]), params["layers"])

  def body(x, ps):
    lp, cp = ps
    for j in range(n):
      pj = jax.tree.map(lambda a, j=j: a[j], lp)
      x = _attend(pj, x, x, qmask, cfg)
      if j == 0:
        x = _attend(cp, x, kv, pmask, cfg)
      x = _ffn(pj, x, cfg)
    return x, None

  x, _ = jax.lax.scan(body, x, (grouped, params["cross"]))
  prefix = layers.linear(params["out_proj"], x[:, :cfg.n_latents], dt)
  return Output(prefix_BKO=prefix, hidden_BQD=x, query_mask_BQ=qmask)


def encoder_forward(params, inputs: dict, cfg: Config):
  """The `multimodal.Encoder` forward: `inputs` holds "points" [B, S, E] and optionally "points_mask",
  "video", "video_mask", "text", "text_mask"; returns the prefix [B, K, O]."""
  unknown = set(inputs) - {"points", "points_mask", "video", "video_mask", "text", "text_mask"}
  if "points" not in inputs or unknown:
    raise ValueError(f"Q-Former inputs need 'points' and take points_mask, video[_mask], text[_mask]; found keys "
                     f"{sorted(inputs)}")
  return forward(params, inputs["points"], cfg, points_mask_BS=inputs.get("points_mask"),
                 video_BVX=inputs.get("video"), video_mask_BV=inputs.get("video_mask"),
                 text_BTX=inputs.get("text"), text_mask_BT=inputs.get("text_mask")).prefix_BKO


QFORMER = mm.Encoder(init=init, forward=encoder_forward, width=lambda c: c.out_width, n_tokens=lambda c: c.n_latents,
                     axes=AXES)


@dataclasses.dataclass(frozen=True)
class AlignerConfig:
  """STLLM-Aligner end to end: point cloud -> set-abstraction features (+ ray encoding) -> the Q-Former's
  cross-attention; video frames -> patch tokens -> extra queries (when `video` is set); the prefix out."""
  points: pointcloud.Config = pointcloud.Config()
  video: video_lib.Config | None = None
  qformer: Config = Config()

  def __post_init__(self):
    def bad(msg):
      raise ValueError(f"qformer.AlignerConfig: {msg}")
    if self.points.width != self.qformer.encoder_width:
      bad(f"the point features ({self.points.width} wide) must match qformer.encoder_width "
          f"({self.qformer.encoder_width})")
    have = 0 if self.video is None else self.video.width
    if have != self.qformer.video_width:
      bad(f"the video tokens ({have} wide, 0 without video) must match qformer.video_width "
          f"({self.qformer.video_width})")


def aligner_init(c: AlignerConfig, key) -> dict:
  """{"points": point-cloud params, "qformer": Q-Former params[, "video": video params]}."""
  kp, kq, kv = jax.random.split(key, 3)
  params = {"points": pointcloud.init(c.points, kp), "qformer": init(c.qformer, kq)}
  if c.video is not None:
    params["video"] = video_lib.init(c.video, kv)
  return params


def aligner_forward(params, inputs: dict, c: AlignerConfig):
  """The `multimodal.Encoder` forward: `inputs` holds the point cloud ("xyz", "rgb"[, "mask", "c2w"]), "frames"
  [B, F, H, W, C] when the config has video, and optionally "text" / "text_mask"; returns the prefix [B, K, O]."""
  keys = {"xyz", "rgb", "mask", "c2w", "text", "text_mask"} | ({"frames"} if c.video is not None else set())
  if not {"xyz", "rgb"} <= set(inputs) or set(inputs) - keys or (c.video is not None and "frames" not in inputs):
    raise ValueError(f"aligner inputs need 'xyz', 'rgb'{', frames' if c.video is not None else ''} and take "
                     f"{sorted(keys)}; found keys {sorted(inputs)}")
  pts = pointcloud.encode(params["points"], inputs["xyz"], inputs["rgb"], c.points, mask_BN=inputs.get("mask"),
                          c2w_B44=inputs.get("c2w"))
  vid = None if c.video is None else video_lib.forward(params["video"], inputs["frames"], c.video)
  return forward(params["qformer"], pts.features_BMC, c.qformer, points_mask_BS=pts.mask_BM, video_BVX=vid,
                 text_BTX=inputs.get("text"), text_mask_BT=inputs.get("text_mask")).prefix_BKO


ALIGNER = mm.Encoder(init=aligner_init, forward=aligner_forward, width=lambda c: c.qformer.out_width,
                     n_tokens=lambda c: c.qformer.n_latents, axes=AXES + pointcloud.AXES + video_lib.AXES)
