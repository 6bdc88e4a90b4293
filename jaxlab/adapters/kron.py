"""CDKA: Component Designed Kronecker Adapters (arXiv:2602.01267).

In the paper's [out, in] orientation, dW = s * sum_{i=1..r} B_i (kron) A_i with B_i [d_out/r1, r2] and
A_i [r1, d_in/r2]; rank(dW) <= r * r1 * r2 (sharper: r * min(r1, d_in/r2) * min(r2, d_out/r1), capped by
min(d_in, d_out); random factors reach it). r1 = r2 = 1 is LoRA of rank r with B = [B_1 .. B_r] and
A = [A_1; ..; A_r]. jaxlab kernels are [in, out], so the kernel update is dW^T. Params per targeted kernel path (same targets as `lora`):

  {"layers/attn/q/kernel": {"kron_a": [L, r, r1, d_in/r2], "kron_b": [L, r, d_out/r1, r2]}}

Init: A_i kaiming-uniform (a=sqrt 5, fan_in d_in/r2, as torch on an [r1, d_in/r2] weight; r1=r2=1 gives
LoRA's init), B_i zeros. Stabilization s = alpha / sqrt(r * r2) (a second-hand convention on which two
reimplementations agree; with r2 = 1 it is rsLoRA's alpha/sqrt(r)).

`kron_matvec` applies dW without materializing it: with X = x reshaped [r2, d_in/r2] (row-major),
(B (kron) A) vec(X) = vec(B X A^T), so y = sum_i B_i X A_i^T flattened row-major to d_out.
`nearest_kron` is Van Loan's rearrangement + SVD: the best sum of r Kronecker products in Frobenius norm.

Logical axes: kron_a ("rank", "kron_r1", "kron_in"), kron_b ("rank", "kron_out", "kron_r2"), leading "layers".
Axes: L layers, r components, p = d_out/r1, q = r2, m = r1, n = d_in/r2.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.adapters import lora
from jaxlab.nn import axes

RECOMMENDED = (2, 8)  # (r1, r2), second-hand

# Logical axes of the adapter leaves; a tree holding a base model and its adapters takes `axis_rules(base_rules)`.
AXES = axes.rules((r"kron_a", ("rank", "kron_r1", "kron_in"), "kron_in"),
                  (r"kron_b", ("rank", "kron_out", "kron_r2"), "kron_r2"))


def axis_rules(base: axes.Rules) -> axes.Rules:
  """`base` plus the adapter leaves' rules (as `lora.axis_rules`): base params and adapters together."""
  return base + AXES


@dataclasses.dataclass(frozen=True)
class Config:
  r: int = 4
  r1: int = 2
  r2: int = 8
  alpha: float = 16.0
  targets: tuple[str, ...] = ("q", "v")

  def __post_init__(self):
    if not isinstance(self.targets, tuple):
      object.__setattr__(self, "targets", (self.targets,) if isinstance(self.targets, str) else tuple(self.targets))
    for name in ("r", "r1", "r2"):
      if getattr(self, name) <= 0:
        raise ValueError(f"kron.Config: {name} must be positive, found {getattr(self, name)}")
    if not self.targets:
      raise ValueError("kron.Config: targets must name at least one kernel, found none")
    lora.compile_targets(self.targets)

  @property
  def scale(self) -> float:
    return self.alpha / math.sqrt(self.r * self.r2)

  def replace(self, **kw) -> "Config":
    return dataclasses.replace(self, **kw)


PRESETS = {"recommended": Config(r=4, r1=2, r2=8, alpha=16.0),
           "official": Config(r=8, r1=2, r2=2, alpha=64.0, targets=lora.ALL_LINEAR)}


def _check_dims(path: str, d_in: int, d_out: int, r1: int, r2: int) -> None:
  if d_out % r1 or d_in % r2:
    raise ValueError(f"{path}: kernel [in={d_in}, out={d_out}] needs r1 | d_out and r2 | d_in, "
                     f"found r1={r1}, r2={r2}")


