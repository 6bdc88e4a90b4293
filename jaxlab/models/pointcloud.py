"""Point-cloud encoder and 3D ray positional encoding of STLLM (Spatio-Temporal LLM, arXiv 2507.05258).

Encoder: PointNet++ set abstraction (arXiv 1706.02413) over padded point sets with xyz + colour. Each stage
picks `n_centers` centres by farthest point sampling, groups each centre's `k` nearest real points within
`radius`, runs a shared MLP (linear + ReLU; no batch norm) on [(neighbour - centre) / radius, neighbour
features] and max-pools over the group. FPS starts at the real point farthest from the real points' centroid,
so (for points in general position, without distance ties) the centres, their order and every output are
functions of the point set: invariant to the input order and to padding. Centres beyond the real point count
are masked (their features are zero).

Ray encoding (STLLM's `RayDirectionEncoderForPointCloud`): points are moved into the first video frame's camera
(w2c = inverse of the rigid c2w), each point's ray from the camera centre is normalized (twice, as the
reference does), and the direction d gets [d, sin(d * f), cos(d * f)] with f = 2**arange(L) computed as
torch's int64 power (so f wraps to -2**63 at 63 and to 0 from 64 on, as in the reference with L = 127), the
3 * L products ordered coordinate-major, then adaptive average pooling over points to the token count and a
linear map (or, `ray_proj=False`, a zero column appended: the reference's "dummy" method). The reference runs
it in bfloat16; `dtype` chooses here. `frame_viewdirs` / `frame_ray_embedding` are the same encoding of the
video frames' pixel rays (`RayDirectionEncoderForImage`), pooled to the patch grid; its linear map to the
video-feature width belongs to whoever adds it to the video tokens.

Axes: B batch, N input points, M centres, k neighbours, C features, R ray-embedding width, L frequencies.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.models import multimodal as mm
from jaxlab.nn import axes, layers


@dataclasses.dataclass(frozen=True)
class Stage:
  """One set-abstraction stage."""
  n_centers: int
  k: int
  radius: float
  widths: tuple[int, ...]

  def __post_init__(self):
    object.__setattr__(self, "widths", tuple(int(w) for w in self.widths))
    if self.n_centers <= 0 or self.k <= 0 or self.radius <= 0 or not self.widths or min(self.widths) <= 0:
      raise ValueError(f"pointcloud.Stage: n_centers, k, radius and widths must be positive and widths non-empty, "
                       f"found {self}")


@dataclasses.dataclass(frozen=True)
class Config:
  n_points: int = 128  # N: the padded point count of an input
  in_features: int = 3  # per-point features beside xyz (rgb)
  stages: tuple[Stage, ...] = (Stage(32, 8, 0.3, (16, 32)), Stage(8, 8, 0.6, (32, 48)))
  ray_freqs: int = 0  # L of the ray positional encoding (0: none); the reference uses 127
  ray_proj: bool = True  # linear map of the ray embedding to the width (False: the zero-padded embedding)
  init_std: float = 0.02
  param_dtype: layers.DType = "float32"
  dtype: layers.DType = "float32"

  def __post_init__(self):
    def bad(msg):
      raise ValueError(f"pointcloud.Config: {msg}")
    object.__setattr__(self, "stages", tuple(self.stages))
    if self.n_points <= 0 or self.in_features < 0 or not self.stages:
      bad(f"need n_points > 0, in_features >= 0 and at least one stage, found {self.n_points}, "
          f"{self.in_features}, {len(self.stages)} stages")
    if not all(isinstance(s, Stage) for s in self.stages):
      bad(f"stages must be pointcloud.Stage, found {[type(s).__name__ for s in self.stages]}")
    prev = self.n_points
    for i, s in enumerate(self.stages):
      if s.n_centers > prev or s.k > prev:
        bad(f"stage {i} picks {s.n_centers} centres and {s.k} neighbours from {prev} points; both must be <= {prev}")
      prev = s.n_centers
    if self.ray_freqs < 0:
      bad(f"ray_freqs must be >= 0, found {self.ray_freqs}")
    if self.ray_freqs and not self.ray_proj and ray_width(self.ray_freqs) + 1 != self.width:
      bad(f"ray_proj=False adds the raw ray embedding ({ray_width(self.ray_freqs) + 1} wide) to the features, "
          f"which are {self.width} wide")
    layers.check_dtype_names(self, bad)

  @property
  def width(self) -> int:
    return self.stages[-1].widths[-1]

  @property
  def n_tokens(self) -> int:
    return self.stages[-1].n_centers

  def replace(self, **kw) -> "Config":
    return dataclasses.replace(self, **kw)


PRESETS: dict[str, Config] = {
    "tiny": Config(),
    "tiny-rays": Config(ray_freqs=4),
    # PointNet++ SSG classification widths over 1024 ScanNet points, with STLLM's 127-frequency ray encoding.
    "pointnet2-ssg": Config(n_points=1024, stages=(Stage(512, 32, 0.2, (64, 64, 128)),
                                                   Stage(128, 64, 0.4, (128, 128, 256)),
                                                   Stage(32, 64, 0.8, (256, 512, 768))), ray_freqs=127),
}

AXES = axes.rules(
    (r"stages/\d+/mlp/\d+/kernel", ("embed", "mlp"), "embed"),
    (r"stages/\d+/mlp/\d+/bias", ("mlp",), None),
    (r"ray_proj/kernel", ("patch", "embed"), "patch"),  # fixed features in, like patch pixels
    (r"ray_proj/bias", ("embed",), None),
)


def ray_width(n_freqs: int) -> int:
  """R: width of the ray embedding of L frequencies, 3 + 2 * 3L."""
  return 3 + 6 * n_freqs


def init(cfg: Config, key) -> dict:
  """{"stages": [{"mlp": [linear, ...]}, ...][, "ray_proj"]}: normal(0, init_std) kernels, zero biases."""
  dt = jnp.dtype(cfg.param_dtype)
  ks = iter(jax.random.split(key, 1 + sum(len(s.widths) for s in cfg.stages)))
  stages, d_in = [], cfg.in_features
  for s in cfg.stages:
    mlp, d = [], 3 + d_in
    for w in s.widths:
      mlp.append(layers.linear_init(next(ks), d, w, bias=True, std=cfg.init_std, dtype=dt))
      d = w
    stages.append({"mlp": mlp})
    d_in = s.widths[-1]
  params = {"stages": stages}
  if cfg.ray_freqs and cfg.ray_proj:
    params["ray_proj"] = layers.linear_init(next(ks), ray_width(cfg.ray_freqs), cfg.width, bias=True,
                                            std=cfg.init_std, dtype=dt)
  return params


def param_axes(cfg: Config):
  """Logical axis names of every parameter, as a tree shaped like `init(cfg, key)`."""
  return axes.logical_axes(jax.eval_shape(lambda: init(cfg, jax.random.key(0))), AXES)


def farthest_point_sample(xyz_N3, mask_N, m: int):
  """[m] indices: the real point farthest from the real centroid, then repeatedly the real point farthest
  from those chosen. Once every real point is chosen the rest repeat one (mask them by the real count)."""
  x = xyz_N3.astype(jnp.float32)
  w = mask_N.astype(jnp.float32)
  centroid = (x * w[:, None]).sum(0) / jnp.maximum(w.sum(), 1.0)
  sq = lambda c: jnp.sum(jnp.square(x - c), axis=-1)
  first = jnp.argmax(jnp.where(mask_N, sq(centroid), -1.0))
  dist = jnp.where(mask_N, jnp.inf, -1.0)

  def body(i, carry):
    idx, dist = carry
    dist = jnp.minimum(dist, jnp.where(mask_N, sq(x[idx[i - 1]]), -1.0))
    return idx.at[i].set(jnp.argmax(dist).astype(jnp.int32)), dist

  idx = jnp.zeros((m,), jnp.int32).at[0].set(first.astype(jnp.int32))
  idx, _ = jax.lax.fori_loop(1, m, body, (idx, dist))
  return idx


def _stage(p, s: Stage, xyz_BN3, feats_BNC, mask_BN, dtype):
  centres = jax.vmap(lambda x, m: farthest_point_sample(x, m, s.n_centers))(xyz_BN3, mask_BN)
  take = jax.vmap(lambda a, i: a[i])
  c_xyz = take(xyz_BN3, centres)  # [B, M, 3]
  c_mask = jnp.arange(s.n_centers)[None] < mask_BN.sum(-1, keepdims=True)
  d2 = jnp.sum(jnp.square(c_xyz[:, :, None].astype(jnp.float32) - xyz_BN3[:, None].astype(jnp.float32)), -1)
  d2 = jnp.where(mask_BN[:, None], d2, jnp.inf)  # [B, M, N]
  neg, nbr = jax.lax.top_k(-d2, s.k)  # [B, M, k]: the k nearest, nearest first
  valid = -neg <= s.radius ** 2
  g_xyz = take(xyz_BN3, nbr) - c_xyz[:, :, None]
  h = jnp.concatenate([(g_xyz / s.radius).astype(dtype), take(feats_BNC, nbr).astype(dtype)], -1)
  for lp in p["mlp"]:
    h = jax.nn.relu(layers.linear(lp, h, dtype))
  h = jnp.max(jnp.where(valid[..., None], h, -jnp.inf), axis=2)
  return c_xyz, jnp.where(c_mask[..., None], h, 0).astype(dtype), c_mask


def ray_frequencies(n_freqs: int) -> np.ndarray:
  """[L] float64: 2**k for k < L as torch's `2 ** torch.arange(L)` gives them (int64, wrapping past 2**62)."""
  wrapped = [((1 << k) + (1 << 63)) % (1 << 64) - (1 << 63) for k in range(n_freqs)]
  return np.asarray(wrapped, np.float64)


