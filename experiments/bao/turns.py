"""Turn-level credit for multi-turn GRPO, as UserRL defines it (arXiv 2509.19736; SalesforceAIResearch/UserRL,
`compute_turn_credits` and `compute_grpo_multiturn_advantage` in its verl fork's trainer/ppo/core_algos.py).

Each trajectory has per-turn rewards r_0 .. r_{n-1}. Two choices shape its advantages:
  trajectory score  "Sum": mean(r) rounded to 4 decimals (the reference names the mean "Sum");
                    "R2G": sum_t gamma^t r_t.
  turn credit       "Equalized": 1 for every turn; "R2G": c_t = sum_{k>=t} gamma^(k-t) r_k;
                    "EM": round(0.5 + 0.5 (1 - exp(-2 r_t)) / (1 - exp(-2)), 4).
Trajectory scores are normalized within their group (GRPO): f = (s - mean) / (std + eps) (std unbiased; a
group of one has mean 0 and std 1), or f = s - mean without the std. Each response token of turn t gets c_t
(0 outside the response mask, before the first turn and in turns past n), and the row is rescaled to
a = c * f * nnz / sum(c), nnz the count of its non-zero token credits; a row whose token credits sum to 0
gets 0. So the tokens' mean credit over the non-zero ones is f, split across turns in proportion to c_t.

Axes: B trajectories, N turns (padded), L tokens.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Literal, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import choices

Credit = Literal["Equalized", "R2G", "EM"]
CREDITS = choices.values(Credit)
Score = Literal["Sum", "R2G"]
SCORES = choices.values(Score)


@dataclasses.dataclass(frozen=True)
class TurnCredit:
  """gamma: discount of R2G credits and scores; credit: one of CREDITS; score: one of SCORES;
  scale_by_std: divide by the group std (UserRL's norm_adv_by_std_in_grpo); eps: added to the std."""
  gamma: float = 0.8
  credit: Credit = "Equalized"
  score: Score = "Sum"
  scale_by_std: bool = True
  eps: float = 1e-6

  def __post_init__(self):
    choices.check(self, prefix="TurnCredit: ")
    if not 0.0 <= self.gamma <= 1.0:
      raise ValueError(f"TurnCredit: gamma must be in [0, 1], found {self.gamma}")
    if self.eps < 0:
      raise ValueError(f"TurnCredit: eps must be >= 0, found {self.eps}")


PRESETS = {f"{c.lower()}-{s.lower()}": TurnCredit(credit=c, score=s) for c in CREDITS for s in SCORES}


def pad_rewards(reward_lists: Sequence[Sequence[float]], width: int | None = None):
  """Per-trajectory turn rewards -> (rewards [B, N] float32, zero-padded; n_turns [B] int32)."""
  n = np.asarray([len(r) for r in reward_lists], np.int32)
  width = int(n.max(initial=0)) if width is None else width
  if n.size and n.max() > width:
    raise ValueError(f"width must be >= the longest trajectory ({int(n.max())} turns), found {width}")
  out = np.zeros((len(reward_lists), max(width, 1)), np.float32)
  for i, r in enumerate(reward_lists):
    out[i, :len(r)] = r
  return out, n


def _round4(x):
  return jnp.round(x * 1e4) / 1e4


def turn_credits(rewards_BN, n_turns_B, cfg: TurnCredit = TurnCredit()):
  """(credits [B, N], 0 past each trajectory's n turns; scores [B]) for `cfg`'s credit and score modes."""
  r_BN = jnp.asarray(rewards_BN, jnp.float32)
  if r_BN.ndim != 2:
    raise ValueError(f"rewards must be [B, N], found shape {r_BN.shape}")
  n = r_BN.shape[1]
  valid_BN = jnp.arange(n)[None, :] < jnp.asarray(n_turns_B)[:, None]
  r_BN = jnp.where(valid_BN, r_BN, 0.0)
  t = jnp.arange(n)
  # disc[t, k] = gamma^(k - t) for k >= t: the discounted reward-to-go as one matmul
  disc_NN = jnp.where(t[None, :] >= t[:, None], jnp.float32(cfg.gamma) ** jnp.maximum(t[None, :] - t[:, None], 0), 0.0)
  r2g_BN = jnp.einsum("bk,tk->bt", r_BN, disc_NN, precision=jax.lax.Precision.HIGHEST)
  if cfg.score == "R2G":
    score_B = r2g_BN[:, 0]
  else:
    count_B = jnp.sum(valid_BN, axis=1)
    score_B = jnp.where(count_B > 0, _round4(jnp.sum(r_BN, axis=1) / jnp.maximum(count_B, 1)), 0.0)
  if cfg.credit == "Equalized":
    credit_BN = jnp.ones_like(r_BN)
  elif cfg.credit == "R2G":
    credit_BN = r2g_BN
  else:
    credit_BN = _round4(0.5 + 0.5 * (1.0 - jnp.exp(-2.0 * r_BN)) / (1.0 - math.exp(-2.0)))
  return jnp.where(valid_BN, credit_BN, 0.0), score_B


def turn_index_from_boundaries(boundaries_BL):
  """Token -> turn index from UserRL's turn_boundaries (1 where a turn starts): -1 before the first start;
  a row without any start is all turn 0, as the reference treats it."""
  b_BL = jnp.asarray(boundaries_BL, jnp.int32)
  idx_BL = jnp.cumsum(b_BL, axis=1) - 1
  return jnp.where(jnp.any(b_BL == 1, axis=1, keepdims=True), idx_BL, 0)


def token_credits(credits_BN, turn_index_BL, mask_BL):
  """Each token's turn credit: credits[b, turn_index[b, l]] on mask, 0 where the index is < 0 or >= N."""
  c_BN = jnp.asarray(credits_BN, jnp.float32)
  idx_BL = jnp.asarray(turn_index_BL, jnp.int32)
  ok_BL = (idx_BL >= 0) & (idx_BL < c_BN.shape[1]) & (jnp.asarray(mask_BL) > 0)
  got_BL = jnp.take_along_axis(c_BN, jnp.clip(idx_BL, 0, c_BN.shape[1] - 1), axis=1)
  return jnp.where(ok_BL, got_BL, 0.0)


def group_normalize(score_B, group_ids_B, scale_by_std: bool = True, eps: float = 1e-6):
  """(s - group mean) [/ (group std + eps)], std unbiased; a group of one keeps s (mean 0, std 1).

  Deviations are taken from each group's first score, so a group of equal scores gets exactly 0."""
  s_B = jnp.asarray(score_B, jnp.float32)
  g_B = jnp.asarray(group_ids_B)
  same_BB = (g_B[:, None] == g_B[None, :]).astype(jnp.float32)
  count_B = jnp.sum(same_BB, axis=1)
  first_B = jnp.argmax(same_BB, axis=1)
  d_BB = s_B[None, :] - s_B[first_B][:, None]
  mean_d_B = jnp.sum(same_BB * d_BB, axis=1) / count_B
  dev_BB = same_BB * (d_BB - mean_d_B[:, None])
  std_B = jnp.sqrt(jnp.sum(dev_BB ** 2, axis=1) / jnp.maximum(count_B - 1, 1))
  single_B = count_B == 1
  centered_B = jnp.where(single_B, s_B, jnp.diagonal(dev_BB))
  if not scale_by_std:
    return centered_B
  return centered_B / (jnp.where(single_B, 1.0, std_B) + eps)


def turn_advantages(rewards_BN, n_turns_B, turn_index_BL, mask_BL, group_ids_B, cfg: TurnCredit = TurnCredit()):
  """Per-token advantages [B, L] of UserRL's turn-level GRPO (module docstring); jit-friendly for a fixed cfg.

  Args:
    rewards_BN: per-turn rewards, padded past each trajectory's turns.
    n_turns_B: the number of turns of each trajectory.
    turn_index_BL: the turn each token belongs to (-1: none; `turn_index_from_boundaries` builds it).
    mask_BL: 1 on the policy's response tokens (the loss mask), 0 on prompt, observations and padding.
    group_ids_B: rows with equal ids share a prompt (GRPO group); `jnp.arange(B) // G` for prompt-major rows.
    cfg: credit and score modes, gamma, std scaling and eps.
  """
  mask = jnp.asarray(mask_BL)
  if jnp.shape(turn_index_BL) != mask.shape or mask.shape[0] != jnp.shape(rewards_BN)[0]:
    raise ValueError(f"turn_index and mask must be [B, L] with B = {jnp.shape(rewards_BN)[0]}, found "
                     f"{jnp.shape(turn_index_BL)} and {mask.shape}")
  credit_BN, score_B = turn_credits(rewards_BN, n_turns_B, cfg)
  tok_BL = token_credits(credit_BN, turn_index_BL, mask)
  f_B = group_normalize(score_B, group_ids_B, cfg.scale_by_std, cfg.eps)
  total_B = jnp.sum(tok_BL, axis=1)
  nnz_B = jnp.sum(tok_BL != 0, axis=1).astype(jnp.float32)
  scale_B = jnp.where(total_B != 0, f_B * nnz_B / jnp.where(total_B != 0, total_B, 1.0), 0.0)
  return tok_BL * scale_B[:, None]
