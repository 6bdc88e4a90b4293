"""Rollouts for RL: G samples per prompt in one batch, with the sampling policy's per-token log-probs.

`sample_rollout` repeats each prompt G times (prompt-major rows), samples all B = P * G rows in one call of
`jaxlab.generate.sample` (stop tokens inside the compiled loop), then cuts each row after the first stop
string found in its decoded text (the shortest token prefix whose text contains it), so the completion mask
and log-probs cover exactly the tokens the reward sees. The log-probs are the old-policy log-probs of GRPO
(arXiv 2402.03300): `log_softmax(logits / temperature)` of the sampled tokens. With `slots` < B the rows are
decoded by continuous batching instead (`jaxlab.generate.continuous`: `slots` rows at a time, a finished row's slot
refilled by the next; row i samples its own key stream `fold_in(key, i)`, the tokens `sample` gives it alone),
so short completions stop costing decode steps; one-device decoding.

Axes: B = P * G rows, T prompt length, N new tokens.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from jaxlab import sharding as shd
from jaxlab.generate import continuous, prefix as prefix_lib, sampling
from jaxlab.models import transformer as tfm


class Rollout(NamedTuple):
  """prompt [B, T] (left-padded) and prompt_mask; tokens, completion_mask and logp [B, N] (0 / pad outside
  the mask); texts: the decoded completions (token lists without `decode`); examples: each row's example."""
  prompt: Any
  prompt_mask: Any
  tokens: Any
  completion_mask: Any
  logp: Any
  texts: list
  examples: list


def repeat_groups(items: Sequence, group_size: int) -> list:
  """Each item `group_size` times in a row: [a, a, b, b] for G = 2."""
  return [x for x in items for _ in range(group_size)]


def _stop_length(row: list[int], decode: Callable[[list[int]], str], stop_strings: Sequence[str]) -> int | None:
  """Tokens up to and including the first that completes a stop string; None when no stop string occurs."""
  stops = [s for s in stop_strings if s]
  if not any(s in decode(row) for s in stops):
    return None
  return next(k for k in range(1, len(row) + 1) if any(s in decode(row[:k]) for s in stops))


def truncate_at_stop_strings(tokens_BN, mask_BN, logp_BN, decode: Callable[[list[int]], str],
                             stop_strings: Sequence[str], pad_id: int = 0):
  """Cuts each row after the token that completes its first stop string (host NumPy arrays in and out)."""
  tokens, mask = np.array(tokens_BN), np.array(mask_BN)
  logp = None if logp_BN is None else np.array(logp_BN)
  for i in range(tokens.shape[0]):
    n = int(mask[i].sum())
    k = _stop_length(tokens[i, :n].tolist(), decode, stop_strings)
    if k is not None and k < n:
      tokens[i, k:], mask[i, k:] = pad_id, 0
      if logp is not None:
        logp[i, k:] = 0.0
  return tokens, mask, logp


def sample_rollout(params, cfg: tfm.Config, prompts: Sequence[Sequence[int]], examples: Sequence[dict], *,
                   group_size: int, max_new_tokens: int, key, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None, stop_tokens: Sequence[int] = (), stop_strings: Sequence[str] = (),
                   decode: Callable[[list[int]], str] | None = None, pad_id: int | None = None,
                   slots: int | None = None, **sample_kw) -> Rollout:
  """Samples `group_size` completions of every prompt in one batch.

  Args:
    params, cfg: the policy.
    prompts: P token lists (any lengths; left-padded here).
    examples: P dicts handed to the reward with each completion.
    group_size: G.
    max_new_tokens, key, temperature, top_k, top_p, stop_tokens: as in `jaxlab.generate.sample`.
    stop_strings: text ending a completion; needs `decode`.
    decode: token list -> text; also gives `Rollout.texts`.
    pad_id: filler of the token arrays (default the config's pad, else 0).
    slots: rows decoded at a time by continuous batching (None or >= B: every row in one `sample` batch).
    **sample_kw: passed to `sample` (e.g. weights, forward_fn); with `slots`, only `weights`.
  """
  if len(prompts) != len(examples):
    raise ValueError(f"got {len(prompts)} prompts and {len(examples)} examples")
  if stop_strings and decode is None:
    raise ValueError("stop_strings need a decode function")
  pad = int(pad_id if pad_id is not None else (cfg.pad_token_id if cfg.pad_token_id is not None else 0))
  rows = repeat_groups([list(p) for p in prompts], group_size)
  if slots is not None and slots < len(rows):
    prompt, prompt_mask, tokens, mask, logp = _continuous(params, cfg, rows, max_new_tokens, slots, key, temperature,
                                                           top_k, top_p, stop_tokens, pad, sample_kw)
  else:
    out = sampling.sample(params, cfg, rows, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                          key=key, stop_tokens=tuple(stop_tokens), pad_id=pad, return_logprobs=True, **sample_kw)
    seqs, prompt_mask, tokens, mask, logp = (shd.to_numpy(x) for x in (
        out.sequences, out.prompt_mask, out.tokens, out.completion_mask, out.logprobs))
    prompt = seqs[:, :prompt_mask.shape[1]]
  if stop_strings:
    tokens, mask, logp = truncate_at_stop_strings(tokens, mask, logp, decode, stop_strings, pad)
  completions = [row[:int(m.sum())].tolist() for row, m in zip(tokens, mask)]
  texts = [decode(c) for c in completions] if decode is not None else completions
  return Rollout(prompt, prompt_mask, tokens, mask, logp, texts, repeat_groups(list(examples), group_size))


