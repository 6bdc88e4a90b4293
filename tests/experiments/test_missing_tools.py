"""A missing tool or package is one line: `skipped:` in reproduce (which goes on, exits 0 and lists it in the
report), `error:` in run (exit 2); experiments' `requires` are checked before any work; jaxlab.errors' table of
no-deps wheels is .ci/no-deps.txt's."""
import dataclasses
import json
import os
import pickle
import re
import subprocess
import sys

import pytest

from experiments import __main__ as cli
from experiments import registry
from experiments.runner import readme as readme_lib, splits
from experiments.runner.claims import Claim
from jaxlab import errors

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HIDDEN = ("bwrap", "espeak-ng")
# the experiments whose smoke preset needs a hidden tool, and the Debian package each names
NEEDS = {"bfcl_audio": "espeak-ng", "dvworld": "bubblewrap", "susvibes": "bubblewrap"}


def test_no_deps_table_is_ci_no_deps_txt():
  with open(os.path.join(REPO, ".ci", "no-deps.txt")) as f:
    pins = dict(re.match(r"([\w.-]+)==(\S+)", line).groups() for line in f if line.strip()[:1].isalnum())
  assert pins == {name: version for name, (version, _) in errors.NO_DEPS.items()}


def test_missing_dependency_names_package_and_install_command():
  e = errors.missing("bwrap", "the sandbox")
  assert isinstance(e, OSError) and isinstance(e, cli.USER_ERRORS)
  assert str(e) == "the sandbox needs bubblewrap (not installed): apt-get install -y bubblewrap"
  assert str(errors.missing("pyrit", "pia")) == "pia needs pyrit (not installed): pip install --no-deps pyrit==1.1.0"
  assert str(pickle.loads(pickle.dumps(e))) == str(e)
  assert errors.missing_import(ModuleNotFoundError("x", name="jericho"), "tw", "textworld").package == "jericho"
  assert errors.missing_import(ModuleNotFoundError("x", name="networkx"), "tw", "textworld") is None
  with pytest.raises(KeyError, match="unknown requirement 'bwarp'"):
    errors.installed("bwarp")


@dataclasses.dataclass(frozen=True)
class Cfg:
  seed: int = 0
  tool: bool = True


def _run(cfg, out_dir, resume):
  splits.record(out_dir, "toy_ok", {"test": {"items": ["one"]}})
  return {"loss": 1.0}


@pytest.fixture
def toys(monkeypatch, tmp_path):
  presets = {p: Cfg() for p in registry.PRESETS}
  claim = Claim("c", "holds", "1", "{loss} > 0")
  exps = {"toy_ok": registry.Experiment("toy_ok", Cfg, presets, _run, paper="scale", claims=(claim,),
                                        results=("loss",)),
          "toy_tool": registry.Experiment("toy_tool", Cfg, presets, lambda *a: pytest.fail("ran without its tool"),
                                          paper="cdka", claims=(claim,), results=("loss",),
                                          requires=lambda cfg: ("bwrap", "espeak-ng") if cfg.tool else ())}
  monkeypatch.setattr(registry, "experiments", lambda: exps)
  monkeypatch.setattr(registry, "import_errors", lambda: {})
  monkeypatch.setenv("PATH", str(tmp_path / "empty"))
  return exps


def test_requires_names_known_requirements():
  presets = {p: Cfg() for p in registry.PRESETS}
  with pytest.raises(ValueError, match=r"requires names \['bwarp'\]"):
    registry.Experiment("toy", Cfg, presets, _run, requires=("bwarp",))


