"""stllm: the full preset planned on `cpu-8` (each model's train step and greedy decoding on Qwen2-7B, at 4 frames
of 168 px to keep the test short)."""
import pytest

from experiments.runner import plan as plan_lib

REPO = "Qwen/Qwen2-7B-Instruct"


@pytest.mark.slow
def test_full_preset_plans_on_cpu_8():
  p = plan_lib.plan("stllm", "full", "cpu-8", ["room.n_frames=4", "room.image_size=168"])
  models = ("video_only", "points_only", "stllm_3d", "stllm_aligner")
  assert [w["name"] for w in p["workloads"]] == [f"{k}.{m}" for m in models for k in ("train_step", "generate")]
  assert isinstance(p["fits"], bool) and p["chips"] == 8
  for w in p["workloads"]:
    assert isinstance(w["fits"], bool) and w["bytes_per_chip"] > 0 and w["mesh"]["fsdp"] == 8, w["name"]
    assert w["steps"] >= 1 and 0.65 <= w["flops_per_step"] / w["analytic_flops_per_step"] <= 1.5, w["name"]
  assert all(w["steps"] == 3000 for w in p["workloads"] if w["kind"] == "train")
