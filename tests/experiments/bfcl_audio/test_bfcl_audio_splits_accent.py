"""bfcl_audio's recorded splits (the connector's alignment requests apart from every evaluated request, single- or
multi-turn) and its accent factor (the clip is espeak-ng's speech in the accent's voice, and the factor's drop is
reported)."""
import dataclasses
import shutil

import numpy as np
import pytest

from experiments import bfcl_audio as exp
from experiments.bfcl_audio import run as run_exp
from experiments.bfcl_audio import true_audio
from experiments.runner import splits


# ---- splits ----

def test_alignment_requests_are_disjoint_from_every_evaluated_request():
  cfg = dataclasses.replace(exp.PRESETS["cpu"], multi_turn_categories=("multi_turn_base",), n_multi_turn=20)
  items, turns = run_exp.load_items(cfg.categories, cfg.n_per_category), run_exp.evaluated_turns(cfg)
  ids, heard = {it["id"] for it in items}, [it["text"] for it in items] + turns
  align = true_audio.align_items(cfg, ids, heard)
  data = run_exp.split_items(items, turns, align)
  assert len(data["train"]["questions"]) == cfg.align_clips and data["test_multi_turn"]["questions"]
  assert splits.overlaps(splits.hashed(data)) == []
  assert not {splits.canonical(t) for t in data["train"]["questions"]} & {splits.canonical(t) for t in heard}
  # holding out by id alone leaves the evaluated multi-turn openings among the alignment requests: the check fails
  by_id = run_exp.split_items(items, turns, true_audio.align_items(cfg, ids))
  assert [s for s, _, _ in splits.overlaps(splits.hashed(by_id))] == ["test_multi_turn"]
  # and holding out nothing, the evaluated single-turn requests too
  none = run_exp.split_items(items, turns, true_audio.align_items(cfg, set()))
  assert {s for s, _, _ in splits.overlaps(splits.hashed(none))} == {"test", "test_multi_turn"}


def test_smoke_records_only_evaluation_splits():
  cfg = exp.PRESETS["smoke"]  # the connector is untrained and the multi-turn suite off
  data = run_exp.split_items(run_exp.load_items(cfg.categories, cfg.n_per_category), run_exp.evaluated_turns(cfg), [])
  assert set(data) == {"test"} and len(data["test"]["questions"]) == len(cfg.categories) * cfg.n_per_category


# ---- accent ----

def test_accent_perturbations_parse():
  assert exp.parse_perturbation("accent_en-gb-scotland") == {"factor": "accent", "voice": "en-gb-scotland"}
  assert {f"accent_{v}" for v in ("en-gb", "en-gb-scotland", "en-029")} <= set(exp.PRESETS["cpu"].perturbations)
  with pytest.raises(ValueError, match="the accent must be one of"):
    exp.Config(perturbations=("accent_fr-fr",))


def _espeak():
  if shutil.which("espeak-ng") is None:
    pytest.skip("espeak-ng is not installed")


def test_accent_clip_is_the_accent_voice():
  _espeak()
  from experiments.bfcl_audio import tts
  item = {"id": "x", "text": "Find the area of a triangle with a base of 10 units.", "ground_truth": None}
  audio, meta = exp.make_clip(item, "accent_en-029", seed=0)
  ref, _ = tts.synthesize(item["text"], voice="en-029", seed=meta["seed"])
  clean, _ = exp.make_clip(item, "clean", seed=0)
  assert meta["tts"]["voice"] == "en-029" and np.array_equal(audio, ref)
  assert audio.shape != clean.shape or not np.array_equal(audio, clean)


def test_accent_drop_is_reported_as_a_factor(tmp_path):
  _espeak()
  cfg = exp.Config(suites=("text_audio",), categories=("simple",), n_per_category=2, n_perturb=2,
                   perturbations=("accent_en-gb", "accent_en-gb-scotland"))
  items = run_exp.load_items(cfg.categories, cfg.n_per_category)
  # a transcriber that hears only the en-us voice: every accent clip is heard as silence
  known = {exp.make_clip(it, "clean", seed=cfg.seed)[0].tobytes(): it["text"] for it in items}
  by_text = {it["text"]: it for it in items}
  from tests.experiments.bfcl_audio.test_bfcl_audio import ground_truth_text
  generate = lambda reqs: [ground_truth_text(by_text[r["user"]]) if r["user"] in by_text else "" for r in reqs]
  res = run_exp.run_with(cfg, str(tmp_path), generate, lambda audio: known.get(audio.tobytes(), ""))
  assert res["ast_accuracy.text_audio.clean"] == 1.0
  assert res["ast_accuracy.text_audio.accent_en-gb"] == res["ast_accuracy.text_audio.accent_en-gb-scotland"] == 0.0
  assert res["drop.accent"] == 1.0 and res["worst_factor"] == "accent"
