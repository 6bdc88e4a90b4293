"""Judges: callables that decide, per item, whether a model output is right.

A judge is any callable `items -> sequence of bools`, where an item is whatever the experiment asks about (a
patch and its descriptions, a question and an answer, a chart and its code). Experiments take external judges
(an LLM judge, a human-label lookup) by name from the command line: `load("module:name")`.
"""
from __future__ import annotations

import importlib
from typing import Protocol, Sequence, TypeVar

Item = TypeVar("Item", contravariant=True)


class Judge(Protocol[Item]):
  """Decides, per item, whether it is right (True) or not."""

  def __call__(self, items: Sequence[Item]) -> Sequence[bool]: ...


def load(spec: str, needed_for: str = "this run") -> Judge:
  """The judge named by "module:name" (a class is instantiated without arguments).

  Raises:
    ValueError: `spec` is empty (naming what needs a judge) or not of the form "module:name".
  """
  if not spec:
    raise ValueError(f"{needed_for} needs a judge: pass --set judge=module:name naming a callable "
                     "items -> list[bool] (see jaxlab.evals.judge.Judge); none was given")
  mod, _, name = spec.partition(":")
  if not mod or not name:
    raise ValueError(f"judge must be 'module:name', found {spec!r}")
  obj = getattr(importlib.import_module(mod), name)
  return obj() if isinstance(obj, type) else obj
