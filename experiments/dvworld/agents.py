"""The agents: the reference (oracle) programs, one broken variant per kind, and a chat LM (SmolLM2 at the cpu
preset) that writes the plotting / openpyxl code itself and talks to the DV-Interact user.

An LM agent is `LMAgent(generate)` over `generate(list of chat message lists, max_new_tokens=None) -> texts`, so
any chat model (or a test's scripted stand-in) fits. Its code is the first fenced code block of its reply (the
whole reply when there is none); it runs in the sandbox like every other candidate.
"""
from __future__ import annotations

import re
from typing import Callable, Sequence

from experiments.dvworld import interact, sheet, tasks

Generate = Callable[[list], list]
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", re.DOTALL)

CODE_SYSTEM = "You are a data-visualization assistant. Reply with one complete Python program in a ```python block."
INTERACT_SYSTEM = ("You are a data-visualization assistant talking to a user. Each reply is one line: [action] "
                   "<a question for the user> or [answer] <the JSON the user asked for>.")


def extract_code(text: str) -> str:
  """The first fenced code block of `text` (an unclosed one runs to the end), else the whole text."""
  m = _FENCE.search(text)
  return (m.group(1) if m else text).strip() + "\n"


def data_preview(df, rows: int = 3) -> str:
  return df.head(rows).to_csv(index=False)


class LMAgent:
  """A chat model as the agent of all three domains."""

  def __init__(self, generate: Generate, interact_tokens: int | None = None):
    self.generate, self.interact_tokens = generate, interact_tokens

  def _code(self, prompts: Sequence[str]) -> list[str]:
    msgs = [[{"role": "system", "content": CODE_SYSTEM}, {"role": "user", "content": p}] for p in prompts]
    return [extract_code(t) for t in self.generate(msgs)] if msgs else []

  def evol_programs(self, specs: Sequence[tasks.Spec], frames: dict) -> list[str]:
    return self._code([f"{s.instruction(list(frames[s.source].columns))}\nThe first rows of data.csv:\n"
                       f"{data_preview(frames[s.source])}" for s in specs])

  def sheet_programs(self, items: Sequence[tuple[tasks.Spec, str, str | None]]) -> list[str]:
    return self._code([sheet.instruction(s, mode, brk) for s, mode, brk in items])

  def interact_policy(self):
    def policy(histories: list[list[dict]]) -> list[str]:
      return self.generate([[{"role": "system", "content": INTERACT_SYSTEM}, *h] for h in histories],
                           max_new_tokens=self.interact_tokens)
    return policy


class ProgramAgent:
  """The reference (`broken` None) or one broken kind: programs written from the task specs."""

  def __init__(self, broken: str | None = None):
    if broken is not None and broken not in tasks.BROKEN:
      raise ValueError(f"broken kind must be one of {tasks.BROKEN}, found {broken!r}")
    self.broken = broken

  def evol_programs(self, specs, frames) -> list[str]:
    del frames
    return [tasks.program(s, self.broken) for s in specs]

  def sheet_programs(self, items) -> list[str]:
    return [sheet.program(s, self.broken) for s, _, _ in items]

  def interact_policy(self, spec_by_request):
    return interact.scripted_policy(spec_by_request, self.broken)


def chat_generate(model: str, default_tokens: int, slots: int | None = None) -> Generate:
  """`generate` over a chat model (`experiments._shared.chat_models.answer`), greedy, batched (`slots` rows at a
  time when given)."""
  from experiments._shared.chat_models import answer, load_chat_model
  cfg, params, tok = load_chat_model(model)

  def generate(batch: list, max_new_tokens: int | None = None) -> list:
    if not batch:
      return []
    ids = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True) for m in batch]
    return answer(cfg, params, tok, ids, max_new_tokens or default_tokens, slots=slots)[0]
  return generate
