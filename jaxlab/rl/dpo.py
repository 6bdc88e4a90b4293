"""Preference and SFT batches, and DPO's reference log-probs computed once (DPO, arXiv 2305.18290).

Rows are `prompt + completion`, right-padded; inputs are the row without its last token, targets the row
shifted by one, and the loss mask (`jaxlab.losses.completion_loss_mask`) keeps only targets that are
completion tokens, so prompt tokens never enter a loss. DPO's reference policy is frozen, so its sequence
log-probs of every pair are computed in one pass over the data before training (`reference_logprobs`) and
stored in the batches; the loss (`jaxlab.losses.dpo_loss_fn`) then runs the policy only.

Axes: B rows (pairs), T positions.
"""
from __future__ import annotations

import functools
from typing import Iterable, Sequence

import jax
import numpy as np

from jaxlab import losses
from jaxlab.models import transformer as tfm


def sft_batch(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], length: int,
              pad_id: int = 0) -> dict:
  """inputs, targets, loss_mask [B, length] (int32) of right-padded `prompt + completion` rows.

  Args:
    prompts, completions: token lists, one pair per row (each prompt non-empty).
    length: T; a row's prompt + completion may have at most T + 1 tokens.
    pad_id: filler after a row's last token.
  """
  if len(prompts) != len(completions):
    raise ValueError(f"got {len(prompts)} prompts and {len(completions)} completions")
  rows = np.full((len(prompts), length + 1), pad_id, np.int32)
  p_len, n_len = [], []
  for i, (p, c) in enumerate(zip(prompts, completions)):
    seq = list(p) + list(c)
    if not p or len(seq) > length + 1:
      raise ValueError(f"row {i}: prompt of {len(p)} and completion of {len(c)} tokens; need a non-empty "
                       f"prompt and at most {length + 1} tokens in all")
    rows[i, :len(seq)] = seq
    p_len.append(len(p))
    n_len.append(len(seq))
  mask = np.asarray(losses.completion_loss_mask(np.asarray(p_len), np.asarray(n_len), length), np.int32)
  return {"inputs": rows[:, :-1], "targets": rows[:, 1:], "loss_mask": mask}


def pair_batch(prompts: Sequence[Sequence[int]], chosen: Sequence[Sequence[int]],
               rejected: Sequence[Sequence[int]], length: int, pad_id: int = 0) -> dict:
  """The `dpo_loss_fn` batch (without reference log-probs) of (prompt, chosen, rejected) triples."""
  c = sft_batch(prompts, chosen, length, pad_id)
  r = sft_batch(prompts, rejected, length, pad_id)
  return {"chosen_inputs": c["inputs"], "chosen_targets": c["targets"], "chosen_mask": c["loss_mask"],
          "rejected_inputs": r["inputs"], "rejected_targets": r["targets"], "rejected_mask": r["loss_mask"]}


@functools.partial(jax.jit, static_argnames=("cfg",))
def _pair_logprobs(params, batch, cfg):
  return losses.pair_logprobs(params, cfg, batch)


def reference_logprobs(ref_params, cfg: tfm.Config, batches: Iterable[dict]) -> list[dict]:
  """Each pair batch with ref_chosen_logp and ref_rejected_logp [B] (float32 host arrays) added, one forward each."""
  out = []
  keys = ("chosen_inputs", "chosen_targets", "chosen_mask", "rejected_inputs", "rejected_targets",
          "rejected_mask")
  for batch in batches:
    c, r = _pair_logprobs(ref_params, {k: batch[k] for k in keys}, cfg)
    out.append(dict(batch, ref_chosen_logp=np.asarray(c, np.float32), ref_rejected_logp=np.asarray(r, np.float32)))
  return out
