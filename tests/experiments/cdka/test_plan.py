"""cdka's full preset planned on cpu-8 (LLaMA-2-7B's architecture shipped as data, no weights) and its one-line stop
when the checkpoint is not downloaded."""
import pytest

from experiments import registry
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


def test_full_preset_without_downloads_names_the_fetch_command(tmp_path, monkeypatch):
  monkeypatch.setenv("JAXLAB_MODELS", str(tmp_path / "models"))
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
  with pytest.raises(registry.OverrideError, match=r"hf download meta-llama/Llama-2-7b-hf .*setup\.model_path") as e:
    registry.config_for("cdka", "full")
  assert "\n" not in str(e.value) and "hf download meta-math/MetaMathQA" in str(e.value)
  assert "hf download openai/gsm8k" in str(e.value)
