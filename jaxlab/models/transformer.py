"""Decoder-only transformer LM family: LLaMA-2/3, Mistral, Qwen2/2.5, Qwen3 and OLMo-2 through config flags.

A family is a config, not a branch on a name: `qkv_bias` (Qwen2), `qk_norm` ("head": Qwen3, "full": OLMo-2),
`post_norm` (OLMo-2: norms on the block outputs instead of the inputs), `sliding_window` (Mistral),
`tie_embeddings`, rope variants (jaxlab.nn.rope). `causal=False` gives the bidirectional encoder used by
masked diffusion LMs. Presets include the GaLore/SCALE LLaMA shapes (arXiv 2403.03507, configs/llama_*.json).

A pass is `embed`, `positions_and_mask`, `stack` (the layers) and `head`; `forward`, the padded layer programs
(`programs`) and the decode path of `jaxlab.generate.sampling` all run these. Blocks are stacked on a leading
`layers` axis and run under `jax.lax.scan` (or, split into per-layer trees, as an unrolled loop). A layer
program (PoLar) is a list of layer indices (skips and repeats allowed); each executed position has its own
KV-cache slot. Captures (hidden states, residual updates, attention weights) are scan outputs. What a paper
changes inside a block enters through the named hook points of `Intervention`.

Axes: B batch, T query positions, S key positions, D model, H heads, G kv heads, K head dim, F mlp, V vocab,
P executed layer positions.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import choices
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
  activation: layers.Activation = "silu"
  qkv_bias: bool = False
  o_bias: bool = False
  mlp_bias: bool = False
  qk_norm: Literal["none", "head", "full"] = "none"  # "head": per head, over K; "full": over the whole H*K projection
  post_norm: bool = False
  tie_embeddings: bool = False
  sliding_window: int | None = None
  causal: bool = True
  init_std: float = 0.02
  param_dtype: layers.DType = "float32"
  dtype: layers.DType = "float32"  # compute dtype
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
    if self.kdim % 2:
      bad(f"head_dim must be even for rotary embeddings, found {self.kdim}")
    layers.check_dtype_names(self, bad)
    choices.check(self, bad, nested=False)

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
AXES = axes.rules(
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
)


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
  return axes.logical_axes(jax.eval_shape(lambda: init(cfg, jax.random.key(0))), AXES)


@dataclasses.dataclass(frozen=True)
class Intervention:
  """Named hook points inside every decoder block; `layer` is the (traced) index of the layer being run.

  attn_weights: fn(weights_BHTS, layer) -> weights_BHTS, replaces the attention pattern after softmax.
  attn_update: fn(update_BTD, layer) -> update_BTD, replaces what attention adds to the residual stream.
  attention: fn(q_BTHK, k_BSGK, v_BSGK, mask_BTS) -> out_BTHK in place of the softmax attention, e.g. a fused
    kernel that knows the mask's structure (`kernels.spec_verify`); k/v include the cache. It exposes no
    attention weights, so it excludes the `attn_weights` hook and capture.
  """
  attn_weights: Callable | None = None
  attn_update: Callable | None = None
  attention: Callable | None = None


class Output(NamedTuple):
  logits: Any  # [B, T, V]
  cache: Any = None
  hidden_states: Any = None  # [P+1, B, T, D]; 0 = embeddings, last = after the final norm (HF convention)
  attn_updates: Any = None  # [P, B, T, D]
  mlp_updates: Any = None  # [P, B, T, D]
  attn_weights: Any = None  # [P, B, H, T, S]


class Frame(NamedTuple):
  """What every layer of one pass shares (`positions_and_mask`)."""
  k_pos: Any  # [B, S] the keys' positions, -1: never attended
  mask: Any  # [B, T, S] True: may attend
  cos: Any  # rotary tables at the query positions
  sin: Any


def _attention(p, x_BTD, frame: Frame, cfg: Config, slot, index, layer, hooks: Intervention | None):
  dt = jnp.dtype(cfg.dtype)
  b, t, _ = x_BTD.shape
  h, g, k = cfg.n_heads, cfg.kv_heads, cfg.kdim
  q, kk, v = (layers.linear(p[n], x_BTD, dt) for n in ("q", "k", "v"))
  if cfg.qk_norm == "full":
    q, kk = layers.rms_norm(p["q_norm"], q, cfg.norm_eps), layers.rms_norm(p["k_norm"], kk, cfg.norm_eps)
  q, kk, v = q.reshape(b, t, h, k), kk.reshape(b, t, g, k), v.reshape(b, t, g, k)
  if cfg.qk_norm == "head":
    q, kk = layers.rms_norm(p["q_norm"], q, cfg.norm_eps), layers.rms_norm(p["k_norm"], kk, cfg.norm_eps)
  if frame.cos is not None:
    q, kk = rope_lib.apply(q, frame.cos, frame.sin), rope_lib.apply(kk, frame.cos, frame.sin)
  heads_major = slot is not None
  if slot is not None:  # slot = (k cache [P,B,G,S,K], v cache, slot index), or one layer's [B,G,S,K] and None
    kc, vc = attn_lib.cache_write(slot[0], slot[1], kk, v, slot[2], index)
    kk, v, slot = (kc, vc, (kc, vc)) if slot[2] is None else (kc[slot[2]], vc[slot[2]], (kc, vc))
  hooks = hooks or Intervention()
  if hooks.attention is not None:
    if heads_major:
      kk, v = jnp.swapaxes(kk, 1, 2), jnp.swapaxes(v, 1, 2)
    out, w = hooks.attention(q, kk.astype(dt), v.astype(dt), frame.mask), None
  else:
    hook = None if hooks.attn_weights is None else lambda w: hooks.attn_weights(w, layer)
    out, w = attn_lib.attention(q, kk.astype(dt), v.astype(dt), frame.mask, weights_hook=hook,
                                heads_major=heads_major)
  return layers.linear(p["o"], out.reshape(b, t, h * k), dt), w, slot


def block(p, x_BTD, frame: Frame, cfg: Config, slot=None, index=None, layer=0, hooks: Intervention | None = None):
  """One decoder layer on the residual stream (params `p` of one layer): (x, attention update, MLP update,
  attention weights, cache slot). `slot` is None or (k cache [P,B,G,S,K], v cache, slot index), written at
  `index`; `layer` is what the hooks see."""
  eps = cfg.norm_eps
  inp = x_BTD if cfg.post_norm else layers.rms_norm(p["attn_norm"], x_BTD, eps)
  a, w, slot = _attention(p["attn"], inp, frame, cfg, slot, index, layer, hooks)
  if cfg.post_norm:
    a = layers.rms_norm(p["post_attn_norm"], a, eps)
  if hooks is not None and hooks.attn_update is not None:
    a = hooks.attn_update(a, layer).astype(a.dtype)
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


def positions_and_mask(cfg: Config, valid_BT, cache=None, positions_BT=None, attn_mask_BTS=None) -> Frame:
  """Frame(k_pos [B, S], mask [B, T, S], rotary cos, sin) of a forward pass.

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
  return Frame(k_pos, mask, cos, sin)


