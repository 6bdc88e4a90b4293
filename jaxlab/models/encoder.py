"""BERT-family bidirectional encoders (BERT, arXiv 1810.04805; MiniLM, arXiv 2002.10957) and sentence embeddings.

Embeddings are word + learned absolute position + token type, then a LayerNorm; each block is post-norm:
x = LN(x + attn(x)), x = LN(x + mlp(x)), with biases everywhere and exact (erf) GELU. Padded keys are masked.
MiniLM is BERT at a smaller width and depth (the same architecture, a different config). Sentence embeddings
pool the last hidden state (masked mean, as Sentence-BERT, arXiv 1908.10084, or the [CLS] vector) and
optionally L2-normalize. Blocks are stacked on a leading `layers` axis under lax.scan.

Axes: B batch, T sequence, D model, F mlp, H heads, K head dim, L layers, V vocab, P positions.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import choices
from jaxlab.models import transformer as tfm
from jaxlab.nn import attention as attn_lib
from jaxlab.nn import axes, layers

CAPTURES = ("hidden_states", "attn_weights")
POOLINGS = ("mean", "cls")


@dataclasses.dataclass(frozen=True)
class Config:
  vocab_size: int = 128
  d_model: int = 64
  n_layers: int = 2
  n_heads: int = 4
  d_ff: int = 128
  max_position_embeddings: int = 64
  type_vocab_size: int = 2
  activation: layers.Activation = "gelu"  # exact erf GELU, as BERT uses
  norm_eps: float = 1e-12
  pad_token_id: int | None = 0
  init_std: float = 0.02
  param_dtype: layers.DType = "float32"
  dtype: layers.DType = "float32"  # compute dtype
  remat: bool = False

  def __post_init__(self):
    def bad(msg):
      raise ValueError(f"encoder.Config: {msg}")
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_position_embeddings",
                 "type_vocab_size"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
        bad(f"{name} must be a positive int, found {getattr(self, name)!r}")
    if self.d_model % self.n_heads:
      bad(f"n_heads ({self.n_heads}) must divide d_model ({self.d_model})")
    layers.check_dtype_names(self, bad)
    choices.check(self, bad, nested=False)
    if self.norm_eps <= 0:
      bad(f"norm_eps must be positive, found {self.norm_eps}")
    if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
      bad(f"pad_token_id must be in [0, {self.vocab_size}) or None, found {self.pad_token_id}")

  @property
  def kdim(self) -> int:
    return self.d_model // self.n_heads

  @classmethod
  def tiny(cls, **kw) -> "Config":
    return dataclasses.replace(PRESETS["tiny"], **kw)

  def replace(self, **kw) -> "Config":
    return dataclasses.replace(self, **kw)


def _bert(d, n, h, f, v=30522) -> Config:
  return Config(vocab_size=v, d_model=d, n_layers=n, n_heads=h, d_ff=f, max_position_embeddings=512)


PRESETS: dict[str, Config] = {
    "tiny": Config(),
    "minilm-l6": _bert(384, 6, 12, 1536),  # sentence-transformers/all-MiniLM-L6-v2
    "minilm-l12": _bert(384, 12, 12, 1536),  # sentence-transformers/all-MiniLM-L12-v2
    "bert-base": _bert(768, 12, 12, 3072),  # bert-base-uncased
    "bert-large": _bert(1024, 24, 16, 4096),  # bert-large-uncased
}

# Logical axes of every parameter: the block names (attn/q, mlp/up, attn_norm, ...) and embed/embedding are
# transformer's, then the encoder-only params. Token types are a tiny vocabulary, positions a lookup table.
AXES = tfm.AXES + axes.rules(
    (r"pos_embed", ("pos", "embed"), "pos"),
    (r"type_embed/embedding", ("vocab", "embed"), "vocab"),
    (r"embed_norm/(scale|bias)", ("embed",), None),
)


def init(cfg: Config, key) -> dict:
  """Random params: normal(0, init_std) matrices and tables, unit norm scales, zero biases (as BERT initializes)."""
  dt = jnp.dtype(cfg.param_dtype)
  d, f, L, std = cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.init_std
  ke, kp, kt, kq, kk, kv, ko, km = jax.random.split(key, 8)
  lin = lambda k, i, o: layers.linear_init(k, i, o, bias=True, std=std, dtype=dt, stack=(L,))
  ln = lambda stack=(L,): layers.norm_init(d, bias=True, dtype=dt, stack=stack)
  block = {"attn": {"q": lin(kq, d, d), "k": lin(kk, d, d), "v": lin(kv, d, d), "o": lin(ko, d, d)},
           "attn_norm": ln(),
           "mlp": layers.mlp_init(km, d, f, gated=False, bias=True, std=std, dtype=dt, stack=(L,)),
           "mlp_norm": ln()}
  return {"embed": layers.embed_init(ke, cfg.vocab_size, d, std=std, dtype=dt),
          "pos_embed": layers.normal(kp, (cfg.max_position_embeddings, d), std, dt),
          "type_embed": layers.embed_init(kt, cfg.type_vocab_size, d, std=std, dtype=dt),
          "embed_norm": ln(()), "layers": block}


def param_axes(cfg: Config):
  """Logical axis names of every parameter, as a tree shaped like `init(cfg, key)`."""
  return axes.logical_axes(jax.eval_shape(lambda: init(cfg, jax.random.key(0))), AXES)


class Output(NamedTuple):
  last_hidden_state: Any  # [B, T, D]
  hidden_states: Any = None  # [L+1, B, T, D]; 0 = embeddings (after their LayerNorm), l = output of block l
  attn_weights: Any = None  # [L, B, H, T, T]


def _check_inputs(tokens_BT, mask_BT, token_types_BT, positions_BT, cfg: Config):
  if tokens_BT.ndim != 2 or not jnp.issubdtype(tokens_BT.dtype, jnp.integer):
    raise ValueError(f"tokens_BT must be a 2-D integer array [B, T], found shape {tuple(tokens_BT.shape)} "
                     f"dtype {tokens_BT.dtype}")
  t = tokens_BT.shape[1]
  if positions_BT is None and t > cfg.max_position_embeddings:
    raise ValueError(f"sequence length {t} exceeds max_position_embeddings ({cfg.max_position_embeddings})")
  for name, a in (("mask_BT", mask_BT), ("token_types_BT", token_types_BT), ("positions_BT", positions_BT)):
    if a is not None and tuple(a.shape) != tuple(tokens_BT.shape):
      raise ValueError(f"{name} must have the tokens' shape {tuple(tokens_BT.shape)}, found {tuple(a.shape)}")


def embed(params, tokens_BT, cfg: Config, token_types_BT=None, positions_BT=None):
  """LayerNorm(word + position + token type embeddings): [B, T, D]. Positions default to 0..T-1."""
  dt = jnp.dtype(cfg.dtype)
  b, t = tokens_BT.shape
  if positions_BT is None:
    positions_BT = jnp.broadcast_to(jnp.arange(t), (b, t))
  if token_types_BT is None:
    token_types_BT = jnp.zeros((b, t), jnp.int32)
  x = layers.embed(params["embed"], tokens_BT, dt)
  x = x + jnp.take(params["pos_embed"], positions_BT, axis=0).astype(dt)
  x = x + layers.embed(params["type_embed"], token_types_BT, dt)
  return layers.layer_norm(params["embed_norm"], x, cfg.norm_eps)


def _block(p, x_BTD, mask_BTS, cfg: Config):
  dt, eps = jnp.dtype(cfg.dtype), cfg.norm_eps
  b, t, d = x_BTD.shape
  q, k, v = (layers.linear(p["attn"][n], x_BTD, dt).reshape(b, t, cfg.n_heads, cfg.kdim) for n in "qkv")
  a, w = attn_lib.attention(q, k, v, mask_BTS)
  a = layers.linear(p["attn"]["o"], a.reshape(b, t, d), dt)
  x_BTD = layers.layer_norm(p["attn_norm"], x_BTD + a, eps)
  m = layers.mlp(p["mlp"], x_BTD, cfg.activation, dt)
  return layers.layer_norm(p["mlp_norm"], x_BTD + m, eps), w


def forward(params, tokens_BT, cfg: Config, *, mask_BT=None, token_types_BT=None, positions_BT=None,
            capture: Sequence[str] = ()) -> Output:
  """Encodes token sequences.

  Args:
    tokens_BT: int token ids [B, T].
    mask_BT: 1 (or True) on real tokens, 0 on padding (HF `attention_mask`); padded keys are never attended.
      None: every token is real.
    token_types_BT: segment ids in [0, type_vocab_size) (HF `token_type_ids`); None: all 0.
    positions_BT: absolute positions; None: 0..T-1 in every row (as BERT does, whatever the padding).
    capture: any of "hidden_states" (embeddings and every block's output) and "attn_weights".
  """
  unknown = set(capture) - set(CAPTURES)
  if unknown:
    raise ValueError(f"unknown capture {sorted(unknown)}; expected a subset of {CAPTURES}")
  _check_inputs(tokens_BT, mask_BT, token_types_BT, positions_BT, cfg)
  x = embed(params, tokens_BT, cfg, token_types_BT, positions_BT)
  mask = None if mask_BT is None else mask_BT.astype(bool)[:, None, :]

  def body(x, p):
    x, w = _block(p, x, mask, cfg)
    ys = {"hidden_states": x, "attn_weights": w}
    return x, {k: v for k, v in ys.items() if k in capture}

  if cfg.remat:
    body = jax.checkpoint(body, prevent_cse=False)
  x_last, ys = jax.lax.scan(body, x, params["layers"])
  hs = jnp.concatenate([x[None], ys["hidden_states"]], axis=0) if "hidden_states" in capture else None
  return Output(last_hidden_state=x_last, hidden_states=hs, attn_weights=ys.get("attn_weights"))


def pool(h_BTD, mask_BT=None, pooling: str = "mean", normalize: bool = True):
  """[B, D] from hidden states: masked mean over real tokens or the first ([CLS]) token, optionally L2-normalized."""
  if pooling not in POOLINGS:
    raise ValueError(f"pooling must be one of {POOLINGS}, found {pooling!r}")
  h = h_BTD.astype(jnp.float32)
  if pooling == "cls":
    e = h[:, 0]
  else:
    m = jnp.ones(h.shape[:2], jnp.float32) if mask_BT is None else mask_BT.astype(jnp.float32)
    e = jnp.einsum("btd,bt->bd", h, m) / jnp.maximum(m.sum(1), 1e-9)[:, None]
  if normalize:
    e = e / jnp.maximum(jnp.linalg.norm(e, axis=-1, keepdims=True), 1e-12)
  return e


def sentence_embedding(params, cfg: Config, tokens_BT, mask_BT=None, pooling: str = "mean",
                       normalize: bool = True, token_types_BT=None):
  """Sentence vectors [B, D] (fp32): the encoder's last hidden state pooled by `pool`.

  Args:
    tokens_BT: token ids including the [CLS] / [SEP] specials, as the tokenizer's template writes them.
    mask_BT: 1 on real tokens, 0 on padding; None: no padding.
    pooling: "mean" (masked mean, Sentence-BERT) or "cls" (the first token's vector).
    normalize: L2-normalize each vector (cosine similarity is then a dot product).
  """
  if pooling not in POOLINGS:
    raise ValueError(f"pooling must be one of {POOLINGS}, found {pooling!r}")
  out = forward(params, tokens_BT, cfg, mask_BT=mask_BT, token_types_BT=token_types_BT)
  return pool(out.last_hidden_state, mask_BT, pooling, normalize)


def load_tokenizer(path: str):
  """An HFTokenizer over `path`'s tokenizer.json (or that file) whose bos / eos are [CLS] / [SEP], for `embed_texts`.

  The specials come from tokenizer_config.json / special_tokens_map.json beside it ("[CLS]", "[SEP]", "[PAD]",
  "[MASK]" when absent). Fixed-length padding and truncation stored in tokenizer.json (all-MiniLM-L6-v2's pads
  every row to 128) are switched off: they would hide the real lengths, and `embed_texts` pads and truncates.
  """
  import tokenizers
  from jaxlab.data.tokenizers import HFTokenizer
  file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
  if not os.path.isfile(file):
    raise FileNotFoundError(f"expected a tokenizer.json file or a directory with one, found {path!r}")
  folder = os.path.dirname(os.path.abspath(file))
  special = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "mask_token": "[MASK]"}
  for fname in ("special_tokens_map.json", "tokenizer_config.json"):  # later file wins
    f = os.path.join(folder, fname)
    if os.path.isfile(f):
      with open(f) as fh:
        for k, v in json.load(fh).items():
          v = v.get("content") if isinstance(v, dict) else v
          if k in special and isinstance(v, str):
            special[k] = v
  tok = tokenizers.Tokenizer.from_file(file)
  tok.no_padding()
  tok.no_truncation()
  return HFTokenizer(tok, bos_token=special["cls_token"], eos_token=special["sep_token"],
                     pad_token=special["pad_token"], mask_token=special["mask_token"], name=file)


_embed_jit = jax.jit(sentence_embedding, static_argnames=("cfg", "pooling", "normalize"))


def embed_texts(params, cfg: Config, tokenizer, texts: Sequence[str], *, batch_size: int = 32,
                max_length: int | None = None, pooling: str = "mean", normalize: bool = True,
                pad_multiple: int = 16) -> np.ndarray:
  """Sentence vectors [N, D] for `texts`, as `[CLS] text [SEP]` rows batched and right-padded.

  Args:
    tokenizer: a jaxlab tokenizer whose bos_id / eos_id are [CLS] / [SEP] (see `load_tokenizer`).
    max_length: tokens per row including the two specials (longer texts are truncated before [SEP]);
      default max_position_embeddings. all-MiniLM-L6-v2 was trained with 256.
    pad_multiple: rows are padded to a multiple of this length, so few distinct shapes are compiled.
  """
  if isinstance(texts, str):
    raise TypeError("embed_texts expects a sequence of strings, found a single str")
  if tokenizer.bos_id is None or tokenizer.eos_id is None:
    raise ValueError(f"{tokenizer!r} has no bos/eos ids; embed_texts needs [CLS]/[SEP] as bos/eos "
                     "(build it with encoder.load_tokenizer)")
  if tokenizer.vocab_size > cfg.vocab_size:
    raise ValueError(f"tokenizer vocab ({tokenizer.vocab_size}) exceeds the model's vocab_size ({cfg.vocab_size})")
  max_length = cfg.max_position_embeddings if max_length is None else max_length
  if not 2 <= max_length <= cfg.max_position_embeddings:
    raise ValueError(f"max_length must be in [2, {cfg.max_position_embeddings}], found {max_length}")
  if batch_size <= 0:
    raise ValueError(f"batch_size must be positive, found {batch_size}")
  enc = tokenizer.encode_batch(list(texts))  # right-padded: row b's tokens are its first mask.sum() ids
  rows = [ids[:min(n, max_length - 2)] for ids, n in zip(enc.ids.tolist(), enc.attention_mask.sum(1).tolist())]
  order = sorted(range(len(rows)), key=lambda r: -len(rows[r]))  # similar lengths share a batch: less padding
  out = np.zeros((len(rows), cfg.d_model), np.float32)
  for s in range(0, len(rows), batch_size):
    idx = order[s:s + batch_size]
    t = min(-(-(len(rows[idx[0]]) + 2) // pad_multiple) * pad_multiple, cfg.max_position_embeddings)
    ids = np.full((len(idx), t), tokenizer.batch_pad_id, np.int32)
    mask = np.zeros((len(idx), t), np.int32)
    for b, r in enumerate(idx):
      ids[b, :len(rows[r]) + 2] = [tokenizer.bos_id, *rows[r], tokenizer.eos_id]
      mask[b, :len(rows[r]) + 2] = 1
    out[idx] = np.asarray(_embed_jit(params, cfg, jnp.asarray(ids), jnp.asarray(mask), pooling, normalize))
  return out
