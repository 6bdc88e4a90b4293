"""Unified diffs: parse, apply to a directory, strip files, reverse, and make one from two file sets.

Used by code benchmarks that score a model's patch (SUSVIBES, LeiLiLab/susvibes, and SWE-style tasks): the patch is
parsed (`git diff` sections or bare `---`/`+++` pairs), the files a harness protects are stripped from it
(`strip_files`), and the rest is applied to a fresh copy of the repository (`apply`), hunk by hunk at the header's
line or the nearest position where its old lines match (an offset, never fuzz), optionally ignoring changes in
whitespace as `git apply --ignore-space-change` does. Patch paths are untrusted: an absolute path or one that leaves
the root is an error, never a write.

`parse(text, recount=True)` reads the diffs language models write: hunk headers with wrong or missing counts, blank
context lines that lost their leading space; the hunk then ends at the first line that cannot belong to it.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import re

DEV_NULL = "/dev/null"
NO_EOL = "\\ No newline at end of file"
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_LOOSE_HUNK = re.compile(r"^@@(?: -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))?)?.*?@@")
_GIT = re.compile(r"^diff --git (?:a/)?(\S+) (?:b/)?(\S+)")


class PatchError(ValueError):
  """A malformed patch, or one that does not apply; the message names the file, line or hunk."""


@dataclasses.dataclass
class Hunk:
  """One hunk: `lines` are (tag, text) with tag ' ', '-' or '+'; `no_eol` holds '-' / '+' when the old / new side's
  last line has no newline (the file's end)."""
  old_start: int
  new_start: int
  lines: list[tuple[str, str]]
  no_eol: set[str] = dataclasses.field(default_factory=set)

  @property
  def old(self) -> list[str]:
    return [t for tag, t in self.lines if tag != "+"]

  @property
  def new(self) -> list[str]:
    return [t for tag, t in self.lines if tag != "-"]

  def header(self) -> str:
    o, n = len(self.old), len(self.new)
    return f"@@ -{self.old_start},{o} +{self.new_start},{n} @@"


@dataclasses.dataclass
class FilePatch:
  """The changes to one file; `old_path` / `new_path` without a/ b/ prefixes, DEV_NULL for creation / deletion."""
  old_path: str
  new_path: str
  hunks: list[Hunk]

  @property
  def path(self) -> str:
    return self.old_path if self.new_path == DEV_NULL else self.new_path

  @property
  def paths(self) -> set[str]:
    return {p for p in (self.old_path, self.new_path) if p != DEV_NULL}


def _strip_prefix(path: str) -> str:
  path = path.split("\t", 1)[0].strip()
  if path.startswith('"') and path.endswith('"'):
    path = path[1:-1]
  return path[2:] if path.startswith(("a/", "b/")) else path


def parse(text: str, *, recount: bool = False) -> list[FilePatch]:
  """The file patches of a unified diff (empty text: none).

  Args:
    text: `git diff` output or bare `--- old` / `+++ new` sections; other lines between sections are ignored.
    recount: take hunk lengths from the body rather than the header (for model-written diffs).

  Raises:
    PatchError: a hunk outside a file section, a hunk header that does not parse, or a body shorter than its header.
  """
  lines = text.splitlines()
  out: list[FilePatch] = []
  git = None  # a `diff --git` header not yet followed by ---/+++: an empty file created or deleted
  i = 0
  while i < len(lines):
    line = lines[i]
    if line.startswith("diff --git ") or (git and line.startswith(("new file mode", "deleted file mode"))):
      if line.startswith("diff --git "):
        _flush(git, out)
        m = _GIT.match(line)
        git = [m.group(1), m.group(2), None] if m else None
      else:
        git[2] = "new" if line.startswith("new") else "deleted"
      i += 1
      continue
    if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
      git = None
      out.append(FilePatch(_strip_prefix(line[4:]), _strip_prefix(lines[i + 1][4:]), []))
      i += 2
      continue
    if line.startswith("@@"):
      if not out:
        raise PatchError(f"line {i + 1}: a hunk before any '--- a/PATH' / '+++ b/PATH' file header: {line!r}")
      hunk, i = _hunk(lines, i, recount)
      out[-1].hunks.append(hunk)
      continue
    i += 1
  _flush(git, out)
  for fp in out:
    if fp.old_path == DEV_NULL and fp.new_path == DEV_NULL:
      raise PatchError("a file section with /dev/null on both sides")
  return out


def _flush(git, out: list[FilePatch]) -> None:
  if git and git[2]:
    out.append(FilePatch(DEV_NULL, git[1], []) if git[2] == "new" else FilePatch(git[0], DEV_NULL, []))


def _hunk(lines: list[str], i: int, recount: bool) -> tuple[Hunk, int]:
  m = (_LOOSE_HUNK if recount else _HUNK).match(lines[i])
  if not m:
    raise PatchError(f"line {i + 1}: expected a hunk header '@@ -START,COUNT +START,COUNT @@', found {lines[i]!r}")
  old_start, old_n, new_start, new_n = m.groups()
  hunk = Hunk(int(old_start or 0), int(new_start or 0), [])
  want_old = None if recount else (1 if old_n is None else int(old_n))
  want_new = None if recount else (1 if new_n is None else int(new_n))
  n_old = n_new = loose_tail = 0
  j = i + 1
  while j < len(lines):
    if not recount and n_old >= want_old and n_new >= want_new:
      break
    line = lines[j]
    if line.startswith("\\"):
      _mark_no_eol(hunk)
      j += 1
      continue
    if recount and (line.startswith(("@@", "diff --git ")) or (line.startswith("--- ") and j + 1 < len(lines)
                                                                 and lines[j + 1].startswith("+++ "))):
      break
    tag = line[:1] if line else " "
    if tag not in " -+":
      if recount:
        break
      raise PatchError(f"line {j + 1}: a hunk line must start with ' ', '-' or '+', found {line!r}")
    hunk.lines.append((tag, line[1:]))
    loose_tail = loose_tail + 1 if not line else 0
    n_old += tag != "+"
    n_new += tag != "-"
    j += 1
  if j < len(lines) and lines[j].startswith("\\"):
    _mark_no_eol(hunk)
    j += 1
  if not recount and (n_old, n_new) != (want_old, want_new):
    raise PatchError(f"line {i + 1}: hunk {lines[i]!r} promises {want_old} old / {want_new} new lines, its body "
                     f"has {n_old} / {n_new}")
  if recount and loose_tail:  # empty lines (no leading space) after the body separate sections; not context
    del hunk.lines[-loose_tail:]
  if not hunk.lines:
    raise PatchError(f"line {i + 1}: hunk {lines[i]!r} has no lines")
  return hunk, j


def _mark_no_eol(hunk: Hunk) -> None:
  if hunk.lines:
    tag = hunk.lines[-1][0]
    hunk.no_eol.update("-+" if tag == " " else tag)


def format_patch(patches: list[FilePatch]) -> str:
  """The unified diff text of `patches` (git-style headers; counts recomputed)."""
  out = []
  for fp in patches:
    a = DEV_NULL if fp.old_path == DEV_NULL else f"a/{fp.old_path}"
    b = DEV_NULL if fp.new_path == DEV_NULL else f"b/{fp.new_path}"
    out.append(f"diff --git a/{fp.path} b/{fp.path}")
    out += ["new file mode 100644"] if a == DEV_NULL else ["deleted file mode 100644"] if b == DEV_NULL else []
    out += [f"--- {a}", f"+++ {b}"]
    for h in fp.hunks:
      out.append(h.header())
      last_old = max((k for k, (t, _) in enumerate(h.lines) if t != "+"), default=-1)
      last_new = max((k for k, (t, _) in enumerate(h.lines) if t != "-"), default=-1)
      for k, (tag, text) in enumerate(h.lines):
        out.append(tag + text)
        if ("-" in h.no_eol and k == last_old) or ("+" in h.no_eol and k == last_new):
          out.append(NO_EOL)
  return "\n".join(out) + ("\n" if out else "")


def touched_files(patch: str | list[FilePatch]) -> set[str]:
  """Every path a patch creates, edits or deletes."""
  patches = parse(patch, recount=True) if isinstance(patch, str) else patch
  return set().union(*(fp.paths for fp in patches)) if patches else set()


def strip_files(patches: list[FilePatch], paths) -> tuple[list[FilePatch], list[str]]:
  """(`patches` without every file section that touches one of `paths`, the stripped paths, sorted)."""
  protected = {os.path.normpath(p) for p in paths}
  kept, removed = [], set()
  for fp in patches:
    hit = {p for p in fp.paths if os.path.normpath(p) in protected}
    if hit:
      removed |= hit
    else:
      kept.append(fp)
  return kept, sorted(removed)


def reverse(patches: list[FilePatch]) -> list[FilePatch]:
  """The patch that undoes `patches` (applied after them, it restores the original files)."""
  swap = {" ": " ", "-": "+", "+": "-"}
  return [FilePatch(fp.new_path, fp.old_path,
                    [Hunk(h.new_start, h.old_start, [(swap[t], s) for t, s in h.lines], {swap[t] for t in h.no_eol})
                     for h in fp.hunks])
          for fp in reversed(patches)]


def safe_path(root: str, path: str) -> str:
  """`root/path` for a relative path that stays inside `root`; PatchError for an absolute or escaping one."""
  if not path or os.path.isabs(path) or "\x00" in path:
    raise PatchError(f"patch path must be relative to the repository, found {path!r}")
  root = os.path.realpath(root)
  full = os.path.realpath(os.path.join(root, path))
  if os.path.commonpath([root, full]) != root or full == root:
    raise PatchError(f"patch path {path!r} leaves the repository root")
  return full


def _read_lines(full: str) -> tuple[list[str], bool]:
  with open(full, encoding="utf-8", errors="surrogateescape", newline="") as f:
    text = f.read()
  return text.splitlines(), text.endswith(("\n", "\r"))


def _norm(s: str) -> str:
  return " ".join(s.split())


def _find(lines: list[str], old: list[str], at: int, ignore_space: bool) -> int | None:
  """The start nearest `at` where `old` matches `lines` (exactly, or up to whitespace changes)."""
  eq = (lambda a, b: _norm(a) == _norm(b)) if ignore_space else (lambda a, b: a.rstrip("\r") == b.rstrip("\r"))
  n = len(old)
  for d in range(len(lines) + 1):
    for pos in ((at - d, at + d) if d else (at,)):
      if 0 <= pos <= len(lines) - n and all(eq(lines[pos + k], old[k]) for k in range(n)):
        return pos
  return None


def apply(patches: list[FilePatch], root: str, *, ignore_space_change: bool = False) -> list[str]:
  """Applies `patches` to the files under `root`, all or nothing; returns the paths written or deleted.

  Raises:
    PatchError: a path outside `root`, a created file that exists, an edited file that does not, or a hunk whose
      old lines match nowhere in the file.
  """
  results: dict[str, tuple[list[str] | None, bool]] = {}
  for fp in patches:
    target = safe_path(root, fp.path)
    if fp.old_path == DEV_NULL:
      if os.path.exists(target) and fp.path not in results:
        raise PatchError(f"{fp.path}: the patch creates it, but it already exists")
      lines, eol = [], True
    elif fp.path in results:
      lines, eol = results[fp.path]
      if lines is None:
        raise PatchError(f"{fp.path}: edited after the patch deleted it")
    else:
      src = safe_path(root, fp.old_path)
      if not os.path.isfile(src):
        raise PatchError(f"{fp.old_path}: the patch edits it, but there is no such file")
      lines, eol = _read_lines(src)
    lines = list(lines)
    offset = 0
    for k, h in enumerate(fp.hunks):
      at = max(h.old_start - 1 + offset, 0) if h.old else min(h.old_start + offset, len(lines))
      pos = _find(lines, h.old, at, ignore_space_change)
      if pos is None:
        raise PatchError(f"{fp.path}: hunk {k + 1} ({h.header()}) does not match the file's lines")
      lines[pos:pos + len(h.old)] = h.new
      offset += len(h.new) - len(h.old)
      if pos + len(h.new) == len(lines):  # the hunk reaches the end: its markers say how the file ends
        eol = "+" not in h.no_eol
    results[fp.path] = (None, True) if fp.new_path == DEV_NULL else (lines, eol)
    if fp.old_path not in (DEV_NULL, fp.new_path) and fp.new_path != DEV_NULL:
      results.setdefault(fp.old_path, (None, True))  # a rename removes the old file
  for path, (lines, eol) in results.items():
    full = safe_path(root, path)
    if lines is None:
      if os.path.exists(full):
        os.remove(full)
      continue
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8", errors="surrogateescape", newline="") as f:
      f.write("\n".join(lines) + ("\n" if eol and lines else ""))
  return sorted(results)


def write_files(files: dict[str, str], root: str) -> list[str]:
  """Writes whole files (path -> content) under `root`, each path checked as `apply` checks a patch's."""
  targets = {p: safe_path(root, p) for p in files}
  for p, content in files.items():
    os.makedirs(os.path.dirname(targets[p]), exist_ok=True)
    with open(targets[p], "w", encoding="utf-8") as f:
      f.write(content)
  return sorted(files)


def make_diff(old: dict[str, str], new: dict[str, str]) -> str:
  """The unified diff (git-style, 3 lines of context) taking file set `old` (path -> text) to `new`."""
  out = []
  for path in sorted(set(old) | set(new)):
    a, b = old.get(path), new.get(path)
    if a == b:
      continue
    body = list(difflib.unified_diff(_diff_lines(a), _diff_lines(b), "/dev/null" if a is None else f"a/{path}",
                                     "/dev/null" if b is None else f"b/{path}", lineterm="\n"))
    if not body:  # an empty file created or deleted: headers without hunks
      body = [f"--- {DEV_NULL if a is None else 'a/' + path}\n", f"+++ {DEV_NULL if b is None else 'b/' + path}\n"]
    mode = "new file mode 100644\n" if a is None else "deleted file mode 100644\n" if b is None else ""
    out.append(f"diff --git a/{path} b/{path}\n" + mode + "".join(body))
  return "".join(out)


def _diff_lines(text: str | None) -> list[str]:
  if text is None:
    return []
  lines = text.splitlines(keepends=True)
  if lines and not lines[-1].endswith("\n"):
    lines[-1] += "\n" + NO_EOL + "\n"
  return lines
