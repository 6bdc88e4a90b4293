"""experiments/btd.py: answer pairs checked by reasoning-gym's own scorer (ties by value), the judge-samples file
path end to end on a simulated judge of known BTD parameters, and one-line errors for bad samples files."""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import btd as exp
from experiments.btd import run as run_exp
from experiments import registry
from experiments.btd import aggregation as btd


def test_answer_pairs_have_the_verdict_the_scorer_gives():
  reasoning_gym = pytest.importorskip("reasoning_gym")
  items, y = run_exp.answer_pairs("basic_arithmetic", 40, 0.25, seed=3)
  data = reasoning_gym.create_dataset("basic_arithmetic", size=40, seed=3)
  for it, yi, entry in zip(items, y, data):
    assert it["question"] == entry["question"]
    if yi == 0.5:  # the right value written two ways (the scorer matches strings, so compare numbers)
      assert float(it["a"]) == float(it["b"]) == float(entry["answer"]) and it["a"] != it["b"]
      continue
    sa, sb = (data.score_answer(answer=it[k], entry=entry) for k in ("a", "b"))
    assert yi == {(1.0, 0.0): 1.0, (0.0, 1.0): 0.0}[(float(sa >= 1), float(sb >= 1))]
  assert {0.0, 0.5, 1.0} <= set(y.tolist())


def _write_samples(path, key, items, n):
  theta = jnp.asarray(np.random.default_rng(0).normal(0, 2, items), jnp.float32)
  v = np.asarray(btd.simulate_verdicts(key, theta, 0.8, n))
  y = np.asarray(btd.rating(theta, 0.8))  # ground truth: the generating model's own rating
  names = {btd.A: "A", btd.B: "B", btd.TIE: "tie"}
  with open(path, "w") as f:
    for row, yi in zip(v, y):
      f.write(json.dumps({"verdicts": [names[int(c)] for c in row], "y": float(yi)}) + "\n")


def test_samples_file_runs_end_to_end_and_btd_beats_majority_on_a_btd_judge(tmp_path):
  path = tmp_path / "samples.jsonl"
  _write_samples(path, jax.random.PRNGKey(1), 400, 16)
  cfg = registry.apply_overrides(exp.PRESETS["full"], [f"samples_path={path}", "samples=16", "ns=1,4,16"])
  out = tmp_path / "run"
  out.mkdir()
  res = run_exp.run(cfg, str(out), False)
  assert res["items"] == 400 and res["unparsed_share"] == 0.0
  assert res["mae.btd.n16"] < res["mae.btd.n4"] < res["mae.btd.n1"]
  assert res["mae.btd"] < res["mae.majority"] and res["mae.btd"] < res["mae.soft_sc"]
  rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
  assert {r["method"] for r in rows} == {"majority", "soft_sc", "btd_raw", "btd"} and (out / "mae_by_n.png").exists()


def test_bad_samples_files_are_named(tmp_path):
  cfg = registry.apply_overrides(exp.PRESETS["full"], [f"samples_path={tmp_path / 'none.jsonl'}", "samples=4",
                                                       "ns=1,4"])
  with pytest.raises(FileNotFoundError, match="expected a JSONL file of judge verdicts"):
    run_exp.run(cfg, str(tmp_path), False)
  short = tmp_path / "short.jsonl"
  short.write_text(json.dumps({"verdicts": ["A", "B"], "y": 1.0}) + "\n")
  with pytest.raises(ValueError, match="item 0 has 2 verdicts, samples=4"):
    run_exp.run(dataclasses.replace(cfg, samples_path=str(short)), str(tmp_path), False)
  with pytest.raises(ValueError, match="ns must be increasing"):
    registry.apply_overrides(exp.PRESETS["cpu"], ["ns=4,2"])

