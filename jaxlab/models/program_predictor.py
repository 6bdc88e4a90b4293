"""The PoLar program predictor (arXiv 2606.06574, "Skip a Layer or Loop It? Learning Program-of-Layers in LLMs").

From a frozen embedder's question token states it predicts, for each of the target LM's L layers, a segment
boundary logit and three op logits (SKIP / KEEP / REPEAT, `jaxlab.models.programs`): the token states are
projected to the predictor width, L learned layer queries cross-attend to them (multi-head attention with no
residual or norm, as the reference's `nn.MultiheadAttention` call), then `n_blocks` post-norm transformer
encoder layers (ReLU MLP of width 4 d) mix the layers, and two linear heads read each layer out.

The loss is the reference's: per example, the boundary BCE averaged over layers 1..L-1 plus the op CE averaged
over segment starts; examples are weighted (weights normalized to mean 1). `beam_decode` turns one example's
logits into programs: boundaries where sigmoid >= threshold (segments longer than `max_pack` are split), then a
beam over the top `top_ops` ops of each segment's start layer scored by the summed op log-probabilities.

Axes: B batch, T question tokens, E embedder width, L target layers, D predictor width, H heads, O ops (3).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.models import programs
from jaxlab.models import transformer as tfm
from jaxlab.nn import attention as attn_lib
from jaxlab.nn import axes, layers

N_OPS = 3


@dataclasses.dataclass(frozen=True)
class Config:
  n_layers: int = 30  # L: layers of the LM whose programs are predicted
  d_in: int = 384  # E: the frozen embedder's width (all-MiniLM-L6-v2)
  d_model: int = 256
  n_heads: int = 4
  n_blocks: int = 2
  norm_eps: float = 1e-5
  init_std: float = 0.02
  param_dtype: layers.DType = "float32"
  dtype: layers.DType = "float32"

  def __post_init__(self):
    def bad(msg):
      raise ValueError(f"program_predictor.Config: {msg}")
    for name in ("n_layers", "d_in", "d_model", "n_heads", "n_blocks"):
      if getattr(self, name) <= 0:
        bad(f"{name} must be positive, found {getattr(self, name)}")
    if self.d_model % self.n_heads:
      bad(f"n_heads ({self.n_heads}) must divide d_model ({self.d_model})")
    layers.check_dtype_names(self, bad)

  @property
  def d_ff(self) -> int:
    return 4 * self.d_model

  def replace(self, **kw) -> "Config":
    return dataclasses.replace(self, **kw)


PRESETS: dict[str, Config] = {
    "tiny": Config(n_layers=4, d_in=16, d_model=32, n_heads=4, n_blocks=2),
    "smollm2-135m-minilm": Config(n_layers=30, d_in=384),  # the reference's width 256, 4 heads, 2 blocks
}

AXES = tfm.AXES + axes.rules(
    (r"in_proj/kernel", ("patch", "embed"), "patch"),  # outside features in
    (r"in_proj/bias", ("embed",), None),
    (r"layer_queries", ("pos", "embed"), "pos"),
    (r"(seg_head|op_head)/kernel", ("embed", "classes"), "embed"),
    (r"(seg_head|op_head)/bias", ("classes",), None),
)


def init(cfg: Config, key) -> dict:
  """Random params: normal(0, init_std) matrices and queries, unit norm scales, zero biases."""
  dt = jnp.dtype(cfg.param_dtype)
  d, n, std = cfg.d_model, cfg.n_blocks, cfg.init_std
  ks = iter(jax.random.split(key, 16))
  lin = lambda i, o, stack=(): layers.linear_init(next(ks), i, o, bias=True, std=std, dtype=dt, stack=stack)
  return {
      "in_proj": lin(cfg.d_in, d),
      "layer_queries": layers.normal(next(ks), (cfg.n_layers, d), 1.0, dt),  # nn.Embedding's N(0, 1)
      "cross": {"attn": {name: lin(d, d) for name in "qkvo"}},
      "layers": {"attn": {name: lin(d, d, (n,)) for name in "qkvo"},
                 "attn_norm": layers.norm_init(d, bias=True, dtype=dt, stack=(n,)),
                 "mlp": layers.mlp_init(next(ks), d, cfg.d_ff, gated=False, bias=True, std=std, dtype=dt,
                                        stack=(n,)),
                 "mlp_norm": layers.norm_init(d, bias=True, dtype=dt, stack=(n,))},
      "seg_head": lin(d, 1),
      "op_head": lin(d, N_OPS),
  }


def param_axes(cfg: Config):
  """Logical axis names of every parameter, as a tree shaped like `init(cfg, key)`."""
  return axes.logical_axes(jax.eval_shape(lambda: init(cfg, jax.random.key(0))), AXES)


class Output(NamedTuple):
  seg_logits_BL: jax.Array  # boundary logit per layer (layer 0's is never used)
  op_logits_BLO: jax.Array  # op logits per layer (read at segment starts)


def _mha(p, q_BLD, kv_BTD, mask_BT, cfg: Config):
  dt, h = jnp.dtype(cfg.dtype), cfg.n_heads
  b, lq, d = q_BLD.shape
  q = layers.linear(p["q"], q_BLD, dt).reshape(b, lq, h, d // h)
  k = layers.linear(p["k"], kv_BTD, dt).reshape(b, -1, h, d // h)
  v = layers.linear(p["v"], kv_BTD, dt).reshape(b, -1, h, d // h)
  a, _ = attn_lib.attention(q, k, v, None if mask_BT is None else mask_BT.astype(bool)[:, None, :])
  return layers.linear(p["o"], a.reshape(b, lq, d), dt)


def forward(params, tokens_BTE, cfg: Config, mask_BT=None) -> Output:
  """Boundary and op logits from question token states.

  Args:
    tokens_BTE: the frozen embedder's last hidden states of the question tokens.
    mask_BT: 1 on real tokens, 0 on padding (padded tokens are never attended); None: all real.
  """
  if tokens_BTE.ndim != 3 or tokens_BTE.shape[-1] != cfg.d_in:
    raise ValueError(f"tokens_BTE must be [B, T, {cfg.d_in}] (d_in), found shape {tuple(tokens_BTE.shape)}")
  if mask_BT is not None and tuple(mask_BT.shape) != tuple(tokens_BTE.shape[:2]):
    raise ValueError(f"mask_BT must be [B, T] = {tuple(tokens_BTE.shape[:2])}, found {tuple(mask_BT.shape)}")
  dt = jnp.dtype(cfg.dtype)
  b = tokens_BTE.shape[0]
  feats = layers.linear(params["in_proj"], tokens_BTE, dt)
  queries = jnp.broadcast_to(params["layer_queries"].astype(dt), (b, cfg.n_layers, cfg.d_model))
  x = _mha(params["cross"]["attn"], queries, feats, mask_BT, cfg)

  def body(x, p):
    x = layers.layer_norm(p["attn_norm"], x + _mha(p["attn"], x, x, None, cfg), cfg.norm_eps)
    x = layers.layer_norm(p["mlp_norm"], x + layers.mlp(p["mlp"], x, "relu", dt), cfg.norm_eps)
    return x, None

  x, _ = jax.lax.scan(body, x, params["layers"])
  seg = layers.linear(params["seg_head"], x, dt)[..., 0]
  return Output(seg.astype(jnp.float32), layers.linear(params["op_head"], x, dt).astype(jnp.float32))


def per_example_loss(out: Output, boundary_BL, ops_BL):
  """[B]: mean boundary BCE over layers 1..L-1 + mean op CE over segment starts (ops != IGNORE)."""
  seg = out.seg_logits_BL[:, 1:]
  y = boundary_BL[:, 1:].astype(jnp.float32)
  bce = jnp.mean(jnp.maximum(seg, 0) - seg * y + jnp.log1p(jnp.exp(-jnp.abs(seg))), axis=1)
  logp = jax.nn.log_softmax(out.op_logits_BLO, -1)
  valid = ops_BL != programs.IGNORE
  nll = -jnp.take_along_axis(logp, jnp.where(valid, ops_BL, 0)[..., None], -1)[..., 0]
  ce = jnp.sum(nll * valid, 1) / jnp.maximum(valid.sum(1), 1)
  return bce + ce


def loss(params, tokens_BTE, mask_BT, boundary_BL, ops_BL, weights_B, cfg: Config):
  """The weighted mean of `per_example_loss`, weights normalized to mean 1 (all ones: the plain mean)."""
  per = per_example_loss(forward(params, tokens_BTE, cfg, mask_BT), boundary_BL, ops_BL)
  w = weights_B.astype(jnp.float32)
  return jnp.mean(w / (jnp.mean(w) + 1e-8) * per)


def segments_from_boundaries(seg_probs_L, threshold: float = 0.5, max_pack: int = 4) -> list[tuple[int, int]]:
  """(start, size) segments: a start at layer 0 and wherever seg_probs >= threshold, long ones split."""
  n = len(seg_probs_L)
  starts = [0] + [i for i in range(1, n) if seg_probs_L[i] >= threshold]
  out = []
  for s, e in zip(starts, starts[1:] + [n]):
    for a in range(s, e, max_pack):
      out.append((a, min(a + max_pack, e) - a))
  return out


def beam_decode(seg_logits_L, op_logits_LO, *, threshold: float = 0.5, max_pack: int = 4, beam: int = 5,
                top_ops: int = 2) -> list[tuple[tuple[programs.Segment, ...], float]]:
  """The `beam` best (segments, summed op log-prob) of one example, best first.

  Raises:
    ValueError: logits of mismatched shapes, or beam / top_ops / max_pack not positive.
  """
  seg = np.asarray(seg_logits_L, np.float64)
  op = np.asarray(op_logits_LO, np.float64)
  if seg.ndim != 1 or op.shape != (seg.shape[0], N_OPS):
    raise ValueError(f"expected seg logits [L] and op logits [L, {N_OPS}], found {seg.shape} and {op.shape}")
  if min(beam, top_ops, max_pack) <= 0:
    raise ValueError(f"beam, top_ops and max_pack must be positive, found {beam}, {top_ops}, {max_pack}")
  logp = op - np.logaddexp.reduce(op, axis=-1, keepdims=True)
  beams = [((), 0.0)]
  for start, size in segments_from_boundaries(1 / (1 + np.exp(-seg)), threshold, max_pack):
    best = np.argsort(-logp[start], kind="stable")[:top_ops]
    grown = [(segs + (programs.Segment(start, size, int(o)),), score + float(logp[start, o]))
             for segs, score in beams for o in best]
    beams = sorted(grown, key=lambda b: -b[1])[:beam]
  return beams