def init(cfg: Config, base_params, key, dtype=jnp.float32) -> dict:
  """Adapter params for every kernel matching `cfg.targets` (A_i kaiming-uniform, B_i zeros).

  Args:
    cfg: r, r1, r2, alpha, targets.
    base_params: the model's params (arrays or ShapeDtypeStructs), only shapes are read.
    key: PRNG key.
    dtype: adapter param dtype.
  """
  paths = lora.target_paths(base_params, cfg.targets)
  out = {}
  for k, (path, shape) in zip(jax.random.split(key, len(paths)), paths.items()):
    *lead, d_in, d_out = shape
    _check_dims(path, d_in, d_out, cfg.r1, cfg.r2)
    n, p = d_in // cfg.r2, d_out // cfg.r1
    out[path] = {"kron_a": lora.kaiming_uniform(k, (*lead, cfg.r, cfg.r1, n), n, dtype),
                 "kron_b": jnp.zeros((*lead, cfg.r, p, cfg.r2), dtype)}
  return out


def kron_sum(a, b):
  """sum_i B_i (kron) A_i in [out, in] orientation. a: [.., r, m, n], b: [.., r, p, q] -> [.., p*m, q*n]."""
  *lead, _, m, n = a.shape
  p, q = b.shape[-2:]
  return jnp.einsum("...ipq,...imn->...pmqn", b, a).reshape(*lead, p * m, q * n)


def kron_matvec(x, a, b, scale: float = 1.0):
  """x @ (scale * sum_i B_i (kron) A_i)^T without forming the matrix.

  Args:
    x: [..., d_in] inputs.
    a: [r, r1, d_in/r2] components A_i (one layer: no leading stacked axis).
    b: [r, d_out/r1, r2] components B_i.
    scale: s.
  """
  _, m, n = a.shape
  _, p, q = b.shape
  if x.shape[-1] != q * n:
    raise ValueError(f"kron_matvec: x has last dim {x.shape[-1]}, expected r2 * d_in/r2 = {q * n}")
  x_qn = x.reshape(*x.shape[:-1], q, n)
  t = jnp.einsum("...qn,imn->...iqm", x_qn, a)  # X A_i^T: [.., r, q, m]
  y = jnp.einsum("ipq,...iqm->...pm", b, t)  # sum_i B_i X A_i^T
  return scale * y.reshape(*x.shape[:-1], p * m)


def delta(leaf, scale: float):
  """The [.., in, out] kernel update scale * dW^T, in fp32."""
  return scale * jnp.swapaxes(kron_sum(leaf["kron_a"].astype(jnp.float32), leaf["kron_b"].astype(jnp.float32)),
                              -1, -2)


def deltas(adapter, cfg: Config) -> dict:
  return {p: delta(leaf, cfg.scale) for p, leaf in adapter.items()}


def merge(base_params, adapter, cfg: Config):
  """Effective params W + s * dW^T for every adapted kernel."""
  return lora.add_deltas(base_params, deltas(adapter, cfg))


def unmerge(merged_params, adapter, cfg: Config):
  return lora.add_deltas(merged_params, deltas(adapter, cfg), sign=-1.0)


# ------------------------------------------------------------------------------------------ budgets

