"""Answers read out of model completions and scored against gold answers.

`extract_answer` reads the final number of a completion (after "####", "The answer is", or the last "=" of
its first line; else the last number, or the first line for non-numeric answers); `extract_choice` the first
commonsense answer word; `exact_match` compares them with a gold answer after
`jaxlab.data.tasks.arithmetic.normalize`. `extract_tagged` reads `<answer>...</answer>` or `\\boxed{...}`
(the RL rewards' format).
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from jaxlab.data.tasks.arithmetic import NUMBER, Example, normalize


def extract_answer(text: str) -> str:
  """The final numeric answer of a completion: the number after the last "####" / "The answer is" / "=" of
  its first line, else the last number of the first line, else the first line (normalized)."""
  for marker in ("####", "The answer is:", "The answer is", "the answer is"):
    if marker in text:
      tail = text.rsplit(marker, 1)[1].strip().split("\n")[0]
      m = NUMBER.search(tail)
      return normalize(m.group(0) if m else tail)
  line = text.strip().split("\n")[0] if text.strip() else ""
  if "=" in line:
    m = NUMBER.match(line.rsplit("=", 1)[1].strip())
    return normalize(m.group(0)) if m else ""
  nums = NUMBER.findall(line)
  return normalize(nums[-1] if nums else line)


_CHOICE = re.compile(r"\b(true|false|solution[12]|answer[1-5]|option[12]|ending[1-4])\b", re.IGNORECASE)


def extract_choice(text: str) -> str:
  """The first commonsense answer word (true/false, solutionK, answerK, optionK, endingK), else the first line."""
  m = _CHOICE.search(text)
  return m.group(1).lower() if m else normalize(text.strip().split("\n")[0] if text.strip() else "")


def exact_match(completion: str, answer: str) -> bool:
  """Whether the completion's final answer equals `answer` after normalization: numeric answers through
  `extract_answer`, others (commonsense choices) through `extract_choice`."""
  gold = normalize(answer)
  if not gold:
    return False
  numeric = re.fullmatch(r"-?\d+(\.\d+)?", gold) is not None
  return (extract_answer(completion) if numeric else extract_choice(completion)) == gold


def accuracy(completions: Sequence[str], examples: Sequence[Example]) -> float:
  if len(completions) != len(examples):
    raise ValueError(f"accuracy: {len(completions)} completions for {len(examples)} examples")
  if not examples:
    return float("nan")
  return float(np.mean([exact_match(c, e.answer) for c, e in zip(completions, examples)]))


_ANSWER = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)
_BOXED = re.compile(r"\\boxed\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")


def extract_tagged(text: str) -> str | None:
  """The last `<answer>...</answer>` content (stripped; reasoning-gym's answer format), else the last
  `\\boxed{...}` content, else None."""
  hits = _ANSWER.findall(text)
  if hits:
    return hits[-1].strip()
  boxed = _BOXED.findall(text)
  return boxed[-1].strip() if boxed else None
