"""Exact top-k inner-product search over row-sharded, chunked matrices (the LatentLens index search).

The LatentLens query (arXiv:2602.00462) is a cosine top-k over millions of stored text-token vectors per LM
layer. Here each of `L` stored matrices [N, D] is searched at once: rows are sharded over every axis of a mesh
(`jax.shard_map`), each shard scans its rows in chunks of `chunk` rows with a running top-k (scores for one
chunk only: [L, Q, chunk]), shards' candidates are merged, and an index too large for device memory can be
streamed from host memory (a memory-mapped file) in blocks of `block_rows`, merged the same way.

Ties: an entry ranks before another when its score is higher, or equal with a lower row index. Every merge
keeps this order because `jax.lax.top_k` puts the lower position first among equal values and candidates are
always concatenated in increasing row order (running best, then the next chunk; shard 0, then shard 1, ...).

Axes: L stored matrices (layers), N rows, D dims, Q queries, k neighbours, C chunk rows, M candidates.
"""
from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

NEG_INF = float("-inf")


def merge_topk(scores_QM, ids_QM, k: int):
  """Top-k of candidates given in increasing-id order for equal scores; returns (scores [Q,k], ids [Q,k])."""
  s, j = jax.lax.top_k(scores_QM, k)
  return s, jnp.take_along_axis(ids_QM, j, axis=-1)


def _scan_rows(q_QD, v_LND, s_LN, base, *, k, chunk, n_valid, compute_dtype):
  """Running top-k over the rows of one shard; ids are `base` + the local row."""
  n_layers, n, _ = v_LND.shape
  nq = q_QD.shape[0]
  q = q_QD.astype(compute_dtype)

  def step(c, carry):
    best_s, best_i = carry
    start = c * chunk
    v = jax.lax.dynamic_slice_in_dim(v_LND, start, chunk, axis=1).astype(compute_dtype)
    sc = jnp.einsum("qd,lcd->lqc", q, v, preferred_element_type=jnp.float32)
    if s_LN is not None:
      sc = sc * jax.lax.dynamic_slice_in_dim(s_LN, start, chunk, axis=1)[:, None, :].astype(jnp.float32)
    ids = base + start + jnp.arange(chunk, dtype=jnp.int32)
    sc = jnp.where(ids < n_valid, sc, NEG_INF)
    ts, ti = jax.lax.top_k(sc, min(k, chunk))
    cat_s = jnp.concatenate([best_s, ts], axis=-1)
    cat_i = jnp.concatenate([best_i, ids[ti]], axis=-1)
    return merge_topk(cat_s, cat_i, k)

  init = (jnp.full((n_layers, nq, k), NEG_INF, jnp.float32), jnp.full((n_layers, nq, k), -1, jnp.int32))
  return jax.lax.fori_loop(0, n // chunk, step, init)


@functools.lru_cache(maxsize=64)
def _search_fn(mesh, k: int, chunk: int, has_scale: bool, compute_dtype):
  kw = dict(k=k, chunk=chunk, compute_dtype=compute_dtype)
  if mesh is None:
    def run(q, v, s, base, n_valid):
      return _scan_rows(q, v, s if has_scale else None, base[0], n_valid=n_valid, **kw)
    return jax.jit(run)
  rows = tuple(mesh.axis_names)

  def local(q, v, s, base, n_valid):
    bs, bi = _scan_rows(q, v, s if has_scale else None, base[0], n_valid=n_valid, **kw)
    ss, si = jax.lax.all_gather(bs, rows), jax.lax.all_gather(bi, rows)  # [shards, L, Q, k], increasing rows
    n_sh, n_l, nq, _ = ss.shape
    flat = lambda a: jnp.moveaxis(a, 0, 2).reshape(n_l, nq, n_sh * k)
    return merge_topk(flat(ss), flat(si), k)

  s_spec = P(None, rows) if has_scale else P()
  run = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(None, rows), s_spec, P(rows), P()),
                      out_specs=(P(), P()), check_vma=False)
  return jax.jit(run)


def _n_shards(mesh) -> int:
  return 1 if mesh is None else int(np.prod(list(mesh.shape.values())))


def _device_block(host_LN, lo: int, hi: int, rows: int, mesh):
  """Rows [lo, hi) of a host array [L, N, ...] as a device array of `rows` rows (zero padded), sharded on N."""
  n_l = host_LN.shape[0]
  if mesh is None:
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  else:
    sharding = NamedSharding(mesh, P(None, tuple(mesh.axis_names)))
  shape = (n_l, rows) + tuple(host_LN.shape[2:])

  def cb(index):
    r = index[1]
    a, b = lo + (r.start or 0), lo + (rows if r.stop is None else r.stop)
    out = np.zeros((n_l, b - a) + shape[2:], host_LN.dtype)
    take = max(0, min(b, hi) - a)
    out[:, :take] = host_LN[:, a:a + take]
    return out
  return jax.make_array_from_callback(shape, sharding, cb)


def default_compute_dtype(storage_dtype) -> jnp.dtype:
  """float32 for float32 storage and on CPU (no fast low-precision matmul); bfloat16 on accelerators."""
  if jnp.dtype(storage_dtype) == jnp.float32 or jax.default_backend() == "cpu":
    return jnp.dtype(jnp.float32)
  return jnp.dtype(jnp.bfloat16)


