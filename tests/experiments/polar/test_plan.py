"""polar's full preset planned without weights: Qwen2.5-3B-Instruct named by repo id, the program scorer and the
predictor's step compiled for 8 CPU devices with FLOPs near the analytic count."""
import pytest

from experiments import registry
from experiments.polar import run as polar_run
from experiments.runner import plan as plan_lib


def test_full_preset_scoring_calls():
  cfg = registry.config_for("polar", "full", required=False)
  # 36 layers, stride 1, edit sizes 1, 2, 4: 36 + 35 + 33 starts x 2 ops = 208 edits; the beam's first step scores
  # 209 programs (4 batches of 64), the two later ones at most 4 x 208 (13 batches); 500 held-out questions of 10
  assert polar_run.scoring_calls(cfg, 36) == 1250 * (4 + 2 * 13) + 500


@pytest.mark.slow
def test_full_preset_plans_on_cpu_8():
  p = plan_lib.plan("polar", "full", "cpu-8")
  assert [w["name"] for w in p["workloads"]] == ["score_programs", "predictor_step"]
  assert isinstance(p["fits"], bool) and all(isinstance(w["fits"], bool) for w in p["workloads"])
  for w in p["workloads"]:
    assert w["mesh"]["data"] == 8 and w["bytes_per_chip"] > 0
    assert 0.65 <= w["flops_per_step"] / w["analytic_flops_per_step"] <= 1.5, w
