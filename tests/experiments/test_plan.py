"""`experiments plan`: a preset's workloads compiled ahead of time for a topology, with the JSON keys the README
names, a fit verdict from the compiler's memory analysis, traced FLOPs against a closed form and against the
model's analytic count, and one line (exit 1) when a workload does not fit."""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from experiments import __main__ as cli
from experiments.runner import plan as plan_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOP = {"experiment", "preset", "topology", "chips", "hbm_bytes_per_chip", "fits", "chip_hours", "workloads"}
WORKLOAD = {"name", "kind", "mesh", "bytes_per_chip", "hbm_bytes_per_chip", "fits", "flops_per_step",
            "analytic_flops_per_step", "seconds_per_step", "steps"}


def test_traced_flops_count_each_scan_body_times_its_length():
  def f(x_MK, ws_LKK):
    def body(x, w):
      return jnp.tanh(x @ w), None
    return jax.lax.scan(body, x_MK, ws_LKK)[0] @ ws_LKK[0]
  m, k, layers = 8, 16, 5
  args = (jax.ShapeDtypeStruct((m, k), jnp.float32), jax.ShapeDtypeStruct((layers, k, k), jnp.float32))
  assert plan_lib.traced_flops(f, *args) == (layers + 1) * 2 * m * k * k
  grad = jax.grad(lambda x, w: f(x, w).sum(), argnums=1)  # backward: two matmuls per forward matmul
  assert plan_lib.traced_flops(grad, *args) == 3 * (layers + 1) * 2 * m * k * k
  pick = lambda p, x, w: jax.lax.cond(p, lambda: f(x, w), lambda: x)  # noqa: E731  (the costlier branch counts)
  assert plan_lib.traced_flops(pick, jax.ShapeDtypeStruct((), bool), *args) == (layers + 1) * 2 * m * k * k

  def conv(x_NWC, k_WIO):  # a kernel stored [W, I, O], as Whisper's are: 2 * outputs * W * I
    return jax.lax.conv_general_dilated(x_NWC, k_WIO, (1,), "SAME", dimension_numbers=("NWC", "WIO", "NWC"))
  shapes = (jax.ShapeDtypeStruct((2, 50, 80), jnp.float32), jax.ShapeDtypeStruct((3, 80, 384), jnp.float32))
  assert plan_lib.traced_flops(conv, *shapes) == 2 * (2 * 50 * 384) * 3 * 80

  def loop(x, w):
    return jax.lax.while_loop(lambda c: c[1] < 3, lambda c: (jnp.tanh(c[0] @ w[0]), c[1] + 1), (x, 0))[0]
  assert plan_lib.traced_flops(loop, *args, loop_trips=7) == 7 * 2 * m * k * k


def test_plan_on_cpu_8_writes_the_named_keys_and_matches_the_analytic_flops(tmp_path):
  out = tmp_path / "plan.json"
  assert cli.main(["plan", "lm_pretrain", "--preset", "smoke", "--topology", "cpu-8", "--json", str(out)]) == 0
  p = json.loads(out.read_text())
  assert set(p) == TOP and p["experiment"] == "lm_pretrain" and p["chips"] == 8 and p["fits"] is True
  assert [w["name"] for w in p["workloads"]] == ["train_step", "eval_step"]
  for w in p["workloads"]:
    assert set(w) == WORKLOAD and w["mesh"]["data"] == 8 and 0 < w["bytes_per_chip"] <= w["hbm_bytes_per_chip"]
    assert 0.65 <= w["flops_per_step"] / w["analytic_flops_per_step"] <= 1.5
  train = p["workloads"][0]
  assert train["steps"] == 30 and p["chip_hours"] == pytest.approx(
      sum(w["steps"] * w["seconds_per_step"] for w in p["workloads"]) * 8 / 3600)


