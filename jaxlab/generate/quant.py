"""Weight-only int8 and bf16 matmul kernels for memory-bound decoding.

int8 is symmetric per-output-channel ("vector-wise") absmax quantization as in LLM.int8() (Dettmers et al.,
arXiv 2208.07339, section 3.1), applied to the weights only: w[i, o] ~= q[i, o] * scale[o] with
q = round(w / scale) in [-127, 127] and scale[o] = max_i |w[i, o]| / 127. Activations stay in the compute
dtype. bf16 stores the weights rounded to bfloat16 and computes in fp32.

`quantize(params, "int8" | "bf16")` replaces every matmul kernel of a transformer param tree by a `QKernel`
(the embedding table used for lookups is kept; with tied embeddings an `lm_head` is added, built from the
table, so the vocabulary projection is quantized too). A `QKernel` stores its weight transposed, [.., out, in],
and is consumed by `jaxlab.nn.layers.linear` through `x @ kernel` (`__rmatmul__`): the weight is dequantized
and multiplied with a dense dot, or, for at most `REDUCE_ROWS` activation rows, by a multiply-and-reduce over
the contiguous `in` axis that XLA fuses with the conversion, so the stored int8/bf16 bytes are what is read.
On XLA:CPU that fused reduce measured 2-10x slower than the dot inside the decode loop (llama-60m, batch 1),
so REDUCE_ROWS is 0 there: the dequantization of the loop-invariant weights is then hoisted out of the
decode loop, and int8/bf16 save storage and transfer rather than per-step reads.

Axes: I input features, O output features, M rows of the activation.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

MODES = ("fp32", "bf16", "int8")
REDUCE_ROWS = 0  # at most this many activation rows: multiply-reduce over the stored bytes; else a dense dot


@jax.tree_util.register_pytree_node_class
class QKernel:
  """A [.., I, O] matmul kernel stored as [.., O, I] int8 (with a per-O scale) or bf16.

  Attributes:
    w_OI: the stored weight, transposed (int8 or bfloat16; leading axes are stacked layers).
    scale_O: float32 per-output-channel scale (int8), or None (bf16).
    compute_dtype: the dtype `astype` asked for; the product is computed in float32 and cast to it.
  """

  def __init__(self, w_OI, scale_O=None, compute_dtype: str = "float32"):
    self.w_OI, self.scale_O, self.compute_dtype = w_OI, scale_O, compute_dtype

  def tree_flatten(self):
    return (self.w_OI, self.scale_O), self.compute_dtype

  @classmethod
  def tree_unflatten(cls, compute_dtype, children):
    return cls(*children, compute_dtype=compute_dtype)

  @property
  def shape(self) -> tuple[int, ...]:
    s = tuple(self.w_OI.shape)
    return (*s[:-2], s[-1], s[-2])

  @property
  def ndim(self) -> int:
    return len(self.w_OI.shape)

  @property
  def dtype(self):
    return jnp.dtype(self.compute_dtype)

  def astype(self, dtype) -> "QKernel":
    return QKernel(self.w_OI, self.scale_O, jnp.dtype(dtype).name)

  def dequantize(self):
    """The [.., I, O] float32 kernel this one approximates."""
    w = self.w_OI.astype(jnp.float32)
    if self.scale_O is not None:
      w = w * self.scale_O[..., None]
    return jnp.swapaxes(w, -1, -2)

  def __rmatmul__(self, x_MI):
    if self.ndim != 2 or x_MI.ndim != 2:
      raise ValueError(f"QKernel matmul takes a [M, I] activation and one [O, I] weight, found {x_MI.shape} "
                       f"and {self.w_OI.shape} (index stacked layers first)")
    x = x_MI.astype(jnp.float32)
    if x.shape[0] <= REDUCE_ROWS:
      y_OM = jnp.sum(self.w_OI.astype(jnp.float32)[:, None, :] * x[None, :, :], axis=-1)
      if self.scale_O is not None:
        y_OM = y_OM * self.scale_O[:, None]
      y = y_OM.T
    else:
      y = x @ self.dequantize()
    return y.astype(self.compute_dtype)


def quantize_kernel(kernel_IO, mode: str) -> QKernel:
  """One [.., I, O] kernel as a QKernel ("int8": per-output-channel symmetric scales; "bf16": rounded)."""
  w_OI = jnp.swapaxes(jnp.asarray(kernel_IO, jnp.float32), -1, -2)
  if mode == "bf16":
    return QKernel(w_OI.astype(jnp.bfloat16))
  if mode != "int8":
    raise ValueError(f"quantize_kernel mode must be 'int8' or 'bf16', found {mode!r}")
  amax = jnp.max(jnp.abs(w_OI), axis=-1)
  scale = jnp.where(amax > 0, amax / 127.0, 1.0)
  q = jnp.clip(jnp.round(w_OI / scale[..., None]), -127, 127).astype(jnp.int8)
  return QKernel(q, scale.astype(jnp.float32))


def is_quantized(params) -> bool:
  return any(isinstance(x, QKernel) for x in jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, QKernel)))


def _quantize_tree(tree, mode):
  if isinstance(tree, dict):
    return {k: (quantize_kernel(v, mode) if k == "kernel" and not isinstance(v, dict) else _quantize_tree(v, mode))
            for k, v in tree.items()}
  return tree


@functools.partial(jax.jit, static_argnames="mode")
def _quantize(params, mode):
  out = _quantize_tree(params, mode)
  if "lm_head" not in params and "embed" in params:  # tied embeddings: quantize the projection, keep the table
    out["lm_head"] = {"kernel": quantize_kernel(params["embed"]["embedding"].T, mode)}
  return out


def quantize(params, mode: str):
  """A transformer param tree whose matmul kernels are QKernels of `mode` ("int8" or "bf16"; "fp32": unchanged).

  Args:
    params: params of `jaxlab.models.transformer` (any tree whose matmul weights sit under "kernel" keys,
      [.., in, out]). Already quantized params are returned as they are.
    mode: "fp32" (no change), "bf16" (weights rounded to bfloat16) or "int8" (per-output-channel absmax).

  Returns:
    the same tree with each "kernel" a QKernel; a tied-embedding model also gets `lm_head` (its forward then
    projects through it instead of the table, which stays for the token lookup).
  """
  if mode not in MODES:
    raise ValueError(f"weights mode must be one of {MODES}, found {mode!r}")
  if mode == "fp32" or is_quantized(params):
    return params
  return _quantize(params, mode)


def weight_bytes(params) -> int:
  """Bytes of every array in `params` (QKernels count their stored int8/bf16 bytes and scales)."""
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
