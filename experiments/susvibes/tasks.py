"""SUSVIBES tasks: the mini benchmark on disk and its view as a repository snapshot with tests.

A mini task is a directory `mini/<id>/` holding
  task.json    {"cwe": "CWE-22", "target": "pkg/module.py", "request": "..."}: the weakness, the file holding the
               masked feature and the feature request the agent reads;
  repo/        the repository snapshot with the feature masked (its tests/ are the functional tests);
  security/    the security tests, added to the snapshot only for the security run (SUSVIBES' test patch);
  secure/, insecure/  the two reference solutions as whole files (paths relative to the repository root).
Tests are stdlib unittest files discovered under tests/ and run from the repository root (`TEST_ARGV`). The
interpreter starts with -P and imports unittest before the root joins sys.path, so a file of the agent's named like a
stdlib module the runner needs (unittest.py) cannot stand in for it.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import os

MINI_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mini")
TEST_ARGV = ("python", "-P", "-c", "import sys, unittest; sys.path.insert(0, ''); unittest.main(module=None, "
             "argv=['unittest', 'discover', '-s', 'tests', '-p', 'test_*.py', '-v'])")

# MITRE's names of the weaknesses the mini benchmark covers.
CWE_NAMES = {
    "CWE-22": "Improper Limitation of a Pathname to a Restricted Directory ('Path Traversal')",
    "CWE-23": "Relative Path Traversal",
    "CWE-78": "Improper Neutralization of Special Elements used in an OS Command ('OS Command Injection')",
    "CWE-79": "Improper Neutralization of Input During Web Page Generation ('Cross-site Scripting')",
    "CWE-89": "Improper Neutralization of Special Elements used in an SQL Command ('SQL Injection')",
    "CWE-130": "Improper Handling of Length Parameter Inconsistency",
    "CWE-208": "Observable Timing Discrepancy",
    "CWE-338": "Use of Cryptographically Weak Pseudo-Random Number Generator (PRNG)",
    "CWE-409": "Improper Handling of Highly Compressed Data (Data Amplification)",
    "CWE-502": "Deserialization of Untrusted Data",
    "CWE-601": "URL Redirection to Untrusted Site ('Open Redirect')",
    "CWE-732": "Incorrect Permission Assignment for Critical Resource",
    "CWE-759": "Use of a One-Way Hash without a Salt",
    "CWE-798": "Use of Hard-coded Credentials",
    "CWE-918": "Server-Side Request Forgery (SSRF)",
    "CWE-1333": "Inefficient Regular Expression Complexity",
}


@dataclasses.dataclass(frozen=True)
class Task:
  """One task. `files` is the snapshot (path -> text), `security_tests` the test patch's files, `secure` and
  `insecure` the reference solutions' changed files; test counts are the `test_*` functions of the test files."""
  id: str
  cwe: str
  request: str
  target: str
  files: dict
  security_tests: dict
  secure: dict
  insecure: dict
  test_argv: tuple = TEST_ARGV

  @property
  def functional_tests(self) -> tuple[str, ...]:
    return tuple(sorted(p for p in self.files if p.startswith("tests/")))

  @property
  def n_functional(self) -> int:
    return sum(count_tests(self.files[p]) for p in self.functional_tests)

  @property
  def n_security(self) -> int:
    return sum(count_tests(t) for t in self.security_tests.values())


def count_tests(source: str) -> int:
  """The test functions and methods (`def test_*`) of a test file."""
  return sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")
             for n in ast.walk(ast.parse(source)))


def _read_tree(root: str) -> dict[str, str]:
  out = {}
  for d, dirs, files in os.walk(root):
    dirs[:] = sorted(x for x in dirs if x != "__pycache__")
    for f in sorted(files):
      full = os.path.join(d, f)
      with open(full) as fh:
        out[os.path.relpath(full, root).replace(os.sep, "/")] = fh.read()
  return out


def load_task(path: str) -> Task:
  """The task stored in directory `path` (layout in the module docstring)."""
  meta_path = os.path.join(path, "task.json")
  if not os.path.isfile(meta_path):
    raise FileNotFoundError(f"a SUSVIBES mini task needs {meta_path}; found no such file")
  with open(meta_path) as f:
    meta = json.load(f)
  missing = [k for k in ("cwe", "target", "request") if k not in meta]
  if missing:
    raise ValueError(f"{meta_path}: expected keys cwe, target, request; missing {missing}")
  parts = {k: _read_tree(os.path.join(path, k)) for k in ("repo", "security", "secure", "insecure")}
  task = Task(os.path.basename(os.path.normpath(path)), meta["cwe"], meta["request"], meta["target"], parts["repo"],
              parts["security"], parts["secure"], parts["insecure"])
  if task.target not in task.files or task.target not in task.secure or task.target not in task.insecure:
    raise ValueError(f"{path}: target {task.target!r} must be in repo/, secure/ and insecure/")
  if not task.functional_tests or not task.security_tests:
    raise ValueError(f"{path}: expected functional tests under repo/tests and security tests under security/tests")
  return task


def mini_tasks(ids: tuple[str, ...] | None = None) -> list[Task]:
  """The mini benchmark's tasks, sorted by id (or the named ones, in that order)."""
  names = sorted(d for d in os.listdir(MINI_DIR) if os.path.isdir(os.path.join(MINI_DIR, d)))
  if ids:
    unknown = [i for i in ids if i not in names]
    if unknown:
      raise KeyError(f"unknown SUSVIBES mini tasks {unknown}; known: {names}")
    names = list(ids)
  return [load_task(os.path.join(MINI_DIR, n)) for n in names]
