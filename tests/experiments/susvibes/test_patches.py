"""Unified diffs: git's own diffs parse and apply to git's result, our diffs apply under `git apply` to the same files,
reversal restores the original, stripping removes whole file sections, model-style diffs with wrong counts and blank
context still apply, and malformed or escaping patches fail with a message naming the problem."""
import os
import random
import shutil
import subprocess

import pytest

from experiments.susvibes import patches

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs the git CLI as the oracle")


def _tree(root) -> dict[str, str]:
  out = {}
  for d, dirs, files in os.walk(root):
    dirs[:] = [x for x in dirs if x != ".git"]
    for f in files:
      full = os.path.join(d, f)
      with open(full, newline="") as fh:
        out[os.path.relpath(full, root)] = fh.read()
  return out


def _random_text(rng) -> str:
  lines = [rng.choice(["a", "b", "c", "def f():", "  return 1", ""]) for _ in range(rng.randint(0, 14))]
  text = "\n".join(lines)
  return text + "\n" if lines and rng.random() < 0.8 else text


def _random_pair(rng):
  old = {f"pkg/m{i}.py": _random_text(rng) for i in range(3) if rng.random() < 0.8}
  new = {p: (_random_text(rng) if rng.random() < 0.7 else old.get(p, "x = 1\n"))
         for p in sorted(set(old) | {"pkg/new.py"}) if rng.random() < 0.85}
  return old, new


def _git(cwd, *args, check=True):
  return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=check)


@needs_git
def test_our_diffs_match_git_apply_and_gits_diffs_match_ours(tmp_path):
  rng = random.Random(0)
  for trial in range(25):
    old, new = _random_pair(rng)
    ours, theirs = tmp_path / f"ours{trial}", tmp_path / f"theirs{trial}"
    for d in (ours, theirs):
      d.mkdir()
      patches.write_files(old, str(d))
    diff = patches.make_diff(old, new)
    patches.apply(patches.parse(diff), str(ours))
    assert _tree(ours) == new
    _git(theirs, "init", "-q")
    (theirs / "p.diff").write_text(diff)
    _git(theirs, "apply", "p.diff")
    os.remove(theirs / "p.diff")
    assert _tree(theirs) == new
    # the other direction: git's diff of the two trees, parsed and applied by us
    a, b = tmp_path / f"a{trial}", tmp_path / f"b{trial}"
    patches.write_files(old, str(a.mkdir() or a))
    patches.write_files(new, str(b.mkdir() or b))
    git_diff = _git(tmp_path, "diff", "--no-index", "--no-prefix", f"a{trial}", f"b{trial}", check=False).stdout
    git_diff = git_diff.replace(f"a{trial}/", "").replace(f"b{trial}/", "")
    patches.apply(patches.parse(git_diff), str(a))
    assert _tree(a) == new


def test_reverse_restores_and_format_round_trips(tmp_path):
  rng = random.Random(1)
  for trial in range(100):
    old, new = _random_pair(rng)
    root = tmp_path / str(trial)
    root.mkdir()
    patches.write_files(old, str(root))
    parsed = patches.parse(patches.make_diff(old, new))
    assert patches.parse(patches.format_patch(parsed)) == parsed
    assert patches.parse(patches.make_diff(old, new), recount=True) == parsed
    patches.apply(parsed, str(root))
    patches.apply(patches.reverse(parsed), str(root))
    assert _tree(root) == old


def test_hunks_apply_at_an_offset_and_ignore_space_change(tmp_path):
  base = "".join(f"line{i}\n" for i in range(20))
  diff = patches.make_diff({"f.py": base}, {"f.py": base.replace("line10\n", "changed\n")})
  (tmp_path / "f.py").write_text("extra\nextra\n" + base)
  patches.apply(patches.parse(diff), str(tmp_path))
  assert (tmp_path / "f.py").read_text() == "extra\nextra\n" + base.replace("line10\n", "changed\n")
  (tmp_path / "f.py").write_text(base.replace("line9\n", "line9   \n"))
  with pytest.raises(patches.PatchError, match=r"f.py: hunk 1 .* does not match"):
    patches.apply(patches.parse(diff), str(tmp_path))
  patches.apply(patches.parse(diff), str(tmp_path), ignore_space_change=True)
  assert "changed\n" in (tmp_path / "f.py").read_text()


