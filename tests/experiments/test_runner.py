"""Experiment runner: --set parsing, run directories, reproduce/report, and SIGKILL + --resume == uninterrupted."""
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Literal

import numpy as np
import pytest

from experiments import __main__ as cli
from experiments import registry
from experiments.runner import claims
from jaxlab import choices
from jaxlab.models import transformer as tfm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class ToyConfig:
  model: tfm.Config = tfm.Config.tiny()
  steps: int = 3
  lr: float = 0.1
  name: str | None = None
  flag: bool = False
  dims: tuple[int, ...] = (1, 2)

  def __post_init__(self):
    if self.steps < 1:
      raise ValueError(f"steps must be >= 1, found {self.steps}")


def test_overrides_parse_typed_and_nested_values():
  cfg = registry.apply_overrides(ToyConfig(), ["steps=7", "lr=1e-3", "name=none", "flag=true", "dims=4,5,6",
                                               "model.d_model=128", "model.n_kv_heads=None",
                                               "model.rope.theta=500000"])
  assert (cfg.steps, cfg.lr, cfg.name, cfg.flag, cfg.dims) == (7, 1e-3, None, True, (4, 5, 6))
  assert cfg.model.d_model == 128 and cfg.model.n_kv_heads is None and cfg.model.rope.theta == 500000
  assert registry.apply_overrides(ToyConfig(), ["name=abc"]).name == "abc"


@pytest.mark.parametrize("item,key,why", [
    ("stepz=3", "stepz", "unknown key"), ("model.d_modl=3", "model.d_modl", "unknown key"),
    ("steps=1.5", "steps", "expected int"), ("flag=maybe", "flag", "expected bool"),
    ("lr=fast", "lr", "expected float"), ("dims=a,b", "dims", "expected int"),
    ("steps=0", "steps", "steps must be >= 1"), ("model.n_heads=5", "model.n_heads", "must divide"),
    ("model=tiny", "model", "nested config"), ("steps", "steps", "key=value")])
def test_bad_overrides_name_the_key(item, key, why):
  with pytest.raises(registry.OverrideError) as err:
    registry.apply_overrides(ToyConfig(), [item])
  assert key in str(err.value) and why in str(err.value)


@pytest.mark.parametrize("name", ["lm_pretrain", "scale"])
def test_flat_keys_reach_the_nested_corpus_eval_and_checkpoint_configs(name):
  exp = registry.get(name)
  old = registry.apply_overrides(exp.presets["smoke"], ["corpus=/c.jsonl", "tokenizer=/t", "max_docs=7",
                                                        "val_fraction=0.2", "eval_every=5", "eval_batches=3",
                                                        "ckpt_every=4", "keep_ckpts=1"])
  new = registry.apply_overrides(exp.presets["smoke"], ["corpus.path=/c.jsonl", "corpus.tokenizer=/t",
                                                        "corpus.max_docs=7", "corpus.val_fraction=0.2",
                                                        "eval.every=5", "eval.batches=3", "checkpoint.every=4",
                                                        "checkpoint.keep=1"])
  assert old == new
  assert (new.corpus.path, new.corpus.max_docs, new.eval.every, new.checkpoint.keep) == ("/c.jsonl", 7, 5, 1)
  with pytest.raises(registry.OverrideError, match="corpus.max_docs must be >= 1"):
    registry.apply_overrides(exp.presets["smoke"], ["max_docs=0"])


def test_cli_rejects_bad_set_before_running(tmp_path, capsys, monkeypatch):
  ran = []
  monkeypatch.setattr(registry, "run_experiment", lambda *a, **k: ran.append(a))
  for item, key in [("model.d_modl=3", "d_modl"), ("steps=ten", "steps")]:
    rc = cli.main(["run", "lm_pretrain", "--preset", "smoke", "--set", item, "--root", str(tmp_path)])
    assert rc == 2 and key in capsys.readouterr().err
  assert not ran and os.listdir(tmp_path) == []


def test_run_dir_never_overwrites(tmp_path):
  root = str(tmp_path)
  first = registry.resolve_run_dir("x", None, False, root)
  assert first == os.path.join(root, "x")
  os.makedirs(first)
  assert registry.resolve_run_dir("x", None, False, root) == first  # empty dir: still free
  open(os.path.join(first, "results.json"), "w").close()
  assert registry.resolve_run_dir("x", None, False, root) == first + "-2"
  assert registry.resolve_run_dir("x", None, True, root) == first
  with pytest.raises(registry.RunDirExists, match="--resume"):
    registry.resolve_run_dir("x", first, False, root)
  assert registry.resolve_run_dir("x", first, True, root) == first


