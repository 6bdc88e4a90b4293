"""The CPU matmul that reads group-quantized 8- or 4-bit weights as bytes: `qmatmul_cpu.cc` through XLA's FFI.

`matmul(x_MI, q_OI, s_OG, z_OG)` is x @ (q * s + z)^T with each group of I / G consecutive inputs of an output
row sharing one scale and offset (the layout of `jaxlab.generate.quant.QKernel`, "asym"/"best"), for at most
`MAX_ROWS` activation rows: decoding's matmuls, which on XLA:CPU otherwise read the dequantized float32 weights
(XLA hoists the loop-invariant dequantization out of the decode loop) or run an unvectorized fused reduce.

The source is compiled on first use with the system C++ compiler for this CPU (`-O3 -march=native`) into
`$JAXLAB_CACHE/kernels` (default `~/.cache/jaxlab`), keyed by the source, the flags and jaxlib's version, and
registered as the FFI target `jaxlab_qmatmul_u8`. `available()` is False (with the reason in `why_unavailable()`)
when no compiler or FFI headers are found; callers then keep XLA's dot.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

TARGET = "jaxlab_qmatmul_u8"
MAX_ROWS = 16  # activation rows the kernel takes; `group` must be a multiple of LANES
LANES = 16
SOURCE = os.path.join(os.path.dirname(__file__), "qmatmul_cpu.cc")
FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-std=c++17", "-shared", "-fPIC")
_why: list[str] = []


def _cache_dir() -> str:
  return os.path.join(os.environ.get("JAXLAB_CACHE") or os.path.expanduser("~/.cache/jaxlab"), "kernels")


def _cpu_flags() -> str:
  """This CPU's feature flags (-march=native builds for them, so a cache shared between machines keys on them)."""
  try:
    with open("/proc/cpuinfo") as f:
      return next((line for line in f if line.startswith(("flags", "Features"))), platform.processor())
  except OSError:
    return platform.processor()


def _build(flags=FLAGS) -> str:
  """The shared library built from SOURCE with `flags` (cached; compiled on a miss)."""
  compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
  if compiler is None:
    raise RuntimeError("no C++ compiler (g++, c++ or clang++ on PATH, or $CXX)")
  with open(SOURCE, "rb") as f:
    key = " ".join((compiler, *flags, jax.__version__, platform.machine(), _cpu_flags())).encode()
    key = hashlib.sha256(f.read() + key).hexdigest()[:16]
  path = os.path.join(_cache_dir(), f"qmatmul_cpu-{key}.so")
  if not os.path.exists(path):
    os.makedirs(_cache_dir(), exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=_cache_dir())
    os.close(fd)
    cmd = [compiler, *flags, f"-I{jax.ffi.include_dir()}", SOURCE, "-o", tmp]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
      os.unlink(tmp)
      error = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip()[:200])
      raise RuntimeError(f"{compiler} failed on {SOURCE}: {error}")
    os.replace(tmp, path)  # atomic: concurrent builders each write their own file
  return path


def register(path: str, target: str = TARGET) -> None:
  """Registers the handler of the library at `path` as the cpu FFI target `target`."""
  lib = ctypes.cdll.LoadLibrary(path)
  jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(lib.JaxlabQMatmulU8), platform="cpu")


@functools.lru_cache(maxsize=None)
def available() -> bool:
  """Whether the kernel is compiled and registered (built on the first call); `JAXLAB_QMATMUL=0` turns it off."""
  if os.environ.get("JAXLAB_QMATMUL", "1") == "0":
    _why.append("JAXLAB_QMATMUL=0")
    return False
  try:
    register(_build())
  except (OSError, RuntimeError, subprocess.SubprocessError) as e:
    _why.append(str(e))
    return False
  return True


def why_unavailable() -> str:
  """Why `available()` is False ("" when it is True or was not asked)."""
  return "; ".join(_why)


def supports(m: int, i: int, g: int, bits: int = 8) -> bool:
  """Whether `matmul` takes M activation rows against I inputs in G groups of `bits`-bit weights."""
  block = LANES if bits == 8 else 2 * LANES
  return bits in (8, 4) and 1 <= m <= MAX_ROWS and g >= 1 and i % g == 0 and (i // g) % block == 0


def matmul(x_MI, q_OI, s_OG, z_OG, *, bits: int = 8, target: str = TARGET):
  """x[M, I] @ (q[O, I] * s + z)^T -> float32 [M, O], s and z broadcast over each of G groups of I / G inputs.

  With `bits=4`, q is [O, I / 2]: in each block of 32 inputs, byte k holds input k (low nibble) and k + 16.
  """
  m, i = x_MI.shape
  o, g = s_OG.shape
  if (not supports(m, i, g, bits) or q_OI.dtype != jnp.uint8 or q_OI.shape != (o, i * bits // 8)
      or z_OG.shape != (o, g)):
    raise ValueError(f"qmatmul takes x [M<={MAX_ROWS}, I] and uint8 q [O, I * bits / 8] (bits 8 or 4) in groups "
                     f"of a multiple of {LANES} (8 bits) or {2 * LANES} (4 bits) inputs with s, z [O, G], found "
                     f"bits {bits}, x {x_MI.shape}, q {q_OI.shape} {q_OI.dtype}, s {s_OG.shape}, z {z_OG.shape}")
  if target == TARGET and not available():
    raise RuntimeError(f"the qmatmul CPU kernel is unavailable: {why_unavailable()}")
  out = jax.ShapeDtypeStruct((m, o), jnp.float32)
  return jax.ffi.ffi_call(target, out, vmap_method="sequential")(
      x_MI.astype(jnp.float32), q_OI, s_OG.astype(jnp.float32), z_OG.astype(jnp.float32), bits=np.int32(bits))
