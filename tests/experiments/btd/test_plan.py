"""btd's full preset does no accelerator work (it reads sampled verdicts from a file): `plan` lists no workloads,
and without the file the preset fails in one line naming what to give."""
import pytest

from experiments import registry
from experiments.runner import plan as plan_lib


def test_full_preset_plans_no_workloads():
  p = plan_lib.plan("btd", "full", "cpu-8")
  assert p["workloads"] == [] and p["fits"] is True and p["chip_hours"] == 0


def test_full_preset_without_the_samples_is_one_line(tmp_path, monkeypatch):
  monkeypatch.setenv("JAXLAB_MODELS", str(tmp_path / "models"))
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
  with pytest.raises(registry.OverrideError) as e:
    registry.config_for("btd", "full")
  assert "\n" not in str(e.value) and "samples_path is required (--set samples_path=FILE.jsonl" in str(e.value)