def test_strip_files_removes_every_section_touching_a_protected_path():
  old = {"app/core.py": "x = 1\n", "tests/test_security.py": "assert True\n", "tests/test_feature.py": "pass\n"}
  new = {"app/core.py": "x = 2\n", "tests/test_security.py": "", "tests/test_feature.py": "pass\n",
         "tests/helper.py": "y = 1\n"}
  parsed = patches.parse(patches.make_diff(old, new))
  kept, removed = patches.strip_files(parsed, {"tests/test_security.py", "tests/./helper.py"})
  assert removed == ["tests/helper.py", "tests/test_security.py"]
  assert [fp.path for fp in kept] == ["app/core.py"]
  assert patches.touched_files(patches.format_patch(kept)) == {"app/core.py"}


def test_model_style_diff_with_wrong_counts_and_bare_blank_context(tmp_path):
  (tmp_path / "m.py").write_text("def f(x):\n\n  return x\n\n\ndef g():\n  pass\n")
  text = ("Here is the fix:\n```diff\n--- m.py\n+++ m.py\n@@ -1,9 +1,9 @@\n def f(x):\n\n-  return x\n"
          "+  return x + 1\n```\nThanks")
  with pytest.raises(patches.PatchError, match=r"line 10: a hunk line must start with .*found '```'"):
    patches.parse(text)
  patches.apply(patches.parse(text, recount=True), str(tmp_path))
  assert (tmp_path / "m.py").read_text() == "def f(x):\n\n  return x + 1\n\n\ndef g():\n  pass\n"


@pytest.mark.parametrize("text, match", [
    ("@@ -1 +1 @@\n-a\n+b\n", "a hunk before any"),
    ("--- a/f.py\n+++ b/f.py\n@@ one two @@\n-a\n", "expected a hunk header"),
    ("--- a/f.py\n+++ b/f.py\n@@ -1,3 +1,3 @@\n-a\n+b\n", "promises 3 old / 3 new lines, its body has 1 / 1"),
])
def test_malformed_patches_name_the_problem(text, match):
  with pytest.raises(patches.PatchError, match=match):
    patches.parse(text)


@pytest.mark.parametrize("path", ["../outside.py", "/etc/passwd", "a/../../outside.py"])
def test_paths_leaving_the_root_are_refused(tmp_path, path):
  root = tmp_path / "repo"
  root.mkdir()
  diff = f"--- /dev/null\n+++ {path}\n@@ -0,0 +1 @@\n+owned = True\n"
  with pytest.raises(patches.PatchError, match="relative to the repository|leaves the repository"):
    patches.apply(patches.parse(diff), str(root))
  with pytest.raises(patches.PatchError):
    patches.write_files({path: "owned = True\n"}, str(root))
  assert sorted(os.listdir(tmp_path)) == ["repo"] and not os.listdir(root)


def test_apply_is_all_or_nothing_and_checks_existence(tmp_path):
  (tmp_path / "a.py").write_text("one\n")
  good = "--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-one\n+two\n"
  bad = "--- a/b.py\n+++ b/b.py\n@@ -1 +1 @@\n-x\n+y\n"
  with pytest.raises(patches.PatchError, match="b.py: the patch edits it, but there is no such file"):
    patches.apply(patches.parse(good + bad), str(tmp_path))
  assert (tmp_path / "a.py").read_text() == "one\n"
  with pytest.raises(patches.PatchError, match="already exists"):
    patches.apply(patches.parse("--- /dev/null\n+++ b/a.py\n@@ -0,0 +1 @@\n+z\n"), str(tmp_path))
