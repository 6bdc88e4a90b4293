"""Weight-only int8 and bf16 matmul kernels for memory-bound decoding.

int8 stores each weight row (one output channel) in groups of `group` consecutive input features, each group
with its own float32 scale s and, for the "asym" and "best" schemes, an offset z: w[i, o] ~= q[i, o] * s + z.
"sym" is absmax quantization, s = max |w| / 127, q = round(w / s) in [-127, 127] (with group = the whole row it
is the per-output-channel "vector-wise" quantization of LLM.int8(), Dettmers et al., arXiv 2208.07339,
section 3.1); "asym" is min-max quantization, s = (max w - min w) / 255, z = min w, q = round((w - z) / s) in
[0, 255] (the zero-point form of Jacob et al., arXiv 1712.05877, section 2.1); "best" takes, group by group,
whichever of the two has the smaller squared error. Small groups follow the weights' local range, as GGML's
block formats do (blocks of 32 along the input): "asym" with group 32 reproduces a Q4_1 block and "sym" a Q8_0
block up to float rounding, so "best" with group 32 is lossless (to ~1 ulp) on checkpoints shipped in those
formats and no worse than either scheme on others. The default int8 mode (`INT8`) is "best" with group 32,
keeping the vocabulary projection int8 too: on SmolLM2-135M-Instruct (Q4_1 file) its greedy tokens equal
fp32's on 8 chat prompts x 128 tokens (`experiments/bench.py generate --prompts chat`), where per-channel
absmax agreed on 20% of the positions, "sym" with group 32 on 46%, "asym" on 66%, bf16 on 83%.
int4 stores min-max 4-bit groups (s = (max w - min w) / 15, z = min w; groups of a multiple of 32 inputs), two
values a byte in GGML's Q4_1 order (byte k of a 32-input block holds input k in its low nibble, k + 16 in its
high one), so a Q4_1 checkpoint's blocks come back to float rounding; a kernel whose inputs the blocks do not
tile is int8, and the vocabulary projection is int8 ("best", group 32: GGUF files keep it at Q8_0 or better).
bf16 stores the weights rounded to bfloat16. Activations stay in the compute dtype (products in float32).

`quantize(params, "int8" | "bf16")` replaces every matmul kernel of a transformer param tree by a `QKernel`
(the embedding table used for lookups is kept; with tied embeddings an `lm_head` is added, built from the
table, so the vocabulary projection is quantized too, unless `head="fp32"`). A `QKernel` stores its weight
transposed, [.., out, in], and is consumed by `jaxlab.nn.layers.linear` through `x @ kernel` (`__rmatmul__`).
On CPU, a uint8 or 4-bit kernel with offsets ("asym"/"best"/int4) meets at most `KERNEL_ROWS` activation rows
(decoding's) in `kernels.qmatmul_cpu`, a C++ kernel that reads the stored bytes and widens them in registers: 1
byte (int8) or half a byte (int4) a weight, plus 8 bytes of scale and offset a group, instead of the 4 of the
dequantized float32 weight, which XLA hoists out of the decode loop. `python -m experiments bench generate
--prompts chat --weights fp32,int8,int4` on SmolLM2-135M-Instruct (2 CPUs) measured batch 1 at 1.9x fp32's
tokens/s (int8) and 2.0x (int4), batch 8 at 1.1x, with the tokens of fp32 (the kernel sums in float32 as the
dense dot does). Other rows, platforms
and kernels are dequantized and multiplied with a dense dot, or, for at most `REDUCE_ROWS` activation rows, by
a multiply-and-reduce over the contiguous `in` axis that XLA fuses with the conversion; on XLA:CPU that fused
reduce measured 2-10x slower than the dot inside the decode loop (llama-60m, batch 1), so REDUCE_ROWS is 0.

Axes: I input features, O output features, G groups per row (I / group), J features per group, M activation
rows.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernels import qmatmul_cpu

MODES = ("fp32", "bf16", "int8", "int4")
SCHEMES = ("sym", "asym", "best")
HEADS = ("same", "bf16", "int8", "fp32")
INT8 = {"group": 32, "scheme": "best", "head": "same"}  # what `quantize(params, "int8")` uses
INT4 = {"group": 32, "head": "int8"}  # what `quantize(params, "int4")` uses
REDUCE_ROWS = 0  # at most this many activation rows: multiply-reduce over the stored bytes; else a dense dot
KERNEL_ROWS = qmatmul_cpu.MAX_ROWS  # on CPU, at most this many rows of a uint8 kernel: the byte-reading kernel


@jax.tree_util.register_pytree_node_class
class QKernel:
  """A [.., I, O] matmul kernel stored as [.., O, I] int8/uint8 with per-group scales (and offsets), or bf16.

  Attributes:
    w_OI: the stored weight, transposed: int8 ("sym"), uint8 ("asym"/"best") or bfloat16; leading axes are
      stacked layers.
    scale_OG: float32 [.., O, G] scale of each group of I / G consecutive input features (int8), or None.
    zero_OG: float32 [.., O, G] offset of each group ("asym"/"best"), or None.
    compute_dtype: the dtype `astype` asked for; the product is computed in float32 and cast to it.
  """

  def __init__(self, w_OI, scale_OG=None, zero_OG=None, compute_dtype: str = "float32", bits: int = 8):
    self.w_OI, self.scale_OG, self.zero_OG, self.compute_dtype, self.bits = w_OI, scale_OG, zero_OG, compute_dtype, bits

  def tree_flatten(self):
    return (self.w_OI, self.scale_OG, self.zero_OG), (self.compute_dtype, self.bits)

  @classmethod
  def tree_unflatten(cls, aux, children):
    return cls(*children, compute_dtype=aux[0], bits=aux[1])

  @property
  def shape(self) -> tuple[int, ...]:
    s = tuple(self.w_OI.shape)
    return (*s[:-2], s[-1] * 8 // self.bits, s[-2])

  @property
  def ndim(self) -> int:
    return len(self.w_OI.shape)

  @property
  def dtype(self):
    return jnp.dtype(self.compute_dtype)

  @property
  def group(self) -> int | None:
    """Input features per scale group (None for bf16)."""
    return None if self.scale_OG is None else self.shape[-2] // self.scale_OG.shape[-1]

  def astype(self, dtype) -> "QKernel":
    return QKernel(self.w_OI, self.scale_OG, self.zero_OG, jnp.dtype(dtype).name, self.bits)

  def _grouped(self, x):  # [.., O, G] per-group values broadcast over the group's features: [.., O, I]
    return jnp.repeat(x, self.group, axis=-1)

  def dequantize(self):
    """The [.., I, O] float32 kernel this one approximates."""
    w = (self.w_OI if self.bits == 8 else _unpack4(self.w_OI)).astype(jnp.float32)
    if self.scale_OG is not None:
      w = w * self._grouped(self.scale_OG)
    if self.zero_OG is not None:
      w = w + self._grouped(self.zero_OG)
    return jnp.swapaxes(w, -1, -2)

  def __rmatmul__(self, x_MI):
    if self.ndim != 2 or x_MI.ndim != 2:
      raise ValueError(f"QKernel matmul takes a [M, I] activation and one [O, I] weight, found {x_MI.shape} "
                       f"and {self.w_OI.shape} (index stacked layers first)")
    x = x_MI.astype(jnp.float32)
    if self._kernel_ok(x.shape[0]):
      y = _qmatmul(self.bits, x, self.w_OI, self.scale_OG, self.zero_OG)
    elif x.shape[0] <= REDUCE_ROWS and self.bits == 8:
      y = self._reduce(x)
    else:
      y = x @ self.dequantize()
    return y.astype(self.compute_dtype)

  def _kernel_ok(self, rows: int) -> bool:
    return (rows <= KERNEL_ROWS and self.w_OI.dtype == jnp.uint8 and self.zero_OG is not None
            and qmatmul_cpu.supports(rows, self.shape[-2], self.scale_OG.shape[-1], self.bits)
            and jax.default_backend() == "cpu" and qmatmul_cpu.available())

  def _reduce(self, x_MI):
    o, i = self.w_OI.shape
    if self.scale_OG is None:
      return jnp.sum(self.w_OI.astype(jnp.float32)[:, None, :] * x_MI[None], axis=-1).T
    g = self.scale_OG.shape[-1]
    x_MGJ = x_MI.reshape(-1, g, i // g)
    w_OGJ = self.w_OI.astype(jnp.float32).reshape(o, g, i // g)
    y_OMG = jnp.sum(w_OGJ[:, None] * x_MGJ[None], axis=-1) * self.scale_OG[:, None, :]
    if self.zero_OG is not None:
      y_OMG = y_OMG + self.zero_OG[:, None, :] * jnp.sum(x_MGJ, axis=-1)[None]
    return jnp.sum(y_OMG, axis=-1).T


def _unpack4(w_OP):  # [.., O, I / 2] bytes -> [.., O, I] 4-bit values (block order of `_pack4`)
  b = w_OP.reshape(*w_OP.shape[:-1], -1, 16)
  return jnp.concatenate([b & 15, b >> 4], axis=-1).reshape(*w_OP.shape[:-1], -1)


def _pack4(q_OI):  # [.., O, I] values in [0, 15] -> [.., O, I / 2]: byte k of a 32-block holds k and k + 16
  b = q_OI.astype(jnp.uint8).reshape(*q_OI.shape[:-1], -1, 2, 16)
  return (b[..., 0, :] | (b[..., 1, :] << 4)).reshape(*q_OI.shape[:-1], -1)


def _dense(bits, x_MI, q_OI, s_OG, z_OG):
  return x_MI @ QKernel(q_OI, s_OG, z_OG, bits=bits).dequantize()


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _qmatmul(bits, x_MI, q_OI, s_OG, z_OG):
  return jax.lax.platform_dependent(x_MI, q_OI, s_OG, z_OG, cpu=functools.partial(qmatmul_cpu.matmul, bits=bits),
                                    default=functools.partial(_dense, bits))


@_qmatmul.defjvp
def _qmatmul_jvp(bits, primals, tangents):
  x, q, s, z = primals
  tx, _, ts, tz = tangents
  _, ty = jax.jvp(lambda x, s, z: _dense(bits, x, q, s, z), (x, s, z), (tx, ts, tz))
  return _qmatmul(bits, x, q, s, z), ty


def _check_group(i: int, group: int) -> int:
  group = i if group in (0, None) else int(group)
  if group < 1 or i % group:
    raise ValueError(f"int8 group must divide the kernel's input features ({i}), found {group}")
  return group


def quantize_kernel(kernel_IO, mode: str, *, group: int = 0, scheme: str = "sym") -> QKernel:
  """One [.., I, O] kernel as a QKernel.

  Args:
    kernel_IO: the float kernel, [.., in, out].
    mode: "int8", "int4" (min-max in 16 levels, groups of a multiple of 32 inputs, two values a byte; `scheme`
      is ignored) or "bf16" (weights rounded to bfloat16; `group` and `scheme` are ignored).
    group: input features per scale group; 0 = the whole row (one scale per output channel; int8 only).
    scheme: "sym" (absmax, int8 in [-127, 127]), "asym" (min-max, uint8 with a per-group offset) or "best"
      (per group, the one of the two with the smaller squared error; stored as uint8 with an offset).
  """
  w_OI = jnp.swapaxes(jnp.asarray(kernel_IO, jnp.float32), -1, -2)
  if mode == "bf16":
    return QKernel(w_OI.astype(jnp.bfloat16))
  if mode == "int4":
    i = w_OI.shape[-1]
    if not group or group % 32 or i % group:
      raise ValueError(f"int4 groups must be a multiple of 32 inputs dividing {i}, found {group}")
    w = w_OI.reshape(*w_OI.shape[:-1], i // group, group)
    lo, hi = jnp.min(w, axis=-1), jnp.max(w, axis=-1)
    s = jnp.where(hi > lo, (hi - lo) / 15.0, 1.0)
    q = jnp.clip(jnp.round((w - lo[..., None]) / s[..., None]), 0, 15).reshape(w_OI.shape)
    return QKernel(_pack4(q), s, lo, bits=4)
  if mode != "int8":
    raise ValueError(f"quantize_kernel mode must be 'int8', 'int4' or 'bf16', found {mode!r}")
  if scheme not in SCHEMES:
    raise ValueError(f"int8 scheme must be one of {SCHEMES}, found {scheme!r}")
  i = w_OI.shape[-1]
  group = _check_group(i, group)
  w = w_OI.reshape(*w_OI.shape[:-1], i // group, group)
  amax = jnp.max(jnp.abs(w), axis=-1)
  s_sym = jnp.where(amax > 0, amax / 127.0, 1.0)
  q_sym = jnp.clip(jnp.round(w / s_sym[..., None]), -127, 127)
  if scheme == "sym":
    return QKernel(q_sym.astype(jnp.int8).reshape(w_OI.shape), s_sym)
  lo, hi = jnp.min(w, axis=-1), jnp.max(w, axis=-1)
  s_asym = jnp.where(hi > lo, (hi - lo) / 255.0, 1.0)
  q_asym = jnp.clip(jnp.round((w - lo[..., None]) / s_asym[..., None]), 0, 255)
  if scheme == "best":  # a symmetric group as uint8: q + 128 with offset -128 s
    err_sym = jnp.sum(jnp.square(q_sym * s_sym[..., None] - w), axis=-1)
    err_asym = jnp.sum(jnp.square(q_asym * s_asym[..., None] + lo[..., None] - w), axis=-1)
    use_sym = err_sym < err_asym
    q_asym = jnp.where(use_sym[..., None], q_sym + 128.0, q_asym)
    s_asym = jnp.where(use_sym, s_sym, s_asym)
    lo = jnp.where(use_sym, -128.0 * s_sym, lo)
  return QKernel(q_asym.astype(jnp.uint8).reshape(w_OI.shape), s_asym, lo)


def is_quantized(params) -> bool:
  return any(isinstance(x, QKernel) for x in jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, QKernel)))


def _quantize_tree(tree, fn):
  if isinstance(tree, dict):
    return {k: (fn(v) if k == "kernel" and not isinstance(v, dict) else _quantize_tree(v, fn)) for k, v in tree.items()}
  return tree


@functools.partial(jax.jit, static_argnames=("mode", "group", "scheme", "head"))
def _quantize(params, mode, group, scheme, head):
  def int8(kernel_IO, group=group, scheme=scheme):
    g = group if group and kernel_IO.shape[-2] % group == 0 else 0
    return quantize_kernel(kernel_IO, "int8", group=g, scheme=scheme)

  def fn(kernel_IO):
    if mode != "int4":
      return int8(kernel_IO) if mode == "int8" else quantize_kernel(kernel_IO, mode)
    if kernel_IO.shape[-2] % group:  # inputs the 4-bit blocks do not tile: int8
      return int8(kernel_IO, INT8["group"], INT8["scheme"])
    return quantize_kernel(kernel_IO, "int4", group=group)
  head_fn = {"same": fn, "bf16": functools.partial(quantize_kernel, mode="bf16"), "fp32": None,
             "int8": functools.partial(int8, group=INT8["group"], scheme=INT8["scheme"])}[head]
  out = _quantize_tree({k: v for k, v in params.items() if k != "lm_head"}, fn)
  if "lm_head" in params:
    out["lm_head"] = params["lm_head"] if head_fn is None else _quantize_tree(params["lm_head"], head_fn)
  elif "embed" in params and head_fn is not None:  # tied: quantize the projection, keep the table for lookups
    out["lm_head"] = {"kernel": head_fn(params["embed"]["embedding"].T)}
  return out


def quantize(params, mode: str, *, group: int | None = None, scheme: str | None = None, head: str | None = None):
  """A transformer param tree whose matmul kernels are QKernels of `mode` ("int8", "int4" or "bf16"; "fp32":
  unchanged).

  Args:
    params: params of `jaxlab.models.transformer` (any tree whose matmul weights sit under "kernel" keys,
      [.., in, out]). Already quantized params are returned as they are.
    mode: "fp32" (no change), "bf16" (weights rounded to bfloat16), "int8" or "int4" (4-bit min-max groups;
      a kernel whose inputs the groups do not tile is int8).
    group: input features per scale group (int8: 0 is one scale per output channel; int4: a multiple of 32);
      default `INT8["group"]` / `INT4["group"]`. An int8 kernel whose input features it does not divide gets
      one scale per output channel.
    scheme: int8 "sym", "asym" or "best" (see the module docstring); default `INT8["scheme"]`.
    head: the vocabulary projection: "same" (as the other kernels), "bf16", "int8" (`INT8`'s), or "fp32" (kept
      as it is: a tied model then projects through the embedding table); default `INT8["head"]` for int8,
      `INT4["head"]` for int4, "same" for bf16.

  Returns:
    the same tree with each "kernel" a QKernel; a tied-embedding model also gets `lm_head` (its forward then
    projects through it instead of the table, which stays for the token lookup) unless `head="fp32"`.
  """
  if mode not in MODES:
    raise ValueError(f"weights mode must be one of {MODES}, found {mode!r}")
  defaults = INT4 if mode == "int4" else INT8
  group = defaults["group"] if group is None else int(group)
  scheme = INT8["scheme"] if scheme is None else scheme
  head = (defaults["head"] if mode in ("int8", "int4") else "same") if head is None else head
  if mode == "int4" and (group < 32 or group % 32):
    raise ValueError(f"int4 groups must be a positive multiple of 32 inputs, found {group}")
  if scheme not in SCHEMES or head not in HEADS:
    raise ValueError(f"scheme must be one of {SCHEMES} and head one of {HEADS}, found {scheme!r}, {head!r}")
  if mode == "fp32" or is_quantized(params):
    return params
  return _quantize(params, mode, group, scheme, head)


def weight_bytes(params) -> int:
  """Bytes of every array in `params` (QKernels count their stored int8/bf16 bytes, scales and offsets)."""
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
