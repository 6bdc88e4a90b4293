"""The README's Python blocks run as written (in order, one namespace, from an empty working directory)."""
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_python_blocks_run(tmp_path, monkeypatch):
  text = open(os.path.join(REPO, "README.md")).read()
  blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
  assert blocks, "the README has no python block"
  monkeypatch.chdir(tmp_path)
  namespace = {"__name__": "readme"}
  for i, block in enumerate(blocks):
    exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)  # noqa: S102
