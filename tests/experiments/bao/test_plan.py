"""bao's full preset planned without weights: Qwen3-4B named by repo id, its SFT step, rollouts, GRPO step and
evaluation turns compiled for 8 CPU devices with train FLOPs near the analytic count (the stop without the
download: tests/experiments/test_full_presets.py)."""
import pytest

from experiments import registry
from experiments.bao import run as bao_run
from experiments.runner import plan as plan_lib


def test_full_preset_call_counts():
  cfg = registry.config_for("bao", "full", required=False)
  # 42 turns per iteration at most (15 + 12 + 15), 2 GRPO methods x 200 iterations; 5 evaluations of 200 episodes
  # in 4 batches of 64; 64 episodes x 42 turns in minibatches of 64; two warm starts of 1000 SFT steps
  assert bao_run.call_counts(cfg) == {"rollout": 2 * 200 * 42, "eval": 5 * 42 * 4, "grpo": 2 * 200 * 42,
                                      "sft": 2000}


@pytest.mark.slow
def test_full_preset_plans_on_cpu_8():
  p = plan_lib.plan("bao", "full", "cpu-8")
  assert [w["name"] for w in p["workloads"]] == ["sft_step", "rollout", "grpo_step", "eval_generate"]
  assert isinstance(p["fits"], bool) and all(isinstance(w["fits"], bool) for w in p["workloads"])
  for w in p["workloads"]:
    assert w["mesh"]["fsdp"] == 8 and w["bytes_per_chip"] > 0
    if w["kind"] == "train":
      assert 0.65 <= w["flops_per_step"] / w["analytic_flops_per_step"] <= 1.5, w
