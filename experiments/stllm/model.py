"""The four models of the STLLM experiment (arXiv 2507.05258; see experiments/stllm/__init__.py) on one LM.

Every model reads "<bos> [<image> x V] [<points> x P] question ? answer <eos>", the placeholders replaced by
features as `jaxlab.models.multimodal` splices them:
  video_only     the clip's tokens (`models.video`: per-frame ViT patches + temporal position) after an MLP
  points_only    the room's set-abstraction tokens (`models.pointcloud`) after an MLP
  stllm_3d       both: point tokens after an MLP concatenated with the video and text tokens
  stllm_aligner  the video tokens, and ahead of all the Q-Former aligner's prefix (`models.qformer`): its
                 latents, the raw video tokens and the question's embeddings as queries, cross-attending to the
                 room's point features with their ray encoding in the first frame's camera; no point tokens
                 (the reference's "learnable queries ... followed by egocentric video"). With `video_ray_freqs`
                 > 0 its video queries carry their patches' ray encoding too (`pointcloud.frame_ray_embedding`:
                 each frame's pixel rays relative to the first frame, pooled to the patch grid, linearly mapped to
                 the video width and added before the Q-Former's video projection; the reference adds its map
                 after its own projection of the features, the same sum of two linear maps).

Axes: B batch, T tokens, F frames, N points, K prefix latents, D LM width, V vocab.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxlab import losses
from jaxlab.models import multimodal as mm
from jaxlab.models import pointcloud, qformer
from jaxlab.models import transformer as tfm
from jaxlab.models import video as video_lib
from jaxlab.nn import layers

MODELS = ("video_only", "points_only", "stllm_3d", "stllm_aligner")
# Logical axes of every model's params: the LM and connectors, the video tower, the point encoder, the Q-Former.
AXES = mm.AXES + video_lib.AXES + pointcloud.AXES + qformer.AXES
# Each model's top-level param groups (`init`): the LM, the video tower and its connector, the point encoder and
# its connector, the aligner (its point encoder with the ray encoding, and the Q-Former).
GROUPS = {"video_only": ("lm", "video"), "points_only": ("lm", "points"), "stllm_3d": ("lm", "video", "points"),
          "stllm_aligner": ("lm", "video", "aligner")}
ALL_GROUPS = ("lm", "video", "points", "aligner")


def trained_groups(kind: str, trainable: tuple[str, ...] | None) -> tuple[str, ...]:
  """The groups of `kind`'s params that train when only the groups named in `trainable` do (None: all); a
  one-line ValueError when `trainable` names a group no model has or leaves `kind` nothing to train."""
  if trainable is None:
    return GROUPS[kind]
  unknown = [g for g in trainable if g not in ALL_GROUPS]
  if unknown or not trainable:
    raise ValueError(f"stllm: trainable must name param groups among {ALL_GROUPS}, found {tuple(trainable)}")
  out = tuple(g for g in GROUPS[kind] if g in trainable)
  if not out:
    raise ValueError(f"stllm: trainable={tuple(trainable)} leaves {kind} nothing to train (its groups: "
                     f"{GROUPS[kind]})")
  return out


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  kind: str
  text: tfm.Config
  video: video_lib.Config
  points: pointcloud.Config
  aligner: qformer.Config  # its encoder / video / text / out widths are checked against the others
  video_id: int = 3
  points_id: int = 5
  video_ray_freqs: int = 0  # L of the aligner's video-patch ray encoding (0: none)

  def __post_init__(self):
    def bad(msg):
      raise ValueError(f"stllm.ModelConfig: {msg}")
    if self.kind not in MODELS:
      bad(f"kind must be one of {MODELS}, found {self.kind!r}")
    if self.video_ray_freqs < 0 or (self.video_ray_freqs and self.kind != "stllm_aligner"):
      bad(f"video_ray_freqs (>= 0) encodes the aligner's video queries only, found {self.video_ray_freqs} for "
          f"{self.kind}")
    g = self.video.features.vision.grid // self.video.spatial_pool
    if self.video_ray_freqs and self.video.tokens_per_frame != g * g:
      bad(f"video rays need one token per pooled patch ({g * g} a frame), found {self.video.tokens_per_frame}")
    q, want = self.aligner, (self.points.width, self.video.width, self.text.d_model, self.text.d_model)
    if self.kind == "stllm_aligner" and (q.encoder_width, q.video_width, q.text_width, q.out_width) != want:
      bad(f"aligner (encoder, video, text, out) widths must be {want}, found "
          f"{(q.encoder_width, q.video_width, q.text_width, q.out_width)}")

  @property
  def uses_video(self) -> bool:
    return self.kind != "points_only"

  @property
  def point_tokens(self) -> int:
    return self.points.n_tokens if self.kind in ("points_only", "stllm_3d") else 0

  @property
  def video_tokens(self) -> int:
    return self.video.n_tokens if self.uses_video else 0

  @property
  def n_prefix(self) -> int:
    return self.aligner.n_latents if self.kind == "stllm_aligner" else 0


def _connector(key, d_in: int, cfg: ModelConfig) -> dict:
  d = cfg.text.d_model
  return mm.connector_init(jax.random.split(key), d_in, d, d, bias=True, std=cfg.text.init_std,
                           dtype=jnp.dtype(cfg.text.param_dtype))


def init(cfg: ModelConfig, key, lm_params=None) -> dict:
  """{"lm"[, "video": {"encoder", "connector"}][, "points": {"encoder", "connector"}][, "aligner": {"points",
  "qformer"}]}; `lm_params` (the trained LM) replaces the random LM."""
  ks = jax.random.split(key, 6)
  params = {"lm": tfm.init(cfg.text, ks[0]) if lm_params is None else lm_params}
  if cfg.uses_video:
    params["video"] = {"encoder": video_lib.init(cfg.video, ks[1]), "connector": _connector(ks[2], cfg.video.width, cfg)}
  if cfg.point_tokens:
    params["points"] = {"encoder": pointcloud.init(cfg.points, ks[3]),
                        "connector": _connector(ks[4], cfg.points.width, cfg)}
  if cfg.n_prefix:
    kp, kq = jax.random.split(ks[5])
    params["aligner"] = {"points": pointcloud.init(cfg.points, kp), "qformer": qformer.init(cfg.aligner, kq)}
    if cfg.video_ray_freqs:
      params["aligner"]["video_rays"] = {"ray_proj": layers.linear_init(
          jax.random.fold_in(kq, 1), pointcloud.ray_width(cfg.video_ray_freqs), cfg.video.width, bias=True,
          std=cfg.text.init_std, dtype=jnp.dtype(cfg.text.param_dtype))}
  return params


def forward(params, batch: dict, cfg: ModelConfig):
  """[B, T, V] logits over the token positions (the prefix's dropped). `batch`: "tokens" [B, T], and as the
  model needs them "frames" [B, F, H, W, 3], "xyz"/"rgb" [B, N, 3], "mask" [B, N], "c2w" [B, F, 4, 4],
  "intrinsics" [B, 3, 3] (the aligner's video rays), "question_mask" [B, T] (the aligner's text queries)."""
  tokens = jnp.asarray(batch["tokens"])
  dt = jnp.dtype(cfg.text.dtype)
  x = layers.embed(params["lm"]["embed"], tokens, dt)
  emb, vid = x, None
  if cfg.uses_video:
    vid = video_lib.forward(params["video"]["encoder"], batch["frames"], cfg.video)
    x = mm.scatter(x, tokens == cfg.video_id, mm.connector(params["video"]["connector"], vid, "gelu", dt))
  if cfg.point_tokens:
    pts = pointcloud.encode(params["points"]["encoder"], batch["xyz"], batch["rgb"], cfg.points,
                            mask_BN=batch["mask"], c2w_B44=batch["c2w"][:, 0] if cfg.points.ray_freqs else None)
    x = mm.scatter(x, tokens == cfg.points_id, mm.connector(params["points"]["connector"], pts.features_BMC, "gelu", dt))
  if not cfg.n_prefix:
    return tfm.forward(params["lm"], tokens, cfg.text, inputs_embeds_BTD=x).logits
  pts = pointcloud.encode(params["aligner"]["points"], batch["xyz"], batch["rgb"], cfg.points, mask_BN=batch["mask"],
                          c2w_B44=batch["c2w"][:, 0] if cfg.points.ray_freqs else None)
  if cfg.video_ray_freqs:
    vid = vid + video_rays(params["aligner"]["video_rays"], batch["c2w"], batch["intrinsics"], cfg).astype(vid.dtype)
  pre = qformer.forward(params["aligner"]["qformer"], pts.features_BMC, cfg.aligner, points_mask_BS=pts.mask_BM,
                        video_BVX=vid, text_BTX=emb, text_mask_BT=batch["question_mask"]).prefix_BKO
  p = mm.prefix(x, pre)
  k = cfg.n_prefix
  toks = jnp.pad(tokens, ((0, 0), (k, 0)))
  return tfm.forward(params["lm"], toks, cfg.text, inputs_embeds_BTD=p.embeds_BTD,
                     attention_mask_BT=p.mask_BT).logits[:, k:]


def video_rays(params, c2w_BF44, k_B33, cfg: ModelConfig):
  """[B, F * P, video width]: each video token's ray encoding, frame-major like `video.forward`'s tokens."""
  v = cfg.video
  size, grid = v.features.vision.image_size, v.features.vision.grid // v.spatial_pool
  dirs = pointcloud.frame_viewdirs(jnp.asarray(c2w_BF44, jnp.float32), jnp.asarray(k_B33, jnp.float32), size, size)
  emb = pointcloud.frame_ray_embedding(dirs, size, size, grid, cfg.video_ray_freqs)
  out = layers.linear(params["ray_proj"], emb, jnp.dtype(cfg.text.dtype))
  return out.reshape(out.shape[0], -1, out.shape[-1])


def loss_fn(cfg: ModelConfig) -> losses.LossFn:
  """Summed next-token NLL over the answer tokens ("targets", "loss_mask"), their count, and no aux."""
  def fn(params, batch, rng):
    del rng
    return (*losses.next_token_nll(forward(params, batch, cfg), batch["targets"], batch["loss_mask"]), {})
  return fn


def greedy(cfg: ModelConfig, banned=()):
  """Jitted greedy decoding `(params, batch, lengths_B, max_new) -> tokens`: the answer written into
  batch["tokens"] after each row's prompt (`lengths_B` tokens), every step a full forward."""
  def run(params, batch, lengths_B, max_new):
    rows = jnp.arange(batch["tokens"].shape[0])
    t = batch["tokens"].shape[1]

    def body(i, toks):
      logits = forward(params, {**batch, "tokens": toks}, cfg)[rows, lengths_B + i - 1].astype(jnp.float32)
      if banned:
        logits = logits.at[:, jnp.asarray(banned)].set(-jnp.inf)
      return toks.at[rows, jnp.minimum(lengths_B + i, t - 1)].set(jnp.argmax(logits, -1).astype(toks.dtype))
    return jax.lax.fori_loop(0, max_new, body, batch["tokens"])
  return jax.jit(run)
