"""The LLM judge of REA answers (STLLM, arXiv 2507.05258; see experiments/stllm/__init__.py): a local chat model,
given by path, reads the question, the reference answer and a model's answer and replies "correct" or "wrong",
correct when the answer means the same as the reference even if it is worded differently, as the paper's GPT-4o
judge does (one prompt per task, greedy). A reply that says neither counts as wrong. Without a judge the run scores
by exact string match.
"""
from __future__ import annotations

import re

SYSTEM = "You are a helpful assistant."
TASK_TEXT = {
    "relative_direction": "on which side of the agent (front, back, left or right) an object is at the end of the "
                          "clip",
    "relative_distance": "which of two pieces of furniture is closer to the agent at the end of the clip",
    "find_my_item": "where the item the agent handled in the clip is now",
    "furniture_affordance": "to which of two pieces of furniture the agent should bring an item",
    "action_planning": "how the agent gets from where the clip ends to a piece of furniture",
}
PROMPT = """You are a fair evaluator of answers about an agent moving in a room. The question asks {what}.

Question: {question}
Ground truth answer: {reference}
Predicted answer: {prediction}

Reply "correct" if the predicted answer means the same as the ground truth answer, even if it is worded
differently; reply "wrong" if it names another place, object, side or route, leaves out what the question asks, or
does not answer. Reply with one word only: correct or wrong."""


def prompt(task: str, question: str, reference: str, prediction: str) -> str:
  return PROMPT.format(what=TASK_TEXT[task], question=question, reference=reference, prediction=prediction)


def verdict(reply: str) -> bool | None:
  """True for "correct", False for "wrong" / "incorrect" (the first such word of the reply), None for neither."""
  for w in re.findall(r"[a-z]+", reply.lower()):
    if w == "correct":
      return True
    if w in ("wrong", "incorrect"):
      return False
  return None


class LMJudge:
  """A local chat model (a transformers directory, a .gguf file or a registered model name) as the judge."""

  def __init__(self, path: str, max_new_tokens: int = 4, batch: int = 16):
    from experiments._shared import chat_models
    self.path, self.max_new_tokens, self.batch = path, max_new_tokens, batch
    self.cfg, self.params, self.tok = chat_models.load_chat_model(path)

  def replies(self, prompts: list[str]) -> list[str]:
    from experiments._shared import chat_models
    out = []
    for i in range(0, len(prompts), self.batch):
      ids = [chat_models.chat_ids(self.tok, p, SYSTEM) for p in prompts[i:i + self.batch]]
      out += chat_models.answer(self.cfg, self.params, self.tok, ids, self.max_new_tokens)[0]
    return out

  def __call__(self, items) -> list[bool | None]:
    """Verdicts for (task, question, reference, prediction) items, in order; each distinct item is asked once."""
    items = [tuple(x) for x in items]
    todo = list(dict.fromkeys(items))
    got = dict(zip(todo, map(verdict, self.replies([prompt(*x) for x in todo]))))
    return [got[x] for x in items]
