"""tpu_gpu_scripts/device_check.sh on this CPU at its reduced size (DEVICE_CHECK_SMALL=1), as a subprocess: the
JSON it writes has every section's figures with sane values, and the decode agreements are fractions."""
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_device_check_small_run_writes_sane_figures(tmp_path):
  out = tmp_path / "figures.json"
  env = {**os.environ, "DEVICE_CHECK_SMALL": "1", "DEVICE_CHECK_KERNEL_TESTS": "0", "PYTHON": sys.executable,
         "JAX_PLATFORMS": "cpu"}
  env.pop("XLA_FLAGS", None)
  proc = subprocess.run(["bash", os.path.join(ROOT, "tpu_gpu_scripts", "device_check.sh"), str(out)], env=env,
                        capture_output=True, text=True, timeout=1800)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  res = json.loads(out.read_text())
  assert res["errors"] == {} and res["backend"] == "cpu" and res["small"] is True and res["kernel_tests_rc"] == -1
  positive = ["spec_verify_float32_kernel_s", "spec_verify_bfloat16_reference_s", "train_step_s",
              "train_tokens_per_s", "bf16_matmul_peak_measured", "train_mfu_vs_measured_peak", "total_s"]
  positive += [f"decode_{m}_b{b}_tokens_per_s" for m in ("fp32", "bf16", "int8") for b in (1, 2)]
  for key in positive:
    assert isinstance(res[key], float) and math.isfinite(res[key]) and res[key] > 0, (key, res.get(key))
  assert res["spec_verify_float32_max_abs_err"] < 1e-4 and res["spec_verify_bfloat16_max_abs_err"] < 0.1
  assert math.isfinite(res["train_first_loss"]) and abs(res["train_first_loss"] - math.log(256)) < 1.0
  for key in [f"decode_{m}_b{b}_agreement_with_fp32" for m in ("bf16", "int8") for b in (1, 2)]:
    assert 0.0 <= res[key] <= 1.0