class Searcher:
  """Exact top-k inner products against L stored matrices.

  Args:
    vectors_LND: host array [L, N, D] (any dtype JAX can hold: float32, bfloat16, float8_e4m3fn); may be a
      read-only memory map.
    scale_LN: optional per-row factor [L, N]: the stored row is `vectors[l, n] * scale[l, n]`.
    mesh: a `jax.sharding.Mesh`; rows are sharded over all its axes (None: one device).
    chunk: rows scored at a time per shard (bounds the score buffer to L x Q x chunk floats).
    block_rows: None places the whole index on the devices once; an int streams it from host memory in blocks
      of that many rows per search (for an index larger than device memory).
    compute_dtype: matmul input dtype (scores always accumulate in float32); default `default_compute_dtype`.
  """

  def __init__(self, vectors_LND, scale_LN=None, *, mesh=None, chunk: int = 8192, block_rows: int | None = None,
               compute_dtype=None):
    if vectors_LND.ndim != 3:
      raise ValueError(f"vectors must be [L, N, D], found shape {vectors_LND.shape}")
    if scale_LN is not None and tuple(scale_LN.shape) != tuple(vectors_LND.shape[:2]):
      raise ValueError(f"scale must be [L, N] = {vectors_LND.shape[:2]}, found {scale_LN.shape}")
    if chunk < 1 or (block_rows is not None and block_rows < 1):
      raise ValueError(f"chunk and block_rows must be positive, found {chunk}, {block_rows}")
    self.host, self.host_scale, self.mesh = vectors_LND, scale_LN, mesh
    self.n = int(vectors_LND.shape[1])
    self.compute_dtype = jnp.dtype(compute_dtype or default_compute_dtype(vectors_LND.dtype))
    self.shards = _n_shards(mesh)
    block = self.n if block_rows is None else min(block_rows, self.n)
    per_shard = -(-block // self.shards)
    self.chunk = min(chunk, per_shard)
    self.rows_per_block = -(-per_shard // self.chunk) * self.chunk * self.shards
    self.blocks = [(lo, min(lo + block, self.n)) for lo in range(0, self.n, block)]
    self.resident = None
    if block_rows is None:
      self.resident = self._place(*self.blocks[0])

  def _place(self, lo, hi):
    v = _device_block(self.host, lo, hi, self.rows_per_block, self.mesh)
    s = None if self.host_scale is None else _device_block(self.host_scale, lo, hi, self.rows_per_block,
                                                           self.mesh)
    n_loc = self.rows_per_block // self.shards
    base = np.arange(self.shards, dtype=np.int32) * n_loc
    if self.mesh is not None:
      base = jax.device_put(base, NamedSharding(self.mesh, P(tuple(self.mesh.axis_names))))
    return v, s, base, hi - lo

  def search(self, q_QD, k: int):
    """Returns (scores [L, Q, k] float32, rows [L, Q, k] int32), best first, ties to the lower row."""
    if not 1 <= k <= self.n:
      raise ValueError(f"k must be in [1, {self.n}] (the stored rows), found {k}")
    q = jnp.asarray(q_QD, jnp.float32)
    if q.ndim != 2 or q.shape[1] != self.host.shape[2]:
      raise ValueError(f"queries must be [Q, {self.host.shape[2]}], found {q.shape}")
    best = None
    for lo, hi in self.blocks:
      v, s, base, n_valid = self.resident if self.resident is not None else self._place(lo, hi)
      fn = _search_fn(self.mesh, k, self.chunk, s is not None, self.compute_dtype)
      bs, bi = fn(q, v, s if s is not None else jnp.zeros((), jnp.float32), base, jnp.int32(n_valid))
      bi = bi + lo
      if best is not None:
        bs, bi = merge_topk(jnp.concatenate([best[0], bs], -1), jnp.concatenate([best[1], bi], -1), k)
      best = (bs, bi)
    return best


def merge_layers(scores_LQk, rows_LQk, k: int, layers: Sequence[int] | None = None):
  """Global top-k across stored layers: ties go to the earlier stored layer, then the lower row.

  Returns (scores [Q, k], layer position [Q, k] (index into the stored layers), rows [Q, k]).
  """
  n_l, nq, kk = scores_LQk.shape
  sel = np.arange(n_l) if layers is None else np.asarray(sorted(layers), dtype=np.int32)
  s = jnp.moveaxis(scores_LQk[sel], 0, 1).reshape(nq, len(sel) * kk)
  pos = jnp.broadcast_to(jnp.asarray(sel, jnp.int32)[:, None], (len(sel), kk)).reshape(-1)
  r = jnp.moveaxis(rows_LQk[sel], 0, 1).reshape(nq, len(sel) * kk)
  if k > len(sel) * kk:
    raise ValueError(f"k={k} exceeds the {len(sel) * kk} candidates of {len(sel)} layers")
  top, j = jax.lax.top_k(s, k)
  return top, pos[j], jnp.take_along_axis(r, j, axis=-1)