def point_viewdirs(xyz_BN3, c2w_B44):
  """[B, N, 3]: unit directions of the points seen from the camera `c2w` (rigid camera-to-world)."""
  r, t = c2w_B44[:, :3, :3], c2w_B44[:, :3, 3]
  cam = jnp.einsum("bnj,bji->bni", xyz_BN3 - t[:, None], r)  # R^T (p - t): the point in camera coordinates
  unit = lambda v: v / jnp.maximum(jnp.linalg.norm(v, axis=-1, keepdims=True), 1e-12)
  return unit(unit(cam))


def _pool_matrix(n: int, m: int) -> np.ndarray:
  """[m, n]: torch's adaptive average pooling of n rows to m (bin i averages [floor(in/m), ceil((i+1)n/m)))."""
  w = np.zeros((m, n), np.float32)
  for i in range(m):
    lo, hi = (i * n) // m, -(-((i + 1) * n) // m)
    w[i, lo:hi] = 1.0 / (hi - lo)
  return w


def adaptive_avg_pool(x_BNC, m: int):
  """[B, m, C]: torch's adaptive_avg_pool1d over N."""
  n = x_BNC.shape[1]
  if m == n:
    return x_BNC
  return jnp.einsum("mn,bnc->bmc", jnp.asarray(_pool_matrix(n, m), x_BNC.dtype), x_BNC)


