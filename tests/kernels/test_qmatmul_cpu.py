"""The CPU 8- and 4-bit matmul (kernels.qmatmul_cpu) against a float64 NumPy product of the dequantized weights:
the AVX-512 build and a generic x86-64 build (the loops the compiler vectorizes), every row count it takes,
groups of 16/32/64, output counts that leave partial chunks; its gradient, vmap and clear errors; and inside
`jaxlab.generate.quant`, sampling with it gives the tokens of the dequantized dense dot."""
import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jaxlab.generate import quant, sample
from jaxlab.models import transformer as tfm
from kernels import qmatmul_cpu

pytestmark = pytest.mark.skipif(not qmatmul_cpu.available(), reason=f"no kernel: {qmatmul_cpu.why_unavailable()}")


def _operands(m, i, o, group, seed=0, bits=8):
  rng = np.random.default_rng(seed)
  g = i // group
  q = rng.integers(0, 2 ** bits, (o, i)).astype(np.uint8)
  s = rng.uniform(1e-3, 2e-2, (o, g)).astype(np.float32)
  z = rng.normal(0, 1, (o, g)).astype(np.float32)
  x = rng.normal(0, 1, (m, i)).astype(np.float32)
  w = q.astype(np.float64) * np.repeat(s, group, -1) + np.repeat(z, group, -1)
  if bits == 4:  # byte k of each 32-input block: input k in the low nibble, k + 16 in the high one
    b = q.reshape(o, i // 32, 2, 16)
    q = (b[:, :, 0] | (b[:, :, 1] << 4)).reshape(o, i // 2).astype(np.uint8)
  return (x, q, s, z), x.astype(np.float64) @ w.T


@pytest.mark.parametrize("m", [1, 2, 3, 8, 11, 16])
@pytest.mark.parametrize("i,o,group,bits", [(576, 200, 32, 8), (64, 64, 16, 8), (128, 129, 64, 8), (96, 1, 32, 8),
                                            (576, 200, 32, 4), (128, 129, 64, 4), (96, 1, 32, 4)])
def test_matmul_equals_float64_product(m, i, o, group, bits):
  args, ref = _operands(m, i, o, group, bits=bits)
  got = np.asarray(jax.jit(functools.partial(qmatmul_cpu.matmul, bits=bits))(*args))
  assert got.shape == (m, o) and got.dtype == np.float32
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_generic_build_equals_native(tmp_path, monkeypatch):
  monkeypatch.setenv("JAXLAB_CACHE", str(tmp_path))
  flags = tuple("-march=x86-64" if f == "-march=native" else f for f in qmatmul_cpu.FLAGS)
  qmatmul_cpu.register(qmatmul_cpu._build(flags), "jaxlab_qmatmul_u8_generic")
  assert len(list((tmp_path / "kernels").glob("*.so"))) == 1
  for m, bits in ((1, 8), (5, 8), (1, 4), (5, 4)):
    args, ref = _operands(m, 192, 70, 32, seed=m, bits=bits)
    generic = np.asarray(qmatmul_cpu.matmul(*args, bits=bits, target="jaxlab_qmatmul_u8_generic"))
    np.testing.assert_allclose(generic, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    np.testing.assert_allclose(generic, np.asarray(qmatmul_cpu.matmul(*args, bits=bits)), rtol=1e-5, atol=1e-5)


def test_vmap_and_errors():
  (x, q, s, z), _ = _operands(6, 64, 24, 16)
  x3 = np.stack([x, 2 * x, -x])
  got = jax.vmap(qmatmul_cpu.matmul, in_axes=(0, None, None, None))(x3, q, s, z)
  np.testing.assert_allclose(np.asarray(got), np.stack([np.asarray(qmatmul_cpu.matmul(r, q, s, z)) for r in x3]),
                             rtol=1e-6)
  for bad in ((np.ones((17, 64), np.float32), q, s, z), (x, q.astype(np.int8), s, z), (x[:, :48], q, s, z),
              (x, q, s[:, :3], z)):
    with pytest.raises(ValueError, match="qmatmul takes"):
      qmatmul_cpu.matmul(*bad)
  with pytest.raises(ValueError, match="qmatmul takes"):  # 4-bit: groups of 16 are no 32-input blocks
    qmatmul_cpu.matmul(x, q[:, :32], s, z, bits=4)


def test_qkernel_gradient_equals_dense():
  w = np.random.default_rng(3).normal(0, 0.3, (64, 40)).astype(np.float32)
  qk = quant.quantize_kernel(w, "int8", group=32, scheme="best")
  dense = qk.dequantize()
  x = jnp.asarray(np.random.default_rng(4).normal(0, 1, (2, 64)), jnp.float32)
  f = lambda x: jnp.sum(jnp.sin(x @ qk))
  assert qk._kernel_ok(2)
  ref = jax.grad(lambda x: jnp.sum(jnp.sin(x @ dense)))(x)
  np.testing.assert_allclose(np.asarray(jax.grad(f)(x)), np.asarray(ref), rtol=1e-5, atol=1e-5)


def test_sampling_with_kernel_equals_dense_dot(monkeypatch):
  cfg = tfm.Config.tiny(vocab_size=128, init_std=0.2, eos_token_id=None, pad_token_id=0, d_model=64)
  q = quant.quantize(tfm.init(cfg, jax.random.key(0)), "int8")
  prompts = [[5, 17, 99, 3, 42, 7, 64], [8, 120, 33]]
  with_kernel = sample(q, cfg, prompts, 12, return_logits=True)
  monkeypatch.setattr(quant, "KERNEL_ROWS", 0)
  dense = sample(q, cfg, prompts, 12, return_logits=True)
  np.testing.assert_array_equal(np.asarray(with_kernel.tokens), np.asarray(dense.tokens))
  np.testing.assert_allclose(np.asarray(with_kernel.logits), np.asarray(dense.logits), atol=2e-5, rtol=1e-4)


def test_sharded_forward_equals_single_device():
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  cfg = tfm.Config.tiny(vocab_size=128, init_std=0.2, eos_token_id=None, pad_token_id=0, d_model=64)
  q = quant.quantize(tfm.init(cfg, jax.random.key(0)), "int8")
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 128, (8, 1)), jnp.int32)
  fwd = jax.jit(lambda q, t: tfm.forward(q, t, cfg).logits)
  assert "jaxlab_qmatmul_u8" in fwd.lower(q, tokens).as_text()
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
  sharded = fwd(jax.device_put(q, NamedSharding(mesh, P())), jax.device_put(tokens, NamedSharding(mesh, P("data"))))
  np.testing.assert_allclose(np.asarray(sharded), np.asarray(fwd(q, tokens)), rtol=1e-6, atol=1e-6)
