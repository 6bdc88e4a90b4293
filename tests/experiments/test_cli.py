"""The CLI as a user runs it: relative run directories from a fresh working directory, one-line errors, failed
starts that leave nothing behind, help listing config keys, extending a run with --resume, Ctrl-C, and `judge` on
a run directory made elsewhere."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from experiments import __main__ as cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = ["--preset", "smoke", "--set", "eval_batches=1", "--set", "max_docs=60"]


def _env(**extra):
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAXLAB_")}
  env.update(XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu", JAXLAB_NO_PROGRESS="1",
             PYTHONPATH=REPO, **extra)
  return env


def _cli(cwd, *args, check=True):
  p = subprocess.run([sys.executable, "-m", "experiments", *args], cwd=cwd, env=_env(), capture_output=True,
                     text=True, timeout=600)
  if check:
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  return p


@pytest.mark.slow
def test_relative_default_root_run_resume_extend_and_reproduce(tmp_path):
  _cli(tmp_path, "run", "lm_pretrain", *SMALL, "--set", "steps=12", "--set", "ckpt_every=6")
  run = tmp_path / "runs" / "lm_pretrain"
  assert json.loads((run / "results.json").read_text())["steps"] == 12
  assert sorted(os.listdir(run / "checkpoints")) == ["12", "6"]
  out = _cli(tmp_path, "run", "lm_pretrain", *SMALL, "--set", "steps=16", "--set", "ckpt_every=6", "--resume")
  assert "resumed from step 12" in out.stdout
  steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]
  assert steps[-1] == 16 and json.loads((run / "results.json").read_text())["steps"] == 16
  shrink = _cli(tmp_path, "run", "lm_pretrain", *SMALL, "--set", "steps=8", "--set", "ckpt_every=6", "--resume",
                check=False)
  assert shrink.returncode == 2 and "steps may only grow" in shrink.stderr
  _cli(tmp_path, "reproduce", "--preset", "smoke", "--only", "lm_pretrain")
  assert (tmp_path / "runs" / "lm_pretrain-2" / "results.json").exists()
  assert "## lm_pretrain" in (tmp_path / "runs" / "report.md").read_text()


@pytest.mark.parametrize("args,needle", [
    (["--set", "mesh=data:3"], "mesh spec 'data:3' asks for 3 devices"),  # rejected inside the run
    (["--preset", "full"], "lm_pretrain --preset full: corpus.path is required (--set corpus.path=PATH)"),
])
def test_failed_start_leaves_nothing_behind(tmp_path, capsys, args, needle):
  out = tmp_path / "run"
  argv = ["run", "lm_pretrain", "--preset", "smoke", *args, "--out", str(out)]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert needle in err and err.startswith("error: ") and len(err.splitlines()) == 1
  assert not out.exists()
  os.makedirs(out)
  assert cli.main(argv + ["--resume"]) == 2 and os.listdir(out) == []  # resume is not refused for "config differs"
  capsys.readouterr()


def test_user_errors_are_one_line_and_debug_shows_the_traceback(tmp_path):
  for args, needle in [(["run", "lm_pretrain", "--set", "lr=-1"], "lr must be a finite number > 0"),
                       (["run", "nope"], "unknown experiment 'nope'"),
                       (["bench", "nope"], "unknown benchmark 'nope'")]:
    p = _cli(tmp_path, *args, check=False)
    assert p.returncode == 2 and needle in p.stderr and p.stderr.count("\n") == 1, p.stderr
  bad = tmp_path / "bad"
  bad.mkdir()
  (bad / "config.json").write_text("{not json")
  p = _cli(tmp_path, "run", "lm_pretrain", "--out", "bad", "--resume", check=False)
  assert p.returncode == 2 and str(bad / "config.json") in p.stderr and p.stderr.count("\n") == 1
  p = _cli(tmp_path, "--debug", "run", "lm_pretrain", "--set", "warmup_steps=99", check=False)
  assert p.returncode != 0 and "Traceback" in p.stderr and "warmup_steps must be in [0, steps=30]" in p.stderr
  assert os.listdir(tmp_path) == ["bad"]


def test_help_lists_config_keys_and_benchmarks(capsys):
  assert cli.main(["run", "lm_pretrain", "--help"]) == 0
  text = capsys.readouterr().out
  header = next(line for line in text.splitlines() if line.startswith("key"))
  assert header.split() == ["key", "type", "smoke", "cpu", "full"]
  rows = {line.split()[0]: line.split()[1:] for line in text.splitlines()[text.splitlines().index(header) + 1:]
          if line.strip() and not line.startswith("may change")}
  assert rows["lr"] == ["float", "0.003", "0.002", "0.001"] and rows["model.d_model"] == ["int", "64", "256", "512"]
  assert "steps" in text.split("may change on --resume:")[1]
  assert cli.main(["bench", "--help"]) == 0 and "input" in capsys.readouterr().out
  assert cli.main(["run", "--help"]) == 0 and "lm_pretrain" in capsys.readouterr().out


def test_resume_into_an_empty_directory_says_so(tmp_path):
  p = _cli(tmp_path, "run", "lm_pretrain", *SMALL, "--set", "steps=2", "--set", "warmup_steps=1", "--out", "fresh",
           "--resume")
  assert "holds no run yet; starting from scratch" in p.stdout
  assert (tmp_path / "fresh" / "results.json").exists()


@pytest.mark.slow
def test_ctrl_c_keeps_complete_checkpoints_and_prints_the_resume_command(tmp_path):
  # far more steps than the run can take before the interrupt, so that a slow poll under load cannot let it finish
  args = [sys.executable, "-m", "experiments", "run", "lm_pretrain", *SMALL, "--set", "steps=100000",
          "--set", "ckpt_every=5", "--set", "log_every=1", "--out", "r"]
  # the run starts with SIGINT at its default, as from a terminal: a runner started in the background by a
  # non-interactive shell ignores SIGINT, children inherit that, and the run would rightly leave it ignored
  proc = subprocess.Popen(args, cwd=tmp_path, env=_env(PYTHONFAULTHANDLER="1"), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  try:
    metrics, deadline = tmp_path / "r" / "metrics.jsonl", time.time() + 300
    while not (metrics.exists() and metrics.read_text().count("\n") > 12):
      assert proc.poll() is None and time.time() < deadline, proc.communicate()
      time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    try:
      out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:  # stuck: SIGABRT makes faulthandler print every thread's stack
      proc.send_signal(signal.SIGABRT)
      err = proc.communicate(timeout=60)[1]
      pytest.fail(f"no exit within 300 s of Ctrl-C; the run's threads:\n{err[-8000:]}")
  finally:
    proc.kill()
  assert proc.returncode == 130, err[-3000:]
  assert "Traceback" not in err and "--out" in err and err.strip().endswith("--resume")
  ckpts = tmp_path / "r" / "checkpoints"
  steps = [d for d in os.listdir(ckpts) if d.isdigit()]
  assert steps and all((ckpts / d / "commit_success.txt").exists() for d in steps)
  resume = err.strip().splitlines()[-1].split()
  assert resume[:4] == ["python", "-m", "experiments", "run"] and "steps=100000" in resume


def test_judge_a_finished_run_directory(tmp_path):
  """A run made elsewhere (results.json, items.json, config.json), judged by today's polar claims."""
  run = tmp_path / "polar_gpu"
  run.mkdir()
  (run / "config.json").write_text(json.dumps({"experiment": "polar", "preset": "cpu", "config": {}}))
  full = [1.0] * 60 + [0.0] * 40
  items = {"acc.full_forward": full, "acc.predictor_top1": full, "pass5.predictor": [1.0] * 90 + [0.0] * 10,
           "pass5.full_plus_random_edits": [1.0] * 70 + [0.0] * 30}
  (run / "items.json").write_text(json.dumps(items))
  results = {k: sum(v) / len(v) for k, v in items.items()}
  (run / "results.json").write_text(json.dumps(dict(results, git_commit="ab" * 20, git_dirty=False)))
  out = _cli(tmp_path, "judge", "polar_gpu").stdout.splitlines()
  assert out[0] == "polar (cpu): 1 run(s) at commit(s) abababababab"
  assert out[1].startswith("polar claim pass5: not measurable at this preset: random programs' pass@5")
  assert out[1].endswith("(pass5.full_plus_random_edits=0.7, acc.full_forward=0.6)")
  assert out[2] == ("polar claim top1: not reproduced  [acc.predictor_top1 - acc.full_forward = 0, 95% interval [0, 0] "
                    "(n=100, paired, bootstrap over items)]")
  assert out[3].startswith("polar claim pass5_vs_chance: reproduced  [pass5.predictor - pass5.full_plus_random_edits = "
                           "0.2, 95% interval [0.1")
  assert out[-1] == "claims: 1 not measurable at this preset, 1 not reproduced, 1 reproduced"
  assert _cli(tmp_path, "judge", "polar_gpu/results.json").stdout.splitlines() == out
  missing = _cli(tmp_path, "judge", "nowhere", check=False)
  assert missing.returncode == 2 and missing.stderr.startswith("error: ") and missing.stderr.count("\n") == 1
