"""Reward functions for RL on text: exact answers, format checks, model-based scores, weighted sums.

A `RewardFn` maps decoded completions and their examples (the prompt's dict: answer, metadata ...) to one float
per completion. Exact answers use reasoning-gym's own scorer (`dataset.score_answer`; arXiv 2505.24760) or
string equality after an extractor; the default extractor is `jaxlab.evals.answers.extract_tagged` (the last
`<answer>...</answer>`, else the last `\\boxed{...}`). A model-based reward (e.g. a process reward
model) is any `score(texts, examples) -> [B]`, wrapped by `model_reward`.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import numpy as np

from jaxlab.evals.answers import extract_tagged

RewardFn = Callable[[Sequence[str], Sequence[dict]], np.ndarray]

def _normalize(s: Any) -> str:
  return " ".join(str(s).strip().split()).rstrip(".").lower()


def exact_answer(extract: Callable[[str], str | None] = extract_tagged, key: str = "answer") -> RewardFn:
  """1.0 where `extract(text)` equals `example[key]` (whitespace, case and a final period ignored), else 0.0."""
  def reward(texts, examples):
    out = []
    for text, ex in zip(texts, examples, strict=True):
      got = extract(text)
      out.append(float(got is not None and _normalize(got) == _normalize(ex[key])))
    return np.asarray(out, np.float32)
  return reward


def reasoning_gym_answer(dataset, extract: Callable[[str], str | None] = extract_tagged) -> RewardFn:
  """reasoning-gym's scorer: `dataset.score_answer(answer=extract(text), entry=example)` (partial credit kept).

  Args:
    dataset: a `reasoning_gym` dataset (`reasoning_gym.create_dataset(name, ...)`); examples are its entries.
    extract: pulls the answer out of a completion.
  """
  def reward(texts, examples):
    return np.asarray([float(dataset.score_answer(answer=extract(t), entry=ex))
                       for t, ex in zip(texts, examples, strict=True)], np.float32)
  return reward


def format_reward(pattern: str = r"(?s).*<answer>.*?</answer>\s*", full: bool = True) -> RewardFn:
  """1.0 where the completion matches the regex `pattern` (whole text when `full`, else anywhere)."""
  rx = re.compile(pattern)
  match = rx.fullmatch if full else rx.search

  def reward(texts, examples):
    del examples
    return np.asarray([float(match(t) is not None) for t in texts], np.float32)
  return reward


def model_reward(score: Callable[[Sequence[str], Sequence[dict]], Any]) -> RewardFn:
  """A model-based reward: `score(texts, examples)` (e.g. a PRM's final or minimum step score) as float32 [B]."""
  def reward(texts, examples):
    out = np.asarray(score(texts, examples), np.float32).reshape(-1)
    if out.shape[0] != len(texts):
      raise ValueError(f"the reward model returned {out.shape[0]} scores for {len(texts)} completions")
    return out
  return reward


def combine(*weighted: tuple[RewardFn, float]) -> RewardFn:
  """The weighted sum of several rewards, e.g. `combine((exact_answer(), 1.0), (format_reward(), 0.1))`."""
  if not weighted:
    raise ValueError("combine needs at least one (reward_fn, weight)")

  def reward(texts, examples):
    return sum(w * np.asarray(fn(texts, examples), np.float32) for fn, w in weighted).astype(np.float32)
  return reward
