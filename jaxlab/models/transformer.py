"""Decoder-only transformer LM family: LLaMA-2/3, Mistral, Qwen2/2.5, Qwen3 and OLMo-2 through config flags.

A family is a config, not a branch on a name: `qkv_bias` (Qwen2), `qk_norm` ("head": Qwen3, "full": OLMo-2),
`post_norm` (OLMo-2: norms on the block outputs instead of the inputs), `sliding_window` (Mistral),
`tie_embeddings`, rope variants (jaxlab.nn.rope). `causal=False` gives the bidirectional encoder used by
masked diffusion LMs. Presets include the GaLore/SCALE LLaMA shapes (arXiv 2403.03507, configs/llama_*.json).

Blocks are stacked on a leading `layers` axis and run under `jax.lax.scan`. A layer program (PoLar) is a list
of layer indices (skips and repeats allowed); each executed position has its own KV-cache slot. Captures
(hidden states, residual updates, attention weights) are scan outputs.

Axes: B batch, T query positions, S key positions, D model, H heads, G kv heads, K head dim, F mlp, V vocab,
P executed layer positions.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.nn import attention as attn_lib
from jaxlab.nn import axes, layers, rope as rope_lib
from jaxlab.nn.rope import Rope

CAPTURES = ("hidden_states", "attn_updates", "mlp_updates", "attn_weights")


@dataclasses.dataclass(frozen=True)
class Config:
  vocab_size: int = 256
  d_model: int = 64
  n_layers: int = 2
  n_heads: int = 4
  n_kv_heads: int | None = None  # None: = n_heads (MHA); 1: MQA
  head_dim: int | None = None  # None: d_model // n_heads
  d_ff: int = 176
  max_position_embeddings: int = 2048
  rope: Rope = Rope()
  norm_eps: float = 1e-6
  activation: str = "silu"
  qkv_bias: bool = False
  o_bias: bool = False
  mlp_bias: bool = False
  qk_norm: str = "none"  # "none" | "head" (per head, over K) | "full" (over the whole H*K projection)
  post_norm: bool = False
  tie_embeddings: bool = False
  sliding_window: int | None = None
  causal: bool = True
  init_std: float = 0.02
  param_dtype: str = "float32"
  dtype: str = "float32"  # compute dtype
  remat: bool = False
  bos_token_id: int | None = None
  eos_token_id: int | tuple[int, ...] | None = None
  pad_token_id: int | None = None

  def __post_init__(self):
    def bad(msg):
      raise ValueError(f"transformer.Config: {msg}")
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff"):
      if getattr(self, name) <= 0:
        bad(f"{name} must be positive, found {getattr(self, name)}")
    if self.n_kv_heads is not None and self.n_kv_heads <= 0:
      bad(f"n_kv_heads must be positive (or None for n_heads), found {self.n_kv_heads}")
    if self.head_dim is not None and self.head_dim <= 0:
      bad(f"head_dim must be positive (or None for d_model // n_heads), found {self.head_dim}")
    if self.head_dim is None and self.d_model % self.n_heads:
      bad(f"n_heads ({self.n_heads}) must divide d_model ({self.d_model}) when head_dim is not given")
    if self.n_heads % self.kv_heads:
      bad(f"n_kv_heads ({self.kv_heads}) must divide n_heads ({self.n_heads})")
    if self.qk_norm not in ("none", "head", "full"):
      bad(f"qk_norm must be 'none', 'head' or 'full', found {self.qk_norm!r}")
    if self.activation not in layers.ACTIVATIONS:
      bad(f"activation must be one of {sorted(layers.ACTIVATIONS)}, found {self.activation!r}")
    if self.kdim % 2:
      bad(f"head_dim must be even for rotary embeddings, found {self.kdim}")
    layers.check_dtype_names(self, bad)

  @property
  def kv_heads(self) -> int:
    return self.n_kv_heads or self.n_heads

  @property
  def kdim(self) -> int:
    return self.head_dim or self.d_model // self.n_heads

  @classmethod
  def tiny(cls, **kw) -> "Config":
    return dataclasses.replace(PRESETS["tiny"], **kw)

  def replace(self, **kw) -> "Config":
    return dataclasses.replace(self, **kw)


def _llama(d, f, h, n, v=32000, maxlen=1024) -> Config:
  return Config(vocab_size=v, d_model=d, n_layers=n, n_heads=h, d_ff=f, max_position_embeddings=maxlen,
                norm_eps=1e-6, bos_token_id=0, eos_token_id=1, pad_token_id=1)


PRESETS: dict[str, Config] = {
    "tiny": Config(vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=176),
    "llama-60m": _llama(512, 1376, 8, 8),
    "llama-130m": _llama(768, 2048, 12, 12),
    "llama-350m": _llama(1024, 2736, 16, 24),
    "llama-1b": _llama(2048, 5461, 32, 24),
    "llama-7b": _llama(4096, 11008, 32, 32, maxlen=2048),
}


# Logical axes of every parameter (trailing dims; stacked layers are prepended as "layers").
for _pat, _names, _fan_in in [
    (r"embed/embedding", ("vocab", "embed"), "vocab"),
    (r"lm_head/kernel", ("embed", "vocab"), "embed"),
    (r"attn/q/kernel", ("embed", "q_heads"), "embed"),
    (r"attn/(k|v)/kernel", ("embed", "kv_heads"), "embed"),
    (r"attn/o/kernel", ("q_heads", "embed"), "q_heads"),
    (r"attn/q/bias", ("q_heads",), None),
    (r"attn/(k|v)/bias", ("kv_heads",), None),
    (r"attn/o/bias", ("embed",), None),
    (r"attn/(q|k)_norm/scale", ("qk_norm",), None),
    (r"mlp/(gate|up)/kernel", ("embed", "mlp"), "embed"),
    (r"mlp/(gate|up)/bias", ("mlp",), None),
    (r"mlp/down/kernel", ("mlp", "embed"), "mlp"),
    (r"mlp/down/bias", ("embed",), None),
    (r"(attn_norm|mlp_norm|post_attn_norm|post_mlp_norm|final_norm)/(scale|bias)", ("embed",), None),
]:
  axes.register(_pat, _names, _fan_in)


def init(cfg: Config, key) -> dict:
  """Random params (normal(0, init_std) matrices, unit norm scales, zero biases), as HF LLaMA initializes."""
  dt = jnp.dtype(cfg.param_dtype)
  d, k, h, g, L = cfg.d_model, cfg.kdim, cfg.n_heads, cfg.kv_heads, cfg.n_layers
  ke, kq, kk, kv, ko, km, kh = jax.random.split(key, 7)
  lin = lambda key, i, o, bias: layers.linear_init(key, i, o, bias=bias, std=cfg.init_std, dtype=dt, stack=(L,))
  attn = {"q": lin(kq, d, h * k, cfg.qkv_bias), "k": lin(kk, d, g * k, cfg.qkv_bias),
          "v": lin(kv, d, g * k, cfg.qkv_bias), "o": lin(ko, h * k, d, cfg.o_bias)}
  if cfg.qk_norm != "none":
    attn["q_norm"] = layers.norm_init(k if cfg.qk_norm == "head" else h * k, dtype=dt, stack=(L,))
    attn["k_norm"] = layers.norm_init(k if cfg.qk_norm == "head" else g * k, dtype=dt, stack=(L,))
  block = {"attn": attn, "mlp": layers.mlp_init(km, d, cfg.d_ff, bias=cfg.mlp_bias, std=cfg.init_std, dtype=dt,
                                                stack=(L,))}
  pre = "post_" if cfg.post_norm else ""
  block[pre + "attn_norm"] = layers.norm_init(d, dtype=dt, stack=(L,))
  block[pre + "mlp_norm"] = layers.norm_init(d, dtype=dt, stack=(L,))
  params = {"embed": layers.embed_init(ke, cfg.vocab_size, d, std=cfg.init_std, dtype=dt), "layers": block,
            "final_norm": layers.norm_init(d, dtype=dt)}
  if not cfg.tie_embeddings:
    params["lm_head"] = layers.linear_init(kh, d, cfg.vocab_size, std=cfg.init_std, dtype=dt)
  return params


def param_axes(cfg: Config):
  """Logical axis names of every parameter, as a tree shaped like `init(cfg, key)`."""
  return axes.logical_axes(jax.eval_shape(lambda: init(cfg, jax.random.key(0))))


@dataclasses.dataclass(frozen=True)
class Intervention:
  """Hooks applied inside every attention block. `layer` is the (traced) index of the layer being run.

  attn_weights: fn(weights_BHTS, layer) -> weights_BHTS, replaces the attention pattern after softmax.
  attn_update: fn(update_BTD, layer) -> update_BTD, replaces what attention adds to the residual stream.
  """
  attn_weights: Callable | None = None
  attn_update: Callable | None = None


class Output(NamedTuple):
  logits: Any  # [B, T, V]
  cache: Any = None
  hidden_states: Any = None  # [P+1, B, T, D]; 0 = embeddings, last = after the final norm (HF convention)
  attn_updates: Any = None  # [P, B, T, D]
  mlp_updates: Any = None  # [P, B, T, D]
  attn_weights: Any = None  # [P, B, H, T, S]


def _attention(p, x_BTD, cos, sin, mask_BTS, cfg: Config, slot, index, layer, intervention, attention_fn):
  dt = jnp.dtype(cfg.dtype)
  b, t, _ = x_BTD.shape
  h, g, k = cfg.n_heads, cfg.kv_heads, cfg.kdim
  q, kk, v = (layers.linear(p[n], x_BTD, dt) for n in ("q", "k", "v"))
  if cfg.qk_norm == "full":
    q, kk = layers.rms_norm(p["q_norm"], q, cfg.norm_eps), layers.rms_norm(p["k_norm"], kk, cfg.norm_eps)
  q, kk, v = q.reshape(b, t, h, k), kk.reshape(b, t, g, k), v.reshape(b, t, g, k)
  if cfg.qk_norm == "head":
    q, kk = layers.rms_norm(p["q_norm"], q, cfg.norm_eps), layers.rms_norm(p["k_norm"], kk, cfg.norm_eps)
  if cos is not None:
    q, kk = rope_lib.apply(q, cos, sin), rope_lib.apply(kk, cos, sin)
  heads_major = slot is not None
  if slot is not None:  # slot = (k cache [P,B,G,S,K], v cache, this layer position's slot index)
    kc, vc = attn_lib.cache_write(slot[0], slot[1], kk, v, slot[2], index)
    kk, v, slot = kc[slot[2]], vc[slot[2]], (kc, vc)
  hook = None
  if intervention is not None and intervention.attn_weights is not None:
    hook = lambda w: intervention.attn_weights(w, layer)
  if attention_fn is not None:
    if heads_major:
      kk, v = jnp.swapaxes(kk, 1, 2), jnp.swapaxes(v, 1, 2)
    out, w = attention_fn(q, kk.astype(dt), v.astype(dt), mask_BTS), None
  else:
    out, w = attn_lib.attention(q, kk.astype(dt), v.astype(dt), mask_BTS, weights_hook=hook, heads_major=heads_major)
  return layers.linear(p["o"], out.reshape(b, t, h * k), dt), w, slot


def block(p, x_BTD, cos, sin, mask_BTS, cfg: Config, slot, index, layer, intervention, attention_fn):
  """One decoder layer on the residual stream (params `p` of one layer; rotary tables and mask from
  `positions_and_mask`): (x, attention update, MLP update, attention weights, cache slot). `forward` scans it;
  the unrolled decode path and layer programs call it per layer."""
  eps = cfg.norm_eps
  inp = x_BTD if cfg.post_norm else layers.rms_norm(p["attn_norm"], x_BTD, eps)
  a, w, slot = _attention(p["attn"], inp, cos, sin, mask_BTS, cfg, slot, index, layer, intervention, attention_fn)
  if cfg.post_norm:
    a = layers.rms_norm(p["post_attn_norm"], a, eps)
  if intervention is not None and intervention.attn_update is not None:
    a = intervention.attn_update(a, layer).astype(a.dtype)
  x_BTD = x_BTD + a
  inp = x_BTD if cfg.post_norm else layers.rms_norm(p["mlp_norm"], x_BTD, eps)
  m = layers.mlp(p["mlp"], inp, cfg.activation, jnp.dtype(cfg.dtype))
  if cfg.post_norm:
    m = layers.rms_norm(p["post_mlp_norm"], m, eps)
  return x_BTD + m, a, m, w, slot


def init_cache(cfg: Config, batch: int, max_len: int, program: Sequence[int] | None = None, dtype=None):
  """An empty KV cache with one slot per executed layer position (len(program), default n_layers); k/v are
  [P, B, G, S, K] (`jaxlab.nn.attention.init_cache`)."""
  n = cfg.n_layers if program is None else len(program)
  return attn_lib.init_cache(n, batch, max_len, cfg.kv_heads, cfg.kdim, jnp.dtype(dtype or cfg.dtype))


def _check_program(program, cfg: Config):
  prog = np.asarray(program, dtype=np.int32)
  if prog.ndim != 1 or prog.size == 0 or prog.min() < 0 or prog.max() >= cfg.n_layers:
    raise ValueError(f"program must be a non-empty list of layer indices in [0, {cfg.n_layers}), found {program}")
  return prog


def positions_and_mask(cfg: Config, valid_BT, cache=None, positions_BT=None, attn_mask_BTS=None):
  """(k_pos [B, S], mask [B, T, S], rotary cos, sin) of a forward pass, as `forward` computes them.

  Positions default to the cumulative count of real tokens (left padding aware), continuing after the cache's
  last written position; `k_pos` is the keys' positions (-1: never attended), the cache's with this step's
  written at its index; the mask combines them with causality or the sliding window and `attn_mask_BTS`.
  """
  if positions_BT is None:
    positions_BT = jnp.cumsum(valid_BT, axis=1) - 1
    if cache is not None:  # continue after the last real position written so far
      positions_BT = positions_BT + jnp.max(cache["pos"], axis=1, keepdims=True) + 1
    positions_BT = jnp.maximum(positions_BT, 0)
  q_pos = jnp.where(valid_BT, positions_BT, -1)
  if cache is None:
    k_pos = q_pos
  else:
    k_pos = jax.lax.dynamic_update_slice_in_dim(cache["pos"], q_pos.astype(jnp.int32), cache["index"], axis=1)
  mask = k_pos[:, None, :] >= 0
  if cfg.causal:
    mask &= attn_lib.causal_mask(positions_BT, k_pos, cfg.sliding_window)
  elif cfg.sliding_window is not None:
    mask &= jnp.abs(positions_BT[:, :, None] - k_pos[:, None, :]) < cfg.sliding_window
  if attn_mask_BTS is not None:
    mask &= attn_mask_BTS
  seq_len = jnp.max(k_pos) + 1 if cfg.rope.type == "dynamic" else None
  cos, sin = rope_lib.cos_sin(cfg.rope, cfg.kdim, cfg.max_position_embeddings, positions_BT, seq_len)
  return k_pos, mask, cos, sin


def forward(params, tokens_BT, cfg: Config, *, positions_BT=None, attention_mask_BT=None, attn_mask_BTS=None,
            cache=None, program: Sequence[int] | None = None, capture: Sequence[str] = (),
            intervention: Intervention | None = None, inputs_embeds_BTD=None,
            attention_fn: Callable | None = None) -> Output:
  """Runs the LM.

  Args:
    tokens_BT: int token ids (ignored where `inputs_embeds_BTD` is given).
    positions_BT: rotary positions; default: cumulative count of unmasked tokens (left padding aware), offset
      by the cache's write index when decoding.
    attention_mask_BT: 1 for real tokens, 0 for padding (HF convention); padded keys are never attended.
    attn_mask_BTS: optional extra boolean mask [B, T, S] (True = may attend), combined with causality/padding.
    cache: a KV cache from `init_cache`; the new keys/values are written at `cache["index"]`.
    program: layer indices to execute in order (None: 0..n_layers-1).
    capture: any of "hidden_states", "attn_updates", "mlp_updates", "attn_weights".
    intervention: hooks replacing attention weights or the attention update.
    inputs_embeds_BTD: embeddings to use instead of looking up `tokens_BT` (e.g. a VLM's spliced sequence).
    attention_fn: fn(q_BTHK, k_BSGK, v_BSGK, mask_BTS) -> out_BTHK in place of the softmax attention, e.g. a
      fused kernel that knows the mask's structure (`kernels.spec_verify`); k/v include the cache.
  """
  unknown = set(capture) - set(CAPTURES)
  if unknown:
    raise ValueError(f"unknown capture {sorted(unknown)}; expected a subset of {CAPTURES}")
  if attention_fn is not None and ("attn_weights" in capture or
                                   (intervention is not None and intervention.attn_weights is not None)):
    raise ValueError("attention_fn does not expose attention weights: drop the 'attn_weights' capture and the "
                     "attn_weights intervention")
  dt = jnp.dtype(cfg.dtype)
  x = layers.embed(params["embed"], tokens_BT, dt) if inputs_embeds_BTD is None else inputs_embeds_BTD.astype(dt)
  b, t = x.shape[:2]
  valid_BT = (jnp.ones((b, t), bool) if attention_mask_BT is None else attention_mask_BT.astype(bool))
  index = None if cache is None else cache["index"]
  k_pos, mask, cos, sin = positions_and_mask(cfg, valid_BT, cache, positions_BT, attn_mask_BTS)

  lp = params["layers"]
  if program is None:
    layer_ids = jnp.arange(cfg.n_layers, dtype=jnp.int32)
  else:
    layer_ids = jnp.asarray(_check_program(program, cfg))
    lp = jax.tree.map(lambda a: a[layer_ids], lp)
  n = layer_ids.shape[0]
  if cache is not None and cache["k"].shape[0] != n:
    raise ValueError(f"cache has {cache['k'].shape[0]} slots but {n} layer positions are executed")

  def body(carry, xs):  # the cache rides in the carry: each layer writes its new entries in place
    x, kc, vc = carry
    p, layer, pos = xs
    slot = None if kc is None else (kc, vc, pos)
    x, a, m, w, slot = block(p, x, cos, sin, mask, cfg, slot, index, layer, intervention, attention_fn)
    ys = {"hidden_states": x, "attn_updates": a, "mlp_updates": m, "attn_weights": w}
    return (x, *((None, None) if slot is None else slot)), {k: v for k, v in ys.items() if k in capture}

  if cfg.remat:
    body = jax.checkpoint(body, prevent_cse=False)
  kc, vc = (None, None) if cache is None else (cache["k"], cache["v"])
  (x_final, kc, vc), ys = jax.lax.scan(body, (x, kc, vc), (lp, layer_ids, jnp.arange(n, dtype=jnp.int32)))
  h = layers.rms_norm(params["final_norm"], x_final, cfg.norm_eps)
  if "lm_head" in params:
    logits = layers.linear(params["lm_head"], h, dt)
  else:
    logits = layers.unembed(params["embed"], h, dt)

  new_cache = None
  if cache is not None:
    new_cache = {"k": kc, "v": vc, "pos": k_pos, "index": index + t}
  hs = None
  if "hidden_states" in capture:
    hs = jnp.concatenate([x[None], ys["hidden_states"][:-1], h[None]], axis=0)
  return Output(logits=logits, cache=new_cache, hidden_states=hs, attn_updates=ys.get("attn_updates"),
                mlp_updates=ys.get("mlp_updates"), attn_weights=ys.get("attn_weights"))


def num_params(params) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


def flops_per_token(cfg: Config, seq_len: int) -> float:
  """Training FLOPs per token (forward + backward = 3x forward): 6N for matmuls plus attention scores."""
  d, k, h, g, f, L = cfg.d_model, cfg.kdim, cfg.n_heads, cfg.kv_heads, cfg.d_ff, cfg.n_layers
  per_layer = d * h * k * 2 + d * g * k * 2 + 3 * d * f
  matmul = L * per_layer + d * cfg.vocab_size
  attn = L * 2 * h * k * seq_len  # QK^T and AV, causal average counted in full as is customary
  return 6.0 * matmul + 3.0 * 2.0 * attn
