"""prm_attack's full preset planned on 8 CPU devices: Qwen2.5-Math-PRM-7B's forward and the gradient attack's
step compiled from the shipped architecture."""
import pytest

from experiments.prm_attack import PRESETS
from experiments.prm_attack import run as prm_run
from experiments.runner import plan as plan_lib

PRM = "Qwen/Qwen2.5-Math-PRM-7B"


def test_the_shipped_architecture_is_a_step_prm_with_a_tied_head():
  lm_cfg, head_cfg = prm_run.architecture(PRM)
  assert (lm_cfg.d_model, lm_cfg.n_layers, lm_cfg.n_heads, lm_cfg.n_kv_heads, lm_cfg.vocab_size) == (
      3584, 28, 28, 4, 152064)
  assert lm_cfg.tie_embeddings and head_cfg.kind == "step" and lm_cfg.param_dtype == "bfloat16"


@pytest.mark.slow
def test_full_preset_plans_the_prm_forward_and_the_attack_step_on_cpu_8():
  p = plan_lib.plan("prm_attack", "full", "cpu-8")
  cfg = PRESETS["full"]
  assert [w["name"] for w in p["workloads"]] == ["prm_forward", "attack_step", "prm_forward.spliced"]
  fwd, attack, _ = p["workloads"]
  assert attack["kind"] == "train" and attack["steps"] == cfg.attack_steps == 1000
  assert fwd["steps"] == prm_run.forward_calls(cfg) > 500 // cfg.batch
  for w in p["workloads"]:
    assert isinstance(w["fits"], bool) and w["mesh"]["data"] == 8
    assert 0.65 <= w["flops_per_step"] / w["analytic_flops_per_step"] <= 1.5