def _toy_run(cfg, out_dir, resume):
  losses = [cfg.lr * (cfg.steps - i) for i in range(cfg.steps)]
  with open(os.path.join(out_dir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps({"step": i + 1, "loss": v}) + "\n" for i, v in enumerate(losses))
  registry.plot_curves(os.path.join(out_dir, "loss.png"), {"train": (list(range(cfg.steps)), losses)})
  return {"final_loss": losses[-1], "nested": {"a": 1}}


def _broken_run(cfg, out_dir, resume):
  raise RuntimeError("boom")


def test_reproduce_writes_runs_and_report(tmp_path, monkeypatch):
  presets = {p: ToyConfig() for p in registry.PRESETS}
  toy = registry.Experiment("toy", ToyConfig, presets, _toy_run, "toy")
  broken = registry.Experiment("broken", ToyConfig, presets, _broken_run, "fails")
  monkeypatch.setattr(registry, "experiments", lambda: {"broken": broken, "toy": toy})
  monkeypatch.setattr(registry, "import_errors", lambda: {"ghost": "SyntaxError: bad"})
  root = str(tmp_path / "runs")
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root]) == 1  # one experiment failed
  run_dir = os.path.join(root, "toy")
  assert sorted(os.listdir(run_dir)) == ["config.json", "loss.png", "metrics.jsonl", "results.json",
                                         "sources.json", "summary.md"]
  results = json.load(open(os.path.join(run_dir, "results.json")))
  assert results["final_loss"] == pytest.approx(0.1) and results["nested.a"] == 1
  saved = json.load(open(os.path.join(run_dir, "config.json")))
  assert saved["config"]["steps"] == 3
  assert saved["host"]["cpu_model"] and saved["host"]["simd"] in ("avx512f", "avx2", "avx", "sse4_2", "neon", "asimd",
                                                                  "unknown")  # the CPU: low float bits vary with it
  report = open(os.path.join(root, "report.md")).read()
  assert "## toy" in report and "| final_loss | 0.1 |" in report and "(toy/loss.png)" in report
  assert "## broken" in report and "RuntimeError: boom" in report
  assert "## ghost" in report and "import failed: SyntaxError: bad" in report
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--only", "toy", "--force"]) == 0
  assert os.path.exists(os.path.join(root, "toy-2", "results.json"))  # the first run was kept


# ----------------------------------------------------------------------------- kill and resume

STEPS, CKPT = 100, 20
ARGS = ["--preset", "smoke", "--set", f"steps={STEPS}", "--set", f"ckpt_every={CKPT}", "--set", "log_every=1",
        "--set", "keep_ckpts=3", "--set", "eval_batches=1"]


def _env(devices=2):
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAXLAB_")}
  env.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu",
             JAXLAB_NO_PROGRESS="1", PYTHONPATH=REPO)
  return env


