"""Run directories: chosen once (absolute), never another run's unless resuming it, and left clean by a run that
fails before producing anything."""
from __future__ import annotations

import os

RESULT_FILES = ("results.json", "config.json", "metrics.jsonl", "checkpoints")


class RunDirExists(FileExistsError):
  pass


def has_results(path: str) -> bool:
  return os.path.isdir(path) and any(os.path.exists(os.path.join(path, f)) for f in RESULT_FILES)


def resolve_run_dir(name: str, out: str | None, resume: bool, root: str = "runs") -> str:
  """The directory a run writes to; never one holding another run's results unless resuming it.

  With an explicit `out` that already holds a run, refuses (RunDirExists) unless `resume`. Without `out`,
  uses `root/name`, or when that holds a run and not `resume`, the first free `root/name-2`, `-3`, ...
  The result is absolute (orbax requires absolute checkpoint paths; a relative `out` or `root` is taken
  relative to the working directory at the time of the call).
  """
  return os.path.abspath(_resolve_run_dir(name, out, resume, root))


def _resolve_run_dir(name: str, out: str | None, resume: bool, root: str) -> str:
  if out is not None:
    if has_results(out) and not resume:
      raise RunDirExists(f"{out} already holds a run (config/results/checkpoints); pass --resume to continue "
                         "it or choose another --out")
    return out
  base = os.path.join(root, name)
  if resume or not has_results(base):
    return base
  i = 2
  while has_results(f"{base}-{i}"):
    i += 1
  return f"{base}-{i}"


def _holds_work(path: str, written: set[str]) -> bool:
  """Whether `path` holds anything but the files this invocation wrote (and empty directories)."""
  for dirpath, _, files in os.walk(path):
    for f in files:
      full = os.path.join(dirpath, f)
      if full not in written and not (f == "metrics.jsonl" and os.path.getsize(full) == 0):
        return True
  return False


def discard_failed_start(out_dir: str, existed: bool, written: set[str]) -> None:
  """After a run failed before producing anything, removes what the runner wrote, so the same --out (or
  --resume) starts cleanly next time; a run that logged, checkpointed or plotted anything is kept whole."""
  if not os.path.isdir(out_dir) or _holds_work(out_dir, written):
    return
  for f in written:
    if os.path.exists(f):
      os.remove(f)
  if not existed:
    for dirpath, _, _ in sorted(os.walk(out_dir), key=lambda t: -len(t[0])):
      if not os.listdir(dirpath):
        os.rmdir(dirpath)
