"""pia's full preset planned without weights: Qwen2.5-7B-Instruct named by repo id, its generation, reference pass
and LoRA steps compiled for 8 CPU devices with FLOPs near the analytic count."""
import pytest

from experiments import registry
from experiments.pia import run as pia_run
from experiments.runner import plan as plan_lib


def test_full_preset_counts_every_generation_batch():
  cfg = registry.config_for("pia", "full", required=False)
  # PLE twice: 16 seeds x 64 attack prompts (16 batches of 64), then 40 generations of 10 children (10 batches);
  # the training answers 5 x 256 (20); three measures of 2 x 1000 + 1000 + 200 answers (52); the seeds 1000 (16)
  assert pia_run.generation_calls(cfg) == 2 * (16 + 40 * 10) + 20 + 3 * 52 + 16


@pytest.mark.slow
def test_full_preset_plans_on_cpu_8():
  p = plan_lib.plan("pia", "full", "cpu-8")
  assert [w["name"] for w in p["workloads"]] == ["generate", "reference_logprobs", "picl_step", "dpo_step"]
  assert isinstance(p["fits"], bool) and all(isinstance(w["fits"], bool) for w in p["workloads"])
  for w in p["workloads"]:
    assert w["mesh"]["fsdp"] == 8 and w["bytes_per_chip"] > 0
    if w["kind"] == "train":
      assert 0.65 <= w["flops_per_step"] / w["analytic_flops_per_step"] <= 1.5, w
  steps = {w["name"]: w["steps"] for w in p["workloads"]}
  assert steps["picl_step"] == steps["dpo_step"] == 500 and steps["reference_logprobs"] == 160