def _continuous(params, cfg, rows, max_new_tokens, slots, key, temperature, top_k, top_p, stop_tokens, pad, kw):
  """(prompt [B, T] left-padded, prompt_mask, tokens [B, N], completion_mask, logp [B, N]) by continuous batching."""
  if set(kw) - {"weights"}:
    raise ValueError(f"continuous-batching rollouts (slots={slots}) take only weights= of the sample arguments, "
                     f"found {sorted(kw)}")
  outs, logps = continuous.generate(params, cfg, rows, max_new_tokens, slots=slots, temperature=temperature,
                                    top_k=top_k, top_p=top_p, key=key, stop_tokens=tuple(stop_tokens),
                                    return_logprobs=True, **kw)
  tokens = np.full((len(rows), max_new_tokens), pad, np.int32)
  mask, logp = np.zeros(tokens.shape, np.int32), np.zeros(tokens.shape, np.float32)
  for i, (o, lp) in enumerate(zip(outs, logps)):
    tokens[i, :len(o)], mask[i, :len(o)], logp[i, :len(o)] = o, 1, lp
  prompt, prompt_mask = prefix_lib.left_pad(rows, pad)
  return prompt, prompt_mask, tokens, mask, logp


def as_batch(ro: Rollout, advantages_B, ref_logp_BN=None) -> dict:
  """The GRPO loss batch (`jaxlab.losses.grpo_loss_fn` keys) of a rollout and its advantages, as host arrays."""
  batch = {"prompt": np.asarray(ro.prompt, np.int32), "prompt_mask": np.asarray(ro.prompt_mask, np.int32),
           "tokens": np.asarray(ro.tokens, np.int32), "completion_mask": np.asarray(ro.completion_mask, np.int32),
           "old_logp": np.asarray(ro.logp, np.float32), "advantages": np.asarray(advantages_B, np.float32)}
  if ref_logp_BN is not None:
    batch["ref_logp"] = np.asarray(ref_logp_BN, np.float32)
  return batch


class PromptCycle:
  """P examples per batch from a list, in order, wrapping around; `get_state`/`set_state` hold the position.

  Each example is a dict with the prompt's token list under `prompt_key` (the rest goes to the reward).
  """

  def __init__(self, examples: Sequence[dict], prompts_per_batch: int, prompt_key: str = "prompt"):
    if not examples:
      raise ValueError("PromptCycle needs at least one example")
    if any(prompt_key not in ex for ex in examples):
      raise ValueError(f"every example needs a {prompt_key!r} token list")
    self.examples, self.p, self.key, self.pos = list(examples), int(prompts_per_batch), prompt_key, 0

  def __iter__(self):
    return self

  def __next__(self) -> list[dict]:
    n = len(self.examples)
    out = [self.examples[(self.pos + i) % n] for i in range(self.p)]
    self.pos += self.p
    return out

  def prompts(self, batch: Sequence[dict]) -> list[list[int]]:
    return [list(ex[self.key]) for ex in batch]

  def get_state(self) -> dict:
    return {"pos": self.pos}

  def set_state(self, state: dict) -> None:
    self.pos = int(state["pos"])
