"""Dense layers as init/apply pairs over plain param dicts.

Axes: B batch, T sequence, D model width, F mlp width, V vocab. Kernels are stored [in, out] (any leading
dims are stacked layers); norms compute in fp32 and cast back to the input dtype.
"""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

from jaxlab import choices

DType = Literal["float32", "bfloat16", "float16"]  # a config's param / compute dtype, by name
DTYPE_NAMES = choices.values(DType)
Activation = Literal["silu", "gelu", "gelu_tanh", "quick_gelu", "relu"]  # the keys of ACTIVATIONS


def check_dtype_names(cfg, fail, names=("param_dtype", "dtype")) -> None:
  """Calls `fail(message)` for the first field of `names` on `cfg` that is not one of DTYPE_NAMES."""
  for name in names:
    if getattr(cfg, name) not in DTYPE_NAMES:
      fail(f"{name} must be float32, bfloat16 or float16, found {getattr(cfg, name)!r}")


def normal(key, shape, std, dtype=jnp.float32):
  return (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def linear_init(key, d_in: int, d_out: int, *, bias: bool = False, std: float = 0.02, dtype=jnp.float32,
                stack: tuple[int, ...] = ()):
  p = {"kernel": normal(key, (*stack, d_in, d_out), std, dtype)}
  if bias:
    p["bias"] = jnp.zeros((*stack, d_out), dtype)
  return p


def linear(p, x, dtype=None):
  """x[..., in] @ kernel[in, out] (+ bias), computed in `dtype` (default: x's dtype)."""
  dtype = dtype or x.dtype
  k = p["kernel"].astype(dtype)
  # A 2-D dot: XLA:CPU emits transposing copies in the backward of the batched einsum form.
  y = (x.astype(dtype).reshape(-1, x.shape[-1]) @ k).reshape(*x.shape[:-1], k.shape[-1])
  if "bias" in p:
    y = y + p["bias"].astype(dtype)
  return y


def embed_init(key, vocab: int, d: int, *, std: float = 0.02, dtype=jnp.float32):
  return {"embedding": normal(key, (vocab, d), std, dtype)}


def embed(p, tokens_BT, dtype=None):
  table = p["embedding"]
  return jnp.take(table, tokens_BT, axis=0).astype(dtype or table.dtype)


def unembed(p, x_BTD, dtype=None):
  """Logits against a tied embedding table [V, D]."""
  dtype = dtype or x_BTD.dtype
  return jnp.einsum("btd,vd->btv", x_BTD.astype(dtype), p["embedding"].astype(dtype))


def norm_init(d: int, *, bias: bool = False, dtype=jnp.float32, stack: tuple[int, ...] = ()):
  p = {"scale": jnp.ones((*stack, d), dtype)}
  if bias:
    p["bias"] = jnp.zeros((*stack, d), dtype)
  return p


def rms_norm(p, x, eps: float):
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return (p["scale"].astype(jnp.float32) * y).astype(x.dtype)


def layer_norm(p, x, eps: float):
  x32 = x.astype(jnp.float32)
  mu = jnp.mean(x32, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x32 - mu), axis=-1, keepdims=True)
  y = (x32 - mu) * jax.lax.rsqrt(var + eps) * p["scale"].astype(jnp.float32)
  if "bias" in p:
    y = y + p["bias"].astype(jnp.float32)
  return y.astype(x.dtype)


def norm(p, x, eps: float, kind: str = "rms"):
  return rms_norm(p, x, eps) if kind == "rms" else layer_norm(p, x, eps)


ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
    "relu": jax.nn.relu,
}
choices.same(ACTIVATIONS, Activation)


def mlp_init(key, d: int, f: int, *, gated: bool = True, bias: bool = False, std: float = 0.02,
             dtype=jnp.float32, stack: tuple[int, ...] = ()):
  kg, ku, kd = jax.random.split(key, 3)
  p = {"up": linear_init(ku, d, f, bias=bias, std=std, dtype=dtype, stack=stack),
       "down": linear_init(kd, f, d, bias=bias, std=std, dtype=dtype, stack=stack)}
  if gated:
    p["gate"] = linear_init(kg, d, f, bias=bias, std=std, dtype=dtype, stack=stack)
  return p


def mlp(p, x_BTD, activation: str = "silu", dtype=None):
  """Gated (down(act(gate x) * up x)) when the params have a gate, else down(act(up x))."""
  act = ACTIVATIONS[activation]
  up = linear(p["up"], x_BTD, dtype)
  h = act(linear(p["gate"], x_BTD, dtype)) * up if "gate" in p else act(up)
  return linear(p["down"], h, dtype)
