"""cdka: the LoRA baseline follows CDKA's scale rule, the full preset is the reference's recipe, the reference's
MetaMathQA filter, and training and test questions are disjoint."""
import json
import math

import pytest

from experiments import cdka as cdka_exp
from experiments._shared import adapters
from experiments.cdka import run as cdka_run
from experiments.runner import splits
from jaxlab.adapters import kron, lora
from jaxlab.data import load_tokenizer


@pytest.mark.parametrize("preset", list(cdka_exp.PRESETS))
def test_lora_baseline_is_cdka_at_r1_r2_1(preset):
  cfg = cdka_exp.PRESETS[preset]
  got = lora.Config(rank=cfg.lora_rank, alpha=cfg.lora_alpha, rslora=cfg.lora_rslora).scale
  assert got == pytest.approx(cfg.cdka_alpha / math.sqrt(cfg.lora_rank * 1))  # alpha / sqrt(r r2), r2 = 1
  assert got == pytest.approx(kron.Config(r=cfg.lora_rank, r1=1, r2=1, alpha=cfg.cdka_alpha).scale)
  assert cfg.lr_lora == cfg.lr_cdka


def test_full_preset_is_the_reference_recipe():
  cfg = cdka_exp.PRESETS["full"]
  assert cfg.data == "metamath_gsm" and cfg.train_records == 100_000 and cfg.template == "Q: {q}\nA: "
  assert cfg.steps * cfg.batch_size == 100_000 and cfg.batch_size == 32  # one epoch of 100k
  assert cfg.warmup_steps == math.ceil(0.03 * cfg.steps) and cfg.lr_floor == 0.0 and cfg.weight_decay == 5e-4
  assert (cfg.cdka_r, cfg.cdka_r1, cfg.cdka_r2, cfg.cdka_alpha, cfg.lr_cdka) == (8, 2, 2, 64.0, 2e-4)
  assert cfg.setup.seq_len == 512 and cfg.setup.max_new_tokens == 512


def test_metamath_gsm_keeps_the_first_short_gsm_records(tmp_path):
  recs = [("GSM_AnsAug", "a + b", "1 + 2 = 3\n#### 3\nThe answer is: 3"),
          ("MATH_AnsAug", "x", "x = 4\nThe answer is: 4"),
          ("GSM_Rephrased", "long " * 30, "5\nThe answer is: 5"),
          ("GSM_SV", "c", "6 = 6\nThe answer is: 6"),
          ("GSM_FOBAR", "d", "7\nThe answer is: 7"),
          ("GSM_AnsAug", "e", "8\nThe answer is: 8")]
  path = tmp_path / "mm.jsonl"
  path.write_text("".join(json.dumps({"type": t, "query": q, "response": r}) + "\n" for t, q, r in recs))
  tok = load_tokenizer("byte")
  got = cdka_run.metamath_gsm(str(path), tok, 3, 64, "Q: {q}\nA: ")
  # brute force: GSM-typed, "Q: q\nA: " + " " + target under 64 bytes with bos, first 3
  want = [(f"Q: {q}\nA: ", r.split("\nThe answer is:")[0], r.rsplit(": ", 1)[1]) for t, q, r in recs
          if "GSM" in t and 1 + len(f"Q: {q}\nA:  " + r.split("\nThe answer is:")[0]) < 64][:3]
  assert [(e.prompt, e.target, e.answer) for e in got] == want
  assert [e.answer for e in got] == ["3", "6", "7"]


@pytest.mark.parametrize("preset", ["smoke", "cpu"])
def test_training_and_test_questions_are_disjoint(preset):
  setup = cdka_exp.PRESETS[preset].setup
  train, test = adapters.load_examples(setup, 0)  # what `adapters.prepare` trains and tests on
  assert splits.overlaps(splits.hashed(cdka_run.split_items(train, test))) == []
  assert not {e.prompt for e in train} & {e.prompt for e in test}
  assert splits.overlaps(splits.hashed(cdka_run.split_items(train, test + train[-2:]))) == [("test", "questions", 2)]
