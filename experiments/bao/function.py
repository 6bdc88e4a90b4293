"""Function gym: find a hidden arithmetic rule of four numbers by probing it, then give its value at a test case.

The rules are the UserRL FunctionGym kind (`a * (b + c) / d`, `(a + b) ** c - d`, ...): `[action] a b c d`
returns the rule's value there (refused at the test case itself), `[search] test` returns the test case,
`[answer] v` scores 1 and ends the episode when `v` equals the rule's value at the test case (to `tol`,
relative), and scores 0 otherwise (the episode goes on); `[finish]` ends it. Every probe is a user-involving
turn (`info["user"]`). The rule (drawn from the gym's `rules`) and the test case follow from the seed.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from jaxlab.envs.base import Turn

RULES = ("a + b * c - d", "a * (b + c) / d", "(a + b) * (c - d)", "(a - b) + c * d", "a * b + c / d",
         "(a + b) * c - d / 2", "a ** 2 + b * c - d", "(a + b) ** 2 - c * d", "a * b - c * d", "(a + c) / (b + d)")

TASK = ("A hidden rule maps four numbers a, b, c, d to one number. Probe it with '[action] a b c d', get the "
        "test case with '[search] test', and give the rule's value there with '[answer] VALUE'.")


def evaluate(rule: str, nums) -> float:
  a, b, c, d = (float(x) for x in nums)
  try:
    return float(eval(rule, {"__builtins__": {}}, {"a": a, "b": b, "c": c, "d": d}))  # RULES only, never input
  except (ZeroDivisionError, OverflowError):
    return math.nan


class FunctionGym:
  """One episode at a time; `reset(seed)` draws the rule from `rules` (or uses `rule`) and a test case with a finite
  value."""
  name = "function"

  def __init__(self, max_turns: int = 15, rule: str | None = None, tol: float = 1e-4, rules: Sequence[str] = RULES):
    self.rules = tuple(rules)
    if not self.rules or any(r not in RULES for r in self.rules):
      raise ValueError(f"rules must be a non-empty subset of {RULES}, found {rules!r}")
    if rule is not None and rule not in RULES:
      raise ValueError(f"rule must be one of {RULES}, found {rule!r}")
    self.max_turns, self.fixed_rule, self.tol = max_turns, rule, tol
    self.rule, self.test = self.rules[0], (1, 1, 1, 1)

  def reset(self, seed: int) -> str:
    rng = np.random.default_rng(seed)
    self.rule = self.fixed_rule or self.rules[int(rng.integers(len(self.rules)))]
    while True:
      self.test = tuple(int(x) for x in rng.integers(1, 10, size=4))
      if math.isfinite(evaluate(self.rule, self.test)):
        return TASK

  def target(self) -> float:
    return evaluate(self.rule, self.test)

  def interact(self, choice: str, content: str) -> Turn:
    if choice == "action":
      nums = _numbers(content)
      if nums is None or len(nums) != 4:
        return Turn("give exactly four numbers: [action] a b c d", 0.0, False, {"user": True, "valid": False})
      if tuple(nums) == tuple(float(x) for x in self.test):
        return Turn("that is the test case: its value is what you must answer", 0.0, False, {"user": True})
      return Turn(f"{_fmt(evaluate(self.rule, nums))}", 0.0, False, {"user": True})
    if choice == "search":
      return Turn("test case: " + " ".join(str(x) for x in self.test), 0.0, False, {"user": False})
    if choice == "answer":
      v = _numbers(content)
      want = self.target()
      ok = v is not None and len(v) == 1 and abs(v[0] - want) <= self.tol * max(1.0, abs(want))
      return Turn("correct" if ok else "incorrect", 1.0 if ok else 0.0, ok, {"user": False, "correct": ok})
    if choice == "finish":
      return Turn("episode finished", 0.0, True, {"user": False})
    return Turn("use one of: [action] a b c d, [search] test, [answer] VALUE, [finish]", 0.0, False,
                {"user": False, "valid": False})


def _numbers(text: str) -> list[float] | None:
  try:
    return [float(x) for x in text.replace(",", " ").split()]
  except ValueError:
    return None


def _fmt(v: float) -> str:
  return "undefined (division by zero)" if not math.isfinite(v) else f"{v:.6g}"
