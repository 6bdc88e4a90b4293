"""mind: the full preset planned on `cpu-8` (LLaVA-1.5-7B's CE and CE + MCA train steps and its greedy decoder)."""
import pytest

from experiments.runner import plan as plan_lib

REPO = "llava-hf/llava-1.5-7b-hf"


@pytest.mark.slow
def test_full_preset_plans_on_cpu_8():
  p = plan_lib.plan("mind", "full", "cpu-8")
  assert [w["name"] for w in p["workloads"]] == ["train_step.ce", "train_step.mca", "generate"]
  assert isinstance(p["fits"], bool) and p["chips"] == 8
  for w in p["workloads"]:
    assert isinstance(w["fits"], bool) and w["bytes_per_chip"] > 0 and w["mesh"]["fsdp"] == 8, w["name"]
    assert w["steps"] >= 1 and 0.65 <= w["flops_per_step"] / w["analytic_flops_per_step"] <= 1.5, w["name"]
  ce, mca, _ = p["workloads"]
  assert ce["kind"] == mca["kind"] == "train" and (ce["steps"], mca["steps"]) == (3 * 2000 + 3 * 1000, 2000)