def test_a_workload_that_does_not_fit_is_one_line_and_exit_1(monkeypatch, capsys):
  small = plan_lib.Topology("cpu-8", "cpu", 8, 1 << 20, 1e9)  # 1 MiB per chip
  monkeypatch.setattr(plan_lib, "topology", lambda name: small)
  assert cli.main(["plan", "lm_pretrain", "--preset", "cpu", "--topology", "cpu-8"]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: lm_pretrain (cpu): train_step needs ")
  assert "GiB per chip, a cpu-8 chip has 0.00 GiB" in err[0]


def test_bad_topology_and_unplannable_experiment_are_one_line(capsys):
  assert cli.main(["plan", "lm_pretrain", "--topology", "v9x-3"]) == 2
  assert "unknown topology 'v9x-3'; expected a TPU type (v5e-1," in capsys.readouterr().err
  assert cli.main(["plan", "chat", "--topology", "cpu-1"]) == 2
  assert "chat declares no workloads to plan" in capsys.readouterr().err


def _has_libtpu() -> bool:
  import importlib.util
  return importlib.util.find_spec("libtpu") is not None


@pytest.mark.skipif(not _has_libtpu(), reason="libtpu not installed (pip install -e '.[tpu]')")
def test_plan_for_a_tpu_slice_from_the_cli(tmp_path):
  out = tmp_path / "v5e.json"
  p = subprocess.run([sys.executable, "-m", "experiments", "plan", "lm_pretrain", "--preset", "cpu", "--topology",
                      "v5e-8", "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stderr[-2000:]
  plan = json.loads(out.read_text())
  assert plan["chips"] == 8 and plan["hbm_bytes_per_chip"] == 16 * 2 ** 30 and plan["fits"] is True
  peak = plan_lib.topology("v5e-8").peak_flops_per_chip * 8
  for w in plan["workloads"]:  # the cost model's seconds (or, where it gives none, the peak's): never faster than peak
    assert w["seconds_per_step"] >= w["flops_per_step"] / peak * (1 - 1e-9) > 0


def test_plan_scale_compiles_each_optimizers_step(tmp_path):
  from experiments.runner import plan as plan_lib
  p = plan_lib.plan("scale", "smoke", "cpu-8", ["optimizers=adamw,scale"])
  assert [w["name"] for w in p["workloads"]] == ["train_step.adamw", "train_step.scale", "eval_step"]
  assert all(w["fits"] and 0.65 <= w["flops_per_step"] / w["analytic_flops_per_step"] <= 1.5 for w in p["workloads"])


def _toy_workloads(cfg, mesh):
  from jax.sharding import NamedSharding, PartitionSpec as P
  x = jax.ShapeDtypeStruct((cfg.n, cfg.n), jnp.float32, sharding=NamedSharding(mesh, P()))
  return [plan_lib.Workload("matmul", "forward", jax.jit(lambda a: a @ a), (x,), cfg.steps, 2.0 * cfg.n ** 3)]


def test_plan_all_writes_the_scale_table_and_the_readme_takes_it(monkeypatch, tmp_path):
  import dataclasses
  from experiments import registry
  from experiments.runner import readme as readme_lib

  @dataclasses.dataclass(frozen=True)
  class Cfg:
    model: str = registry.Hub("org/toy")
    n: int = 64
    steps: int = 3

  def broken(cfg, mesh):
    raise ValueError("no shapes\nsecond line")

  exps = {"toy_plan": registry.Experiment("toy_plan", Cfg, {p: Cfg() for p in registry.PRESETS}, lambda *a: {},
                                          "t", paper="scale", plan=_toy_workloads),
          "toy_none": registry.Experiment("toy_none", Cfg, {p: Cfg() for p in registry.PRESETS}, lambda *a: {},
                                          "t", paper="gig", plan=lambda cfg, mesh: []),
          "toy_bad": registry.Experiment("toy_bad", Cfg, {p: Cfg() for p in registry.PRESETS}, lambda *a: {},
                                         "t", paper="btd", plan=broken)}
  monkeypatch.setattr(registry, "experiments", lambda: exps)
  monkeypatch.setattr(registry, "get", exps.__getitem__)
  logged = []
  report = plan_lib.plan_all("cpu-8", log=logged.append, cache=str(tmp_path / "kept"))
  assert report["errors"] == {"toy_bad": "ValueError: no shapes"}
  again = plan_lib.plan_all("cpu-8", log=logged.append, cache=str(tmp_path / "kept"))
  assert again["plans"] == report["plans"] and sum("read back" in m for m in logged) == 2  # toy_plan, toy_none
  kept = plan_lib.plan_all("cpu-8", log=logged.append, cache=str(tmp_path / "kept"), cached_only=True)
  assert kept["plans"] == report["plans"] and kept["errors"]["toy_bad"].startswith("not yet (python -m")
  (p,) = [p for p in report["plans"] if p["experiment"] == "toy_plan"]
  assert p["models"] == ["org/toy"] and p["workloads"][0]["flops_per_step"] == 2.0 * 64 ** 3
  md = open(plan_lib.write_all(report, str(tmp_path / "runs"))).read()
  assert "| scale | toy_plan | org/toy | cpu-8 |" in md and "| gig | toy_none | - | - | - | - | - | no accelerator" in md
  assert "| - | toy_bad | - | - | - | - | - | not planned: ValueError: no shapes |" in md
  readme = tmp_path / "README.md"
  readme.write_text(f"# x\n{readme_lib.SCALE_BEGIN}\nold\n{readme_lib.SCALE_END}\n")
  assert readme_lib.update_scale(str(readme), json.loads((tmp_path / "runs" / "plan.json").read_text()))
  text = readme.read_text()
  assert "old" not in text and "plan --all --topology cpu-8" in text and "| scale | toy_plan | org/toy |" in text
  assert not readme_lib.update_scale(str(readme), report)  # generated again: unchanged
  # a merge replaces the rows of the experiments a later plan holds and keeps the others
  later = {**report, "commits": ["abc123"], "errors": {},
           "plans": [{**p, "chip_hours": 7.5} for p in report["plans"] if p["experiment"] == "toy_plan"]}
  assert readme_lib.update_scale(str(readme), later, merge=True)
  text = readme.read_text()
  rows = [line for line in text.splitlines() if line.startswith("| ") and "experiment" not in line]
  assert [r.split("|")[2].strip() for r in rows] == ["toy_none", "toy_plan", "toy_bad"] and "| 7.5 |" in rows[1]
  assert "Rows for toy_plan: planned by `python -m experiments plan --all --topology cpu-8` by the code of commit " \
      "abc123" in text and text.count("Full presets planned by") == 1
  # a later merge takes a name off the earlier "Rows for" line, and drops the line once it names none
  assert readme_lib.update_scale(str(readme), {**later, "commits": ["def456"]}, merge=True)
  assert "Rows for toy_plan: planned by" in readme.read_text() and "abc123" not in readme.read_text()
