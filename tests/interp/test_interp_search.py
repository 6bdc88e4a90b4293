"""LatentLens search against brute-force NumPy: ties, several layers, the global merge, chunking, blocks, 8 devices."""
import jax
import numpy as np
import pytest

from jaxlab.interp import lenses, search


def _index(vecs_LND, dtype, rng):
  stored = [lenses.quantize(v, dtype) for v in vecs_LND]
  n = vecs_LND.shape[1]
  scale = None if stored[0][1] is None else np.stack([s[1] for s in stored])
  return lenses.LatentIndex((1, 3, 6)[:len(stored)], np.stack([s[0] for s in stored]), scale,
                            rng.integers(0, 50, n).astype(np.int32), rng.integers(2, 9, n).astype(np.int32),
                            np.arange(n, dtype=np.int32) // 4, {})


def _brute(index, q_QD, k, layer_pos=None):
  """Scores as documented (stored row . unit query, times the fp8 scale), ranked by (-score, layer, row)."""
  q = q_QD.astype(np.float64)
  q = q / np.linalg.norm(q, axis=-1, keepdims=True)
  s = np.einsum("qd,lnd->lqn", q, np.asarray(index.vectors, np.float64))
  if index.scale is not None:
    s = s * index.scale[:, None, :]
  s = s.astype(np.float32)
  n_l, n_q, n = s.shape
  rows = np.arange(n)
  per_layer = np.stack([[np.lexsort((rows, -s[l, i]))[:k] for i in range(n_q)] for l in range(n_l)])
  sel = list(range(n_l)) if layer_pos is None else layer_pos
  glob = []
  for i in range(n_q):
    cand = [(-s[l, i, r], l, r) for l in sel for r in range(n)]
    glob.append(sorted(cand)[:k])
  g = np.asarray(glob)  # [Q, k, 3]
  return s, per_layer, -g[..., 0], g[..., 1].astype(int), g[..., 2].astype(int)


def _check(lens, index, q, k, layer_pos=None):
  s, per_layer, gs, gl, gr = _brute(index, q, k, layer_pos)
  layers = None if layer_pos is None else [index.layers[p] for p in layer_pos]
  nb = lens.search(q, k, layers=layers)
  np.testing.assert_array_equal(np.asarray(nb.layer_rows), per_layer)
  np.testing.assert_array_equal(nb.row, gr)
  np.testing.assert_array_equal(nb.layer, np.asarray(index.layers)[gl])
  np.testing.assert_allclose(np.asarray(nb.score), gs, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(nb.context, index.context[gr])
  np.testing.assert_array_equal(nb.token_id, index.token_id[gr])


def _meshes():
  devs = jax.devices()
  return {"none": None, "8": jax.make_mesh((8,), ("rows",)), "2x4": jax.make_mesh((2, 4), ("a", "b"))} \
      if len(devs) >= 8 else {"none": None}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float8_e4m3fn"])
@pytest.mark.parametrize("mesh_name,chunk,block_rows", [("none", 16, None), ("none", 1000, None),
                                                         ("8", 7, None), ("2x4", 5, 50), ("none", 3, 64)])
def test_ties_match_brute_force(dtype, mesh_name, chunk, block_rows):
  # Entries of +-1/4 in 16 dims: every score is a multiple of 1/16 (exact in all three dtypes), so ties abound.
  rng = np.random.default_rng(0)
  v = rng.choice([-0.25, 0.25], size=(3, 203, 16)).astype(np.float32)
  q = rng.choice([-1.0, 1.0], size=(6, 16)).astype(np.float32)
  index = _index(v, dtype, rng)
  mesh = _meshes().get(mesh_name, "skip")
  if mesh == "skip":
    pytest.skip("needs 8 devices")
  lens = lenses.LatentLens(index, mesh=mesh, chunk=chunk, block_rows=block_rows)
  s, _, gs, _, _ = _brute(index, q, 5)
  assert (gs[:, :-1] == gs[:, 1:]).any(), "the data must contain ties"
  _check(lens, index, q, 5)
  _check(lens, index, q, 7, layer_pos=[0, 2])


def test_gaussian_matches_float64_brute_force():
  rng = np.random.default_rng(1)
  v = rng.standard_normal((2, 1000, 24)).astype(np.float32)
  q = rng.standard_normal((9, 24)).astype(np.float32)
  index = _index(v, "float32", rng)
  mesh = _meshes().get("8")
  for m, chunk in [(None, 128), (mesh, 37)]:
    _check(lenses.LatentLens(index, mesh=m, chunk=chunk), index, q, 5)


def test_sharded_equals_single_device():
  rng = np.random.default_rng(2)
  v = rng.standard_normal((2, 517, 32))
  stored = np.stack([lenses.quantize(x, "bfloat16")[0] for x in v])
  q = rng.standard_normal((5, 32)).astype(np.float32)
  single = search.Searcher(stored, chunk=64).search(q, 8)
  for name, mesh in _meshes().items():
    got = search.Searcher(stored, mesh=mesh, chunk=11, block_rows=200).search(q, 8)
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(single[1]), err_msg=name)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(single[0]), err_msg=name)


def test_rejects_bad_queries_and_k():
  s = search.Searcher(np.ones((1, 4, 3), np.float32))
  with pytest.raises(ValueError, match="k must be"):
    s.search(np.ones((2, 3)), 5)
  with pytest.raises(ValueError, match="queries must be"):
    s.search(np.ones((2, 4)), 2)
