"""experiments/tele_lens.py end to end on a tiny random LM with a word-level tokenizer: every results key the
claims name is written, the token layout matches the task's text, features are cached per layer; the smoke preset
on the real SmolLM2 (slow)."""
import math
import os
import re

import jax
import numpy as np
import pytest

from experiments import registry
from experiments import tele_lens as exp
from jaxlab.data.tasks import reasoning
from jaxlab.models import transformer as tfm


class WordTokenizer:
  """Each space-led word or newline is one token (ids assigned on first sight, capped by `size`)."""

  def __init__(self, size):
    self.size, self.ids = size, {}

  def encode(self, text):
    out = []
    for piece in re.findall(r"\n|\s?[^\s]+", text):
      if piece not in self.ids:
        if len(self.ids) >= self.size:
          raise ValueError("word tokenizer is full")
        self.ids[piece] = len(self.ids)
      out.append(self.ids[piece])
    return out

  def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=False):
    text = "".join(f" <{m['role']}> {m['content']}" for m in messages)
    return self.encode(text + (" <assistant>" if add_generation_prompt else ""))


CFG = exp.Config(examples=6, layers=(0, 2), uncertainty_layer=2, rank=8, alpha=8.0, learning_rate=1e-2,
                 epochs=2, batch_size=64)


def test_runs_on_a_tiny_model_and_writes_every_claimed_key(tmp_path):
  tok = WordTokenizer(400)
  mcfg = tfm.Config.tiny(vocab_size=400, n_layers=2, d_ff=64, tie_embeddings=True)
  params = tfm.init(mcfg, jax.random.key(0))
  rows = exp.build(CFG, tok)
  assert len(rows) == 3 * CFG.examples and {r["split"] for r in rows} == {"train", "test"}
  ex = reasoning.generate("cycle", CFG.examples, seed=CFG.seed)[0]
  r = next(r for r in rows if r["task"] == "cycle")
  assert r["ids"][r["cot_start"]:r["cot_end"]] == tok.encode(ex.cot) and r["ids"][-1] == tok.encode(" " + ex.answer)[0]
  res = exp.run_with_model(CFG, str(tmp_path), mcfg, params, tok, "tiny-random")
  claimed = {k for c in registry.get("tele_lens").claims for k in c.keys}
  wanted = {f"horizon.top5.layer{l}.d{d}" for l in CFG.layers for d in range(1, 9)}
  wanted |= {f"final_answer_acc.layer{l}" for l in CFG.layers} | claimed
  wanted |= {"auroc.pivot", "auroc.topk_highest", "auroc.self_certainty", "auroc.perplexity", "bypass.rate", "bypass.accuracy_change"}
  assert wanted <= set(res)
  for k in wanted - {"bypass.accuracy_change"}:
    assert math.isnan(res[k]) or 0.0 <= res[k] <= 1.0, (k, res[k])
  assert -1.0 <= res["bypass.accuracy_change"] <= 1.0
  cached = os.listdir(tmp_path / "features")
  assert len(cached) == len(CFG.layers) and all(f.startswith("tiny-random-layer") for f in cached)
  assert (tmp_path / "horizon.png").exists() and (tmp_path / "metrics.jsonl").exists()


def test_registered_with_presets_and_claims():
  e = registry.get("tele_lens")
  assert e.paper == "tele_lens" and {"smoke", "cpu", "full"} <= set(e.presets)
  assert {c.id for c in e.claims} == {"myopic", "pivot"}
  with pytest.raises(ValueError, match="uncertainty_layer must be one of layers"):
    exp.Config(layers=(1, 2), uncertainty_layer=3)
  with pytest.raises(ValueError, match="tasks must be names"):
    exp.Config(tasks=("sorting",))


@pytest.mark.slow
def test_smoke_preset_on_the_real_model(tmp_path):
  from jaxlab.models import registry as models
  try:
    models.real_model_path("smollm2-135m-instruct")
  except FileNotFoundError as e:
    pytest.skip(str(e))
  res = exp.run(exp.PRESETS["smoke"], str(tmp_path), False)
  assert 0.0 <= res["horizon.top5.layer15.d1"] <= 1.0 and res["positions"] > 0