def frame_viewdirs(c2w_BF44, k_B33, h: int, w: int):
  """[B, F, H*W, 3]: STLLM's pixel-centre ray directions of every frame, row-major over pixels.

  Each frame's camera is taken relative to the first (inverse(c2w_0) @ c2w_f); a pixel's direction
  ((x + 0.5 - cx) / fx, (y + 0.5 - cy) / fy, 1) is rotated by it and normalized, and, as the reference does,
  then multiplied on the right by the first camera's world rotation (d @ R_0).
  """
  if c2w_BF44.ndim != 4 or c2w_BF44.shape[2:] != (4, 4) or tuple(k_B33.shape) != (c2w_BF44.shape[0], 3, 3):
    raise ValueError(f"frame rays need c2w [B, F, 4, 4] and intrinsics [B, 3, 3], found {tuple(c2w_BF44.shape)} "
                     f"and {tuple(k_B33.shape)}")
  r0 = c2w_BF44[:, 0, :3, :3]
  r_rel = jnp.einsum("bji,bfjk->bfik", r0, c2w_BF44[:, :, :3, :3])  # rotation of inverse(c2w_0) @ c2w_f
  ys, xs = jnp.meshgrid(jnp.arange(h, dtype=jnp.float32) + 0.5, jnp.arange(w, dtype=jnp.float32) + 0.5,
                        indexing="ij")
  k = k_B33[:, None, None]
  dirs = jnp.stack([(xs - k[..., 0, 2]) / k[..., 0, 0], (ys - k[..., 1, 2]) / k[..., 1, 1],
                    jnp.ones_like(xs - k[..., 0, 2])], -1).reshape(k_B33.shape[0], 1, h * w, 3)
  rays = jnp.einsum("bfij,bfnj->bfni", r_rel, dirs)
  unit = rays / jnp.linalg.norm(rays, axis=-1, keepdims=True)
  return jnp.einsum("bfni,bij->bfnj", unit, r0)


def frame_ray_embedding(viewdirs_BFN3, h: int, w: int, grid: int, n_freqs: int):
  """[B, F, grid*grid, R]: each frame's directions average-pooled (torch's adaptive_avg_pool2d) from the
  H x W pixels to a grid x grid patch grid, then [d, sin(d f), cos(d f)] (no zero column)."""
  b, f = viewdirs_BFN3.shape[:2]
  if tuple(viewdirs_BFN3.shape[2:]) != (h * w, 3):
    raise ValueError(f"frame directions must be [B, F, {h}*{w}, 3], found {tuple(viewdirs_BFN3.shape)}")
  d = viewdirs_BFN3.reshape(b, f, h, w, 3)
  ph, pw = (jnp.asarray(_pool_matrix(n, grid), d.dtype) for n in (h, w))
  d = jnp.einsum("ih,jw,bfhwc->bfijc", ph, pw, d).reshape(b * f, grid * grid, 3)
  return ray_embedding(d, n_freqs).reshape(b, f, grid * grid, -1)


