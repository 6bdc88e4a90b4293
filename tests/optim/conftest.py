"""Shared fixtures for optimizer tests: a quadratic param tree with its axis rules and FSDP placement over 8
devices."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxlab.nn import axes

# A small tree with a stacked matrix (fan-in first), a matrix with fan-in first and out < in, and a vector.
QUAD_AXES = axes.rules((r"quad/w", ("embed", "mlp"), "embed"), (r"quad/v", ("mlp", "embed"), "mlp"),
                       (r"quad/b", ("embed",)))


def quad_params(key, scale=1.0):
  kw, kv, kb = jax.random.split(key, 3)
  return {"quad": {"w": scale * jax.random.normal(kw, (2, 16, 24)),
                   "v": scale * jax.random.normal(kv, (24, 16)),
                   "b": scale * jax.random.normal(kb, (16,))}}


@pytest.fixture
def quad():
  return quad_params


@pytest.fixture
def quad_axes():
  return QUAD_AXES


def fsdp_place(tree, mesh):
  """Shards each leaf's largest dim divisible by the mesh size over "fsdp" (replicated when none is)."""
  n = mesh.devices.size
  def spec(x):
    dims = [i for i in np.argsort(x.shape)[::-1] if x.shape[i] % n == 0]
    names = [None] * x.ndim
    if dims:
      names[dims[0]] = "fsdp"
    return NamedSharding(mesh, P(*names))
  return jax.device_put(tree, jax.tree.map(spec, tree))


@pytest.fixture
def fsdp():
  assert jax.device_count() >= 8, "tests/conftest.py should give 8 CPU devices"
  mesh = Mesh(np.array(jax.devices()[:8]), ("fsdp",))
  return lambda tree: fsdp_place(tree, mesh)


def sharded_matches_single(tx, params, grads, steps=2, rtol=1e-5, atol=1e-6):
  """Runs `steps` jitted updates on single-device and on FSDP-sharded params, grads and state; compares them."""
  mesh = Mesh(np.array(jax.devices()[:8]), ("fsdp",))
  dev0 = jax.devices()[0]
  update = jax.jit(tx.update)
  p1, g1 = jax.device_put((params, grads), dev0)
  p8, g8 = fsdp_place(params, mesh), fsdp_place(grads, mesh)
  assert any(len(x.sharding.device_set) == 8 and not x.sharding.is_fully_replicated for x in jax.tree.leaves(p8))
  s1, s8 = jax.jit(tx.init)(p1), fsdp_place(jax.jit(tx.init)(p8), mesh)
  for _ in range(steps):
    u1, s1 = update(g1, s1, p1)
    u8, s8 = update(g8, s8, p8)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol), u1, u8)
    p1 = jax.tree.map(jnp.add, p1, u1)
    p8 = jax.tree.map(jnp.add, p8, u8)
  return u8


@pytest.fixture
def sharded_check():
  return sharded_matches_single
