"""conpress's full preset planned on cpu-8 (Qwen3-4B's architecture shipped as data, no weights)."""
import pytest

from experiments.runner import plan as plan_lib


@pytest.mark.slow
def test_full_preset_plans_each_generation_budget_and_the_fine_tune_on_cpu_8():
  p = plan_lib.plan("conpress", "full", "cpu-8")
  assert [w["name"] for w in p["workloads"]] == ["generate.n1", "generate.n2", "generate.n4", "generate.n8",
                                                "sft_step"]
  assert isinstance(p["fits"], bool) and all(isinstance(w["fits"], bool) for w in p["workloads"])
  for w in p["workloads"]:
    ratio = w["flops_per_step"] / w["analytic_flops_per_step"]
    assert 0.65 <= ratio <= 1.5 if w["kind"] == "train" else 0.3 <= ratio <= 1.5, (w["name"], ratio)
  steps = {w["name"]: w["steps"] for w in p["workloads"]}
  # 496 held-out + 8000 training single questions, and the held-out ones again after the fine-tune (64 a chunk)
  assert steps["generate.n1"] == -(-8496 // 64) + 2 * -(-496 // 64)  # + after SFT and after the RFT baseline
  assert steps["generate.n4"] == -(-(124 + 2 * 2000) // 64) and steps["sft_step"] == 2 * 2000