def num_params(d_in: int, d_out: int, r: int, r1: int, r2: int) -> int:
  """Trainable params of one [out, in] matrix's adapter: r * (d_out/r1 * r2 + r1 * d_in/r2)."""
  return r * (d_out // r1 * r2 + r1 * (d_in // r2))


def rank_bound(d_in: int, d_out: int, r: int, r1: int, r2: int) -> int:
  """max rank of dW: r * rank(B_i) * rank(A_i) <= r * min(r2, d_out/r1) * min(r1, d_in/r2), capped."""
  return min(d_in, d_out, r * min(r2, d_out // r1) * min(r1, d_in // r2))


def _divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def feasible_configs(d_in: int, d_out: int, budget: int) -> list[dict]:
  """Every (r, r1, r2) with r1 | d_out, r2 | d_in and at most `budget` params, with params and rank bound.

  Args:
    d_in, d_out: the layer shape.
    budget: trainable parameters allowed for this one matrix (LoRA rank k uses k * (d_in + d_out)).
  """
  out = []
  for r1 in _divisors(d_out):
    for r2 in _divisors(d_in):
      per = num_params(d_in, d_out, 1, r1, r2)
      for r in range(1, budget // per + 1):
        out.append({"r": r, "r1": r1, "r2": r2, "params": r * per,
                    "rank_bound": rank_bound(d_in, d_out, r, r1, r2)})
  return out


def recommend(d_in: int, d_out: int, budget: int, prefer: str = "rank") -> dict:
  """One config from `feasible_configs`.

  prefer="rank": the highest (tight) rank bound; ties go to the shape nearest the recommended (r1, r2) = (2, 8)
    in |log2| distance, then to the one using more of the budget, then to fewer components r. For large square
    layers this reaches full rank with r1, r2 near sqrt(d).
  prefer="shape": the feasible (r1, r2) nearest (2, 8) with as many components r as the budget allows
    (the second-hand guideline: keep the component shape, spend the budget on r).
  """
  configs = feasible_configs(d_in, d_out, budget)
  if not configs:
    cheapest = min(num_params(d_in, d_out, 1, a, b) for a in _divisors(d_out) for b in _divisors(d_in))
    raise ValueError(f"no CDKA config fits a budget of {budget} params for [out={d_out}, in={d_in}] "
                     f"(the cheapest needs {cheapest})")
  t1, t2 = RECOMMENDED

  def dist(c):
    return abs(math.log2(c["r1"] / t1)) + abs(math.log2(c["r2"] / t2))
  if prefer == "rank":
    return min(configs, key=lambda c: (-c["rank_bound"], dist(c), -c["params"], c["r"]))
  if prefer == "shape":
    return min(configs, key=lambda c: (dist(c), -c["r"], -c["rank_bound"]))
  raise ValueError(f"prefer must be 'rank' or 'shape', found {prefer!r}")


# -------------------------------------------------------------------------------- nearest Kronecker

def rearrange(M, r1: int, r2: int) -> np.ndarray:
  """Van Loan's R(M): [p*q, m*n], row (i, l) = vec of block (i, l) so that R(B kron A) = vec(B) vec(A)^T."""
  M = np.asarray(M)
  d_out, d_in = M.shape
  p, m, q, n = d_out // r1, r1, r2, d_in // r2
  return M.reshape(p, m, q, n).transpose(0, 2, 1, 3).reshape(p * q, m * n)


def nearest_kron(M, r1: int, r2: int, r: int = 1):
  """The best sum of r Kronecker products B_i [d_out/r1, r2] (kron) A_i [r1, d_in/r2] to M [out, in].

  Returns:
    (a [r, r1, d_in/r2], b [r, d_out/r1, r2], relative Frobenius error); kron_sum(a, b) is the approximation.
  """
  M = np.asarray(M, np.float64)
  d_out, d_in = M.shape
  if d_out % r1 or d_in % r2:
    raise ValueError(f"nearest_kron: M [{d_out}, {d_in}] needs r1 | d_out and r2 | d_in, found r1={r1}, r2={r2}")
  p, n = d_out // r1, d_in // r2
  u, s, vt = np.linalg.svd(rearrange(M, r1, r2), full_matrices=False)
  r = min(r, s.size)
  root = np.sqrt(s[:r])
  b = (u[:, :r] * root).T.reshape(r, p, r2)
  a = (vt[:r].T * root).T.reshape(r, r1, n)
  total = float(np.sum(s ** 2))
  err = math.sqrt(max(total - float(np.sum(s[:r] ** 2)), 0.0) / total) if total > 0 else 0.0
  return a, b, err
