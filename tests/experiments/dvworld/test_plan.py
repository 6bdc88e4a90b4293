"""dvworld at paper scale: the full preset scores artifacts made elsewhere, so there is no accelerator workload to
plan."""

from experiments.runner import plan as plan_lib


def test_full_preset_plans_no_workload_on_cpu_8():
  p = plan_lib.plan("dvworld", "full", "cpu-8")
  assert p["workloads"] == [] and p["chip_hours"] == 0 and isinstance(p["fits"], bool)
