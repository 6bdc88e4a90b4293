"""tele_lens's full preset planned on 8 CPU devices: the paper's model (lxucs/tele-lens-llm, Qwen2.5-7B shapes)
generating CoTs, extracting hidden states and reading out, and the probes' train steps, compiled from the shipped
architecture."""
import pytest

from experiments import registry
from experiments.runner import plan as plan_lib
from jaxlab.hf import hub

LLM = "lxucs/tele-lens-llm"


def test_full_preset_names_the_papers_model_and_probes_within_its_depth():
  cfg = registry.config_for("tele_lens", "full", required=False)
  mcfg = hub.config(cfg.model)
  assert cfg.model == LLM and (mcfg.d_model, mcfg.n_layers, mcfg.vocab_size) == (3584, 28, 152064)
  assert cfg.layers[-1] <= mcfg.n_layers and cfg.uncertainty_layer == 21


@pytest.mark.slow
def test_full_preset_plans_generation_extraction_and_probe_steps_on_cpu_8():
  p = plan_lib.plan("tele_lens", "full", "cpu-8")
  assert [w["name"] for w in p["workloads"]] == ["generate.greedy", "generate.sampled", "extract_hidden", "lm_readout",
                                                 "probe_train_step.tokens", "probe_train_step.answer"]
  by = {w["name"]: w for w in p["workloads"]}
  assert by["generate.sampled"]["steps"] == 3 * by["generate.greedy"]["steps"] == 3 * (2000 // 16)
  for w in p["workloads"]:
    assert isinstance(w["fits"], bool)
    if w["kind"] == "train":
      assert 0.65 <= w["flops_per_step"] / w["analytic_flops_per_step"] <= 1.5
