"""spec_dllm smoke preset end to end through the runner: every headline key, sane values, the plot."""
import math
import os

from experiments import registry

METHODS = ("vanilla", "fast_dllm", "fast_dllm_dual_cache", "speculative", "speculative_vanilla")


def test_smoke_preset_writes_every_result(tmp_path):
  registry.load_all()
  out_dir, results = registry.run_experiment("spec_dllm", "smoke", out=str(tmp_path / "run"))
  for m in METHODS:
    assert 0.0 <= results[f"accuracy.{m}"] <= 1.0
    assert results[f"nfe.{m}"] > 0 and math.isfinite(results[f"seconds.{m}"])
    # tokens committed per denoising step can never be below one
    assert results[f"tokens_per_step.{m}"] >= 1.0
  # vanilla commits exactly one token per step in the smoke preset's even split; threshold decoding never fewer
  assert results["nfe.fast_dllm"] <= results["nfe.vanilla"]
  # exact speculative decoding of the vanilla sampler decodes vanilla's tokens, in no more forwards
  assert results["accuracy.speculative_vanilla"] == results["accuracy.vanilla"]
  assert results["nfe.speculative_vanilla"] <= results["nfe.vanilla"]
  assert os.path.exists(os.path.join(out_dir, "results.json"))
  assert any(f.endswith(".png") for f in os.listdir(out_dir))
