"""splits.json: items hashed by their canonical text, train/evaluation overlaps refused in one line unless the
experiment declares the kind shared, and a paper's run that records no splits fails."""
import dataclasses
import hashlib
import json
import os

import pytest

from experiments import __main__ as cli
from experiments import registry
from experiments.runner import splits
from experiments.runner.claims import Claim


@dataclasses.dataclass(frozen=True)
class Cfg:
  seed: int = 0
  overlap: bool = False
  record: bool = True


def _run(cfg, out_dir, resume):
  if cfg.record:
    test = ["q3", "q1"] if cfg.overlap else ["q3", "q4"]
    splits.record(out_dir, "toy_split", {"train": {"questions": ["q1", "q2"], "personas": ["p"]},
                                         "test": {"questions": test, "personas": ["p"]}})
  return {"acc": 0.5}


@pytest.fixture
def toy(monkeypatch):
  presets = {p: Cfg() for p in registry.PRESETS}
  claim = Claim("c", "holds", "1", "{acc} > 0")
  exp = registry.Experiment("toy_split", Cfg, presets, _run, paper="polar", claims=(claim,), results=("acc",),
                            shared={"personas": "the paper evaluates its personas on held-out prompts"})
  monkeypatch.setattr(registry, "experiments", lambda: {"toy_split": exp})
  monkeypatch.setattr(registry, "import_errors", lambda: {})
  return exp


def test_items_are_hashed_by_canonical_text():
  sha = hashlib.sha256(b"What is 2 + 2?").hexdigest()
  assert splits.digest("What is  2 +\n2? ") == sha
  assert splits.digest({"b": 1, "a": [2]}) == hashlib.sha256(b'{"a": [2], "b": 1}').hexdigest()
  assert splits.hashed({"test": {"q": ["x", " x", "y"]}}) == {"test": {"q": [splits.digest("x"), splits.digest("y")]}}


def test_overlaps_count_items_of_one_kind_against_train_only():
  h = splits.hashed({"train": {"q": ["a", "b", "c"], "p": ["u"]}, "test": {"q": ["b", "c", "d"], "p": ["v"]},
                     "ood": {"q": ["e"]}, "calibration": {"p": ["u"]}})
  assert sorted(splits.overlaps(h)) == [("calibration", "p", 1), ("test", "q", 2)]
  assert splits.overlaps(splits.hashed({"test": {"q": ["a"]}, "ood": {"q": ["a"]}})) == []  # no train: nothing


def test_run_writes_splits_json_with_declared_shares(toy, tmp_path):
  out, _ = registry.run_experiment("toy_split", "smoke", root=str(tmp_path))
  data = json.load(open(os.path.join(out, "splits.json")))
  assert data["train"]["questions"] == [splits.digest("q1"), splits.digest("q2")]
  assert data["test"]["questions"] == [splits.digest("q3"), splits.digest("q4")]
  assert data["shared"] == {"personas": "the paper evaluates its personas on held-out prompts"}
  assert splits.read(out) == data and splits.read(str(tmp_path)) is None


def test_undeclared_overlap_stops_the_run_before_it_writes_anything(toy, tmp_path, capsys):
  root = str(tmp_path / "runs")
  assert cli.main(["run", "toy_split", "--preset", "smoke", "--root", root, "--set", "overlap=true"]) == 2
  err = capsys.readouterr().err.strip().removesuffix("  (--debug shows the traceback)")
  assert err == ("error: toy_split: splits 'train' and 'test' share 1 of their questions (of 2 training and 2 test "
                 "items); make them disjoint or declare 'questions' shared with its reason (Experiment(shared=...))")
  assert not os.path.exists(os.path.join(root, "toy_split", "results.json"))


def test_a_papers_run_without_splits_fails(toy, tmp_path):
  with pytest.raises(registry.SplitsMissing, match="toy_split: the run wrote no splits.json"):
    registry.run_experiment("toy_split", "smoke", ["record=false"], root=str(tmp_path))


def test_shared_needs_a_reason():
  presets = {p: Cfg() for p in registry.PRESETS}
  with pytest.raises(TypeError, match="shared= maps an item kind to the reason"):
    registry.Experiment("toy", Cfg, presets, _run, shared={"questions": " "})
