"""DV-Interact at small scale: an under-specified chart request, a simulated user who holds the hidden intent, and
an agent that may ask before it answers (the multi-turn protocol of `jaxlab.envs.base`).

The request names the table and the x column only; the intent (`tasks.Spec`) adds the value column, the
aggregation, the row filter and the chart kind. `[action] question` goes to the user; `[answer] {json}` submits
{"y": column, "agg": one of tasks.AGGS or null, "filter": {column: value}, "kind": bar|line|pie|scatter}, which
the env turns into a table on the host (pandas over the task's data; the spec is data, never code; its value
column named "value") and compares with the intent's table by `charts.table_alignment` both ways: the interaction
succeeds when the two tables are equal as multisets (alignment 1 each way, so a superset fails too) and the kind is
the intended one. `IntentUser` is scripted, after the reference's user simulator: it refuses requests for code
or for the answer itself, answers the facets of the intent a question asks about (all of them for a question
that names none), and never volunteers the rest.

Per episode: success (0/1), the questions asked and the refusals; the reference's interaction adjustment
0.5 + 0.5 (answered - refused) / (asked + 1), clipped to [0, 1], which its evaluator multiplies into the rubric
score (its run_eval calls it ISR; here `interact_isr` is the success rate and this is `interact_adjust`).
"""
from __future__ import annotations

import json
import re
from typing import Sequence

from experiments.dvworld import tasks
from jaxlab.envs import base
from experiments.dvworld import charts

_REFUSE = re.compile(r"\b(code|python|script|program|implementation|sql|pandas|matplotlib|final answer|"
                     r"the answer|json)\b", re.IGNORECASE)
FACETS = {
    "y": re.compile(r"\b(column|measure|metric|value|variable|quantity|field|what to (show|plot))\b", re.I),
    "agg": re.compile(r"\b(aggregat\w*|average|mean|sum|total|median|max\w*|min\w*|summari[sz]\w*|combine)\b",
                      re.I),
    "filter": re.compile(r"\b(filter\w*|subset|rows|only|restrict\w*|which (records|data|entries))\b", re.I),
    "kind": re.compile(r"\b(chart|plot|graph|kind|type|bar|line|pie|scatter)\b", re.I),
}
REFUSAL = "I can't give you that. Ask me about what I want to see, not how to build it."


def facet_sentence(spec: tasks.Spec, facet: str) -> str:
  if facet == "y":
    return f"I care about {spec.y}."
  if facet == "agg":
    return "Plot every row, no aggregation." if spec.agg is None else f"Take the {spec.agg} per {spec.x}."
  if facet == "filter":
    return "Only rows where " + " and ".join(f"{c} is {v!r}" for c, v in spec.filter) + "."
  return f"As a {spec.kind} chart."


class IntentUser:
  """The scripted user of one task (a `base.UserSimulator`); counts questions and refusals."""

  def __init__(self, spec: tasks.Spec):
    self.spec, self.asked, self.refused = spec, 0, 0

  def __call__(self, history: Sequence[dict], message: str) -> str:
    del history
    self.asked += 1
    if _REFUSE.search(message):
      self.refused += 1
      return REFUSAL
    asked = [f for f, rx in FACETS.items() if rx.search(message)] or list(FACETS)
    return " ".join(facet_sentence(self.spec, f) for f in FACETS if f in asked)


def request(spec: tasks.Spec, columns: Sequence[str], number: int) -> str:
  return (f"Request {number}: I need a chart of the '{spec.source}' table (columns: {', '.join(columns)}) by "
          f"{spec.x}. You may ask me questions with [action] <question>; when you know what I want, reply [answer] "
          'followed by one line of JSON {"y": column, "agg": "mean"|"sum"|"max"|"min"|"median"|null, '
          '"filter": {column: value}, "kind": "bar"|"line"|"pie"|"scatter"}.')


def intent_spec(spec: tasks.Spec) -> dict:
  return {"y": spec.y, "agg": spec.agg, "filter": dict(spec.filter), "kind": spec.kind}


def answer_table(df, x: str, answer: dict) -> dict:
  """The table an answer describes (module docstring); ValueError naming what is wrong with it."""
  if not isinstance(answer, dict) or set(answer) - {"y", "agg", "filter", "kind"}:
    raise ValueError(f"an answer is a JSON object with keys y, agg, filter, kind; found {str(answer)[:80]!r}")
  y, agg, flt = answer.get("y"), answer.get("agg"), answer.get("filter") or {}
  if y not in df.columns:
    raise ValueError(f"answer y must be a column of the table, found {y!r}")
  if agg is not None and agg not in tasks.AGGS:
    raise ValueError(f"answer agg must be one of {tasks.AGGS} or null, found {agg!r}")
  if not isinstance(flt, dict) or any(c not in df.columns for c in flt):
    raise ValueError(f"answer filter must map columns of the table to values, found {flt!r}")
  for c, v in flt.items():
    if df[c].dtype.kind in "iuf":
      try:
        v = float(v)
      except (TypeError, ValueError):
        raise ValueError(f"answer filter {c!r} is numeric, found {v!r}") from None
    df = df[df[c] == v]
  t = df[[x, y]].dropna() if agg is None else df.groupby(x)[y].agg(agg).reset_index()
  return {x: t[x].tolist(), "value": t[y].tolist()}


