"""Learning-rate schedules as optax-style callables `step -> lr` (jit-safe).

`warmup_cosine` is the linear warmup then cosine decay to a floor fraction of the peak used for LLaMA
pretraining (arXiv 2302.13971, section 2.2: cosine to 10% of the peak, 2000 warmup steps) and by GaLore
(arXiv 2403.03507); the cosine follows SGDR (arXiv 1608.03983) without restarts.
"""
from __future__ import annotations

from typing import Callable, Literal

import jax.numpy as jnp

from jaxlab import choices

Schedule = Callable[[jnp.ndarray], jnp.ndarray]


def _check(peak_lr: float, total_steps: int, warmup_steps: int, floor: float):
  if peak_lr < 0:
    raise ValueError(f"peak_lr must be >= 0, found {peak_lr}")
  if total_steps < 1:
    raise ValueError(f"total_steps must be >= 1, found {total_steps}")
  if not 0 <= warmup_steps <= total_steps:
    raise ValueError(f"warmup_steps must be in [0, total_steps={total_steps}], found {warmup_steps}")
  if not 0.0 <= floor <= 1.0:
    raise ValueError(f"floor must be a fraction in [0, 1], found {floor}")


def _warmup(step, peak_lr: float, warmup_steps: int):
  """peak * (step + 1) / warmup: the first update already uses a non-zero rate, the last warmup step the peak."""
  return peak_lr * jnp.minimum(1.0, (step + 1.0) / max(warmup_steps, 1))


def warmup_cosine(peak_lr: float, total_steps: int, warmup_steps: int = 0, floor: float = 0.1) -> Schedule:
  """Linear warmup to `peak_lr` over `warmup_steps`, then cosine decay to `floor * peak_lr` at `total_steps`.

  lr(s) = peak * (s + 1) / W                                    for s < W
  lr(s) = peak * (floor + (1 - floor) * (1 + cos(pi * p)) / 2),  p = min(1, (s - W) / max(1, T - W))  otherwise

  Args:
    peak_lr: the learning rate reached at the end of warmup.
    total_steps: number of optimizer steps T; the schedule stays at the floor afterwards.
    warmup_steps: W, steps of linear warmup.
    floor: final rate as a fraction of `peak_lr`.
  """
  _check(peak_lr, total_steps, warmup_steps, floor)

  def schedule(step):
    s = jnp.asarray(step, jnp.float32)
    p = jnp.clip((s - warmup_steps) / max(1, total_steps - warmup_steps), 0.0, 1.0)
    decay = peak_lr * (floor + (1.0 - floor) * 0.5 * (1.0 + jnp.cos(jnp.pi * p)))
    return jnp.where(s < warmup_steps, _warmup(s, peak_lr, warmup_steps), decay)
  return schedule


def warmup_linear(peak_lr: float, total_steps: int, warmup_steps: int = 0, floor: float = 0.0) -> Schedule:
  """Linear warmup, then linear decay to `floor * peak_lr` at `total_steps` (same arguments as `warmup_cosine`)."""
  _check(peak_lr, total_steps, warmup_steps, floor)

  def schedule(step):
    s = jnp.asarray(step, jnp.float32)
    p = jnp.clip((s - warmup_steps) / max(1, total_steps - warmup_steps), 0.0, 1.0)
    decay = peak_lr * (1.0 - (1.0 - floor) * p)
    return jnp.where(s < warmup_steps, _warmup(s, peak_lr, warmup_steps), decay)
  return schedule


def warmup_constant(peak_lr: float, total_steps: int = 1, warmup_steps: int = 0, floor: float = 1.0) -> Schedule:
  """Linear warmup, then constant `peak_lr` (`total_steps` and `floor` accepted for a uniform signature)."""
  _check(peak_lr, max(total_steps, warmup_steps, 1), warmup_steps, floor)

  def schedule(step):
    s = jnp.asarray(step, jnp.float32)
    return jnp.where(s < warmup_steps, _warmup(s, peak_lr, warmup_steps), jnp.float32(peak_lr))
  return schedule


SCHEDULES = {"cosine": warmup_cosine, "linear": warmup_linear, "constant": warmup_constant}
Schedule = Literal["cosine", "linear", "constant"]  # the names of SCHEDULES, as a config field's type
choices.same(SCHEDULES, Schedule)


def get(name: str, peak_lr: float, total_steps: int, warmup_steps: int = 0, floor: float = 0.1) -> Schedule:
  """A schedule by name: "cosine", "linear" or "constant" (all with linear warmup)."""
  if name not in SCHEDULES:
    raise ValueError(f"unknown schedule {name!r}, expected one of {sorted(SCHEDULES)}")
  return SCHEDULES[name](peak_lr, total_steps, warmup_steps, floor)
