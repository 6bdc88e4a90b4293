"""Reinforcement learning and preference tuning: rollouts, GRPO advantages, rewards, DPO/SFT batches.

The losses live in `jaxlab.losses` (grpo_objective, grpo_loss_fn, dpo_loss_fn, sft_loss_fn); the resumable
GRPO loop in `jaxlab.train.rl_loop`.
"""
from jaxlab.rl import dpo, grpo, rewards, rollout
from jaxlab.rl.dpo import pair_batch, reference_logprobs, sft_batch
from jaxlab.rl.grpo import GRPOConfig, group_advantages
from jaxlab.rl.rollout import PromptCycle, Rollout, as_batch, repeat_groups, sample_rollout, truncate_at_stop_strings

__all__ = ["dpo", "grpo", "rewards", "rollout", "pair_batch", "reference_logprobs", "sft_batch", "GRPOConfig",
           "group_advantages", "PromptCycle", "Rollout", "as_batch", "repeat_groups", "sample_rollout",
           "truncate_at_stop_strings"]
