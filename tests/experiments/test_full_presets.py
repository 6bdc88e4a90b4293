"""Every full preset starts or stops before any compute in one line naming what to fetch: on a machine with nothing
downloaded, a run either starts or ends in one `error:` line that names each missing checkpoint's `hf download`
command (or the dataset and the `--set` key), never a traceback and never a silent stand-in model."""
import os
import subprocess
import sys

import pytest

from experiments import registry
from experiments.runner.overrides import Hub, unset_required
from jaxlab.hf import hub

SELF_CONTAINED = {"gig"}  # full presets that need no checkpoint or dataset from outside the installed packages
CPU_MODELS = ("smollm2", "SmolLM2", "minilm")


@pytest.fixture
def nothing_downloaded(tmp_path, monkeypatch):
  monkeypatch.setenv(hub.MODELS_ENV, str(tmp_path / "models"))
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
  return tmp_path


def _paper_experiments():
  return sorted(n for n, e in registry.experiments().items() if e.paper is not None)


def test_the_registry_has_every_papers_experiment():
  assert len({registry.get(n).paper for n in _paper_experiments()}) == 19


@pytest.mark.parametrize("name", _paper_experiments())
def test_full_preset_starts_or_names_what_to_fetch_in_one_line(name, nothing_downloaded):
  cfg = registry.get(name).presets["full"]
  for key, value in unset_required(cfg):  # a model named by the paper's repo id, not the cpu presets' model
    if isinstance(value, Hub):
      assert hub.is_repo_id(value) and not value.startswith(CPU_MODELS), (key, value)
  try:
    registry.config_for(name, "full")
  except registry.OverrideError as e:
    line = str(e)
    assert "\n" not in line and line.startswith(f"{name} --preset full: ")
    for key, value in unset_required(cfg):
      assert key in line and (f"hf download {value.removeprefix('datasets/')}" in line if isinstance(value, Hub)
                              else "--set" in value), (key, value)
    return
  assert name in SELF_CONTAINED, f"{name}'s full preset needs nothing to be fetched: add it to SELF_CONTAINED"
  assert not any(isinstance(v, str) and v.startswith(CPU_MODELS) for v in vars(cfg).values())


def test_a_full_preset_from_the_cli_is_one_error_line(nothing_downloaded):
  env = dict(os.environ, JAXLAB_MODELS=str(nothing_downloaded / "models"), HF_HUB_CACHE=str(nothing_downloaded))
  p = subprocess.run([sys.executable, "-m", "experiments", "run", "spec_dllm", "--preset", "full"],
                     cwd=nothing_downloaded, capture_output=True, text=True, timeout=300, env=env)
  err = [line for line in p.stderr.splitlines() if line.strip()]
  assert p.returncode == 2 and len(err) == 1, p.stderr[-2000:]
  assert err[0].startswith("error: spec_dllm --preset full: ") and "hf download GSAI-ML/LLaDA-8B-Instruct" in err[0]
  assert not os.path.exists(nothing_downloaded / "runs")  # stopped before it made a run directory
