"""experiments/tele_lens.py end to end on a tiny random LM with a word-level tokenizer: every results key the
claims name is written, the token layout matches the task's text, features are cached per layer; the model's own
CoTs (batched, padded generation) equal a token-by-token greedy decode without a cache; the smoke preset on the
real SmolLM2 (slow)."""
import dataclasses
import itertools
import json
import math
import os
import re

import jax
import numpy as np
import pytest

from experiments import registry
from experiments import tele_lens as exp
from experiments.tele_lens import run as run_exp
from jaxlab.data.tasks import reasoning
from jaxlab.models import transformer as tfm


class WordTokenizer:
  """Each space-led word or newline is one token (ids assigned on first sight, capped by `size`); 0 pads, 1 ends."""
  eos_id = batch_pad_id = 1

  def __init__(self, size):
    self.size, self.ids = size, {"<pad>": 0, "<eos>": 1}

  def decode(self, ids):
    words = {i: w for w, i in self.ids.items()}
    return "".join(words.get(i, f" w{i}") for i in ids)

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


CFG = exp.Config(tasks=("parity", "cycle", "subsum"), examples=6, cot="template", layers=(0, 2), uncertainty_layer=2,
                 rank=8, alpha=8.0, learning_rate=1e-2, epochs=2, batch_size=64)


def test_runs_on_a_tiny_model_and_writes_every_claimed_key(tmp_path):
  tok = WordTokenizer(400)
  mcfg = tfm.Config.tiny(vocab_size=400, n_layers=2, d_ff=64, tie_embeddings=True)
  params = tfm.init(mcfg, jax.random.key(0))
  rows = run_exp.build(CFG, tok, run_exp.questions(CFG))
  assert len(rows) == 3 * CFG.examples and {r["split"] for r in rows} == {"train", "test"}
  ex = reasoning.generate("cycle", CFG.examples, seed=CFG.seed)[0]
  r = next(r for r in rows if r["task"] == "cycle")
  assert r["ids"][r["cot_start"]:r["cot_end"]] == tok.encode(ex.cot) and r["ids"][-1] == tok.encode(" " + ex.answer)[0]
  res = run_exp.run_with_model(CFG, str(tmp_path), mcfg, params, tok, "tiny-random")
  claimed = {k for c in registry.get("tele_lens").claims for k in c.keys}
  wanted = {f"horizon.top5.layer{l}.d{d}" for l in CFG.layers for d in range(1, 9)}
  wanted |= {f"final_answer_acc.layer{l}" for l in CFG.layers} | claimed
  wanted |= {"auroc.pivot", "auroc.topk_highest", "auroc.self_certainty", "auroc.perplexity", "bypass.rate",
             "bypass.accuracy_change"}
  assert wanted <= set(res)
  for k in wanted - {"bypass.accuracy_change"}:
    assert math.isnan(res[k]) or 0.0 <= res[k] <= 1.0, (k, res[k])
  assert -1.0 <= res["bypass.accuracy_change"] <= 1.0
  cached = os.listdir(tmp_path / "features")
  assert len(cached) == len(CFG.layers) and all(f.startswith("tiny-random-layer") for f in cached)
  assert (tmp_path / "horizon.png").exists() and (tmp_path / "metrics.jsonl").exists()
  # the top-k-highest baseline is probe-free: other probes, the same AUROC; the pivot reads the probe
  other = run_exp.run_with_model(dataclasses.replace(CFG, learning_rate=3e-2, probe_activation="silu"),
                                 str(tmp_path / "other"), mcfg, params, tok, "tiny-random")
  assert other["auroc.topk_highest"] == res["auroc.topk_highest"] or math.isnan(res["auroc.topk_highest"])