class InteractEnv:
  """One DV-Interact episode per reset: task `seed % len(specs)` (a `base.Env`)."""
  name = "dvworld_interact"

  def __init__(self, specs: Sequence[tasks.Spec], frames: dict, max_turns: int = 4):
    self.specs, self.frames, self.max_turns = list(specs), frames, max_turns
    self.spec = self.user = None
    self.history: list[dict] = []

  def reset(self, seed: int) -> str:
    self.spec = self.specs[seed % len(self.specs)]
    self.user = IntentUser(self.spec)
    self.history = []
    self.gold = answer_table(self.frames[self.spec.source], self.spec.x, intent_spec(self.spec))
    return request(self.spec, list(self.frames[self.spec.source].columns), seed % len(self.specs) + 1)

  def _facts(self, **kw) -> dict:
    return {"asked": self.user.asked, "refused": self.user.refused, "task": self.spec.id, **kw}

  def interact(self, choice: str, content: str) -> base.Turn:
    if choice == "action":
      reply = self.user(self.history, content)
      self.history += [{"role": "user", "content": content}, {"role": "assistant", "content": reply}]
      return base.Turn(reply, 0.0, False, self._facts(user=True))
    if choice == "answer":
      try:
        ans = json.loads(content)
        table = answer_table(self.frames[self.spec.source], self.spec.x, ans)
      except (ValueError, TypeError, KeyError) as e:
        return base.Turn(f"Your answer could not be used: {e}", 0.0, True, self._facts(correct=False))
      same = charts.table_alignment(self.gold, table) == charts.table_alignment(table, self.gold) == 1.0
      ok = same and ans.get("kind") == self.spec.kind
      return base.Turn("Thanks." if ok else "That is not what I wanted.", float(ok), True,
                       self._facts(correct=bool(ok)))
    if choice == "finish":
      return base.Turn("Ended without an answer.", 0.0, True, self._facts(correct=False))
    return base.Turn("Reply with [action] <question> or [answer] <JSON>.", 0.0, False, self._facts())


def adjustment(asked: int, refused: int) -> float:
  """The reference's interaction adjustment: 0.5 + 0.5 (answered - refused) / (asked + 1), clipped to [0, 1]."""
  return min(1.0, max(0.0, 0.5 + 0.5 * (max(asked - refused, 0) - refused) / (asked + 1)))


def parse_reply(text: str) -> dict:
  """The facets IntentUser's sentences state (what an agent that asked can read off the reply)."""
  out: dict = {}
  if m := re.search(r"I care about (.+?)\.(?:\s|$)", text):
    out["y"] = m.group(1)
  if "no aggregation" in text:
    out["agg"] = None
  elif m := re.search(r"Take the (\w+) per ", text):
    out["agg"] = m.group(1)
  if m := re.search(r"Only rows where (.+?)\.(?:\s|$)", text):
    out["filter"] = {c: _literal(v) for c, v in re.findall(r"(\S+) is ('[^']*'|[-\d.]+)", m.group(1))}
  if m := re.search(r"As a (\w+) chart", text):
    out["kind"] = m.group(1)
  return out


def _literal(v: str):
  return v[1:-1] if v.startswith("'") else float(v)


GENERIC_QUESTION = "What should the chart show: which measure, how summarised, which rows, and what kind of chart?"


def requests(specs, frames) -> dict:
  """Each task's request text -> (spec, columns): what a scripted agent knows of the table it is asked about."""
  return {request(s, list(frames[s.source].columns), i + 1): (s, list(frames[s.source].columns))
          for i, s in enumerate(specs)}


def scripted_policy(spec_by_request, broken: str | None = None, ask: bool = True):
  """A scripted agent over `base.run` histories: asks the generic question once (when `ask`), then answers with
  what the reply stated, changed by the broken kind `broken`; without asking it guesses (the first other column,
  mean, no filter, bar)."""
  def policy(histories: list[list[dict]]) -> list[str]:
    out = []
    for h in histories:
      spec, columns = spec_by_request[h[0]["content"]]
      if ask and len(h) == 1:
        out.append(f"[action] {GENERIC_QUESTION}")
        continue
      ans = parse_reply(h[-1]["content"]) if ask else {}
      ans = {"y": ans.get("y", next(c for c in columns if c != spec.x)), "agg": ans.get("agg", "mean"),
             "filter": ans.get("filter", {}), "kind": ans.get("kind", "bar")}
      if broken == "wrong_aggregation":
        ans["agg"] = spec.other_agg if ans["agg"] is not None else "mean"
      elif broken == "wrong_column":
        ans["y"] = spec.other_y
      elif broken == "missing_filter":
        ans["filter"] = {}
      elif broken == "wrong_chart_type":
        ans["kind"] = tasks.WRONG_TYPE[ans["kind"]]
      out.append("[answer] " + json.dumps(ans))
    return out
  return policy


def episodes(specs, frames, policy, max_turns: int = 4) -> list[dict]:
  """One episode per task; per episode: task, success, asked, refused, adjustment, turns."""
  eps = base.run(lambda: InteractEnv(specs, frames, max_turns), policy, list(range(len(specs))))
  rows = []
  for spec, ep in zip(specs, eps):
    last = ep.turns[-1].info
    asked, refused = last.get("asked", 0), last.get("refused", 0)
    rows.append({"task": spec.id, "success": float(ep.score > 0), "asked": asked, "refused": refused,
                 "adjustment": adjustment(asked, refused), "turns": len(ep.turns),
                 "last": ep.history[-2]["content"][:300]})
  return rows
