"""conpress's packed-answer parser: per-question traces and answers of a completion answering N numbered questions,
never attributing text to a question it may not belong to (the rules are in experiments/conpress/__init__.py), the
reasoning of a `<think>` block included, and the comparison of an answer with a gold answer."""
from __future__ import annotations

import dataclasses
import re

from jaxlab.data.tasks import arithmetic

_LEAD = r"^[ \t>#*_\-]*"
_KEYWORD_HEADER = re.compile(_LEAD + r"(?:question|problem|q)[ \t]*#?[ \t]*(\d{1,3})[ \t]*(?:[:.)\]]|\*\*|-|$)",
                             re.I | re.M)
_BARE_HEADER = re.compile(r"^[ \t>#*_]*(\d{1,3})[ \t]*[.)](?=\s)", re.M)
_VALUE = r"((?:[^\n.,;]|[.,;](?![ \t\n]|$))*)"  # up to the end of the line or of the clause
_NUMBERED_ANSWER = re.compile(r"\b(?:final[ \t]+)?answer[ \t]*(?:(?:to|for|of)[ \t]+(?:question|problem|q)[ \t]*)?"
                              r"#?[ \t]*(\d{1,3})[ \t]*\**[ \t]*(?:[:=]|\bis\b)[ \t]*\**[ \t]*" + _VALUE, re.I)
_OTHER_LABEL = re.compile(r"\b(?:answer[ \t]*(?:(?:to|for|of)[ \t]+(?:question|problem|q)[ \t]*)?|question|problem|q)"
                          r"[ \t]*#?[ \t]*(\d{1,3})[ \t]*\**[ \t]*[:=.)]", re.I)
_ANSWER = re.compile(r"\banswer\b(?:[^\n:=\d]{0,40}?\bis\b|[ \t]*\**[ \t]*[:=])[ \t]*\**[ \t]*" + _VALUE, re.I)
_TAG = re.compile(r"<answer>(.*?)</answer>", re.I | re.S)
_BOX = re.compile(r"\\(?:boxed|fbox)[ \t]*\{")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_EQUALS = re.compile(r"=[ \t]*\**[ \t]*(-?\d[\d,]*(?:\.\d+)?)")
_PARAGRAPH = re.compile(r"\n[ \t]*\n")


@dataclasses.dataclass(frozen=True)
class Parsed:
  """One question's share of a packed answer: its trace (section text) and answer, each None when unknown;
  `reasoning`: its share of the completion's `<think>` block (None without one)."""
  number: int
  trace: str | None
  answer: str | None
  reasoning: str | None = None


def boxed(text: str) -> list[str]:
  """The contents of every complete `\\boxed{...}` (or `\\fbox{...}`) in `text`, nested braces included."""
  out = []
  for m in _BOX.finditer(text):
    depth, i = 1, m.end()
    while i < len(text) and depth:
      depth += {"{": 1, "}": -1}.get(text[i], 0) if text[i - 1] != "\\" else 0
      i += 1
    if not depth:
      out.append(text[m.end():i - 1])
  return out


def _clean(value: str) -> str | None:
  v = value.strip().strip("*").strip().rstrip(".").strip()
  if _BOX.search(v):  # "the answer is \boxed{x}": x, and nothing where the box is cut
    inner = boxed(v)
    v = inner[-1].strip() if inner else ""
  return v or None


def _stated(text: str) -> list[str]:
  """Values stated as answers in a section: "answer: x" / "the answer is x", <answer>x</answer>, \\boxed{x}."""
  out = [_clean(m.group(1)) for m in _ANSWER.finditer(text)]
  out += [_clean(m.group(1)) for m in _TAG.finditer(text)] + [_clean(b) for b in boxed(text)]
  return [v for v in out if v]


def split_think(text: str) -> tuple[str | None, str]:
  """(reasoning, the rest) of a completion: the text of a leading `<think>...</think>` block (or before a
  `</think>` that closes a block the chat template opened) and what follows it; reasoning None without a block
  (or an empty one), the rest "" while the block is unclosed (a completion cut by its budget)."""
  s = text.strip()
  if THINK_CLOSE in s:
    head, rest = s.split(THINK_CLOSE, 1)
    head = head.split(THINK_OPEN, 1)[1] if THINK_OPEN in head else head
    return head.strip() or None, rest.strip()
  if s.startswith(THINK_OPEN):
    return s[len(THINK_OPEN):].strip() or None, ""
  return None, text


def _math(text: str) -> str:
  return text if any(d in text for d in ("$", "\\(", "\\[", "\\boxed")) else f"${text}$"


def equivalent(answer: str | None, gold: str) -> bool:
  """Whether `answer` states `gold`: equal strings after `arithmetic.normalize`, else mathematically equal by
  math-verify (LaTeX or plain expressions: `\\dfrac12` equals `\\frac{1}{2}` and 0.5)."""
  if answer is None:
    return False
  if arithmetic.normalize(answer) == arithmetic.normalize(gold):
    return True
  import math_verify  # a declared dependency, imported where it is used (its sympy import is slow)
  g, a = math_verify.parse(_math(gold)), math_verify.parse(_math(answer))
  return bool(g and a and math_verify.verify(g, a))


_DIGITS = re.compile(r"\d+(?:\.\d+)?")


def _signature(question: str) -> tuple[str, ...] | None:
  """The numbers of a question in order (None with fewer than two): what a trace restating it begins with."""
  nums = tuple(_DIGITS.findall(question))
  return nums if len(nums) >= 2 else None


