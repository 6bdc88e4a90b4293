"""Which code made a run: the git commit of the repository the runner lives in, and whether its tree differed.

`run_experiment` records `git_commit` and `git_dirty` in each run's config.json (next to `preset` and `config`) and
results.json, and in sources.json the repository files the run computed with (`sources`). `reproduce` reads a
finished run back when it was made from a clean tree at the current commit, or at an earlier one where every file
of its sources.json is unchanged at the current commit (`same_code`): what the current code computes, without
running it again. Outside a git checkout (or without git) the commit is "unknown" and `git_dirty` is None: such a
run is never taken for the current code.
"""
from __future__ import annotations

import os
import platform
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNKNOWN = "unknown"
SOURCES_FILE = "sources.json"
PINS = ("pyproject.toml", "install.sh", ".ci/constraints.txt", ".ci/no-deps.txt")  # what gets installed
# the runner's modules that only read finished runs (judging, reports, the README): never a run's source
JUDGING = tuple(f"experiments/runner/{m}.py" for m in ("claims", "judge", "readme", "report", "reproduce"))


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


def sources() -> list[str] | None:
  """The repository files a run in this process computed with, repo-relative and sorted: every module of jaxlab
  and experiments loaded so far (an experiment package's `__init__`, which the registry imports for every
  experiment, only when a module of that package beyond it is loaded; never the runner's `JUDGING` modules), the
  data files tracked beside them, and the install pins. Conservative: a module loaded for another experiment of
  the same process counts. None when such a module was loaded from outside this repository (another checkout on
  the path)."""
  root, loaded = os.path.realpath(REPO), set()
  for name, module in list(sys.modules.items()):
    path = getattr(module, "__file__", None)
    if name.split(".")[0] not in ("jaxlab", "experiments") or not path:
      continue
    rel = os.path.relpath(os.path.realpath(path), root)
    if rel.startswith(".."):
      return None
    loaded.add(rel.replace(os.sep, "/"))
  used = {r.split("/")[1] for r in loaded if r.startswith("experiments/") and r.count("/") > 1
          and not r.endswith("/__init__.py")}
  keep = lambda r: r not in JUDGING and not (r.startswith("experiments/") and r.count("/") > 1
                                             and r.split("/")[1] not in used)
  data = (_git("ls-files", "--", "jaxlab", *(f"experiments/{u}" for u in sorted(used))) or "").split()
  data = [d for d in data if not d.endswith((".py", ".md"))]
  pins = {p for p in PINS if os.path.exists(os.path.join(REPO, p))}
  return sorted({r for r in loaded if keep(r)} | set(data) | pins)


def unchanged(commit: str, now: dict, files) -> bool:
  """Whether every one of `files` is the same at `commit` as at `now`'s commit, `now` being a clean tree."""
  if not files or now.get("git_dirty") is not False or now.get("git_commit") in (None, UNKNOWN):
    return False
  return _git("diff", "--quiet", commit, now["git_commit"], "--", *files) is not None


def host() -> dict:
  """The CPU a run computed on: its model name and widest vector extension, which change XLA:CPU's code and so
  the low bits of every float (a cpu-preset figure can differ between machines at one commit)."""
  model, flags = platform.processor() or platform.machine(), set()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model in ("", platform.machine()):
          model = value.strip()
        elif key.strip() == "flags":
          flags = set(value.split())
          break
  except OSError:
    pass
  simd = next((s for s in ("avx512f", "avx2", "avx", "sse4_2", "neon", "asimd") if s in flags), "unknown")
  return {"cpu_model": model, "simd": simd}


def same_code(saved: dict, now: dict, files=None) -> bool:
  """Whether a run whose config.json (or results.json) is `saved` was made by the code `now` describes: the same
  known commit from a clean tree, or, given the run's `files` (its sources.json), an earlier commit from a clean
  tree at which every one of them is as it is now."""
  commit = saved.get("git_commit")
  if commit in (None, UNKNOWN) or saved.get("git_dirty") is not False:
    return False
  return commit == now.get("git_commit") or (files is not None and unchanged(commit, now, files))


def label(saved: dict) -> str:
  """"<12 hex digits>", with "+dirty" for a tree that differed from it, or "unknown"."""
  commit = saved.get("git_commit") or UNKNOWN
  if commit == UNKNOWN:
    return UNKNOWN
  return commit[:12] + ("+dirty" if saved.get("git_dirty") is not False else "")
