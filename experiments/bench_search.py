"""Exact top-k inner-product search (the LatentLens index query, arXiv:2602.00462): jaxlab vs faiss vs NumPy.

One script, one data set: `--rows` unit vectors of `--dim` dims (default 1M x 384) and `--queries` unit queries
(default 256; each a stored row plus noise, so the top hit is meaningful), top-`k` by inner product (cosine):

  numpy_fp32    chunked matmul + argpartition over the float32 rows (the baseline the targets refer to)
  faiss_fp32    faiss-cpu IndexFlatIP (skipped, and said so, when faiss is not installed:
                `pip install faiss-cpu==1.15.1`)
  jaxlab_fp32   jaxlab.interp.search.Searcher on float32 storage, for each chunk size in `--chunks`
  jaxlab_bf16   the same on bfloat16 storage (half the memory; scores accumulate in float32)

Reported per method: seconds per batch of queries (the best of `--repeats` timed runs after one untimed run
that compiles), queries/s, and recall@k against exact search (NumPy's top `k + 16` candidates rescored in
float64). Ratios: `ratio.jaxlab_fp32_over_faiss` (target >= 1) and `ratio.jaxlab_bf16_over_numpy_fp32`
(target >= 0.8).

  python -m experiments bench search [--rows 1000000 --dim 384 --queries 256 --k 5 --chunks 8192,32768]
"""
from __future__ import annotations

import argparse
import os
import time

import jax
import ml_dtypes
import numpy as np

from experiments import registry
from jaxlab.interp import search as search_lib