def _contains(nums: tuple, sig: tuple, prefix: bool = False) -> bool:
  starts = [0] if prefix else range(len(nums) - len(sig) + 1)
  return any(nums[i:i + len(sig)] == sig for i in starts)


def _cut(body: str, others=()) -> str:
  """The section up to and including the first paragraph that states an answer (a label, tag or statement), and
  before any later paragraph that restates another question (`others`: their signatures)."""
  parts, pos = [], 0
  for m in list(_PARAGRAPH.finditer(body)) + [None]:
    end = m.start() if m else len(body)
    para = body[pos:end]
    if parts and any(_contains(tuple(_DIGITS.findall(para)), sig) for sig in others):
      break
    parts.append(para)
    if _stated(para) or _NUMBERED_ANSWER.search(para):
      break
    if m:
      parts.append(m.group(0))
      pos = m.end()
  return "".join(parts).strip()


def _others(sigs, k: int) -> list[tuple]:
  return [sig for j, sig in enumerate(sigs, 1) if j != k and sig is not None and sig != sigs[k - 1]]


def _sections(text: str, n: int) -> tuple[list, dict[int, str]]:
  """The headers of `text` and the whole text after each header of a number in 1..n numbered once, up to the next."""
  headers = list(_KEYWORD_HEADER.finditer(text))
  if not headers and n > 1:  # with one question, bare numbers are its steps
    headers = list(_BARE_HEADER.finditer(text))
  counts: dict[int, int] = {}
  for h in headers:
    counts[int(h.group(1))] = counts.get(int(h.group(1)), 0) + 1
  sections: dict[int, str] = {}
  for i, h in enumerate(headers):
    k = int(h.group(1))
    if 1 <= k <= n and counts[k] == 1:
      end = headers[i + 1].start() if i + 1 < len(headers) else len(text)
      sections[k] = text[h.end():end].lstrip("*").strip()
  return headers, sections


def _thoughts(reasoning: str, n: int) -> dict[int, str]:
  """Each question's share of a `<think>` block: all of it with one question, else its header sections (as the
  answer's, uncut) that name no other question."""
  if n == 1:
    return {1: reasoning}
  return {k: r for k, r in _sections(reasoning, n)[1].items()
          if r and all(int(m.group(1)) == k for m in _OTHER_LABEL.finditer(r))}


def parse_packed(text: str, n: int, questions=None) -> list[Parsed]:
  """Per-question (trace, answer, reasoning) of a completion answering `n` numbered questions; never a guess (see
  module docstring): what cannot be attributed to exactly one question stays None.

  A completion with a `<think>` block (`split_think`) is parsed after the block; each question's reasoning is its
  share of the block (`_thoughts`), and a question whose reasoning cannot be attributed has no trace (its trace
  without its reasoning is not what the model wrote for it). An unclosed block (a cut completion) answers nothing.

  Args:
    text: the completion.
    n: the number of questions in the prompt.
    questions: the n question texts, optional: a section that begins by restating another question's numbers
      (and not its own) is that question's, so it is dropped; a later paragraph restating another one ends it.
  """
  if n < 1:
    raise ValueError(f"n must be >= 1, found {n}")
  if questions is not None and len(questions) != n:
    raise ValueError(f"questions must hold the n = {n} question texts, found {len(questions)}")
  sigs = [_signature(q) for q in questions] if questions is not None else [None] * n
  reasoning, text = split_think(text)
  thoughts = _thoughts(reasoning, n) if reasoning is not None else None
  headers, sections = _sections(text, n)
  sections = {k: _cut(body, _others(sigs, k)) for k, body in sections.items()}
  if n == 1 and not headers and text.strip():
    sections[1] = _cut(text.strip())
  labels: dict[int, set] = {}
  for m in _NUMBERED_ANSWER.finditer(text):
    v = _clean(m.group(2))
    if v:
      labels.setdefault(int(m.group(1)), set()).add(v)
  out = []
  for k in range(1, n + 1):
    trace = sections.get(k)
    if trace is not None and any(int(m.group(1)) != k for m in _OTHER_LABEL.finditer(trace)):
      trace = None  # it names another question: its text may be that question's
    if trace is not None:
      lead = tuple(_DIGITS.findall(trace))
      own = sigs[k - 1] is not None and _contains(lead, sigs[k - 1], prefix=True)
      if not own and any(_contains(lead, sig, prefix=True) for sig in _others(sigs, k)):
        trace = None  # it begins by restating another question
    if k in labels:
      answer = next(iter(labels[k])) if len(labels[k]) == 1 else None
    elif trace is not None:
      stated = set(_stated(trace))
      eq = _EQUALS.findall(trace)
      answer = (next(iter(stated)) if len(stated) == 1 else None) if stated else (eq[-1] if eq else None)
    else:
      answer = None
    thought = None if thoughts is None else thoughts.get(k)
    if thoughts is not None and thought is None:
      trace = None
    out.append(Parsed(k, trace or None, answer, thought))
  return out


def _renumber(text: str) -> str:
  return _NUMBERED_ANSWER.sub(lambda m: m.group(0).replace(m.group(1), "1", 1), text)


def sft_completion(p: Parsed) -> str:
  """The single-question target of a packed trace: "Problem 1: " + the trace, its answer labels renumbered; after
  its reasoning in a `<think>` block when it has one."""
  body = "Problem 1: " + _renumber(p.trace)
  return body if p.reasoning is None else f"{THINK_OPEN}\n{_renumber(p.reasoning)}\n{THINK_CLOSE}\n\n{body}"
