"""Lenses that name what a hidden state encodes: LogitLens, EmbeddingLens and LatentLens (arXiv:2602.00462).

LogitLens applies the LM's final norm and LM head to a hidden state; EmbeddingLens ranks the input embedding
table by cosine. LatentLens compares a hidden state (e.g. a visual token inside a VLM) with contextual
representations of text tokens: a text-only LM is run over a corpus, and at chosen layers (HF convention:
0 = embeddings, n_layers = the last hidden state, which is already final-normed) the representation of each
sampled (context, position) is stored L2-normalized. A query is scored by cosine against every stored layer
(top-k per layer), then the layers' candidates are merged into one global top-k (k = 5 in the paper).

Sampling (`select_entries`): positions < `skip_first` are skipped (the paper skips the first positions; its
package skips 0 and 1), identical prefixes are stored once (a causal LM gives them the same vector), and at
most `max_contexts` occurrences per token string are kept by reservoir sampling (Algorithm R in corpus order,
one `numpy.random.Generator(seed)`), so the result depends only on the corpus and the seed. The same entries
are stored at every layer.

Storage: float32, bfloat16, or float8_e4m3fn. For fp8 each row is scaled so that its largest magnitude is 448
(the format's maximum; unit vectors would otherwise fall into fp8's subnormals), and `scale[l, n]` = 1 / the
norm of the stored fp8 row, so `vectors * scale` is a unit vector and scores stay cosines. Files:
`index.safetensors` (vectors, scale, token_id, position, context) and `index.json` (layers, dtype, strings).

Ties rank the higher score first, then the earlier stored layer, then the lower row (see jaxlab.interp.search).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable, Literal, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jaxlab import choices
from jaxlab.hf import io
from jaxlab.interp import search as search_lib
from jaxlab.nn import layers as nn_layers

DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16),
          "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn)}
StorageDType = Literal["float32", "bfloat16", "float8_e4m3fn"]  # the keys of DTYPES: an index's storage
choices.same(DTYPES, StorageDType)
FP8_MAX = 448.0


def _unit(x, eps=1e-12):
  x = jnp.asarray(x, jnp.float32)
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)


class LogitLens:
  """LM head on a hidden state: `unembed(norm(h))` -> top-k tokens.

  Args:
    unembed_DV: the LM head [D, V] (for tied embeddings: the embedding table transposed).
    norm: the LM's final norm, fn(h[..., D]) -> h (None: identity).
  """

  def __init__(self, unembed_DV, norm: Callable | None = None):
    self.unembed_DV, self.norm = jnp.asarray(unembed_DV), norm

  @classmethod
  def from_tfm(cls, params, cfg) -> "LogitLens":
    """From jaxlab.models.transformer params (rms final norm; `lm_head` or the tied embedding)."""
    head = params["lm_head"]["kernel"] if "lm_head" in params else params["embed"]["embedding"].T
    return cls(head, lambda h: nn_layers.rms_norm(params["final_norm"], h, cfg.norm_eps))

  def logits(self, h_ND, *, normed: bool = False):
    """Logits [..., V]; `normed=True` skips the final norm (for HF's last hidden state, already normed)."""
    h = jnp.asarray(h_ND, jnp.float32)
    if not normed and self.norm is not None:
      h = self.norm(h)
    return jnp.einsum("...d,dv->...v", h, self.unembed_DV.astype(jnp.float32))

  def topk(self, h_ND, k: int = 5, *, normed: bool = False):
    """(logits [..., k], token ids [..., k]), best first, ties to the lower id."""
    return jax.lax.top_k(self.logits(h_ND, normed=normed), k)

  def over_layers(self, hidden_states_LBTD, k: int = 5):
    """Top-k for every HF-convention hidden state: the final norm on all but the last (already normed).

    Returns (scores [L+1, B, T, k], ids [L+1, B, T, k]).
    """
    hs = jnp.asarray(hidden_states_LBTD)
    a = self.topk(hs[:-1], k)
    b = self.topk(hs[-1:], k, normed=True)
    return jnp.concatenate([a[0], b[0]]), jnp.concatenate([a[1], b[1]])


class EmbeddingLens:
  """Cosine between a hidden state and every row of the input embedding table [V, D] -> top-k tokens."""

  def __init__(self, table_VD):
    self.table_VD = _unit(table_VD)

  @classmethod
  def from_tfm(cls, params) -> "EmbeddingLens":
    return cls(params["embed"]["embedding"])

  def topk(self, h_ND, k: int = 5):
    """(cosines [..., k], token ids [..., k]), best first, ties to the lower id."""
    return jax.lax.top_k(jnp.einsum("...d,vd->...v", _unit(h_ND), self.table_VD), k)


# ------------------------------------------------------------------------------------------- index


def tfm_hidden_fn(params, cfg) -> Callable:
  """fn(tokens [B,T], mask [B,T]) -> hidden states [n_layers+1, B, T, D] of a jaxlab transformer."""
  from jaxlab.models import transformer as tfm

  @jax.jit
  def fn(tokens_BT, mask_BT):
    return tfm.forward(params, tokens_BT, cfg, attention_mask_BT=mask_BT, capture=("hidden_states",)).hidden_states
  return fn


def select_entries(corpus: Sequence[Sequence[int]], *, max_contexts: int = 20, skip_first: int = 2, seed: int = 0,
                   dedupe: bool = True, key: Callable[[int], str] = str):
  """Which (context, position) pairs to store; returns an int array [N, 2] sorted by context then position.

  Args:
    corpus: token id sequences.
    max_contexts: cap of stored occurrences per token string (reservoir sampling, Algorithm R).
    skip_first: positions 0 .. skip_first-1 of every context are never stored.
    seed: seed of the reservoir's generator.
    dedupe: skip an occurrence whose whole prefix (tokens[:pos+1]) was already seen.
    key: token id -> the string occurrences are grouped by (default: the id itself).
  """
  if max_contexts < 1 or skip_first < 0:
    raise ValueError(f"max_contexts must be >= 1 and skip_first >= 0, found {max_contexts}, {skip_first}")
  rng = np.random.default_rng(seed)
  reservoirs: dict[str, list] = {}
  seen_count: dict[str, int] = {}
  trie: dict[tuple[int, int], int] = {}  # (prefix node, next token) -> node: exact prefix identity
  names: dict[int, str] = {}
  for c, seq in enumerate(corpus):
    seq = [int(t) for t in seq]
    node = 0
    for pos, tok in enumerate(seq):
      if dedupe:
        child = trie.get((node, tok))
        fresh = child is None
        if fresh:
          child = trie[(node, tok)] = len(trie) + 1
        node = child
        if not fresh:
          continue
      if pos < skip_first:
        continue
      if tok not in names:
        names[tok] = key(tok)
      name = names[tok]
      n = seen_count.get(name, 0)
      seen_count[name] = n + 1
      res = reservoirs.setdefault(name, [])
      if n < max_contexts:
        res.append((c, pos))
      else:
        j = int(rng.integers(0, n + 1))
        if j < max_contexts:
          res[j] = (c, pos)
  entries = sorted(e for res in reservoirs.values() for e in res)
  return np.asarray(entries, dtype=np.int64).reshape(-1, 2)


def quantize(x_ND, dtype: str):
  """L2-normalizes rows and stores them in `dtype`; returns (stored [N, D], scale [N] float32 or None)."""
  if dtype not in DTYPES:
    raise ValueError(f"storage dtype must be one of {sorted(DTYPES)}, found {dtype!r}")
  x = np.asarray(_unit(x_ND))
  if dtype != "float8_e4m3fn":
    return x.astype(DTYPES[dtype]), None
  m = np.max(np.abs(x), axis=-1, keepdims=True)
  q = (x * (FP8_MAX / np.where(m > 0, m, 1.0))).astype(DTYPES[dtype])
  n = np.linalg.norm(q.astype(np.float32), axis=-1)
  return q, np.where(n > 0, 1.0 / np.where(n > 0, n, 1.0), 0.0).astype(np.float32)


@dataclasses.dataclass
class LatentIndex:
  """Stored contextual token vectors. `vectors[i, n]` belongs to `layers[i]`; row n came from token
  `token_id[n]` at `position[n]` of corpus context `context[n]`."""
  layers: tuple[int, ...]
  vectors: np.ndarray  # [Lc, N, D] in the storage dtype
  scale: np.ndarray | None  # [Lc, N] float32 (fp8 only)
  token_id: np.ndarray  # [N] int32
  position: np.ndarray  # [N] int32
  context: np.ndarray  # [N] int32
  token_strings: dict[int, str]
  meta: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    n_l, n = self.vectors.shape[:2]
    if n_l != len(self.layers) or list(self.layers) != sorted(set(self.layers)):
      raise ValueError(f"layers must be {n_l} increasing distinct ints, found {self.layers}")
    for name in ("token_id", "position", "context"):
      if getattr(self, name).shape != (n,):
        raise ValueError(f"{name} must have shape ({n},), found {getattr(self, name).shape}")
    if (self.scale is None) != (self.vectors.dtype != DTYPES["float8_e4m3fn"]):
      raise ValueError(f"scale must be given exactly for float8 storage (vectors are {self.vectors.dtype})")

  @property
  def dtype(self) -> str:
    return next(k for k, v in DTYPES.items() if v == self.vectors.dtype)

  def dequantized(self) -> np.ndarray:
    """The stored unit vectors as float32 [Lc, N, D]."""
    v = np.asarray(self.vectors, np.float32)
    return v if self.scale is None else v * self.scale[..., None]

  def save(self, path: str) -> None:
    os.makedirs(path, exist_ok=True)
    tensors = {"vectors": self.vectors, "token_id": self.token_id.astype(np.int32),
               "position": self.position.astype(np.int32), "context": self.context.astype(np.int32)}
    if self.scale is not None:
      tensors["scale"] = self.scale.astype(np.float32)
    io.write_file(os.path.join(path, "index.safetensors"), tensors)
    info = {"layers": list(self.layers), "dtype": self.dtype, "rows": int(self.vectors.shape[1]),
            "dim": int(self.vectors.shape[2]), "meta": self.meta,
            "token_strings": {str(k): v for k, v in sorted(self.token_strings.items())}}
    with open(os.path.join(path, "index.json"), "w") as f:
      json.dump(info, f, indent=1)

  @classmethod
  def load(cls, path: str) -> "LatentIndex":
    """Loads a saved index; the vectors stay memory-mapped."""
    files = [os.path.join(path, n) for n in ("index.json", "index.safetensors")]
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
      raise FileNotFoundError(f"{path}: expected index.json and index.safetensors, missing {missing}")
    with open(files[0]) as f:
      info = json.load(f)
    t = io.read_file(files[1])
    if t["vectors"].dtype != DTYPES[info["dtype"]] or t["vectors"].shape[1:] != (info["rows"], info["dim"]):
      raise ValueError(f"{path}: index.json says {info['dtype']} [*, {info['rows']}, {info['dim']}], the tensors "
                       f"are {t['vectors'].dtype} {t['vectors'].shape}")
    return cls(tuple(info["layers"]), t["vectors"], t.get("scale"), t["token_id"], t["position"], t["context"],
               {int(k): v for k, v in info["token_strings"].items()}, info.get("meta", {}))


def build_index(hidden_fn: Callable, corpus: Sequence[Sequence[int]], layers: Sequence[int], *,
                max_contexts: int = 20, skip_first: int = 2, seed: int = 0, dedupe: bool = True,
                dtype: str = "bfloat16", decode: Callable[[int], str] = str, batch_size: int = 32,
                pad_id: int = 0, bucket: int = 16) -> LatentIndex:
  """Runs a text-only LM over `corpus` and stores the sampled contextual token vectors at `layers`.

  Args:
    hidden_fn: fn(tokens [B,T] int32, mask [B,T] int32) -> hidden states [n_layers+1, B, T, D] (HF convention),
      e.g. `tfm_hidden_fn(params, cfg)`. Sequences are right-padded, so a causal LM sees no padding.
    corpus: token id sequences (one per context).
    layers: hidden-state indices to store (0 = embeddings).
    max_contexts, skip_first, seed, dedupe: see `select_entries`; `decode` (token id -> string) is its `key`
      and fills `token_strings`.
    dtype: storage dtype: "float32", "bfloat16" or "float8_e4m3fn".
    batch_size: contexts per forward call; lengths are padded to a multiple of `bucket` (fewer compiles).
  """
  layers = tuple(sorted(set(int(l) for l in layers)))
  entries = select_entries(corpus, max_contexts=max_contexts, skip_first=skip_first, seed=seed, dedupe=dedupe,
                           key=decode)
  if len(entries) == 0:
    raise ValueError("no entries to store: the corpus has no positions >= skip_first")
  ctxs = np.unique(entries[:, 0])
  rows_of = {c: np.nonzero(entries[:, 0] == c)[0] for c in ctxs}
  out = None
  for i in range(0, len(ctxs), batch_size):
    batch = ctxs[i:i + batch_size]
    t = -(-max(len(corpus[c]) for c in batch) // bucket) * bucket
    tok = np.full((batch_size, t), pad_id, np.int32)
    mask = np.zeros((batch_size, t), np.int32)
    for b, c in enumerate(batch):
      tok[b, :len(corpus[c])], mask[b, :len(corpus[c])] = corpus[c], 1
    hs = hidden_fn(jnp.asarray(tok), jnp.asarray(mask))
    if max(layers) >= len(hs) or min(layers) < 0:
      raise ValueError(f"layers must lie in [0, {len(hs) - 1}] (hidden states of the LM), found {layers}")
    hs = np.asarray(jnp.stack([jnp.asarray(hs[l], jnp.float32) for l in layers]))
    if out is None:
      out = np.zeros((len(layers), len(entries), hs.shape[-1]), np.float32)
    for b, c in enumerate(batch):
      r = rows_of[c]
      out[:, r] = hs[:, b, entries[r, 1]]
  stored = [quantize(out[j], dtype) for j in range(len(layers))]
  vectors = np.stack([s[0] for s in stored])
  scale = None if stored[0][1] is None else np.stack([s[1] for s in stored])
  token_id = np.asarray([corpus[c][p] for c, p in entries], np.int32)
  meta = {"max_contexts": max_contexts, "skip_first": skip_first, "seed": seed, "dedupe": dedupe,
          "contexts": len(corpus)}
  return LatentIndex(layers, vectors, scale, token_id, entries[:, 1].astype(np.int32),
                     entries[:, 0].astype(np.int32), {int(t): decode(int(t)) for t in np.unique(token_id)}, meta)


class Neighbors(NamedTuple):
  score: jax.Array  # [Q, k] cosine, best first
  layer: np.ndarray  # [Q, k] stored layer (HF convention)
  row: np.ndarray  # [Q, k] index row
  token_id: np.ndarray  # [Q, k]
  position: np.ndarray  # [Q, k]
  context: np.ndarray  # [Q, k] source context id
  layer_scores: jax.Array  # [Lc, Q, k] per-layer top-k before the merge
  layer_rows: jax.Array  # [Lc, Q, k]


class LatentLens:
  """Cosine top-k against a `LatentIndex`: per stored layer, then merged across layers.

  Args:
    index: the stored vectors.
    mesh, chunk, block_rows, compute_dtype: see `jaxlab.interp.search.Searcher` (rows sharded over the mesh,
      scanned in chunks, optionally streamed from host memory in blocks).
  """

  def __init__(self, index: LatentIndex, *, mesh=None, chunk: int = 8192, block_rows: int | None = None,
               compute_dtype=None):
    self.index = index
    self.searcher = search_lib.Searcher(index.vectors, index.scale, mesh=mesh, chunk=chunk, block_rows=block_rows,
                                        compute_dtype=compute_dtype)

  def search(self, h_QD, k: int = 5, layers: Sequence[int] | None = None) -> Neighbors:
    """Neighbours of the (L2-normalized) queries; `layers` restricts the merge to some stored layers."""
    h = jnp.asarray(h_QD, jnp.float32)
    lead = h.shape[:-1]
    s_l, r_l = self.searcher.search(_unit(h.reshape(-1, h.shape[-1])), k)
    pos = None
    if layers is not None:
      unknown = set(layers) - set(self.index.layers)
      if unknown:
        raise ValueError(f"layers {sorted(unknown)} are not stored; stored: {self.index.layers}")
      pos = [self.index.layers.index(l) for l in layers]
    s, lp, r = search_lib.merge_layers(s_l, r_l, k, pos)
    r, lp = np.asarray(r), np.asarray(lp)
    idx = self.index
    shape = lead + (k,)
    return Neighbors(s.reshape(shape), np.asarray(idx.layers)[lp].reshape(shape), r.reshape(shape),
                     idx.token_id[r].reshape(shape), idx.position[r].reshape(shape), idx.context[r].reshape(shape),
                     s_l, r_l)

  def describe(self, nb: Neighbors) -> list:
    """Nested lists (per query) of dicts: token, token_id, layer, context, position, score."""
    s, flat = np.asarray(nb.score), lambda a: np.asarray(a).reshape(-1, a.shape[-1])
    out = []
    for q in range(flat(s).shape[0]):
      out.append([{"token": self.index.token_strings.get(int(t), str(int(t))), "token_id": int(t),
                   "layer": int(l), "context": int(c), "position": int(p), "score": float(v)}
                  for t, l, c, p, v in zip(flat(nb.token_id)[q], flat(nb.layer)[q], flat(nb.context)[q],
                                           flat(nb.position)[q], flat(s)[q])])
    return out
