"""Muon: the in-file implementation against optax.contrib.muon, and Newton-Schulz against the SVD polar factor."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlab import optim
from jaxlab.models import transformer as tfm
from jaxlab.optim import muon_lib


def test_newton_schulz_approximates_polar_factor():
  x = np.asarray(jax.random.normal(jax.random.key(0), (3, 48, 32)), np.float64)
  got = np.asarray(muon_lib.orthogonalize(jnp.asarray(x, jnp.float32)), np.float64)
  u, _, vh = np.linalg.svd(x, full_matrices=False)
  polar = u @ vh
  s = np.linalg.svd(got, compute_uv=False)
  assert s.min() > 0.5 and s.max() < 1.3  # the quintic's known band around 1 (not exact orthogonality)
  cos = np.sum(got * polar, axis=(1, 2)) / (np.linalg.norm(got, axis=(1, 2)) * np.linalg.norm(polar, axis=(1, 2)))
  assert np.all(cos > 0.97)


@pytest.mark.skipif(muon_lib._optax_muon() is None, reason="installed optax has no contrib.muon with dim numbers")
def test_own_muon_equals_optax_contrib_on_llama_tree():
  params = jax.jit(tfm.init, static_argnums=0)(tfm.Config.tiny(), jax.random.key(0))
  sched = optax.linear_schedule(2e-2, 1e-2, 3)
  outs = {}
  for impl in ("optax", "jaxlab"):
    tx = optim.muon(sched, axes=tfm.AXES, weight_decay=0.1, adam_lr=3e-3, implementation=impl)
    state, update, p = tx.init(params), jax.jit(tx.update), params
    for i in range(3):
      g = jax.tree.map(lambda x, i=i: jax.random.normal(jax.random.fold_in(jax.random.key(i), x.size), x.shape), params)
      u, state = update(g, state, p)
      p = optax.apply_updates(p, u)
    outs[impl] = p
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6),
               outs["optax"], outs["jaxlab"])
  # Stacked kernels are orthogonalized per layer: each layer's update has singular values near 1 * width scale.
  moved = np.asarray(outs["jaxlab"]["layers"]["mlp"]["down"]["kernel"] - params["layers"]["mlp"]["down"]["kernel"])
  assert moved.shape[0] == 2
  for layer in moved:
    s = np.linalg.svd(layer, compute_uv=False)
    assert s.max() / s.min() < 3.0
