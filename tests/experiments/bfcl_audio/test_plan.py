"""bfcl_audio at paper scale: the full preset names Qwen2.5-7B-Instruct and Whisper large-v3 by repo id (never the
cpu model) and plans on cpu-8: the LLM's
generation, Whisper's transcription and features, and the connector's alignment step."""
import pytest

from experiments import registry
from experiments.runner import plan as plan_lib
from jaxlab.hf import hub


def test_full_preset_names_the_models_by_repo_id():
  cfg = registry.config_for("bfcl_audio", "full", required=False)
  assert isinstance(cfg.model, registry.Hub) and str(cfg.model) == "Qwen/Qwen2.5-7B-Instruct"
  assert isinstance(cfg.asr_model, registry.Hub) and str(cfg.asr_model) == "openai/whisper-large-v3"
  assert hub.config(cfg.asr_model).n_mels == 128 and hub.config(cfg.model).d_model == 3584


@pytest.mark.slow
def test_full_preset_plans_on_cpu_8():
  p = plan_lib.plan("bfcl_audio", "full", "cpu-8")
  assert [w["name"] for w in p["workloads"]] == ["generate", "generate.multi_turn", "whisper.encode_prefill",
                                                  "whisper.decode", "whisper.features", "connector_train_step",
                                                  "generate.repeat"]
  assert isinstance(p["fits"], bool)
  for w in p["workloads"]:
    assert w["steps"] > 0 and w["analytic_flops_per_step"] > 0
    if w["kind"] == "train":
      assert 0.65 <= w["flops_per_step"] / w["analytic_flops_per_step"] <= 1.5
    if w["name"].startswith("generate"):
      assert w["mesh"]["fsdp"] == 8