def test_reproduce_skips_what_lacks_a_tool_and_reports_why(toys, tmp_path, capsys):
  root = str(tmp_path / "runs")
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--seeds", "2"]) == 0
  out, err = capsys.readouterr()
  assert err.splitlines() == ["skipped: toy_tool: toy_tool's sandbox needs bubblewrap (not installed): apt-get install "
                              "-y bubblewrap"]  # once, not once per seed
  assert out.splitlines()[-1] == f"report: {root}/report.md (0 failed, 1 skipped: missing tools)"
  assert not os.path.exists(os.path.join(root, "toy_tool"))
  report = json.load(open(os.path.join(root, "claims.json")))
  assert report["experiments"]["toy_tool"]["missing"] == "bubblewrap"
  assert report["papers"]["cdka"]["claims"][0]["verdict"] == "skipped (bubblewrap not installed)"
  assert report["papers"]["scale"]["claims"][0]["verdict"] == "reproduced"
  md = open(os.path.join(root, "report.md")).read()
  assert "- toy_tool: toy_tool's sandbox needs bubblewrap (not installed): apt-get install -y bubblewrap" in md
  assert "**Skipped:** toy_tool's sandbox needs bubblewrap" in md and "| cdka | " in md and "1 skipped |" in md
  assert readme_lib.ran(report) == ["scale"]  # a README merge keeps the skipped paper's row
  with pytest.raises(errors.MissingDependency, match="bubblewrap"):
    registry.run_experiment("toy_tool", "cpu", out=str(tmp_path / "x"))
  assert not os.path.exists(tmp_path / "x")
  registry.run_experiment("toy_ok", "cpu", out=str(tmp_path / "y"))
  toys["toy_tool"] = dataclasses.replace(toys["toy_tool"], run=_run)
  assert registry.run_experiment("toy_tool", "cpu", ["tool=false"], out=str(tmp_path / "z"))[1]["loss"] == 1.0


# ----------------------------------------------------------------------------- the CLI without the tools

def _hidden_path(tmp_path) -> str:
  """A bin directory linking every command on PATH but HIDDEN."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  for d in os.environ["PATH"].split(os.pathsep):
    if not os.path.isdir(d):
      continue
    for name in os.listdir(d):
      path = os.path.join(d, name)
      if name not in HIDDEN and not (bin_dir / name).exists() and os.access(path, os.X_OK) and os.path.isfile(path):
        os.symlink(path, bin_dir / name)
  return str(bin_dir)


@pytest.fixture
def bare(tmp_path):
  """(cwd, env) for the CLI with bwrap and espeak-ng off PATH and an empty WordNet directory."""
  (tmp_path / "wordnet").mkdir()
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAXLAB_")}
  env.update(XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu", JAXLAB_NO_PROGRESS="1",
             PYTHONPATH=REPO, PATH=_hidden_path(tmp_path), WNSEARCHDIR=str(tmp_path / "wordnet"))
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  return cwd, env


def _cli(bare, *args):
  cwd, env = bare
  return subprocess.run([sys.executable, "-m", "experiments", *args], cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=600)


def test_reproduce_skips_experiments_whose_tools_are_missing(bare):
  p = _cli(bare, "reproduce", "--preset", "smoke", "--only", *NEEDS)
  text = p.stdout + p.stderr
  assert p.returncode == 0 and "Traceback" not in text, text[-3000:]
  skipped = [line for line in p.stderr.splitlines() if line.startswith("skipped: ")]
  assert len(skipped) == len(NEEDS), p.stderr
  for name, package in NEEDS.items():
    line = next(line for line in skipped if line.startswith(f"skipped: {name}: "))
    assert f"needs {package} (not installed): apt-get install -y {package}" in line
  assert p.stdout.splitlines()[-1] == f"report: runs/report.md (0 failed, {len(NEEDS)} skipped: missing tools)"
  root = bare[0] / "runs"
  assert sorted(os.listdir(root)) == ["claims.json", "report.md"]  # skipped before any run directory was made
  md = (root / "report.md").read_text()
  for name, package in NEEDS.items():
    assert f"- {name}: {name}'s " in md and f"apt-get install -y {package}" in md
  claims = json.loads((root / "claims.json").read_text())["papers"]
  assert {c["verdict"] for name in NEEDS for c in claims[name]["claims"]} == {
      f"skipped ({package} not installed)" for package in NEEDS.values()}


@pytest.mark.parametrize("args,package", [
    (["dvworld"], "bubblewrap"),
    (["bao", "--set", "entities=wordnet"], "wordnet-base"),  # WordNet moved away by WNSEARCHDIR
])
def test_run_without_its_tool_is_one_error_line(bare, args, package):
  p = _cli(bare, "run", *args, "--preset", "smoke")
  assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr[-3000:]
  assert p.stderr.startswith("error: ") and f"needs {package} (not installed): apt-get install -y {package}" in p.stderr
  assert not os.path.exists(bare[0] / "runs")
