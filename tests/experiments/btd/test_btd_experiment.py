"""experiments/btd.py: answer pairs checked by reasoning-gym's own scorer (ties by value), the judge-samples file
path end to end on a simulated judge of known BTD parameters (self-aggregation included), disjoint calibration and
evaluation items, claims against all three baselines, and one-line errors for bad samples files."""
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
from experiments.runner import claims as claims_lib
from experiments.runner import splits


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


def _plurality(row) -> int:
  """A self-aggregating judge's stand-in: A or B by which it said more often, else a tie."""
  a, b = int(np.sum(row == btd.A)), int(np.sum(row == btd.B))
  return btd.A if a > b else btd.B if b > a else btd.TIE


def _write_samples(path, key, items, n, ns=(1, 4, 16), extra=lambda i: {}):
  theta = jnp.asarray(np.random.default_rng(0).normal(0, 2, items), jnp.float32)
  v = np.asarray(btd.simulate_verdicts(key, theta, 0.8, n))
  y = np.asarray(btd.rating(theta, 0.8))  # ground truth: the generating model's own rating
  names = {btd.A: "A", btd.B: "B", btd.TIE: "tie"}
  with open(path, "w") as f:
    for i, (row, yi) in enumerate(zip(v, y)):
      agg = {str(k): names[_plurality(row[:k])] for k in ns}
      f.write(json.dumps({"verdicts": [names[int(c)] for c in row], "y": float(yi), "self_aggregation": agg,
                          **extra(i)}) + "\n")
  return v, y


def test_samples_file_runs_end_to_end_and_btd_beats_majority_on_a_btd_judge(tmp_path):
  path = tmp_path / "samples.jsonl"
  v, y = _write_samples(path, jax.random.PRNGKey(1), 400, 16)
  cfg = registry.apply_overrides(exp.PRESETS["full"], [f"samples_path={path}", "samples=16", "ns=1,4,16"])
  out = tmp_path / "run"
  out.mkdir()
  res = run_exp.run(cfg, str(out), False)
  assert res["items"] == 400 and res["unparsed_share"] == 0.0
  assert res["mae.btd.n16"] < res["mae.btd.n4"] < res["mae.btd.n1"]
  assert res["mae.btd"] < res["mae.majority"] and res["mae.btd"] < res["mae.soft_sc"]
  rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
  want = {"majority", "soft_sc", "btd_raw", "btd", "self_aggregation"}
  assert {r["method"] for r in rows} == want and (out / "mae_by_n.png").exists()
  for k in ("mae.btd", "mae.majority", "pairwise_acc.btd", "pairwise_acc.self_agg"):  # the claims' paired items
    assert len(res["per_item"][k]) == 200 and np.mean(res["per_item"][k]) == pytest.approx(res[k])
  mae_claim = next(c for c in registry.get("btd").claims if c.id == "mae")
  judged = claims_lib.verdict(mae_claim, [res], "full", [res["per_item"]])
  assert judged["interval"].count("bootstrap over items") == 3 and judged["verdict"] != "not reproduced"
  # self-aggregation at full: the file's final verdicts on the evaluated half, scored independently here
  self_scores = np.array([{btd.A: 1.0, btd.B: 0.0, btd.TIE: 0.5}[_plurality(r)] for r in v[200:]])
  assert res["mae.self_agg"] == pytest.approx(float(np.mean(np.abs(self_scores - y[200:]))), abs=1e-6)
  truth = np.where(y[200:] > 0.5, 1, np.where(y[200:] < 0.5, -1, 0))
  assert res["pairwise_acc.self_agg"] == pytest.approx(float(np.mean(np.sign(self_scores - 0.5) == truth)))
  # splits: the first half calibrates (train), the second is evaluated; items named by line
  recorded = splits.read(str(out))
  assert recorded["train"]["items"] == [splits.digest(f"line {i}") for i in range(200)]
  assert recorded["test"]["items"] == [splits.digest(f"line {i}") for i in range(200, 400)]
  assert splits.overlaps(recorded) == []


def test_an_item_in_both_halves_is_refused(tmp_path):
  path = tmp_path / "samples.jsonl"
  _write_samples(path, jax.random.PRNGKey(2), 8, 4, ns=(1, 4), extra=lambda i: {"question": f"q{i % 7}"})
  cfg = registry.apply_overrides(exp.PRESETS["full"], [f"samples_path={path}", "samples=4", "ns=1,4"])
  with pytest.raises(splits.SplitOverlap, match="share 1 of their items"):
    run_exp.run(cfg, str(tmp_path), False)


def test_generated_items_split_into_disjoint_calibration_and_evaluation_questions():
  pytest.importorskip("reasoning_gym")
  cfg = exp.PRESETS["cpu"]
  items, _ = run_exp.answer_pairs(cfg.dataset, cfg.items, cfg.tie_share, cfg.seed)
  got = run_exp.split_items([it["question"] for it in items], cfg.items // 2, "questions")
  assert len(got["train"]["questions"]) == len(got["test"]["questions"]) == 48
  assert not set(got["train"]["questions"]) & set(got["test"]["questions"])
  assert splits.overlaps(splits.hashed(got)) == []


def test_claims_count_self_aggregation_as_a_baseline():
  reg = registry.get("btd")
  base = {"mae.btd": 0.20, "mae.majority": 0.30, "mae.soft_sc": 0.25, "mae.self_agg": 0.35,
          "pairwise_acc.btd": 0.8, "pairwise_acc.majority": 0.7, "pairwise_acc.soft_sc": 0.75,
          "pairwise_acc.self_agg": 0.6, "judge_accuracy_single": 0.7, "items": 400}
  assert {c.id: claims_lib.holds(c, base) for c in reg.claims} == {"mae": True, "acc": True}
  better_self = {**base, "mae.self_agg": 0.15, "pairwise_acc.self_agg": 0.9}
  assert {c.id: claims_lib.holds(c, better_self) for c in reg.claims} == {"mae": False, "acc": False}


def test_bad_samples_files_are_named(tmp_path):
  cfg = registry.apply_overrides(exp.PRESETS["full"], [f"samples_path={tmp_path / 'none.jsonl'}", "samples=4",
                                                       "ns=1,4"])
  with pytest.raises(FileNotFoundError, match="expected a JSONL file of judge verdicts"):
    run_exp.run(cfg, str(tmp_path), False)
  short = tmp_path / "short.jsonl"
  short.write_text(json.dumps({"verdicts": ["A", "B"], "y": 1.0}) + "\n")
  with pytest.raises(ValueError, match="item 0 has 2 verdicts, samples=4"):
    run_exp.run(dataclasses.replace(cfg, samples_path=str(short)), str(tmp_path), False)
  no_self = tmp_path / "no_self.jsonl"
  no_self.write_text(json.dumps({"verdicts": ["A"] * 4, "y": 1.0, "self_aggregation": {"1": "A"}}) + "\n")
  with pytest.raises(ValueError, match=r"item 0 lacks self_aggregation verdicts for n in \[4\]"):
    run_exp.run(dataclasses.replace(cfg, samples_path=str(no_self)), str(tmp_path), False)
  with pytest.raises(ValueError, match="ns must be increasing"):
    registry.apply_overrides(exp.PRESETS["cpu"], ["ns=4,2"])

