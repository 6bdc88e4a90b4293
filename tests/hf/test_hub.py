"""Checkpoints named by repo id: found where they were downloaded, a missing one is one line with its fetch command,
and the architectures the repository ships build the same configs as the checkpoints themselves."""
import dataclasses
import glob
import os

import pytest

from experiments import registry
from jaxlab.hf import hub
from jaxlab.models.registry import real_model_path

SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.fixture
def empty_stores(tmp_path, monkeypatch):
  monkeypatch.setenv(hub.MODELS_ENV, str(tmp_path / "models"))
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
  return tmp_path


def test_local_path_finds_the_models_dir_and_the_hf_cache(empty_stores):
  assert hub.local_path("org/model") is None and hub.local_path("datasets/org/data") is None
  (empty_stores / "models/org/model").mkdir(parents=True)
  assert hub.local_path("org/model") is None  # an empty directory is not a download
  (empty_stores / "models/org/model/config.json").write_text("{}")
  assert hub.local_path("org/model") == str(empty_stores / "models/org/model")
  snap = empty_stores / "cache/datasets--org--data/snapshots/abc123"
  snap.mkdir(parents=True)
  assert hub.local_path("datasets/org/data") == str(snap)
  assert hub.fetch_command("org/model") == f"hf download org/model --local-dir {empty_stores}/models/org/model"
  assert hub.fetch_command("datasets/org/data").startswith("hf download org/data --repo-type dataset --local-dir")
  assert hub.is_repo_id("org/model") and not hub.is_repo_id("./org/model") and not hub.is_repo_id("a/b/c")


def test_shipped_architecture_builds_the_config_the_gguf_checkpoint_gives(empty_stores):
  shipped, loaded = hub.config(SMOL), hub.config(real_model_path("smollm2-135m-instruct"))
  a, b = dataclasses.asdict(shipped), dataclasses.asdict(loaded)
  assert a.pop("norm_eps") == pytest.approx(b.pop("norm_eps"), rel=1e-6)  # GGUF stores it as float32
  assert a == b
  assert hub.config(SMOL, dtype="bfloat16").param_dtype == "bfloat16"
  with pytest.raises(FileNotFoundError, match="no architecture for 'org/unknown'.*HuggingFaceTB/SmolLM2"):
    hub.architecture("org/unknown")


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(hub.CONFIGS_DIR, "*.json"))),
                         ids=lambda p: os.path.basename(p))
def test_every_shipped_architecture_builds_a_config(path, empty_stores):
  repo = os.path.basename(path)[:-len(".json")].replace("--", "/")
  assert hub.is_repo_id(repo)
  assert hub.config(repo) is not None


@dataclasses.dataclass(frozen=True)
class Cfg:
  model: str = registry.Hub(SMOL)
  steps: int = 1


@pytest.fixture
def toy(monkeypatch):
  exp = registry.Experiment("toy_hub", Cfg, {p: Cfg() for p in registry.PRESETS}, lambda c, o, r: {}, "t")
  monkeypatch.setitem(registry._EXPERIMENTS, "toy_hub", exp)
  return exp


def test_a_run_resolves_its_checkpoints_or_names_the_command_that_fetches_them(toy, empty_stores):
  with pytest.raises(registry.OverrideError) as e:
    registry.config_for("toy_hub", "full")
  line = str(e.value)
  assert "\n" not in line and line.startswith("toy_hub --preset full: model: HuggingFaceTB/SmolLM2-135M-Instruct is "
                                              "not downloaded: hf download HuggingFaceTB/SmolLM2-135M-Instruct")
  assert line.endswith("or --set model=PATH")
  assert registry.config_for("toy_hub", "full", required=False).model == SMOL  # plan sizes it without weights
  assert registry.config_for("toy_hub", "full", ["model=/some/dir"]).model == "/some/dir"
  d = empty_stores / "models" / SMOL
  d.mkdir(parents=True)
  (d / "config.json").write_text("{}")
  assert registry.config_for("toy_hub", "full").model == str(d)
