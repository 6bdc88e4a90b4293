"""Launcher for the two-process tests: a script's worker mode run as two jax.distributed CPU processes."""
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def launch_two_workers(tmp_path):
  """Runs `script --worker tmp_path` as two processes of two CPU devices each (tpu_gpu_scripts/launch_local.sh);
  fails the test with every process's log tail if one fails."""
  def launch(script: str):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXLAB_") and k != "XLA_FLAGS"}
    env["JAXLAB_NO_PROGRESS"] = "1"
    cmd = ["bash", os.path.join(REPO, "tpu_gpu_scripts", "launch_local.sh"), "-n", "2", "-d", "2", "-l",
           str(tmp_path / "logs"), "--", sys.executable, os.path.abspath(script), "--worker", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=400)
    logs = "".join(open(p).read()[-3000:] for p in sorted((tmp_path / "logs").glob("*.log")))
    assert proc.returncode == 0, proc.stderr[-3000:] + logs
  return launch
