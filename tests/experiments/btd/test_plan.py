"""btd's full preset does no accelerator work (it reads sampled verdicts from a file): `plan` lists no
workloads."""

from experiments.runner import plan as plan_lib


def test_full_preset_plans_no_workloads():
  p = plan_lib.plan("btd", "full", "cpu-8")
  assert p["workloads"] == [] and p["fits"] is True and p["chip_hours"] == 0
