"""spec_dllm's full preset planned on 8 CPU devices: LLaDA-8B's block decoders (vanilla, Fast-dLLM's dual cache,
speculative verification) compiled from the shipped architecture."""
import pytest

from experiments.runner import plan as plan_lib

LLADA = "GSAI-ML/LLaDA-8B-Instruct"


@pytest.mark.slow
def test_full_preset_plans_llada_8b_block_decoders_on_cpu_8():
  p = plan_lib.plan("spec_dllm", "full", "cpu-8", ["methods=vanilla,fast_dllm_dual_cache,speculative_dual_cache"])
  names = [w["name"] for w in p["workloads"]]
  assert names == ["vanilla.decode_block", "fast_dllm_dual_cache.decode_block", "speculative_dual_cache.decode_block"]
  blocks, calls = 256 // 32, 1319 + 1  # 8 blocks per GSM8K problem, every problem and the compile-excluding first
  for w in p["workloads"]:
    assert w["kind"] == "generate" and w["mesh"]["tensor"] == 8 and w["steps"] == blocks * calls
    assert isinstance(w["fits"], bool) and w["bytes_per_chip"] > 0
  vanilla = p["workloads"][0]  # 32 forwards over prompt + 256 tokens per block, one token each
  assert 0.65 <= vanilla["flops_per_step"] / vanilla["analytic_flops_per_step"] <= 1.5
  assert vanilla["analytic_flops_per_step"] > 32 * 2 * 7e9 * (128 + 256)  # 7B matmul weights (8B with embeddings)