def _start(out, *extra):
  return subprocess.Popen([sys.executable, "-m", "experiments", "run", "lm_pretrain", *ARGS, "--out", str(out),
                           *extra], cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


def _finish(proc, timeout=300):
  out, _ = proc.communicate(timeout=timeout)
  assert proc.returncode == 0, out[-4000:]
  return out


def _last_logged_step(path):
  try:
    with open(path) as f:
      lines = f.read().splitlines()
  except FileNotFoundError:
    return 0
  steps = [json.loads(line).get("step", 0) for line in lines[:-1] if line.strip()]  # the last may be partial
  return max(steps, default=0)


def _final_state(run_dir):
  from jaxlab.train.checkpoint import Checkpointer
  state = Checkpointer(os.path.join(run_dir, "checkpoints")).restore(STEPS).state
  return {"params": state["params"], "opt_state": state["opt_state"], "rng": state["rng"]}


@pytest.mark.slow
def test_sigkill_then_resume_equals_uninterrupted(tmp_path):
  full, killed = tmp_path / "full", tmp_path / "killed"
  ref = _start(full)
  victim = _start(killed)
  deadline = time.time() + 300
  while _last_logged_step(killed / "metrics.jsonl") < 2 * CKPT + 5:
    assert victim.poll() is None, "the run ended before it could be killed:\n" + victim.stdout.read()[-3000:]
    assert time.time() < deadline, "timed out waiting for training progress"
    time.sleep(0.01)
  victim.send_signal(signal.SIGKILL)
  victim.wait()
  killed_at = _last_logged_step(killed / "metrics.jsonl")
  assert victim.returncode == -signal.SIGKILL and killed_at < STEPS
  assert not (killed / "results.json").exists()

  other_mesh = tmp_path / "other_mesh"
  shutil.copytree(killed, other_mesh)
  resumed = _start(killed, "--resume")
  moved = _start(other_mesh, "--resume", "--set", "mesh=tensor:2", "--set", "strategy=fsdp_tp")
  _finish(ref)
  out = _finish(resumed)
  out_moved = _finish(moved)
  assert "resumed from step" in out and "resumed from step" in out_moved
  resumed_from = int(out.split("resumed from step ")[1].split()[0])
  assert CKPT <= resumed_from <= killed_at and resumed_from % CKPT == 0

  want = _final_state(full)
  got = _final_state(killed)
  import jax
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # bitwise
  # Another mesh reduces in another order; ~60 Adam steps later the params agree to rounding drift only.
  moved_params = _final_state(other_mesh)["params"]
  for a, b in zip(jax.tree.leaves(moved_params), jax.tree.leaves(want["params"])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=2e-4)
  res_moved = json.load(open(other_mesh / "results.json"))
  res_full = json.load(open(full / "results.json"))
  assert res_moved["mesh"] == "data:1,fsdp:1,tensor:2" and res_full["mesh"] == "data:2,fsdp:1,tensor:1"
  res_resumed = json.load(open(killed / "results.json"))
  assert res_resumed["initial_train_loss"] == res_full["initial_train_loss"]  # from the first run's log
  assert res_resumed["final_val_loss"] == res_full["final_val_loss"]
  assert res_moved["final_val_loss"] == pytest.approx(res_full["final_val_loss"], abs=1e-3)
  assert res_full["final_train_loss"] < res_full["initial_train_loss"]
  assert (killed / "config.resumed.json").exists() and (killed / "loss.png").exists()


# ----------------------------------------------------------------------------- typed choices, Required, results keys

@dataclasses.dataclass(frozen=True)
class Stage:
  kind: Literal["warmup", "main"] = "main"


@dataclasses.dataclass(frozen=True)
class TypedConfig:
  optimizer: Literal["adamw", "sgd"] = "adamw"
  schedule: Literal["cosine", "linear"] | None = None
  methods: tuple[Literal["a", "b", "c"], ...] = ("a", "b")
  stage: Stage = Stage()
  data: str = "stdlib"
  steps: int = 2


def _typed_run(cfg, out_dir, resume):
  return {"loss": {m: 1.0 for m in cfg.methods}, "steps": cfg.steps, **({"extra": 1} if cfg.steps > 2 else {})}


def _typed(monkeypatch, **kw):
  presets = {"smoke": TypedConfig(), "cpu": TypedConfig(),
             "full": TypedConfig(data=registry.Required("--set data=PATH: a JSONL corpus"))}
  exp = registry.Experiment("typed", TypedConfig, presets, _typed_run, **{"results": ("loss.<method>", "steps"), **kw})
  monkeypatch.setattr(registry, "experiments", lambda: {"typed": exp})
  return exp


def test_choices_are_checked_in_overrides_presets_and_nested_configs(monkeypatch):
  _typed(monkeypatch)
  cfg = registry.config_for("typed", "smoke", ["optimizer=sgd", "schedule=none", "methods=c,a", "stage.kind=warmup"])
  assert (cfg.optimizer, cfg.schedule, cfg.methods, cfg.stage.kind) == ("sgd", None, ("c", "a"), "warmup")
  for item, message in [("optimizer=adam", "typed: optimizer must be one of ['adamw', 'sgd'], found 'adam'"),
                        ("schedule=cos", "typed: schedule must be one of ['cosine', 'linear'], found 'cos'"),
                        ("methods=a,d", "typed: methods must be one of ['a', 'b', 'c'], found 'd'"),
                        ("stage.kind=cool", "typed: stage.kind must be one of ['warmup', 'main'], found 'cool'")]:
    with pytest.raises(registry.OverrideError) as e:
      registry.config_for("typed", "smoke", [item])
    assert str(e.value) == message
  bad = {p: TypedConfig() for p in registry.PRESETS} | {"cpu": TypedConfig(stage=Stage(kind="cooldown"))}
  with pytest.raises(ValueError, match="experiment 'typed': preset 'cpu': stage.kind must be one of"):
    registry.Experiment("typed", TypedConfig, bad, _typed_run)
  with pytest.raises(ValueError, match=r"transformer.Config: activation must be one of \['silu'"):
    tfm.Config.tiny(activation="swish")
  assert choices.values(Literal["x", "y"]) == ("x", "y")
  with pytest.raises(TypeError, match="differ from the values"):
    choices.same({"x": 1, "z": 2}, Literal["x", "y"])


def test_a_bad_choice_from_the_command_line_is_one_line():
  p = subprocess.run([sys.executable, "-m", "experiments", "run", "lm_pretrain", "--set", "optimizer=adam"],
                     cwd=REPO, env=_env(1), capture_output=True, text=True, timeout=300)
  assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
  assert p.stderr.startswith("error: lm_pretrain: optimizer must be one of ['adamw', 'sgd', 'sgd_colnorm', ") and \
      "], found 'adam'" in p.stderr


def test_an_unset_required_field_is_one_line_and_makes_no_run_directory(tmp_path, monkeypatch):
  _typed(monkeypatch)
  with pytest.raises(registry.OverrideError) as e:
    registry.run_experiment("typed", "full", root=str(tmp_path))
  assert str(e.value) == "typed --preset full: data is required (--set data=PATH: a JSONL corpus)"
  assert os.listdir(tmp_path) == []
  out, results = registry.run_experiment("typed", "full", ["data=/c.jsonl"], root=str(tmp_path))
  assert results["loss.a"] == 1.0 and json.load(open(os.path.join(out, "config.json")))["config"]["data"] == "/c.jsonl"
  required = registry.apply_overrides(registry.get("typed").presets["full"], ())
  assert isinstance(required.data, registry.Required) and json.loads(json.dumps(registry.config_dict(required)))[
      "data"] == "--set data=PATH: a JSONL corpus"  # config.json still serializes


def test_an_unset_required_field_from_the_command_line_is_one_line(tmp_path, capsys):
  assert cli.main(["run", "chat", "--preset", "full", "--root", str(tmp_path / "cli")]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: chat --preset full: model is required (--set model=PATH: ") and err.count("\n") == 1
  assert not (tmp_path / "cli").exists()


def test_a_run_must_write_exactly_its_declared_results_keys(tmp_path, monkeypatch):
  _typed(monkeypatch)
  with pytest.raises(registry.ResultsMismatch, match=r"typed: .* undeclared \['extra'\]"):
    registry.run_experiment("typed", "smoke", ["steps=3"], root=str(tmp_path))
  assert json.load(open(tmp_path / "typed" / "results.json"))["extra"] == 1  # written: nothing computed is lost
  _typed(monkeypatch, results=("loss.<method>", "steps", "accuracy.<method>", "final?"))
  with pytest.raises(registry.ResultsMismatch, match=r"missing \['accuracy.<method>'\]"):
    registry.run_experiment("typed", "smoke", root=str(tmp_path))
  _typed(monkeypatch, results=("loss.<method>", "steps", "extra?"))
  assert registry.run_experiment("typed", "smoke", root=str(tmp_path))[1]["steps"] == 2


def test_claims_and_checks_may_read_only_declared_results_keys():
  presets = {p: TypedConfig() for p in registry.PRESETS}
  claim = claims.Claim("beats", "a beats b", "x", "{loss.a} < {loss.b}", measurable="{acc} > 0", why="floor")
  with pytest.raises(ValueError, match=r"claims and checks read results keys it does not declare \(beats: acc\)"):
    registry.Experiment("typed", TypedConfig, presets, _typed_run, claims=(claim,), results=("loss.<method>",))
  with pytest.raises(ValueError, match="declare the results keys it writes"):
    registry.Experiment("typed", TypedConfig, presets, _typed_run, checks=(claims.Check("c", "t", "p", "{steps} > 0"),))
  assert registry.Experiment("typed", TypedConfig, presets, _typed_run, claims=(claim,),
                             results=("loss.<method>", "acc?")).declares("loss.b")


def test_every_experiment_declares_its_results_keys():
  exps = registry.experiments()
  assert not registry.import_errors()
  assert not [name for name, e in exps.items() if e.results is None]
