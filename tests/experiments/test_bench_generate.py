"""experiments/bench.py `generate`: a tiny run times every variant, and HF's greedy tokens on the same weights
equal jaxlab's."""
import math

from experiments import bench


def test_tiny_generate_bench_times_variants_and_agrees_with_hf():
  out = bench.bench_generate(["--model", "tiny", "--new-tokens", "6", "--batches", "1,2", "--weights", "fp32,int8",
                              "--repeats", "1", "--no-llama-cpp"])
  for b in (1, 2):
    for name in ("jax_fp32", "jax_int8", "hf"):
      rate = out[f"{name}_b{b}_tokens_per_s"]
      assert math.isfinite(rate) and rate > 0, (name, b, out)
    assert out[f"hf_b{b}_agreement_with_jax_fp32"] == 1.0, out
  assert out["jax_int8_weight_bytes"] < out["jax_fp32_weight_bytes"] / 2
