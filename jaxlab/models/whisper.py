"""Whisper (Radford et al., "Robust Speech Recognition via Large-Scale Weak Supervision", arXiv 2212.04356):
the encoder-decoder transformer over log-mel spectrograms that is the speech front end of bfcl_audio.

Encoder: two conv1d (kernel 3, the second with stride 2) each followed by exact GELU, plus fixed sinusoidal
positions, then pre-LN blocks (LN -> self-attention, LN -> GELU MLP) and a final LayerNorm. Decoder: token
embeddings plus learned positions, pre-LN blocks with causal self-attention, cross-attention to the encoder
output and an MLP, a final LayerNorm and logits against the tied token embedding. Keys carry no bias (as
released). Blocks are stacked on a leading `layers` axis, scanned in the encoder and in teacher-forced decoding;
the encoder's self-attention runs blockwise over query tiles. Incremental decoding keeps a fixed-size
self-attention cache (so one compiled step serves every position) and the cross-attention K/V, computed once
per audio by `init_cache`, per layer, and unrolls the decoder layers.

Axes: B batch, F mel bins, T frames / decoder positions, S keys, D model, H heads, K head dim, L layers,
V vocab, W conv width, A encoder positions.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.models import transformer as tfm
from jaxlab.nn import attention as attn_lib
from jaxlab.nn import axes, layers


@dataclasses.dataclass(frozen=True)
class Config:
  vocab_size: int = 51865
  n_mels: int = 80
  d_model: int = 384
  encoder_layers: int = 4
  encoder_heads: int = 6
  encoder_ffn: int = 1536
  decoder_layers: int = 4
  decoder_heads: int = 6
  decoder_ffn: int = 1536
  max_source_positions: int = 1500  # encoder positions; the mel input has twice as many frames
  max_target_positions: int = 448
  norm_eps: float = 1e-5
  init_std: float = 0.02
  param_dtype: layers.DType = "float32"
  dtype: layers.DType = "float32"  # compute dtype

  def __post_init__(self):
    def bad(msg):
      raise ValueError(f"whisper.Config: {msg}")
    for name in ("vocab_size", "n_mels", "d_model", "encoder_layers", "encoder_heads", "encoder_ffn",
                 "decoder_layers", "decoder_heads", "decoder_ffn", "max_source_positions", "max_target_positions"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
        bad(f"{name} must be a positive int, found {getattr(self, name)!r}")
    for name in ("encoder_heads", "decoder_heads"):
      if self.d_model % getattr(self, name):
        bad(f"{name} ({getattr(self, name)}) must divide d_model ({self.d_model})")
    if self.d_model % 2:
      bad(f"d_model must be even (sinusoidal positions), found {self.d_model}")
    if self.norm_eps <= 0:
      bad(f"norm_eps must be positive, found {self.norm_eps}")
    layers.check_dtype_names(self, bad)

  @property
  def n_frames(self) -> int:
    """Mel frames of one encoder input (3000 = 30 s for the released models)."""
    return 2 * self.max_source_positions

  def replace(self, **kw) -> "Config":
    return dataclasses.replace(self, **kw)


def _whisper(d, n, h, vocab=51865, n_mels=80) -> Config:
  return Config(vocab_size=vocab, n_mels=n_mels, d_model=d, encoder_layers=n, encoder_heads=h, encoder_ffn=4 * d,
                decoder_layers=n, decoder_heads=h, decoder_ffn=4 * d)


# openai/whisper's released dimensions (the .en models have one token fewer: no multilingual language token).
PRESETS: dict[str, Config] = {
    "tiny_random": Config(vocab_size=96, n_mels=8, d_model=32, encoder_layers=2, encoder_heads=4, encoder_ffn=64,
                          decoder_layers=2, decoder_heads=4, decoder_ffn=64, max_source_positions=16,
                          max_target_positions=24),
    "tiny.en": _whisper(384, 4, 6, vocab=51864),
    "tiny": _whisper(384, 4, 6),
    "base.en": _whisper(512, 6, 8, vocab=51864),
    "base": _whisper(512, 6, 8),
    "small.en": _whisper(768, 12, 12, vocab=51864),
    "small": _whisper(768, 12, 12),
    "medium.en": _whisper(1024, 24, 16, vocab=51864),
    "medium": _whisper(1024, 24, 16),
    "large-v2": _whisper(1280, 32, 20),
    "large-v3": _whisper(1280, 32, 20, vocab=51866, n_mels=128),
}

AXES = tfm.AXES + axes.rules(
    (r"conv(1|2)/kernel", ("conv_width", "conv_in", "embed"), "conv_in"),
    (r"conv(1|2)/bias", ("embed",), None),
    (r"pos_embed", ("pos", "embed"), "pos"),
    (r"cross_attn/q/kernel", ("embed", "q_heads"), "embed"),
    (r"cross_attn/(k|v)/kernel", ("embed", "kv_heads"), "embed"),
    (r"cross_attn/o/kernel", ("q_heads", "embed"), "q_heads"),
    (r"cross_attn/q/bias", ("q_heads",), None),
    (r"cross_attn/v/bias", ("kv_heads",), None),
    (r"cross_attn/o/bias", ("embed",), None),
    (r"cross_norm/(scale|bias)", ("embed",), None),
)


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> np.ndarray:
  """[length, channels] float32: sin of the first half, cos of the second, geometric timescales (Whisper's)."""
  inc = np.log(max_timescale) / (channels // 2 - 1)
  inv = np.exp(-inc * np.arange(channels // 2))
  t = np.arange(length)[:, None] * inv[None, :]
  return np.concatenate([np.sin(t), np.cos(t)], axis=1).astype(np.float32)


def _attn_init(key, d, std, dt, stack):
  kq, kk, kv, ko = jax.random.split(key, 4)
  lin = lambda k, bias: layers.linear_init(k, d, d, bias=bias, std=std, dtype=dt, stack=stack)
  return {"q": lin(kq, True), "k": lin(kk, False), "v": lin(kv, True), "o": lin(ko, True)}


def init(cfg: Config, key) -> dict:
  """Random params: normal(0, init_std) matrices and tables, unit norm scales, zero biases."""
  dt, d, std = jnp.dtype(cfg.param_dtype), cfg.d_model, cfg.init_std
  ke, kd = jax.random.split(key)
  ln = lambda stack: layers.norm_init(d, bias=True, dtype=dt, stack=stack)
  Le, Ld = (cfg.encoder_layers,), (cfg.decoder_layers,)
  k1, k2, ka, km = jax.random.split(ke, 4)
  conv = lambda k, c_in: {"kernel": layers.normal(k, (3, c_in, d), std, dt), "bias": jnp.zeros((d,), dt)}
  enc = {"conv1": conv(k1, cfg.n_mels), "conv2": conv(k2, d),
         "layers": {"attn_norm": ln(Le), "attn": _attn_init(ka, d, std, dt, Le), "mlp_norm": ln(Le),
                    "mlp": layers.mlp_init(km, d, cfg.encoder_ffn, gated=False, bias=True, std=std, dtype=dt,
                                           stack=Le)},
         "final_norm": ln(())}
  kt, kp, ka, kc, km = jax.random.split(kd, 5)
  dec = {"embed": layers.embed_init(kt, cfg.vocab_size, d, std=std, dtype=dt),
         "pos_embed": layers.normal(kp, (cfg.max_target_positions, d), std, dt),
         "layers": {"attn_norm": ln(Ld), "attn": _attn_init(ka, d, std, dt, Ld), "cross_norm": ln(Ld),
                    "cross_attn": _attn_init(kc, d, std, dt, Ld), "mlp_norm": ln(Ld),
                    "mlp": layers.mlp_init(km, d, cfg.decoder_ffn, gated=False, bias=True, std=std, dtype=dt,
                                           stack=Ld)},
         "final_norm": ln(())}
  return {"encoder": enc, "decoder": dec}


def param_axes(cfg: Config):
  """Logical axis names of every parameter, as a tree shaped like `init(cfg, key)`."""
  return axes.logical_axes(jax.eval_shape(lambda: init(cfg, jax.random.key(0))), AXES)


def _conv(p, x_BTC, stride: int, dt):
  y = jax.lax.conv_general_dilated(x_BTC.astype(dt), p["kernel"].astype(dt), (stride,), [(1, 1)],
                                   dimension_numbers=("NWC", "WIO", "NWC"))
  return jax.nn.gelu(y + p["bias"].astype(dt), approximate=False)


def _heads(x_BTD, h):
  b, t, d = x_BTD.shape
  return x_BTD.reshape(b, t, h, d // h)


def _self_attn(p, x_BTD, h, dt):
  q, k, v = (_heads(layers.linear(p[n], x_BTD, dt), h) for n in "qkv")
  a = attn_lib.blockwise_attention(q, k, v)
  return layers.linear(p["o"], a.reshape(x_BTD.shape), dt)


def _mlp(p, x_BTD, dt):
  return layers.mlp(p, x_BTD, "gelu", dt)


def _check_mel(mel_BFT, cfg: Config):
  if mel_BFT.ndim != 3 or mel_BFT.shape[1] != cfg.n_mels or mel_BFT.shape[2] != cfg.n_frames:
    raise ValueError(f"mel_BFT must be [B, {cfg.n_mels}, {cfg.n_frames}] (n_mels, 2 * max_source_positions "
                     f"frames), found shape {tuple(mel_BFT.shape)}")


def encode(params, mel_BFT, cfg: Config):
  """Encoder output [B, A, D] for log-mel spectrograms [B, n_mels, 2A]."""
  _check_mel(mel_BFT, cfg)
  dt, p = jnp.dtype(cfg.dtype), params["encoder"]
  x = _conv(p["conv1"], jnp.swapaxes(mel_BFT, 1, 2), 1, dt)
  x = _conv(p["conv2"], x, 2, dt)
  x = x + jnp.asarray(sinusoids(cfg.max_source_positions, cfg.d_model), dt)

  def body(x, lp):
    x = x + _self_attn(lp["attn"], layers.layer_norm(lp["attn_norm"], x, cfg.norm_eps), cfg.encoder_heads, dt)
    return x + _mlp(lp["mlp"], layers.layer_norm(lp["mlp_norm"], x, cfg.norm_eps), dt), None

  x, _ = jax.lax.scan(body, x, p["layers"])
  return layers.layer_norm(p["final_norm"], x, cfg.norm_eps)


def cross_kv(params, enc_BAD, cfg: Config):
  """Cross-attention keys [L, B, H, A, K] and values [L, B, H, K, A] of every decoder layer, computed once per
  audio: the layouts a decoding step's matmuls read in place (see `attention.attention(transposed=True)`)."""
  dt, h = jnp.dtype(cfg.dtype), cfg.decoder_heads
  ca = params["decoder"]["layers"]["cross_attn"]

  def one(pk, pv):
    k_BAHK, v_BAHK = (_heads(layers.linear(w, enc_BAD, dt), h) for w in (pk, pv))
    return k_BAHK.transpose(0, 2, 1, 3), v_BAHK.transpose(0, 2, 3, 1)

  return jax.vmap(one)(ca["k"], ca["v"])


def init_cache(params, enc_BAD, cfg: Config, dtype=None) -> dict:
  """A decoding cache for the encoder output: per decoder layer (tuples of L arrays) the self-attention K/V of
  `max_target_positions` slots, empty (keys [B, H, S, K], values [B, H, K, S]), and the cross-attention keys
  [B, H, A, K] and values [B, H, K, A]; `index`, the position of the next token. Per-layer arrays, not one
  stacked array, so a decoding step reads each layer's K/V in place instead of slicing (copying) it out of a
  stack every token."""
  dt = jnp.dtype(dtype or cfg.dtype)
  b, h = enc_BAD.shape[0], cfg.decoder_heads
  s, k = cfg.max_target_positions, cfg.d_model // h
  ck, cv = cross_kv(params, enc_BAD, cfg)
  n = cfg.decoder_layers
  return {"k": tuple(jnp.zeros((b, h, s, k), dt) for _ in range(n)),
          "v": tuple(jnp.zeros((b, h, k, s), dt) for _ in range(n)),
          "cross_k": tuple(ck[i].astype(dt) for i in range(n)), "cross_v": tuple(cv[i].astype(dt) for i in range(n)),
          "index": jnp.zeros((), jnp.int32)}


def _embed_tokens(p, tokens_BT, start, dt):
  t = tokens_BT.shape[1]
  pos = jax.lax.dynamic_slice_in_dim(p["pos_embed"], start, t, axis=0)
  return layers.embed(p["embed"], tokens_BT, dt) + pos.astype(dt)[None]


def _decoder_layer(lp, x, k, v, ck_BHAK, cv_BHKA, mask_BTS, cfg: Config, dt, cached: bool):
  """One decoder block; self-attention keys and values are [B, S, H, K], or if cached keys [B, H, S, K] and
  values [B, H, K, S]."""
  h, eps = cfg.decoder_heads, cfg.norm_eps
  y = layers.layer_norm(lp["attn_norm"], x, eps)
  q = _heads(layers.linear(lp["attn"]["q"], y, dt), h)
  a, _ = attn_lib.attention(q, k, v, mask_BTS, transposed=cached)
  x = x + layers.linear(lp["attn"]["o"], a.reshape(x.shape), dt)
  y = layers.layer_norm(lp["cross_norm"], x, eps)
  q = _heads(layers.linear(lp["cross_attn"]["q"], y, dt), h)
  a, _ = attn_lib.attention(q, ck_BHAK, cv_BHKA, transposed=True)
  x = x + layers.linear(lp["cross_attn"]["o"], a.reshape(x.shape), dt)
  return x + _mlp(lp["mlp"], layers.layer_norm(lp["mlp_norm"], x, eps), dt)


def _logits(p, x, cfg: Config):
  x = layers.layer_norm(p["final_norm"], x, cfg.norm_eps)
  return layers.unembed(p["embed"], x, jnp.float32)


def unstack_layers(layers_p, n: int) -> tuple:
  """The n per-layer trees of a stacked layer tree (for `decode`, which also takes decoder params whose "layers"
  are unstacked once, outside a token loop, so the loop does not slice them out of the stack every step)."""
  return tuple(jax.tree.map(lambda a, i=i: a[i], layers_p) for i in range(n))


def decode(params, tokens_BT, cache: dict, cfg: Config):
  """Runs tokens at positions cache["index"] ... + T against the cache: (logits [B, T, V] fp32, new cache).

  Writes their self-attention K/V into the fixed-size cache, so every call with the same T compiles once.
  The layers are unrolled (not scanned): under a token loop, a scan would copy each layer's weights and cache
  out of their stacks on every step, which costs more than the step's arithmetic.
  """
  dt, p, h = jnp.dtype(cfg.dtype), params["decoder"], cfg.decoder_heads
  b, t = tokens_BT.shape
  start = cache["index"]
  x = _embed_tokens(p, tokens_BT, start, dt)
  s = cache["v"][0].shape[3]
  q_pos = start + jnp.arange(t)
  mask = (jnp.arange(s)[None, :] <= q_pos[:, None])[None]
  z = jnp.zeros((), jnp.int32)
  ks, vs = [], []
  per_layer = p["layers"] if isinstance(p["layers"], (tuple, list)) else unstack_layers(p["layers"], cfg.decoder_layers)
  for i, lp in enumerate(per_layer):
    y = layers.layer_norm(lp["attn_norm"], x, cfg.norm_eps)
    k_new, v_new = (_heads(layers.linear(lp["attn"][n], y, dt), h) for n in "kv")
    ks.append(jax.lax.dynamic_update_slice(cache["k"][i], k_new.transpose(0, 2, 1, 3).astype(cache["k"][i].dtype),
                                           (z, z, start, z)))
    vs.append(jax.lax.dynamic_update_slice(cache["v"][i], v_new.transpose(0, 2, 3, 1).astype(cache["v"][i].dtype),
                                           (z, z, z, start)))
    x = _decoder_layer(lp, x, ks[i], vs[i], cache["cross_k"][i], cache["cross_v"][i], mask, cfg, dt,
                       cached=True)
  return _logits(p, x, cfg), {**cache, "k": tuple(ks), "v": tuple(vs), "index": start + t}


def forward(params, mel_BFT, tokens_BT, cfg: Config):
  """Teacher-forced logits [B, T, V] (fp32) of decoder tokens given log-mel input, without a cache."""
  if tokens_BT.ndim != 2 or tokens_BT.shape[1] > cfg.max_target_positions:
    raise ValueError(f"tokens_BT must be [B, T] with T <= {cfg.max_target_positions}, found shape "
                     f"{tuple(tokens_BT.shape)}")
  dt, p, h = jnp.dtype(cfg.dtype), params["decoder"], cfg.decoder_heads
  enc = encode(params, mel_BFT, cfg)
  ck, cv = cross_kv(params, enc, cfg)
  t = tokens_BT.shape[1]
  x = _embed_tokens(p, tokens_BT, 0, dt)
  mask = attn_lib.causal_mask(jnp.arange(t)[None], jnp.arange(t)[None])

  def body(x, xs):
    lp, k_c, v_c = xs
    y = layers.layer_norm(lp["attn_norm"], x, cfg.norm_eps)
    k, v = (_heads(layers.linear(lp["attn"][n], y, dt), h) for n in "kv")
    return _decoder_layer(lp, x, k, v, k_c, v_c, mask, cfg, dt, cached=False), None

  x, _ = jax.lax.scan(body, x, (p["layers"], ck, cv))
  return _logits(p, x, cfg)
