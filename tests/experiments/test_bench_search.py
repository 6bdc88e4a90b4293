"""experiments/bench_search.py: the NumPy baseline and the exact reference against a full sort, and a tiny bench
run (recall 1.0 for float32 storage, a clear message when faiss is missing)."""
import sys

import numpy as np

from experiments import bench_search as bs


def test_numpy_topk_and_exact_match_a_full_sort():
  v, q = bs.make_data(3000, 16, 7, seed=1)
  np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1, rtol=1e-5)
  full = np.argsort(-(q.astype(np.float64) @ v.T.astype(np.float64)), axis=1)[:, :5]
  s, i = bs.numpy_topk(v, q, 5, chunk=700)  # chunks that don't divide the rows
  np.testing.assert_array_equal(i, full)
  np.testing.assert_allclose(s, np.take_along_axis(q @ v.T, full, 1), rtol=1e-6)
  np.testing.assert_array_equal(bs.exact_topk(v, q, 5), full)
  assert bs.recall(full, full) == 1.0 and bs.recall(full[:, ::-1], full) == 1.0
  assert bs.recall(np.roll(full, 1, axis=0), full) < 0.5


def test_tiny_bench_without_faiss(monkeypatch):
  monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss -> ImportError
  out = bs.bench_search(["--rows", "5000", "--dim", "32", "--queries", "8", "--chunks", "1024,3000",
                         "--repeats", "1"])
  assert "not installed" in out["faiss_fp32"] and "ratio.jaxlab_fp32_over_faiss" not in out
  assert out["jaxlab_fp32.recall_at_k"] == 1.0 and out["numpy_fp32.recall_at_k"] == 1.0
  assert out["jaxlab_bf16.recall_at_k"] >= 0.8
  assert out["jaxlab_fp32.chunk"] in (1024, 3000)
  assert out["jaxlab_bf16.stored_bytes"] * 2 == out["jaxlab_fp32.stored_bytes"]
  np.testing.assert_allclose(out["ratio.jaxlab_bf16_over_numpy_fp32"],
                             out["jaxlab_bf16.queries_per_s"] / out["numpy_fp32.queries_per_s"])