def make_data(rows: int, dim: int, queries: int, seed: int = 0, noise: float = 0.5):
  """(unit vectors [rows, dim] float32, unit queries [queries, dim] float32)."""
  rng = np.random.default_rng(seed)
  v = np.empty((rows, dim), np.float32)
  for lo in range(0, rows, 1 << 17):
    x = rng.standard_normal((min(rows, lo + (1 << 17)) - lo, dim), dtype=np.float32)
    v[lo:lo + len(x)] = x / np.linalg.norm(x, axis=1, keepdims=True)
  q = v[rng.integers(0, rows, queries)] + noise / np.sqrt(dim) * rng.standard_normal((queries, dim),
                                                                                       dtype=np.float32)
  return v, (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


def numpy_topk(v_ND, q_QD, k: int, chunk: int = 1 << 16):
  """Chunked `q @ v.T` + argpartition: (scores [Q, k], ids [Q, k]) best first."""
  best_s = np.full((len(q_QD), 0), -np.inf, np.float32)
  best_i = np.zeros((len(q_QD), 0), np.int64)
  for lo in range(0, len(v_ND), chunk):
    s = q_QD @ v_ND[lo:lo + chunk].T
    kk = min(k, s.shape[1])
    part = np.argpartition(-s, kk - 1, axis=1)[:, :kk]
    cat_s = np.concatenate([best_s, np.take_along_axis(s, part, 1)], 1)
    cat_i = np.concatenate([best_i, part + lo], 1)
    keep = np.argpartition(-cat_s, min(k, cat_s.shape[1]) - 1, axis=1)[:, :k]
    best_s, best_i = np.take_along_axis(cat_s, keep, 1), np.take_along_axis(cat_i, keep, 1)
  order = np.argsort(-best_s, axis=1, kind="stable")
  return np.take_along_axis(best_s, order, 1), np.take_along_axis(best_i, order, 1)


def exact_topk(v_ND, q_QD, k: int, slack: int = 16):
  """Exact top-k ids: NumPy float32 candidates (k + slack) rescored in float64."""
  _, cand = numpy_topk(v_ND, q_QD, k + slack)
  s64 = np.einsum("qd,qcd->qc", q_QD.astype(np.float64), v_ND[cand].astype(np.float64))
  return np.take_along_axis(cand, np.argsort(-s64, axis=1, kind="stable")[:, :k], 1)


def recall(ids_QK, exact_QK) -> float:
  return float(np.mean([len(set(a.tolist()) & set(b.tolist())) / exact_QK.shape[1]
                        for a, b in zip(np.asarray(ids_QK), exact_QK)]))


def _best_time(fn, repeats: int):
  out = fn()  # untimed: compiles / warms caches
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = fn()
    times.append(time.perf_counter() - t0)
  return min(times), out


def _jaxlab(stored, q, k, chunk, repeats):
  searcher = search_lib.Searcher(stored[None], chunk=chunk)

  def fn():
    s, i = searcher.search(q, k)
    return np.asarray(jax.block_until_ready(i))[0]
  return _best_time(fn, repeats)


def _faiss(v, q, k, repeats):
  try:
    import faiss
  except ImportError:
    return None
  faiss.omp_set_num_threads(os.cpu_count() or 1)
  index = faiss.IndexFlatIP(v.shape[1])
  index.add(v)
  return _best_time(lambda: index.search(q, k)[1], repeats)


def bench_search(argv) -> dict:
  """Queries/s and recall@k of exact top-k search: jaxlab (fp32, bf16 storage) vs faiss IndexFlatIP vs NumPy."""
  p = argparse.ArgumentParser(prog="python -m experiments bench search")
  p.add_argument("--rows", type=int, default=1_000_000)
  p.add_argument("--dim", type=int, default=384)
  p.add_argument("--queries", type=int, default=256)
  p.add_argument("--k", type=int, default=5)
  p.add_argument("--chunks", default="8192,32768", help="comma-separated jaxlab chunk sizes (rows per step)")
  p.add_argument("--numpy-chunk", type=int, default=1 << 16)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--no-faiss", action="store_true")
  args = p.parse_args(argv)
  chunks = [int(c) for c in args.chunks.split(",") if c.strip()]
  if min(args.rows, args.dim, args.queries, args.k, args.repeats, *chunks) < 1 or args.k > args.rows:
    raise SystemExit("rows, dim, queries, k, repeats and chunks must be positive, and k <= rows")
  v, q = make_data(args.rows, args.dim, args.queries, args.seed)
  exact = exact_topk(v, q, args.k)
  out = {"rows": args.rows, "dim": args.dim, "queries": args.queries, "k": args.k, "backend": jax.default_backend(),
         "devices": jax.device_count(), "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}

  def record(name, t, ids):
    out[f"{name}.seconds"] = t
    out[f"{name}.queries_per_s"] = args.queries / t
    out[f"{name}.recall_at_k"] = recall(ids, exact)

  record("numpy_fp32", *_best_time(lambda: numpy_topk(v, q, args.k, args.numpy_chunk)[1], args.repeats))
  got = None if args.no_faiss else _faiss(v, q, args.k, args.repeats)
  if got is None:
    out["faiss_fp32"] = "skipped (--no-faiss)" if args.no_faiss else \
        "faiss is not installed: pip install faiss-cpu==1.15.1"
  else:
    record("faiss_fp32", *got)
  for name, stored in (("fp32", v), ("bf16", v.astype(ml_dtypes.bfloat16))):
    best = None
    for c in chunks:
      t, ids = _jaxlab(stored, q, args.k, c, args.repeats)
      record(f"jaxlab_{name}.chunk{c}", t, ids)
      if best is None or t < best[0]:
        best = (t, ids, c)
    record(f"jaxlab_{name}", best[0], best[1])
    out[f"jaxlab_{name}.chunk"] = best[2]
    out[f"jaxlab_{name}.stored_bytes"] = int(stored.nbytes)
  if "faiss_fp32.queries_per_s" in out:
    out["ratio.jaxlab_fp32_over_faiss"] = out["jaxlab_fp32.queries_per_s"] / out["faiss_fp32.queries_per_s"]
  out["ratio.jaxlab_fp32_over_numpy_fp32"] = out["jaxlab_fp32.queries_per_s"] / out["numpy_fp32.queries_per_s"]
  out["ratio.jaxlab_bf16_over_numpy_fp32"] = out["jaxlab_bf16.queries_per_s"] / out["numpy_fp32.queries_per_s"]
  return out


registry.register_bench("search", bench_search,
                        "exact top-5 search, 256 queries x 1M x 384: jaxlab fp32/bf16 vs faiss IndexFlatIP vs NumPy")
