"""BAO's behaviour regularization of multi-turn rewards ("Pushing Forward Pareto Frontiers of Proactive Agents
with Behavioral Agentic Optimization", arXiv 2602.11351), on top of UserRL's turn credit (`experiments.bao.turns`).

BAO maximizes E[R(tau) - w U(tau)], U the number of user-involving turns, and regularizes two behaviours. Per
trajectory with turn rewards r_t, user flags u_t (the turn involved the user), feedback flags f_t (the turn got
feedback from the environment) and T policy tokens over all its turns, the penalized turn rewards are

  r'_t = r_t - w u_t - c_info s_t - [t = n - 1] c_think max(0, T - T') / T'

  s_t = 1 when turns t - 1 and t are both user turns without feedback (the second and later turns of such a
        run pay; the information-seeking regularizer),
  (T - T') / T' the over-thinking penalty, paid once, on the last turn, when the trajectory's token budget T'
        runs out (T > T'; 0 otherwise or when T' = 0).

`penalized_rewards` applies this to one trajectory; `advantages` feeds the penalized rewards to UserRL's
per-token turn advantages (`experiments.bao.turns.turn_advantages`), so the penalties reach the loss exactly as
reward would.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from experiments.bao import turns

_CREDIT = turns.TurnCredit()  # the default credit assignment (frozen, so one shared instance)


@dataclasses.dataclass(frozen=True)
class Regularizers:
  """user_weight: w of R - w U; info_penalty: c_info per repeated user turn without feedback; think_budget: T'
  tokens per trajectory (0: no over-thinking penalty); think_weight: c_think."""
  user_weight: float = 0.0
  info_penalty: float = 0.0
  think_budget: int = 0
  think_weight: float = 1.0

  def __post_init__(self):
    for name in ("user_weight", "info_penalty", "think_weight"):
      if getattr(self, name) < 0:
        raise ValueError(f"Regularizers: {name} must be >= 0, found {getattr(self, name)}")
    if self.think_budget < 0:
      raise ValueError(f"Regularizers: think_budget must be >= 0 (0: off), found {self.think_budget}")


def info_seeking_flags(user: Sequence[bool], feedback: Sequence[bool]) -> np.ndarray:
  """s_t: 1 where turns t - 1 and t are both user-involving turns that got no environment feedback."""
  u = np.asarray(user, bool)
  f = np.asarray(feedback, bool)
  if u.shape != f.shape:
    raise ValueError(f"user and feedback flags must have one entry per turn, found {u.shape} and {f.shape}")
  idle = u & ~f
  out = np.zeros(u.shape, np.float32)
  out[1:] = idle[1:] & idle[:-1]
  return out


def overthinking(tokens: int, budget: int) -> float:
  """(T - T') / T' when the trajectory's T tokens exceed its budget T' > 0, else 0."""
  if budget <= 0 or tokens <= budget:
    return 0.0
  return (tokens - budget) / budget


def penalized_rewards(rewards: Sequence[float], user: Sequence[bool], feedback: Sequence[bool], tokens: int,
                      reg: Regularizers) -> list[float]:
  """One trajectory's turn rewards r'_t (module docstring)."""
  r = np.asarray(rewards, np.float64)
  if r.shape != np.shape(user):
    raise ValueError(f"rewards and user flags must have one entry per turn, found {r.shape} and {np.shape(user)}")
  out = r - reg.user_weight * np.asarray(user, np.float64) - reg.info_penalty * info_seeking_flags(user, feedback)
  if out.size:
    out[-1] -= reg.think_weight * overthinking(tokens, reg.think_budget)
  return out.tolist()


def advantages(reward_lists, user_lists, feedback_lists, token_counts, turn_index_BL, mask_BL, group_ids_B,
               reg: Regularizers, credit: turns.TurnCredit = _CREDIT):
  """Per-token advantages [B, L]: `turns.turn_advantages` on each trajectory's penalized rewards.

  Args:
    reward_lists, user_lists, feedback_lists: per trajectory, one entry per turn.
    token_counts: per trajectory, its policy tokens T.
    turn_index_BL, mask_BL, group_ids_B, credit: as in `turns.turn_advantages`.
    reg: the regularizers (all 0: UserRL's advantages of the plain rewards).
  """
  pen = [penalized_rewards(r, u, f, t, reg) for r, u, f, t in zip(reward_lists, user_lists, feedback_lists,
                                                                     token_counts)]
  rewards_BN, n_B = turns.pad_rewards(pen)
  return turns.turn_advantages(rewards_BN, n_B, turn_index_BL, mask_BL, group_ids_B, credit)
