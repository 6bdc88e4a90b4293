"""GRPO (Shao et al., DeepSeekMath, arXiv 2402.03300): its config and group-normalized advantages.

G completions are sampled per prompt; each completion's advantage is its reward minus its group's mean,
divided by the group's standard deviation ("std", GRPO) or not ("none", Dr. GRPO, arXiv 2503.20783). The
standard deviation is the unbiased one (ddof 1) plus `eps`, as TRL computes it. The clipped loss itself is
`jaxlab.losses.grpo_objective`; the resumable loop is `jaxlab.train.rl_loop`.

Axes: B = P * G sequences (prompt-major: rows p * G ... p * G + G - 1 share prompt p), P prompts, G group.
"""
from __future__ import annotations

import dataclasses
from typing import Literal

import jax.numpy as jnp

from jaxlab import choices, losses

Scale = Literal["std", "none"]
SCALES = choices.values(Scale)


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
  """One GRPO run's hyperparameters.

  prompts_per_batch: P prompts per rollout batch; group_size: G samples each (B = P * G rows).
  max_new_tokens: completion length cap (also the normalizer of aggregation "constant").
  temperature, top_k, top_p: the sampling policy; log-probs are taken under `logits / temperature`.
  stop_tokens: token ids ending a completion (with the model's eos); stop_strings: text that ends it, applied
    to decoded text (needs a `decode`).
  beta: k3-KL coefficient to the frozen reference (0: no reference forward at all).
  clip_low, clip_high: PPO ratio clip range [1 - clip_low, 1 + clip_high] (DAPO's clip-higher when unequal).
  aggregation: "seq_mean" | "token_mean" | "constant" (`jaxlab.losses` docstring).
  scale: advantage scaling, "std" or "none".
  updates_per_batch: gradient steps on each rollout batch (mu), all with the sampling policy's old log-probs.
  eps: added to the group std.
  rollout_slots: rows decoded at a time by continuous batching (`rollout.sample_rollout`'s slots; 0: all B rows in
    one batch).
  """
  prompts_per_batch: int = 2
  group_size: int = 4
  max_new_tokens: int = 16
  temperature: float = 1.0
  top_k: int | None = None
  top_p: float | None = None
  stop_tokens: tuple[int, ...] = ()
  stop_strings: tuple[str, ...] = ()
  beta: float = 0.0
  clip_low: float = 0.2
  clip_high: float = 0.2
  aggregation: losses.Aggregation = "seq_mean"
  scale: Scale = "std"
  updates_per_batch: int = 1
  eps: float = 1e-4
  rollout_slots: int = 0

  def __post_init__(self):
    def bad(msg):
      raise ValueError(f"GRPOConfig: {msg}")
    for name in ("prompts_per_batch", "group_size", "max_new_tokens", "updates_per_batch"):
      if getattr(self, name) < 1:
        bad(f"{name} must be >= 1, found {getattr(self, name)}")
    if self.rollout_slots < 0:
      bad(f"rollout_slots must be >= 0 (0: one batch), found {self.rollout_slots}")
    if self.temperature <= 0:
      bad(f"temperature must be positive (RL samples), found {self.temperature}")
    choices.check(self, bad, nested=False)
    if self.scale == "std" and self.group_size < 2:
      bad("scale 'std' needs group_size >= 2")
    if self.beta < 0 or self.clip_low < 0 or self.clip_high < 0:
      bad(f"beta, clip_low, clip_high must be >= 0, found {self.beta}, {self.clip_low}, {self.clip_high}")

  @property
  def batch_size(self) -> int:
    return self.prompts_per_batch * self.group_size


def group_advantages(rewards_B, group_size: int, scale: str = "std", eps: float = 1e-4):
  """(r - group mean) [/ (group std + eps)] per row, rows grouped prompt-major in blocks of `group_size`."""
  if scale not in SCALES:
    raise ValueError(f"scale must be one of {SCALES}, found {scale!r}")
  r = jnp.asarray(rewards_B, jnp.float32)
  if r.ndim != 1 or r.shape[0] % group_size:
    raise ValueError(f"rewards must be [P * {group_size}], found shape {r.shape}")
  r_PG = r.reshape(-1, group_size)
  adv = r_PG - jnp.mean(r_PG, axis=1, keepdims=True)
  if scale == "std":
    if group_size < 2:
      raise ValueError("scale 'std' needs group_size >= 2")
    adv = adv / (jnp.std(r_PG, axis=1, ddof=1, keepdims=True) + eps)
  return adv.reshape(-1)
