"""fslora's full preset planned on cpu-8 (LLaMA-3.2-3B-Instruct's architecture shipped as data, no weights)."""
import pytest

from experiments.runner import plan as plan_lib


@pytest.mark.slow
def test_full_preset_plans_the_federated_round_and_the_evaluation_on_cpu_8():
  p = plan_lib.plan("fslora", "full", "cpu-8")
  assert [w["name"] for w in p["workloads"]] == ["round", "generate", "test_loss"]
  assert isinstance(p["fits"], bool) and all(isinstance(w["fits"], bool) for w in p["workloads"])
  for w in p["workloads"]:
    ratio = w["flops_per_step"] / w["analytic_flops_per_step"]
    assert 0.65 <= ratio <= 1.5 if w["kind"] == "train" else 0.3 <= ratio <= 1.5, (w["name"], ratio)
  steps = {w["name"]: w["steps"] for w in p["workloads"]}
  assert steps["round"] == 600 * 8  # fedlora, hetlora, flexlora, flora, fslora and the three sweep ratios
  tests = 1172 + 2376 + 3000 + 3000 + 500 + 1838 + 1954 + 1267  # the eight tasks' test sets, each capped at 3000
  assert steps["generate"] == (1 + 8 * 30) * -(-tests // 64)  # the base, then every 20th round of each run