def ray_embedding(viewdirs_BN3, n_freqs: int, n_out: int | None = None):
  """[B, n_out, R]: [d, sin(d f), cos(d f)] per direction, pooled to `n_out` rows (None: N)."""
  d = viewdirs_BN3
  f = jnp.asarray(ray_frequencies(n_freqs), d.dtype)
  df = (d[..., None] * f).reshape(*d.shape[:-1], 3 * n_freqs)
  emb = jnp.concatenate([d, jnp.sin(df), jnp.cos(df)], -1)
  return adaptive_avg_pool(emb, d.shape[1] if n_out is None else n_out)


def ray_encoding(params, viewdirs_BN3, cfg: Config, n_out: int | None = None):
  """[B, n_out, width]: the projected ray embedding (or the embedding with a zero column, `ray_proj=False`)."""
  emb = ray_embedding(viewdirs_BN3.astype(jnp.dtype(cfg.dtype)), cfg.ray_freqs, n_out)
  if cfg.ray_proj:
    return layers.linear(params["ray_proj"], emb, jnp.dtype(cfg.dtype))
  return jnp.concatenate([emb, jnp.zeros_like(emb[..., :1])], -1)


class Output(NamedTuple):
  xyz_BM3: Any  # the last stage's centres
  features_BMC: Any  # their features (+ ray encoding); zero where masked
  mask_BM: Any  # True on centres that are real points


def encode(params, xyz_BN3, feats_BNC, cfg: Config, *, mask_BN=None, c2w_B44=None) -> Output:
  """Encodes padded point sets.

  Args:
    xyz_BN3, feats_BNC: coordinates and per-point features (rgb) of N = cfg.n_points points, padded.
    mask_BN: True on real points (None: all real). Padded points never change the outputs.
    c2w_B44: camera-to-world of the first video frame, for the ray encoding (needed when ray_freqs > 0).
  """
  b = xyz_BN3.shape[0]
  if tuple(xyz_BN3.shape) != (b, cfg.n_points, 3) or tuple(feats_BNC.shape) != (b, cfg.n_points, cfg.in_features):
    raise ValueError(f"points must be xyz [B, {cfg.n_points}, 3] and features [B, {cfg.n_points}, "
                     f"{cfg.in_features}], found {tuple(xyz_BN3.shape)} and {tuple(feats_BNC.shape)}")
  if cfg.ray_freqs and (c2w_B44 is None or tuple(c2w_B44.shape) != (b, 4, 4)):
    raise ValueError(f"ray_freqs > 0 needs c2w [B={b}, 4, 4], found "
                     f"{None if c2w_B44 is None else tuple(c2w_B44.shape)}")
  dt = jnp.dtype(cfg.dtype)
  mask = jnp.ones((b, cfg.n_points), bool) if mask_BN is None else jnp.asarray(mask_BN).astype(bool)
  xyz, h = jnp.asarray(xyz_BN3, jnp.float32), jnp.asarray(feats_BNC)
  for p, s in zip(params["stages"], cfg.stages):
    xyz, h, mask = _stage(p, s, xyz, h, mask, dt)
  if cfg.ray_freqs:
    pos = ray_encoding(params, point_viewdirs(xyz, jnp.asarray(c2w_B44, jnp.float32)), cfg)
    h = jnp.where(mask[..., None], h + pos.astype(dt), 0)
  return Output(xyz_BM3=xyz, features_BMC=h, mask_BM=mask)


def encoder_forward(params, inputs: dict, cfg: Config):
  """The `multimodal.Encoder` forward: `inputs` holds "xyz", "rgb" and optionally "mask" and "c2w"; returns
  the token features [B, M, width] (zero on masked centres)."""
  unknown = set(inputs) - {"xyz", "rgb", "mask", "c2w"}
  if not {"xyz", "rgb"} <= set(inputs) or unknown:
    raise ValueError(f"point-cloud inputs need 'xyz' and 'rgb' and take 'mask', 'c2w'; found keys {sorted(inputs)}")
  return encode(params, inputs["xyz"], inputs["rgb"], cfg, mask_BN=inputs.get("mask"),
                c2w_B44=inputs.get("c2w")).features_BMC


POINTCLOUD = mm.Encoder(init=init, forward=encoder_forward, width=lambda c: c.width, n_tokens=lambda c: c.n_tokens,
                        axes=AXES)
