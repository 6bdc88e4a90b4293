"""Rotary position embeddings: default, linear, dynamic-NTK, llama3 and YaRN scaling.

The variants and their parameters follow the Hugging Face config spelling, accepted both as the older
`rope_scaling` dict (with `rope_theta` beside it) and the newer `rope_parameters` dict. Rotation uses the
"rotate half" layout (first half of the head dim pairs with the second half), as HF checkpoints expect.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Literal

import jax.numpy as jnp
import numpy as np

from jaxlab import choices

RopeType = Literal["default", "linear", "dynamic", "llama3", "yarn"]
ROPE_TYPES = choices.values(RopeType)


@dataclasses.dataclass(frozen=True)
class Rope:
  type: RopeType = "default"
  theta: float = 10000.0
  factor: float = 1.0
  partial_rotary_factor: float = 1.0
  # llama3
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int | None = None
  # yarn
  beta_fast: float = 32.0
  beta_slow: float = 1.0
  mscale: float | None = None
  mscale_all_dim: float | None = None
  attention_factor: float | None = None
  truncate: bool = True

  def __post_init__(self):
    choices.check(self, prefix="rope.")

  @classmethod
  def from_hf(cls, d: dict | None, theta: float | None = None) -> "Rope":
    """From an HF `rope_scaling` or `rope_parameters` dict (None: default rope at `theta`)."""
    d = dict(d or {})
    rope_type = d.pop("rope_type", d.pop("type", "default"))
    kw = {"type": rope_type}
    theta = d.pop("rope_theta", theta)
    if theta is not None:
      kw["theta"] = float(theta)
    fields = {f.name for f in dataclasses.fields(cls)}
    for k, v in d.items():
      if k in fields and v is not None:
        kw[k] = v
    return cls(**kw)

  def to_hf(self) -> dict:
    """The `rope_parameters` dict (it carries `rope_theta`; drop it for the old `rope_scaling` form)."""
    d = {"rope_type": self.type, "rope_theta": self.theta}
    keys = {"linear": ("factor",), "dynamic": ("factor",),
            "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
            "yarn": ("factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor",
                     "original_max_position_embeddings", "truncate")}.get(self.type, ())
    for k in keys:
      if getattr(self, k) is not None:
        d[k] = getattr(self, k)
    if self.partial_rotary_factor != 1.0:
      d["partial_rotary_factor"] = self.partial_rotary_factor
    return d


def _base_inv_freq(theta, dim):
  return 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))


def inv_freq(rope: Rope, head_dim: int, max_positions: int, seq_len=None):
  """(inv_freq [dim/2], attention_scaling). `seq_len` (maybe traced) only matters for dynamic scaling."""
  dim = int(head_dim * rope.partial_rotary_factor)
  base = _base_inv_freq(rope.theta, dim)
  if rope.type == "default":
    return jnp.asarray(base), 1.0
  if rope.type == "linear":
    return jnp.asarray(base / rope.factor), 1.0
  if rope.type == "dynamic":
    if seq_len is None:
      return jnp.asarray(base), 1.0
    seq_len = jnp.maximum(jnp.asarray(seq_len, jnp.float32), max_positions)
    theta = rope.theta * ((rope.factor * seq_len / max_positions) - (rope.factor - 1)) ** (dim / (dim - 2))
    return 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)), 1.0
  if rope.type == "llama3":
    old_len = rope.original_max_position_embeddings or max_positions
    low_wl, high_wl = old_len / rope.low_freq_factor, old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / base
    scaled = np.where(wavelen > low_wl, base / rope.factor, base)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
    return jnp.asarray(np.where(medium, smoothed, scaled).astype(np.float32)), 1.0
  # yarn
  orig = rope.original_max_position_embeddings or max_positions
  factor = rope.factor

  def get_mscale(scale, m=1.0):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

  attn = rope.attention_factor
  if attn is None:
    attn = (get_mscale(factor, rope.mscale) / get_mscale(factor, rope.mscale_all_dim)
            if rope.mscale and rope.mscale_all_dim else get_mscale(factor))

  def correction_dim(rot):
    return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(rope.theta))

  low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
  if rope.truncate:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, dim - 1)
  if low == high:
    high += 0.001
  ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
  extrap = 1 - ramp
  pos_freqs = rope.theta ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
  out = (1.0 / (factor * pos_freqs)) * (1 - extrap) + (1.0 / pos_freqs) * extrap
  return jnp.asarray(out.astype(np.float32)), float(attn)


def cos_sin(rope: Rope, head_dim: int, max_positions: int, positions_BT, seq_len=None):
  """cos, sin [B, T, rot_dim] in fp32 for integer positions."""
  freqs, scale = inv_freq(rope, head_dim, max_positions, seq_len)
  angles = positions_BT.astype(jnp.float32)[..., None] * freqs
  emb = jnp.concatenate([angles, angles], axis=-1)
  return jnp.cos(emb) * scale, jnp.sin(emb) * scale


def apply(x_BTHK, cos_BTR, sin_BTR):
  """Rotates the first R dims of each head (R = rot_dim); the rest pass through (partial rotary)."""
  r = cos_BTR.shape[-1]
  x32 = x_BTHK.astype(jnp.float32)
  xr, xp = x32[..., :r], x32[..., r:]
  x1, x2 = xr[..., : r // 2], xr[..., r // 2:]
  rot = jnp.concatenate([-x2, x1], axis=-1)
  c, s = cos_BTR[:, :, None, :], sin_BTR[:, :, None, :]
  out = xr * c + rot * s
  return jnp.concatenate([out, xp], axis=-1).astype(x_BTHK.dtype)
