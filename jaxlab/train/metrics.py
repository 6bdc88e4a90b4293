"""Training metrics: the machine's peak matmul FLOP/s, MFU, throughput, `metrics.jsonl` and a progress bar.

Model FLOPs utilization (MFU) is achieved model FLOP/s over the hardware peak, as defined in PaLM
(arXiv 2204.02311, appendix B). The peak is measured, not looked up: on CPU it is the best NumPy (BLAS) fp32
GEMM rate on this machine, on accelerators the best jitted bf16 matmul rate of one device times the device
count. The measurement runs once per machine and is cached on disk (keyed by host, CPU count and backend,
with its date), so MFU is comparable across runs; JAXLAB_PEAK_FLOPS overrides it.
"""
from __future__ import annotations

import datetime
import functools
import json
import math
import os
import platform
import time

import jax
import numpy as np

_CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "jaxlab", "peak_flops.json")


def _best_rate(fn, flops: float, repeats: int) -> float:
  fn()
  best = math.inf
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t0)
  return flops / best


def measure_numpy_gemm_flops(n: int = 2048, repeats: int = 5) -> float:
  """Best fp32 FLOP/s of an n x n x n NumPy matmul (2 n^3 FLOPs), over all BLAS threads."""
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32)
  return _best_rate(lambda: a @ b, 2.0 * n ** 3, repeats)


def measure_device_matmul_flops(n: int = 8192, repeats: int = 5, dtype="bfloat16") -> float:
  """Best FLOP/s of a jitted n x n matmul on the first device, times the number of devices."""
  import jax.numpy as jnp
  dev = jax.local_devices()[0]
  a = jax.device_put(jnp.ones((n, n), dtype), dev)
  f = jax.jit(lambda x: x @ x)
  return _best_rate(lambda: f(a).block_until_ready(), 2.0 * n ** 3, repeats) * jax.device_count()


def _key() -> str:
  backend = jax.default_backend()
  kind = jax.devices()[0].device_kind if backend != "cpu" else platform.processor() or platform.machine()
  return f"{platform.node()}|{os.cpu_count()}|{backend}|{kind}|{jax.device_count() if backend != 'cpu' else 1}"


def _load() -> float:
  try:
    return os.getloadavg()[0]
  except OSError:
    return 0.0


@functools.lru_cache(maxsize=None)
def peak_flops() -> float:
  """The machine's peak matmul FLOP/s: measured once per machine, then always read from the cache.

  The cache entry records when it was measured and the 1-minute load average at the time, so MFU figures of
  different runs on one machine share one denominator. JAXLAB_PEAK_FLOPS overrides it; `remeasure_peak_flops`
  replaces the cached value (e.g. once the machine is quiet).
  """
  if os.environ.get("JAXLAB_PEAK_FLOPS"):
    return float(os.environ["JAXLAB_PEAK_FLOPS"])
  entry = _read_cache().get(_key())
  if isinstance(entry, (int, float)):
    entry = {"flops": float(entry)}
  if isinstance(entry, dict) and entry.get("flops", 0) > 0:
    return float(entry["flops"])
  return remeasure_peak_flops()


def remeasure_peak_flops() -> float:
  """Measures the peak now and stores it (with the date and load average) as this machine's cached value."""
  value = measure_numpy_gemm_flops() if jax.default_backend() == "cpu" else measure_device_matmul_flops()
  cached = _read_cache()
  cached[_key()] = {"flops": value, "measured": datetime.date.today().isoformat(), "load": round(_load(), 2)}
  try:
    os.makedirs(os.path.dirname(_CACHE), exist_ok=True)
    tmp = f"{_CACHE}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
      json.dump(cached, f, indent=1)
    os.replace(tmp, _CACHE)
  except OSError:
    pass
  peak_flops.cache_clear()
  return value


def _read_cache() -> dict:
  try:
    with open(_CACHE) as f:
      cached = json.load(f)
  except (OSError, ValueError):
    return {}
  return cached if isinstance(cached, dict) else {}


def mfu(flops_per_token: float, tokens_per_s: float, peak: float | None = None) -> float:
  """Model FLOPs utilization: flops_per_token * tokens_per_s / peak FLOP/s."""
  peak = peak_flops() if peak is None else peak
  return flops_per_token * tokens_per_s / peak


class MetricsWriter:
  """Appends one JSON object per line to `path` (flushed per record, so a killed run keeps what it logged)."""

  def __init__(self, path: str | None):
    self.path = path
    self._f = None
    if path is not None and jax.process_index() == 0:
      os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
      self._f = open(path, "a")

  def write(self, record: dict) -> None:
    if self._f is None:
      return
    self._f.write(json_line(record))
    self._f.flush()

  def close(self) -> None:
    if self._f is not None:
      self._f.close()
      self._f = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def _plain(v):
  if isinstance(v, (np.generic, np.ndarray, jax.Array)):
    v = np.asarray(v).tolist()
  if isinstance(v, float) and not math.isfinite(v):
    return None
  return v


def json_line(record: dict) -> str:
  """One metrics.jsonl line: strict JSON, arrays as lists, non-finite numbers as null."""
  return json.dumps({k: _plain(v) for k, v in record.items()}, allow_nan=False) + "\n"


def read_jsonl(path: str) -> list[dict]:
  """The records of a metrics.jsonl (a truncated last line from a killed run is skipped).

  metrics.jsonl is strict JSON: a non-finite number is written as null, and read back here as NaN.
  """
  out = []
  if not os.path.exists(path):
    return out
  with open(path) as f:
    for line in f:
      try:
        record = json.loads(line)
      except ValueError:
        continue
      out.append({k: math.nan if v is None else v for k, v in record.items()})
  return out


class Throughput:
  """Tokens/s over the steps since the last `rate()` call (compile time excluded by `reset()` after step 1)."""

  def __init__(self):
    self.reset()

  def reset(self):
    self._t0, self._tokens = time.perf_counter(), 0.0

  def add(self, tokens: float):
    self._tokens += tokens

  def rate(self) -> float:
    dt = time.perf_counter() - self._t0
    r = self._tokens / dt if dt > 0 and self._tokens else float("nan")
    self.reset()
    return r


def progress(total: int, initial: int = 0, desc: str = "train"):
  """A tqdm bar (disabled on processes other than 0 and when JAXLAB_NO_PROGRESS is set)."""
  from tqdm.auto import tqdm
  disable = jax.process_index() != 0 or bool(os.environ.get("JAXLAB_NO_PROGRESS"))
  return tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, disable=disable, mininterval=0.5)