def embed(params, tokens_BT, cfg: Config, inputs_embeds_BTD=None):
  """The residual stream's input x_BTD: the tokens' embeddings, or `inputs_embeds_BTD` where given."""
  dt = jnp.dtype(cfg.dtype)
  return layers.embed(params["embed"], tokens_BT, dt) if inputs_embeds_BTD is None else inputs_embeds_BTD.astype(dt)


def head(params, x_BTD, cfg: Config):
  """(h_BTD after the final norm, logits_BTV) of the residual stream after the last layer."""
  dt = jnp.dtype(cfg.dtype)
  h = layers.rms_norm(params["final_norm"], x_BTD, cfg.norm_eps)
  if "lm_head" in params:
    return h, layers.linear(params["lm_head"], h, dt)
  return h, layers.unembed(params["embed"], h, dt)


def stack(layers_p, x_BTD, frame: Frame, cfg: Config, *, program=None, cache=None, capture: Sequence[str] = (),
          hooks: Intervention | None = None):
  """Runs the decoder layers on the residual stream: (x_BTD after the last position, the new (k, v) or None,
  {name: [P, ...]} for each name of `capture`; "hidden_states" there is the stream after each position).

  Args:
    layers_p: the layers' params stacked on a leading axis, run under `jax.lax.scan` (`cfg.remat`: each
      position rematerialized); or a tuple of per-layer trees, run as an unrolled loop: inside a decode loop
      each matmul then reads its loop-invariant weights directly, where the scan's dynamic slice copies every
      layer's weights (and cache slot) on every step.
    frame: from `positions_and_mask`.
    program: None (every layer once, in order) or int [P] layer indices, stacked params only. A concrete
      program without NOOP (-1) entries has its layers' params gathered once; otherwise (traced: one compile
      for every program of one length) each position reads its layer by a dynamic index, and a NOOP position
      leaves the stream and the cache unchanged (its other captures are zeros).
    cache: None or {"k", "v", "index"}: k/v [P, B, G, S, K] with stacked params, tuples of P per-layer
      [B, G, S, K] arrays with a tuple; this pass's keys and values are written at `index`.
    capture: names of CAPTURES.
    hooks: the hook points inside every block.
  """
  unknown = set(capture) - set(CAPTURES)
  if unknown:
    raise ValueError(f"unknown capture {sorted(unknown)}; expected a subset of {CAPTURES}")
  if hooks is not None and hooks.attention is not None and ("attn_weights" in capture or
                                                            hooks.attn_weights is not None):
    raise ValueError("an attention hook does not expose attention weights: drop the 'attn_weights' capture and "
                     "the attn_weights hook")
  index = None if cache is None else cache["index"]

  def run(p, x, kv, layer, pos):  # one executed position
    x, a, m, w, kv = block(p, x, frame, cfg, None if kv is None else (*kv, pos), index, layer, hooks)
    ys = {"attn_updates": a, "mlp_updates": m, "attn_weights": w}
    return x, kv, {k: v for k, v in ys.items() if k in capture}

  def with_state(x, ys):
    return {**ys, "hidden_states": x} if "hidden_states" in capture else ys

  if isinstance(layers_p, (tuple, list)):
    if program is not None:
      raise ValueError("a program needs the layers' params stacked, found a tuple of per-layer trees")
    if cache is not None and len(cache["k"]) != len(layers_p):
      raise ValueError(f"cache has {len(cache['k'])} per-layer slots but {len(layers_p)} layers are executed")
    ks, vs, per_layer = [], [], []
    for i, p in enumerate(layers_p):
      kv = None if cache is None else (cache["k"][i], cache["v"][i])  # one layer's [B,G,S,K]
      x_BTD, kv, ys = run(p, x_BTD, kv, i, None)
      per_layer.append(with_state(x_BTD, ys))
      if kv is not None:
        ks.append(kv[0])
        vs.append(kv[1])
    ys = {k: jnp.stack([y[k] for y in per_layer]) for k in per_layer[0]}
    return x_BTD, None if cache is None else (tuple(ks), tuple(vs)), ys

  try:
    prog = None if program is None else np.asarray(program, np.int32)
  except jax.errors.TracerArrayConversionError:
    prog = None
  dynamic = program is not None and (prog is None or prog.min() < 0)
  if program is None:
    layer_ids = jnp.arange(cfg.n_layers, dtype=jnp.int32)
  else:
    layer_ids = jnp.asarray(program, jnp.int32)
    if not dynamic:
      layers_p = jax.tree.map(lambda a: a[layer_ids], layers_p)
  n = layer_ids.shape[0]
  if cache is not None and cache["k"].shape[0] != n:
    raise ValueError(f"cache has {cache['k'].shape[0]} slots but {n} layer positions are executed")

  def body(carry, xs):  # the cache rides in the carry: each position writes its new entries in place
    x, kv = carry
    if dynamic:
      layer, pos = xs
      idx = jnp.maximum(layer, 0)
      p = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, idx, keepdims=False), layers_p)
      step = lambda x, kv: run(p, x, kv, idx, pos)

      def noop(x, kv):
        zeros = jax.eval_shape(step, x, kv)[2]
        return x, kv, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zeros)
      x, kv, ys = jax.lax.cond(layer >= 0, step, noop, x, kv)
    else:
      p, layer, pos = xs
      x, kv, ys = run(p, x, kv, layer, pos)
    return (x, kv), with_state(x, ys)

  if cfg.remat:
    body = jax.checkpoint(body, prevent_cse=False)
  kv = None if cache is None else (cache["k"], cache["v"])
  pos = None if dynamic and cache is None else jnp.arange(n, dtype=jnp.int32)  # the cache slot of each position
  (x_BTD, kv), ys = jax.lax.scan(body, (x_BTD, kv), (layer_ids, pos) if dynamic else (layers_p, layer_ids, pos))
  return x_BTD, kv, ys


