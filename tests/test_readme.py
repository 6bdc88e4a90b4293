"""The README's set-up commands are what CI runs, and its Python blocks run as written (in order, one namespace,
from an empty working directory); the block that runs the sandbox is left out where bubblewrap is not installed
(the README says it is needed)."""
import os
import re
import shutil
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_python_blocks_run(tmp_path, monkeypatch):
  text = open(os.path.join(REPO, "README.md")).read()
  blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
  assert blocks, "the README has no python block"
  monkeypatch.chdir(tmp_path)
  namespace = {"__name__": "readme"}
  for i, block in enumerate(blocks):
    if "sandbox.run(" in block and shutil.which("bwrap") is None:
      continue
    exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)  # noqa: S102


def test_readme_commands_are_what_ci_runs():
  """The README's two set-up commands go through install.sh, and .ci/run installs and tests the same way."""
  text = open(os.path.join(REPO, "README.md")).read()
  main, tests = re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)[:2]
  assert main == "bash install.sh && python -m experiments reproduce --preset cpu"
  assert tests == "bash install.sh test && python -m pytest -n 2 tests"
  ci = open(os.path.join(REPO, ".ci", "run")).read()
  assert 'bash install.sh test tpu "$@"' in ci and "python -m pytest -n 2 tests\n" in ci
  assert "python -m experiments reproduce --preset smoke" in ci


def test_install_rejects_an_unknown_argument_in_one_line():
  p = subprocess.run(["bash", os.path.join(REPO, "install.sh"), "--bogus"], capture_output=True, text=True)
  assert p.returncode == 2 and p.stdout == ""
  assert p.stderr == "error: install.sh: unknown argument '--bogus'; expected 'test', 'tpu' and/or '--latest'\n"
