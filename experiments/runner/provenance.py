"""Which code made a run: the git commit of the repository the runner lives in, and whether its tree differed.

`run_experiment` records `git_commit` and `git_dirty` in each run's config.json (next to `preset` and `config`) and
results.json; `reproduce` reads a finished run back only when it was made at the current commit from a clean tree.
Outside a git checkout (or without git) the commit is "unknown" and `git_dirty` is None: such a run is never
taken for the current code.
"""
from __future__ import annotations

import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNKNOWN = "unknown"


def _git(*args: str) -> str | None:
  try:
    p = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.SubprocessError):
    return None
  return p.stdout if p.returncode == 0 else None


def current() -> dict:
  """{"git_commit": HEAD's hash or "unknown", "git_dirty": whether `git status --porcelain` lists anything (files
  that .gitignore names, such as runs/, do not count), None when unknown}."""
  head = _git("rev-parse", "HEAD")
  if not head:
    return {"git_commit": UNKNOWN, "git_dirty": None}
  status = _git("status", "--porcelain")
  return {"git_commit": head.strip(), "git_dirty": None if status is None else bool(status.strip())}


def same_code(saved: dict, now: dict) -> bool:
  """Whether a run whose config.json (or results.json) is `saved` was made by the code `now` describes: the same
  known commit, from a clean tree."""
  commit = saved.get("git_commit")
  return commit not in (None, UNKNOWN) and commit == now.get("git_commit") and saved.get("git_dirty") is False


def label(saved: dict) -> str:
  """"<12 hex digits>", with "+dirty" for a tree that differed from it, or "unknown"."""
  commit = saved.get("git_commit") or UNKNOWN
  if commit == UNKNOWN:
    return UNKNOWN
  return commit[:12] + ("+dirty" if saved.get("git_dirty") is not False else "")