def test_lm_readout_entropy_and_the_probe_free_baseline_against_numpy():
  mcfg = tfm.Config.tiny(vocab_size=50, n_layers=2, d_ff=64, init_std=0.2)
  params = tfm.init(mcfg, jax.random.key(1))
  tokens = np.random.default_rng(0).integers(0, 50, (2, 12)).astype(np.int32)
  mask = np.ones_like(tokens)
  mask[1, 9:] = 0
  sc, nxt, ans, ent = (np.asarray(x, np.float64) for x in run_exp.readout_fn(mcfg, (3, 5))(params, tokens, mask))
  logits = np.asarray(tfm.forward(params, tokens, mcfg, attention_mask_BT=mask).logits, np.float64)
  logp = logits - logits.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  np.testing.assert_allclose(ent, -(np.exp(logp) * logp).sum(-1), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(ans, logits[..., [3, 5]], rtol=1e-4, atol=1e-5)
  cfg = exp.Config()
  pc = run_exp.probe_config(cfg, mcfg)
  assert (pc.activation, pc.schedule, cfg.uncertainty_layer) == ("gelu", "linear", 22)


def _greedy_without_cache(params, mcfg, ids, n, stops):
  ids = list(ids)
  for _ in range(n):
    nxt = int(np.argmax(tfm.forward(params, np.asarray([ids], np.int32), mcfg).logits[0, -1]))
    if nxt in stops:
      break
    ids.append(nxt)
  return ids


def test_model_cots_equal_an_uncached_greedy_decode_and_feed_the_probes(tmp_path):
  tok = WordTokenizer(1000)
  mcfg = tfm.Config.tiny(vocab_size=1000, n_layers=2, d_ff=64, tie_embeddings=True)
  params = tfm.init(mcfg, jax.random.key(0))
  cfg = dataclasses.replace(CFG, tasks=("parity", "syllogism"), cot="model", sampled_cots=1, max_cot_tokens=5,
                            generate_batch=4)
  res = run_exp.run_with_model(cfg, str(tmp_path), mcfg, params, tok, "tiny-random")
  cots = json.loads((tmp_path / "cots.json").read_text())
  exs = run_exp.questions(cfg)
  assert len(cots) == len(exs) == 12 and all([c["kind"] for c in q] == ["greedy", "sampled"] for q in cots)
  for q in (0, 5, 11):  # first batch, a middle one, the padded last one
    prompt = run_exp.prompt_ids(tok, exs[q])
    want = _greedy_without_cache(params, mcfg, prompt, cfg.max_cot_tokens, {tok.eos_id})
    assert cots[q][0]["text"] == tok.decode(want[len(prompt):])
  assert any(c[0]["text"] != c[1]["text"] for c in cots)  # sampling at temperature 0.7 differs somewhere
  rows = run_exp.build(cfg, tok, run_exp.questions(cfg), cots)
  assert {r["kind"] for r in rows} <= {"greedy", "sampled"} and res["positions"] > len(rows)
  r = rows[0]
  assert r["ids"][r["cot_start"]:r["cot_end"]] == tok.encode(next(c for c in cots[r["question"]])["cot"])
  assert 0.0 <= res["horizon.top5.layer2.d1"] <= 1.0
  assert math.isnan(res["auroc.pivot"]) or 0 <= res["auroc.pivot"] <= 1
  assert res["full_vocab.layer"] == 2 and 0 < res["full_vocab.positions"] and 0 <= res["full_vocab.top5.d1"] <= 1
  res2 = run_exp.run_with_model(cfg, str(tmp_path), mcfg, params, tok, "tiny-random")  # CoTs and features cached
  assert res2["horizon.top5.layer2.d1"] == res["horizon.top5.layer2.d1"]


def test_a_task_file_replaces_the_generated_tasks(tmp_path):
  path = tmp_path / "tasks.jsonl"
  rows = [{"task": t, "question": f"{t} question {i}?", "answer": a, "cot": f"step one of {i}\nstep two"}
          for t, answers in (("logic", ("true", "false")), ("count", ("three", "four", "five")))
          for i, a in zip(range(6), itertools.cycle(answers))]
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  cfg = dataclasses.replace(CFG, task_file=str(path), examples=4)
  exs = run_exp.questions(cfg)
  assert [(e.task, e.answer) for e in exs] == [(r["task"], r["answer"]) for r in rows if int(r["question"][-2]) < 4]
  assert run_exp.answer_words(exs) == {"logic": ("false", "true"), "count": ("five", "four", "three")}
  assert run_exp.splits(exs) == ["train"] * 2 + ["test"] * 2 + ["train"] * 2 + ["test"] * 2
  tok = WordTokenizer(400)
  built = run_exp.build(cfg, tok, exs)
  assert built[0]["ids"][built[0]["cot_start"]:built[0]["cot_end"]] == tok.encode("step one of 0\nstep two")
  path.write_text(json.dumps({"question": "q"}) + "\n")
  with pytest.raises(ValueError, match=r"tasks.jsonl:1: expected string fields \['answer', 'cot'\]"):
    run_exp.questions(cfg)
  with pytest.raises(FileNotFoundError, match="task_file .* does not exist"):
    run_exp.run(dataclasses.replace(cfg, task_file=str(tmp_path / "none.jsonl")), str(tmp_path), False)


def test_split_cot_cuts_where_the_answer_is_stated():
  answers = ("Yes", "No")
  assert run_exp.split_cot("Both premises hold.\n**Final Answer:** no", answers) == ("Both premises hold.", "No")
  assert run_exp.split_cot("So the answer is yes.", answers) == ("So", "Yes")
  assert run_exp.split_cot("To find the answer, we count.", answers) == ("To find the answer, we count.", None)
  assert run_exp.split_cot("Answer: maybe", answers) == ("", None)


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
  res = run_exp.run(exp.PRESETS["smoke"], str(tmp_path), False)
  assert 0.0 <= res["horizon.top5.layer15.d1"] <= 1.0 and res["positions"] > 0


def test_splits_keep_a_repeated_question_on_its_first_side(tmp_path):
  ex = lambda task, q: reasoning.Example(task, q, (), "yes", ())
  exs = [ex("a", "q1"), ex("a", "q2"), ex("a", "q1"), ex("a", "q3"), ex("a", "q4"), ex("a", "q2"), ex("b", "q1"),
         ex("b", "q5")]
  # task a: distinct q1..q4, the first two train; the repeats of q1 and q2 follow them; task b: q1 trains
  assert run_exp.splits(exs) == ["train", "train", "train", "test", "test", "train", "train", "test"]
  from experiments.runner import splits
  data = run_exp.record_splits(str(tmp_path), exs[:6])
  assert splits.overlaps(data) == [] and len(data["train"]["questions"]) == 2 == len(data["test"]["questions"])
  for preset in ("smoke", "cpu"):  # the generated questions: no test question is a training one
    qs = run_exp.questions(exp.PRESETS[preset])
    where = run_exp.splits(qs)
    train = {(e.task, e.prompt) for e, w in zip(qs, where) if w == "train"}
    test = {(e.task, e.prompt) for e, w in zip(qs, where) if w == "test"}
    assert train and test and not train & test
  with pytest.raises(splits.SplitOverlap):  # what record refuses when a test question is also a training one
    splits.check(splits.hashed({"train": {"questions": ["q1"]}, "test": {"questions": ["q1"]}}), {})


def test_bypass_uses_the_papers_log20_normalisation_and_first_five_tokens():
  cfg = exp.Config()
  assert (cfg.entropy_norm, cfg.bypass_window, cfg.bypass_threshold) == (20.0, 5, 0.1)
  cut = 0.1 * math.log(20)  # entropy (nats) below which a position is confident
  assert run_exp.bypass_at(cfg, [1.0, 1.0, 1.0, 1.0, cut * 0.99, 0.0]) == 4
  assert run_exp.bypass_at(cfg, [1.0, 1.0, 1.0, 1.0, cut * 1.01, 0.0]) is None  # the 6th position is too late
  assert run_exp.bypass_at(cfg, [1.0, cut * 0.5, 0.0]) == 1
  assert run_exp.bypass_at(dataclasses.replace(cfg, bypass_window=4), [1.0] * 4 + [0.0]) is None
  assert run_exp.bypass_at(dataclasses.replace(cfg, entropy_norm=2.0), [0.1 * math.log(2) * 0.99]) == 0
  assert run_exp.bypass_at(cfg, [0.1 * math.log(2) * 1.5]) == 0  # confident on the log 20 scale, not on log 2
