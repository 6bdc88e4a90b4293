"""susvibes at paper scale: the full preset scores artifacts made elsewhere, so there is no accelerator workload to
plan, and without its data it stops in one line saying where to get them."""
import pytest

from experiments import registry
from experiments.runner import plan as plan_lib


def test_full_preset_plans_no_workload_on_cpu_8():
  p = plan_lib.plan("susvibes", "full", "cpu-8")
  assert p["workloads"] == [] and p["chip_hours"] == 0 and isinstance(p["fits"], bool)


def test_full_preset_without_its_data_names_where_to_get_it(tmp_path, monkeypatch):
  monkeypatch.setenv("JAXLAB_MODELS", str(tmp_path / "models"))
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
  with pytest.raises(registry.OverrideError) as e:
    registry.config_for("susvibes", "full")
  msg = str(e.value)
  assert "\n" not in msg and "hf download songwen6968/SusVibes" in msg
