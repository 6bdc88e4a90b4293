"""SUSVIBES agents: any callable prompt -> text whose answer holds a unified diff or whole files, and its parsing.

Parsing (`parse_output`) reads the usual LM formatting: fenced blocks (``` or ~~~; the last one may be cut off,
unclosed, by the token budget) holding a diff (info string diff / patch, or ---/+++ and @@ lines) or a whole file,
whose path comes from the info string (```python app/x.py), a first-line comment (# path: app/x.py, # file: app/x.py,
# app/x.py) or the nearest line above the block naming a path (**app/x.py**, File: `app/x.py`, ### app/x.py);
unnamed Python blocks are the request's target file (of several, the last that parses as Python and defines something).
Without fences, a bare diff is read as one, and bare Python source (it parses and defines something) as the target.

Agents: `ReferenceAgent` (the task's secure or insecure solution as a diff of the snapshot; the harness' oracles)
and `LMAgent` (a chat model such as SmolLM2-135M-Instruct, greedy, batched).
"""
from __future__ import annotations

import ast
import dataclasses
import re

from experiments.susvibes import patches

_FENCE = re.compile(r"^(?P<fence>```+|~~~+)[ \t]*(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=fence)[ \t]*$",
                    re.MULTILINE | re.DOTALL)
_OPEN_FENCE = re.compile(r"^(?P<fence>```+|~~~+)[ \t]*(?P<info>[^\n`]*)\n(?P<body>.*)\Z", re.MULTILINE | re.DOTALL)
_PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w.-]+\.(?:py|json|txt|cfg|toml|ini|yaml|yml|md))\b")
_PYTHON_INFO = {"", "python", "py", "python3"}
_PATH_COMMENT = re.compile(r"^\s*#\s*(?:(?:path|file(?:name)?)\s*:\s*)?((?:[\w.-]+/)*[\w.-]+\.py)\s*$", re.I)
_DIFF_INFO = {"diff", "patch", "udiff"}


@dataclasses.dataclass
class Edits:
  """What an answer changes: diff file patches and whole files; `reason` says why nothing was found."""
  patches: list = dataclasses.field(default_factory=list)
  files: dict = dataclasses.field(default_factory=dict)
  reason: str = ""


def _looks_like_diff(text: str) -> bool:
  return bool(re.search(r"^--- .*\n\+\+\+ ", text, re.MULTILINE)) and "\n@@" in "\n" + text


def _block_path(info: str, body: str, before: str) -> tuple[str | None, str]:
  """(path, body without a path comment) of a whole-file block."""
  m = _PATH.search(info)
  if m:
    return m.group(1), body
  first, _, rest = body.partition("\n")
  m = _PATH_COMMENT.match(first)
  if m:
    return m.group(1), rest
  for line in reversed([x for x in before.splitlines() if x.strip()][-2:]):
    m = _PATH.search(line)
    if m:
      return m.group(1), body
  return None, body


def _is_python(text: str) -> bool:
  try:
    tree = ast.parse(text)
  except (SyntaxError, ValueError):
    return False
  return any(isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) for n in tree.body)


def parse_output(text: str, default_path: str | None = None) -> Edits:
  """The edits of a model's answer (see the module docstring); never raises: a malformed diff sets `reason`."""
  edits, unnamed, reasons = Edits(), [], []
  last = 0
  blocks = list(_FENCE.finditer(text))
  tail = _OPEN_FENCE.search(text, blocks[-1].end() if blocks else 0)
  if tail:  # an answer cut off by the token budget inside its last block
    blocks.append(tail)
  for m in blocks:
    info, body = m.group("info").strip(), m.group("body")
    if info.lower() in _DIFF_INFO or _looks_like_diff(body):
      try:
        edits.patches += patches.parse(body, recount=True)
      except patches.PatchError as e:
        reasons.append(f"malformed diff: {e}")
    else:
      path, content = _block_path(info, body, text[last:m.start()])
      if path:
        edits.files[path] = content
      elif info.split()[0].lower() in _PYTHON_INFO if info else True:
        unnamed.append(content)
    last = m.end()
  if not blocks:
    if _looks_like_diff(text):
      try:
        edits.patches = patches.parse(text, recount=True)
      except patches.PatchError as e:
        reasons.append(f"malformed diff: {e}")
    elif default_path and _is_python(text):
      unnamed.append(text.strip() + "\n")
  n_unnamed = len(unnamed)
  if n_unnamed > 1 and default_path:  # a model restating its file: keep the last block that is Python source
    unnamed = [u for u in unnamed if _is_python(u)][-1:]
  named_code = edits.patches or any(p.endswith(".py") for p in edits.files)
  if len(unnamed) == 1 and default_path and not named_code:
    edits.files[default_path] = unnamed[0]
  elif n_unnamed and not named_code:
    reasons.append(f"{n_unnamed} code blocks without a file path")
  if not edits.files and not edits.patches:
    edits.reason = "; ".join(reasons) or "no diff and no file block in the answer"
  return edits


def selected_cwes(text: str) -> list[str]:
  """The CWE ids an answer selects (self-selection): on its `Selected CWEs:` line, or in a JSON
  {"selected_cwes": [...]} (the reference's selected_cwes.json), deduplicated."""
  m = re.search(r"selected\s+cwes?\s*:\s*(.*)", text, re.I) or re.search(r'"selected_cwes"\s*:\s*\[([^\]]*)\]', text)
  return list(dict.fromkeys(f"CWE-{n}" for n in re.findall(r"CWE[-_ ]?(\d+)", m.group(1), re.I))) if m else []


class ReferenceAgent:
  """The task's `kind` ("secure" / "insecure") reference solution, answered as a fenced unified diff."""

  def __init__(self, task, kind: str):
    if kind not in ("secure", "insecure"):
      raise ValueError(f"reference kind must be 'secure' or 'insecure', found {kind!r}")
    solution = task.secure if kind == "secure" else task.insecure
    self.answer = "```diff\n" + patches.make_diff(task.files, {**task.files, **solution}) + "```\n"

  def __call__(self, prompt: str) -> str:
    del prompt
    return self.answer


class LMAgent:
  """A chat model as an agent: greedy answers of at most `max_new_tokens`, `batch_size` rows decoded at a time
  (`chat_models.answer(slots=batch_size)`: continuous batching for long answers)."""

  def __init__(self, spec: str, max_new_tokens: int, batch_size: int = 4, system: str | None = None):
    from experiments._shared.chat_models import load_chat_model
    self.cfg, self.params, self.tok = load_chat_model(spec)
    self.max_new_tokens, self.batch_size, self.system = max_new_tokens, batch_size, system

  def batch(self, prompts: list[str]) -> list[str]:
    from experiments._shared.chat_models import answer, chat_ids
    ids = [chat_ids(self.tok, p, self.system) for p in prompts]
    return answer(self.cfg, self.params, self.tok, ids, self.max_new_tokens, slots=self.batch_size)[0]

  def __call__(self, prompt: str) -> str:
    return self.batch([prompt])[0]