def forward(params, tokens_BT, cfg: Config, *, positions_BT=None, attention_mask_BT=None, attn_mask_BTS=None,
            cache=None, program: Sequence[int] | None = None, capture: Sequence[str] = (),
            intervention: Intervention | None = None, inputs_embeds_BTD=None) -> Output:
  """Runs the LM: `embed`, `positions_and_mask`, `stack`, `head`.

  Args:
    params: from `init` (or with `layers` as a tuple of per-layer trees, `sampling.split_layers`, and then a
      cache whose k/v are tuples of per-layer arrays, `sampling.layer_list_cache`).
    tokens_BT: int token ids (ignored where `inputs_embeds_BTD` is given).
    positions_BT: rotary positions; default: cumulative count of unmasked tokens (left padding aware), offset
      by the cache's write index when decoding.
    attention_mask_BT: 1 for real tokens, 0 for padding (HF convention); padded keys are never attended.
    attn_mask_BTS: optional extra boolean mask [B, T, S] (True = may attend), combined with causality/padding.
    cache: a KV cache from `init_cache`; the new keys/values are written at `cache["index"]`.
    program: layer indices to execute in order (None: 0..n_layers-1).
    capture: any of "hidden_states", "attn_updates", "mlp_updates", "attn_weights".
    intervention: hooks inside every block (attention weights, attention update, the attention itself).
    inputs_embeds_BTD: embeddings to use instead of looking up `tokens_BT` (e.g. a VLM's spliced sequence).
  """
  x = embed(params, tokens_BT, cfg, inputs_embeds_BTD)
  b, t = x.shape[:2]
  valid_BT = (jnp.ones((b, t), bool) if attention_mask_BT is None else attention_mask_BT.astype(bool))
  frame = positions_and_mask(cfg, valid_BT, cache, positions_BT, attn_mask_BTS)
  prog = None if program is None else _check_program(program, cfg)
  x_final, kv, ys = stack(params["layers"], x, frame, cfg, program=prog, cache=cache, capture=capture,
                          hooks=intervention)
  h, logits = head(params, x_final, cfg)
  new_cache = None
  if cache is not None:
    new_cache = {"k": kv[0], "v": kv[1], "pos": frame.k_pos, "index": cache["index"] + t}
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
