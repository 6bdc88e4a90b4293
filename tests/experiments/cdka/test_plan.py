"""cdka's full preset planned on cpu-8 (LLaMA-2-7B's architecture shipped as data, no weights)."""
import pytest

from experiments.runner import plan as plan_lib


@pytest.mark.slow
def test_full_preset_plans_every_method_and_the_evaluation_on_cpu_8():
  p = plan_lib.plan("cdka", "full", "cpu-8")
  assert [w["name"] for w in p["workloads"]] == ["train_step.full", "train_step.lora", "train_step.cdka",
                                                "generate", "test_loss"]
  assert isinstance(p["fits"], bool) and all(isinstance(w["fits"], bool) for w in p["workloads"])
  for w in p["workloads"]:
    ratio = w["flops_per_step"] / w["analytic_flops_per_step"]
    assert 0.65 <= ratio <= 1.5 if w["kind"] == "train" else 0.3 <= ratio <= 1.5, (w["name"], ratio)
  assert {w["name"]: w["steps"] for w in p["workloads"]}["train_step.cdka"] == 3125
  assert p["workloads"][0]["mesh"]["fsdp"] == 8
