"""spec_dllm smoke preset end to end through the runner: every headline key, sane values, the plot; HumanEval's
model-written programs judged in the sandbox."""
import math
import os
import time

import numpy as np
import pytest

from experiments import registry

METHODS = ("vanilla", "fast_dllm", "fast_dllm_dual_cache", "speculative_dual_cache", "speculative",
           "speculative_vanilla")


@pytest.mark.slow
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
  items = registry.read_items(out_dir)  # each problem's 0/1 per method: the accuracy claims' paired intervals
  for m in METHODS:
    assert np.mean(items[f"accuracy.{m}"]) == pytest.approx(results[f"accuracy.{m}"])
    assert np.mean(items[f"nfe.{m}"]) == pytest.approx(results[f"nfe.{m}"])
  # wall-clock speed-up and tokens-per-step ratio of the claims' pair, from the recorded seconds and tokens per step
  pair = "speculative_dual_cache_over_fast_dllm_dual_cache"
  assert math.isclose(results[f"speedup.{pair}"],
                      results["seconds.fast_dllm_dual_cache"] / results["seconds.speculative_dual_cache"])
  assert math.isclose(results[f"tps_ratio.{pair}"], results["nfe.fast_dllm_dual_cache"]
                      / results["nfe.speculative_dual_cache"])
  assert os.path.exists(os.path.join(out_dir, "results.json"))
  assert os.path.exists(os.path.join(out_dir, "splits.json"))
  assert any(f.endswith(".png") for f in os.listdir(out_dir))


@pytest.mark.sandbox
def test_humaneval_programs_run_in_the_sandbox(tmp_path):
  from experiments.spec_dllm import run as run_spec_dllm
  program = "def add(a, b):\n  return a + b\n\n\ndef check(f):\n  assert f(2, 3) == 5\n\n\ncheck(add)\n"
  assert run_spec_dllm._humaneval_pass(program)
  assert not run_spec_dllm._humaneval_pass(program.replace("a + b", "a - b"))
  start = time.monotonic()
  assert not run_spec_dllm._humaneval_pass("while True:\n  pass\n", timeout=2)
  assert time.monotonic() - start < 10
  os.chmod(tmp_path, 0o777)  # writable by anyone on the host, yet out of the program's reach
  for target in (tmp_path / "escaped", "/x", "/usr/x", "/dev/x"):
    assert not run_spec_dllm._humaneval_pass(f"open({str(target)!r}, 'w').write('x')\n")
  assert os.listdir(tmp_path) == [] and not os.path.exists("/x")
  assert run_spec_dllm._humaneval_pass("open('scratch.txt', 'w').write('x')\n")  # its own directory is writable
