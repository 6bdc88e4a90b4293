"""lost_in_attention: the full preset planned on `cpu-8` (LLaVA-1.5-7B's geometry and accuracy passes)."""
import pytest

from experiments.runner import plan as plan_lib

REPO = "llava-hf/llava-1.5-7b-hf"


@pytest.mark.slow
def test_full_preset_plans_on_cpu_8():
  p = plan_lib.plan("lost_in_attention", "full", "cpu-8")
  assert [w["name"] for w in p["workloads"]] == ["geometry_forward", "accuracy_forward"]
  assert isinstance(p["fits"], bool) and p["chips"] == 8
  for w in p["workloads"]:
    assert isinstance(w["fits"], bool) and w["bytes_per_chip"] > 0 and w["mesh"]["fsdp"] == 8, w["name"]
    assert w["steps"] >= 1 and 0.65 <= w["flops_per_step"] / w["analytic_flops_per_step"] <= 1.5, w["name"]
  geometry, acc = p["workloads"]
  # geometry: unmodified and under each intervention; accuracy: none, 3 interventions x (all + each layer)
  assert geometry["steps"] == 32 * (1 + 3) and acc["steps"] == 32 * (1 + 3 * (1 + 32))
