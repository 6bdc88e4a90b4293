"""The README's Python blocks run as written (in order, one namespace, from an empty working directory); the
block that runs the sandbox is left out where bubblewrap is not installed (the README says it is needed)."""
import os
import re
import shutil

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
