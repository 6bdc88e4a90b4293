"""CDKA: reduction to LoRA, the reshape application against np.kron, the rank bound, nearest-Kronecker recovery,
and the parameter-budget helper against brute-force enumeration."""
import itertools
import math

import jax
import numpy as np
import pytest

from jaxlab.adapters import kron, lora
from jaxlab.models import transformer as tfm
from jaxlab.nn import axes

CFG = tfm.Config.tiny()


def _np_kron_sum(a, b):
  """The oracle: sum_i np.kron(B_i, A_i) for one layer."""
  return sum(np.kron(np.asarray(b[i], np.float64), np.asarray(a[i], np.float64)) for i in range(a.shape[0]))


def _factors(rng, d_in, d_out, r, r1, r2):
  return (rng.standard_normal((r, r1, d_in // r2)).astype(np.float32),
          rng.standard_normal((r, d_out // r1, r2)).astype(np.float32))


def test_init_shapes_scale_and_axes():
  base = tfm.init(CFG, jax.random.key(0))
  cfg = kron.Config(r=3, r1=2, r2=4, alpha=16, targets=("q", "k"))
  ad = kron.init(cfg, base, jax.random.key(1))
  q, k = ad["layers/attn/q/kernel"], ad["layers/attn/k/kernel"]
  assert q["kron_a"].shape == (2, 3, 2, 16) and q["kron_b"].shape == (2, 3, 32, 4)
  assert k["kron_b"].shape == (2, 3, 16, 4) and not np.any(np.asarray(k["kron_b"]))
  bound = 1 / math.sqrt(64 // 4)
  assert np.abs(q["kron_a"]).max() <= bound and np.abs(q["kron_a"]).max() > 0.9 * bound
  assert cfg.scale == pytest.approx(16 / math.sqrt(3 * 4))
  assert axes.logical_axes(ad, kron.AXES)["layers/attn/q/kernel"] == {
      "kron_a": ("layers", "rank", "kron_r1", "kron_in"), "kron_b": ("layers", "rank", "kron_out", "kron_r2")}
  with pytest.raises(ValueError, match="r1 | d_out"):
    kron.init(cfg.replace(r1=3), base, jax.random.key(1))
  assert kron.num_params(64, 64, 3, 2, 4) == sum(x[0].size for x in q.values())


def test_r1_r2_one_is_lora_with_the_same_numbers():
  base = tfm.init(CFG, jax.random.key(0))
  rng = np.random.default_rng(0)
  kcfg = kron.Config(r=4, r1=1, r2=1, alpha=8, targets=("q", "down"))
  lcfg = lora.Config(rank=4, alpha=8, targets=("q", "down"), rslora=True)
  assert kcfg.scale == lcfg.scale
  kad = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(np.float32),
                     kron.init(kcfg, base, jax.random.key(1)))
  # B = [B_1 .. B_r] (columns), A = [A_1; ..; A_r] (rows); lora_a = A^T, lora_b = B^T.
  lad = {p: {"lora_a": np.swapaxes(l["kron_a"][:, :, 0, :], 1, 2), "lora_b": l["kron_b"][..., 0]}
         for p, l in kad.items()}
  for p in kad:
    np.testing.assert_allclose(kron.delta(kad[p], kcfg.scale), lora.delta(lad[p], lcfg.scale), rtol=1e-5,
                               atol=1e-5)
  tokens = jax.random.randint(jax.random.key(2), (2, 8), 0, CFG.vocab_size)
  np.testing.assert_allclose(tfm.forward(kron.merge(base, kad, kcfg), tokens, CFG).logits,
                             tfm.forward(lora.merge(base, lad, lcfg), tokens, CFG).logits, atol=1e-5)


@pytest.mark.parametrize("d_in,d_out,r,r1,r2", [(64, 32, 3, 2, 8), (48, 64, 2, 4, 3), (16, 24, 5, 1, 1),
                                                (64, 64, 1, 8, 8)])
def test_reshape_application_equals_materialized_kron_sum(d_in, d_out, r, r1, r2):
  rng = np.random.default_rng(d_in + r)
  a, b = _factors(rng, d_in, d_out, r, r1, r2)
  dense = _np_kron_sum(a, b)
  np.testing.assert_allclose(kron.kron_sum(a, b), dense, rtol=1e-5, atol=1e-4)
  x = rng.standard_normal((3, 5, d_in)).astype(np.float32)
  np.testing.assert_allclose(kron.kron_matvec(x, a, b, 0.7), 0.7 * x.astype(np.float64) @ dense.T, rtol=1e-4,
                             atol=1e-3)
  w = rng.standard_normal((d_in, d_out)).astype(np.float32)
  merged = lora.add_deltas({"k": w}, {"k": kron.delta({"kron_a": a, "kron_b": b}, 0.7)})["k"]
  np.testing.assert_allclose(x @ merged, x @ w + kron.kron_matvec(x, a, b, 0.7), rtol=1e-4, atol=1e-3)
  back = lora.add_deltas({"k": merged}, {"k": kron.delta({"kron_a": a, "kron_b": b}, 0.7)}, sign=-1)["k"]
  np.testing.assert_allclose(back, w, atol=1e-5)


@pytest.mark.parametrize("d_in,d_out,r,r1,r2", [(64, 64, 2, 2, 4), (32, 48, 3, 2, 2), (64, 32, 4, 1, 4),
                                                (16, 16, 3, 2, 2), (32, 32, 2, 8, 8), (16, 32, 1, 16, 1)])
def test_rank_bound_holds_and_is_reached(d_in, d_out, r, r1, r2):
  rng = np.random.default_rng(r * 7 + r1)
  a, b = _factors(rng, d_in, d_out, r, r1, r2)
  rank = np.linalg.matrix_rank(_np_kron_sum(a, b))
  assert rank <= r * r1 * r2
  assert rank == kron.rank_bound(d_in, d_out, r, r1, r2)
  if r * r1 * r2 <= min(d_in, d_out) and r1 <= d_in // r2 and r2 <= d_out // r1:
    assert rank == r * r1 * r2
  a[1:] = 0  # fewer nonzero components: lower rank
  assert np.linalg.matrix_rank(_np_kron_sum(a, b)) <= r1 * r2


@pytest.mark.parametrize("r", [1, 3])
def test_nearest_kron_recovers_exact_kronecker_sums(r):
  rng = np.random.default_rng(r)
  d_in, d_out, r1, r2 = 24, 20, 4, 3
  a0, b0 = _factors(rng, d_in, d_out, r, r1, r2)
  M = _np_kron_sum(a0, b0)
  a, b, err = kron.nearest_kron(M, r1, r2, r)
  assert a.shape == (r, r1, d_in // r2) and b.shape == (r, d_out // r1, r2)
  assert err < 1e-10
  np.testing.assert_allclose(_np_kron_sum(a, b), M, atol=1e-9)
  if r == 1:  # B and A themselves, up to a reciprocal scale
    for got, want in ((b[0], b0[0].astype(np.float64)), (a[0], a0[0].astype(np.float64))):
      cos = abs(np.sum(got * want)) / (np.linalg.norm(got) * np.linalg.norm(want))
      assert cos == pytest.approx(1.0, abs=1e-9)
  noisy = M + 0.1 * rng.standard_normal(M.shape)
  _, _, e1 = kron.nearest_kron(noisy, r1, r2, 1)
  _, _, e2 = kron.nearest_kron(noisy, r1, r2, 2)
  a_r, b_r = _factors(rng, d_in, d_out, 1, r1, r2)
  rand_err = np.linalg.norm(noisy - _np_kron_sum(a_r, b_r)) / np.linalg.norm(noisy)
  assert e2 <= e1 < rand_err


def test_feasible_configs_match_brute_force_and_recommend_is_optimal():
  d_in, d_out, budget = 12, 8, 70
  got = {(c["r"], c["r1"], c["r2"]): c for c in kron.feasible_configs(d_in, d_out, budget)}
  want = {}
  for r, r1, r2 in itertools.product(range(1, budget + 1), range(1, d_out + 1), range(1, d_in + 1)):
    if d_out % r1 == 0 and d_in % r2 == 0:
      n = r * (r2 * d_out // r1 + r1 * d_in // r2)  # B_i [d_out/r1, r2] + A_i [r1, d_in/r2]
      if n <= budget:
        want[(r, r1, r2)] = n
  assert set(got) == set(want)
  assert all(got[k]["params"] == n for k, n in want.items())
  # The rank bound of every feasible config is reached by random factors.
  rng = np.random.default_rng(0)
  for (r, r1, r2), c in list(got.items())[::7]:
    a, b = _factors(rng, d_in, d_out, r, r1, r2)
    assert np.linalg.matrix_rank(_np_kron_sum(a, b)) == c["rank_bound"]

  best = kron.recommend(d_in, d_out, budget)
  assert best["rank_bound"] == max(c["rank_bound"] for c in got.values())
  # At LoRA rank 8's budget on a 64x64 layer, CDKA reaches full rank; LoRA reaches 8.
  rec = kron.recommend(64, 64, 8 * (64 + 64))
  assert rec["rank_bound"] == 64 and rec["params"] <= 8 * 128
  shape = kron.recommend(64, 64, 8 * 128, prefer="shape")
  assert (shape["r1"], shape["r2"]) == kron.RECOMMENDED and shape["r"] == (8 * 128) // kron.num_params(64, 64, 1, 2, 8)
  tie = kron.recommend(16, 16, 10 ** 6)  # everything reaches full rank: the recommended shape wins the tie
  assert (tie["r1"], tie["r2"]) == kron.RECOMMENDED
  with pytest.raises(ValueError, match="no CDKA config"):
    kron.recommend(64, 64, 10)
