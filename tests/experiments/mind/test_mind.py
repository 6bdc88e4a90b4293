"""experiments/mind: RAD answers re-derived from the scene by an independent parser of the question text, each
negative differs from its positive by exactly its named flaw (and the flawed statement is false in the scene),
hints, phase-2 rows on a hand-made question, output parsing, the vocabulary extension keeping the trained
model's logits, greedy decoding against a step-by-step argmax loop, registration and claims, config errors, and
one smoke run through the CLI from a relative working directory."""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import registry
from experiments._shared import vlm_pipeline as pipe
from experiments.mind import data as D, rad
from experiments.runner import claims as claims_lib
from jaxlab.data import load_tokenizer
from jaxlab.data.tasks import scenes as S
from jaxlab.models import vlm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
registry.load_all()
EXP = registry.get("mind")
NUM = {w: i for i, w in enumerate(("zero", "one", "two", "three", "four", "five"))}
ROWS, COLS = ("top", "middle", "bottom"), ("left", "center", "right")


def oracle_answer(question: str, objs) -> str:
  """The answer from the question's words and the scene's objects (written apart from rad.py)."""
  w = question.split()
  count = lambda a: sum(a in (o.colour, o.shape) for o in objs)
  if w[:2] == ["how", "many"] and w[2] != "objects":
    return list(NUM)[count(w[2])]
  if w[:2] == ["how", "many"]:
    rel, colour, shape = w[4], w[-3], w[-2]
    ref = [o for o in objs if (o.colour, o.shape) == (colour, shape)]
    assert len(ref) == 1, question
    r = ref[0]
    side = {"left": lambda o: o.col < r.col, "right": lambda o: o.col > r.col, "above": lambda o: o.row < r.row,
            "below": lambda o: o.row > r.row}[rel]
    return list(NUM)[sum(side(o) for o in objs if o is not r)]
  assert w[:3] == ["are", "there", "more"], question
  return "yes" if count(w[3]) > count(w[6]) else "no"


def phrases(step: str):
  """(colour, shape, row, col) of every object phrase "colour shape at the row col" in a step."""
  w = step.split()
  return [(w[i], w[i + 1], w[i + 4], w[i + 5]) for i in range(len(w) - 5)
          if w[i] in S.COLOURS and w[i + 2:i + 4] == ["at", "the"]]


def scene_facts(objs):
  return {(o.colour, o.shape, ROWS[o.row], COLS[o.col]) for o in objs}


@pytest.fixture(scope="module")
def questions():
  sc = S.generate(90, seed=3)
  return sc, rad.generate(sc, seed=4, hints="train")


def test_answers_rederived_and_positives_are_true(questions):
  sc, qs = questions
  assert len(qs) == 90 and {q.kind for q in qs} == set(rad.KINDS)
  for q in qs:
    objs = sc.objects[q.scene]
    assert q.answer == oracle_answer(q.words, objs), q
    assert 1 <= len(q.positives) <= 3 and len(set(q.positives)) == len(q.positives)
    for p in q.positives:
      assert all(f in scene_facts(objs) for st in p for f in phrases(st)), p
      last = p[-1].split()
      if q.kind == "compare":
        a, b = NUM[last[0]], NUM[last[-2]]
        assert last[2] == ("more" if a > b else "less" if a < b else "equal")
        assert (a > b) == (q.answer == "yes")
      else:
        assert [w for w in last if w in NUM] == [q.answer]
  assert len({len(q.positives) for q in qs}) > 1 or all(len(q.positives) == 3 for q in qs)


def _diff(a: str, b: str):
  wa, wb = a.split(), b.split()
  return None if len(wa) != len(wb) else [(x, y) for x, y in zip(wa, wb) if x != y]


def test_each_negative_has_exactly_its_named_flaw(questions):
  sc, qs = questions
  seen = set()
  for q in qs:
    facts = scene_facts(sc.objects[q.scene])
    assert [n.flaw for n in q.negatives] == list(rad.FLAWS)
    for n in q.negatives:
      base = q.positives[n.base]
      seen.add((q.kind, n.flaw))
      if n.flaw == "skipped_step":
        assert len(n.steps) == len(base) - 1 and any(base[:j] + base[j + 1:] == n.steps for j in range(len(base)))
        continue
      changed = [j for j in range(len(base)) if base[j] != n.steps[j]]
      d = [x for j in changed for x in _diff(base[j], n.steps[j])]
      if n.flaw == "wrong_count":
        assert d and all(x in NUM or x in rad.COMPARISONS or x in ("to", "than") for pair in d for x in pair)
        assert any(x in NUM and y in NUM for x, y in d)
      elif n.flaw == "wrong_attribute":
        assert len(d) == 1 and all(x in S.COLOURS or x in S.SHAPES for x in d[0]), (base, n)
        if q.kind != "compare":
          assert [f for f in phrases(n.steps[changed[0]]) if f not in facts], n
      else:
        if q.kind == "compare":
          assert changed == [len(base) - 1] and d[0][0] in rad.COMPARISONS and d[0][1] in rad.COMPARISONS
          assert all(x in rad.COMPARISONS or x in ("to", "than") for pair in d for x in pair)
        else:
          assert len(d) == 1 and all(x in ROWS or x in COLS for x in d[0]), (base, n)
          assert [f for f in phrases(n.steps[changed[0]]) if f not in facts], n
  assert seen == {(k, f) for k in rad.KINDS for f in rad.FLAWS}


def test_compare_negatives_state_a_false_count_or_relation(questions):
  sc, qs = questions
  for q in (q for q in qs if q.kind == "compare"):
    objs = sc.objects[q.scene]
    for n in q.negatives:
      stated = [(NUM[w[2]], w[3]) if w[0] == "there" else (NUM[w[0]], w[3]) for w in map(str.split, n.steps[:-1])]
      false = [(k, a) for k, a in stated if k != sum(a in (o.colour, o.shape) for o in objs)]
      last = n.steps[-1].split()
      a, b = NUM[last[0]], NUM[last[-2]]
      bad_rel = last[2] != ("more" if a > b else "less" if a < b else "equal")
      if n.flaw in ("wrong_count", "wrong_attribute"):
        assert len(false) == 1 and not bad_rel, n
      elif n.flaw == "wrong_relation":
        assert not false and bad_rel, n


def test_hints(questions):
  _, qs = questions
  share = lambda f: np.mean([f(q) for q in qs])
  assert all(0.2 < share(f) < 0.47 for f in (lambda q: q.hint is None, lambda q: q.hint == q.answer,
                                                lambda q: q.hint is not None and q.hint != q.answer))
  assert all(q.prompt.startswith(f"hint the answer is {q.hint} . ") for q in qs if q.hint)
  assert all(q.prompt == q.words for q in qs if q.hint is None)
  mis = D.mislead(qs, 0)
  assert all(m.hint != q.answer and m.words == q.words for m, q in zip(mis, qs))


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
  tok = load_tokenizer(S.save_tokenizer(str(tmp_path_factory.mktemp("tok")), rad.vocabulary()))
  cfg = vlm.Config(vision=pipe.vision_model(16, 1), text=pipe.text_model(16, 1, 32, vocab=len(rad.vocabulary())),
                   image_token_id=3, feature_layers=(-1,))
  return D.Encoder(tok, cfg, 96)


def test_phase2_rows_on_a_hand_made_question(encoder):
  q = rad.Question(0, "count", "how many red objects are there ?", ("red",), "one",
                   (("the red objects are the red bar at the top left .", "so there are one ."),),
                   (rad.Negative(("so there are one .",), "skipped_step", 0),), hint=None)
  split = D.Split([q], np.zeros((1, 48, 48, 3), np.float32))
  arrays, kinds, scenes = encoder.phase2_rows(split)
  assert kinds.tolist() == [1, -1] and scenes.tolist() == [0, 0]
  tok = encoder.tok
  for i, (given, target) in enumerate([
      ("the red objects are the red bar at the top left . so there are one .", "answer one correct"),
      ("so there are one .", "answer one wrong fix the red objects are the red bar at the top left . so there "
       "are one .")]):
    inp, tgt, m = arrays["inputs"][i, 0], arrays["targets"][i, 0], arrays["loss_mask"][i, 0]
    prompt = f"how many red objects are there ? given {given} verdict"
    assert inp[0] == tok.bos_id and (inp[1:17] == 3).all()
    n = 17 + len(prompt.split())
    assert tok.decode(inp[17:n].tolist()) == prompt
    assert tok.decode(tgt[m > 0].tolist(), skip_special=False) == target + " <eos>"
    assert m[:n - 1].sum() == 0 and np.flatnonzero(m)[0] == n - 1
  assert D.phase2_target(False, "R", "two") == "answer two wrong fix R"


def test_phase1_batches_draw_one_trained_rationale_and_sampled_positives_and_negatives(encoder):
  sc = S.generate(6, seed=9)
  qs = rad.generate(sc, seed=1)
  split = D.Split(qs, np.random.default_rng(0).random((6, 48, 48, 3), dtype=np.float32))
  tok = encoder.tok
  k = max(len(q.positives) for q in qs)
  sampled = 2
  by_prompt = {tuple(encoder.prompt(q)): q for q in qs}
  trained = {}
  batches = encoder.phase1_sampler(split, 2, 3, sampled, negatives=True, seed=3)
  for _ in range(30):
    batch = {key: np.asarray(v) for key, v in next(batches).items()}
    assert batch["inputs"].shape[:2] == (6, 1) and batch["mca_targets"].shape[:2] == (6, sampled + sampled)
    for i in range(6):
      inp, tgt, m = batch["inputs"][i, 0], batch["targets"][i, 0], batch["loss_mask"][i, 0]
      start = np.flatnonzero(m)[0]  # every row's target starts there (MCA aligns by position)
      q = by_prompt[tuple(inp[:start + 1].tolist())]
      assert np.array_equal(batch["pixels"][i], split.pixels[q.scene])
      rationale = tok.decode(tgt[m > 0].tolist())  # the rationale alone, the reference's QCM-E target
      assert rationale in [D.text(r) for r in q.positives]
      trained.setdefault(q.prompt, set()).add(rationale)
      role, rows = batch["mca_role"][i], batch["mca_targets"][i]
      want = [1] * min(sampled, len(q.positives)) + [0] * (sampled - min(sampled, len(q.positives))) + \
          [-1] * min(sampled, len(q.negatives)) + [0] * (sampled - min(sampled, len(q.negatives)))
      assert role.tolist() == want
      ids = [row[start:].tolist() for row in rows]
      texts = [tok.decode(x[:x.index(tok.eos_id)] if tok.eos_id in x else x) for x in ids]
      pos = [t for t, r in zip(texts, role) if r == 1]
      neg = [t for t, r in zip(texts, role) if r == -1]
      assert len(set(pos)) == len(pos) and set(pos) <= {D.text(r) for r in q.positives}
      assert len(set(neg)) == len(neg) and set(neg) <= {D.text(n.steps) for n in q.negatives}
  # every positive of a question with several gets trained at some draw
  assert any(len(v) == k for v in trained.values()) and k > 1
  ce = next(encoder.phase1_sampler(split, 2, 3, sampled, negatives=False, seed=3))
  sft = next(encoder.sft_sampler(split, "rationale", 2, 3, seed=3))
  assert {key: v.shape for key, v in ce.items()} == {key: v.shape for key, v in sft.items()}


def test_a_non_finite_step_stops_training_with_its_step_and_leaf(encoder, tmp_path):
  from experiments.mind.run import Trainer
  from jaxlab.train.loop import NonFiniteError
  sc = S.generate(4, seed=2)
  qs = rad.generate(sc, seed=1)
  split = D.Split(qs, np.zeros((4, 48, 48, 3), np.float32))
  cfg = EXP.presets["smoke"]
  good = next(encoder.sft_sampler(split, "rationale", 2, 1, seed=0))
  bad = dict(good, pixels=jnp.full_like(good["pixels"], jnp.nan))
  trainer = Trainer(cfg, encoder.cfg, str(tmp_path))
  params = vlm.init(encoder.cfg, jax.random.PRNGKey(0))
  trainer.fit("ok", params, iter([good, good]), 2)  # finite steps pass
  with pytest.raises(NonFiniteError, match="sft: non-finite loss at step 2") as e:
    trainer.fit("sft", params, iter([good, bad, good]), 3)
  assert e.value.step == 2 and e.value.leaf is not None
  events = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [(r["stage"], r.get("event")) for r in events if r.get("event")] == [("sft", "non_finite")]


def test_output_parsing():
  out = "the red objects are the red bar at the top left . so there are one . answer one".split()
  assert D.final_answer(out) == "one" and D.rationale_of(out).endswith("so there are one .")
  assert D.final_answer("wrong fix answer two answer".split()) == "two"
  assert D.final_answer("so there are".split()) == ""
  assert D.verdict("answer two wrong fix x".split()) == "wrong" and D.verdict("answer one".split()) == ""
  assert D.final_answer("answer two wrong fix so there are one .".split()) == "two"


def test_vocabulary_extension_keeps_the_models_logits(tmp_path):
  words = S.vocabulary()
  tok = load_tokenizer(S.save_tokenizer(str(tmp_path / "old"), words))
  cfg = vlm.Config(vision=pipe.vision_model(16, 1), text=pipe.text_model(16, 1, 32), image_token_id=3,
                   feature_layers=(-1,))
  params = vlm.init(cfg, jax.random.PRNGKey(0))
  art = pipe.Artifacts(cfg, params, tok, {})
  new_cfg, new_params, new_tok = D.extend_vocab(art, rad.vocabulary(), str(tmp_path / "new"), 0)
  assert new_cfg.text.vocab_size % 16 == 0 and new_cfg.text.vocab_size >= len(rad.vocabulary()) > len(words)
  assert all(new_tok.encode(w) == [i] for i, w in enumerate(rad.vocabulary()))
  # the trained rows and columns are kept exactly (so the logits over the old words are the old model's); the
  # others start near the trained rows' mean
  old_e, new_e = np.asarray(params["lm"]["embed"]["embedding"]), np.asarray(new_params["lm"]["embed"]["embedding"])
  np.testing.assert_array_equal(new_e[:len(words)], old_e)
  assert np.abs(new_e[len(words):] - old_e.mean(0)).max() < 0.2
  old_h, new_h = np.asarray(params["lm"]["lm_head"]["kernel"]), np.asarray(new_params["lm"]["lm_head"]["kernel"])
  np.testing.assert_array_equal(new_h[:, :len(words)], old_h)
  assert new_h.shape == (16, new_cfg.text.vocab_size)
  want = jax.eval_shape(lambda: vlm.init(new_cfg, jax.random.PRNGKey(1)))
  assert jax.tree.map(lambda x: x.shape, new_params) == jax.tree.map(lambda x: x.shape, want)
  with pytest.raises(ValueError, match="maps 'how'") as e:
    D.extend_vocab(art, words[:5] + ["how"] + words[6:], str(tmp_path / "bad"), 0)
  assert "\n" not in str(e.value)


def test_greedy_decoding_equals_a_step_by_step_argmax(encoder):
  cfg = encoder.cfg
  params = vlm.init(cfg, jax.random.PRNGKey(2))
  sc = S.generate(2, seed=5)
  split = D.Split(rad.generate(sc, seed=2), pipe.normalize(sc.images))
  got = encoder.generate(params, split, None, 3, 3)  # a batch of 3 for 2 questions: one filler row
  length = 64  # one row at a time, right-padded (causal: the padding does not change earlier logits)
  fwd = jax.jit(lambda p, t, x: vlm.forward(p, t, x, cfg).logits[0])
  for q, words in zip(split.questions, got):
    seq = encoder.prompt(q)
    px = jnp.asarray(split.pixels[q.scene][None])
    for _ in range(3):
      buf = np.full((1, length), encoder.pad, np.int32)
      buf[0, :len(seq)] = seq
      logits = np.array(fwd(params, jnp.asarray(buf), px)[len(seq) - 1])
      logits[[cfg.image_token_id, encoder.pad]] = -np.inf
      seq = seq + [int(np.argmax(logits))]
    gen = seq[len(encoder.prompt(q)):]
    if encoder.tok.eos_id in gen:
      gen = gen[:gen.index(encoder.tok.eos_id)]
    assert words == encoder.tok.decode(gen).split()


def test_registered_with_presets_and_claims():
  assert set(EXP.presets) >= {"smoke", "cpu", "full"} and EXP.paper == "mind"
  cpu = EXP.presets["cpu"]
  assert cpu.source == "latentlens" and cpu.train == pipe.TRAIN_PRESETS["cpu"] and cpu.alpha == 1.0
  assert cpu.margin == 0.2 and cpu.top_k == 1
  by_id = {c.id: c for c in EXP.claims}
  good = {"accuracy.mind": 0.6, "accuracy.sft_rationale": 0.5, "accuracy_misleading.mind": 0.55,
          "accuracy_misleading.sft_rationale": 0.3}
  assert claims_lib.holds(by_id["accuracy"], good) and claims_lib.holds(by_id["misleading"], good)
  bad = dict(good, **{"accuracy.mind": 0.4, "accuracy_misleading.mind": 0.3})
  assert not claims_lib.holds(by_id["accuracy"], bad) and not claims_lib.holds(by_id["misleading"], bad)
  assert claims_lib.holds(by_id["accuracy"], {"accuracy.mind": 0.6}) is None


@pytest.mark.parametrize("kw,match", [({"phase1_steps": 0}, "phase1_steps must be >= 1, found 0"),
                                      ({"lr": 0.0}, "expected lr > 0"),
                                      ({"rad": {"kinds": ("count", "colour")}}, "kinds must be a non-empty subset")])
def test_bad_config_is_a_one_line_error(kw, match):
  with pytest.raises(ValueError, match=match) as e:
    if "rad" in kw:
      rad.RadConfig(**kw["rad"])
    else:
      EXP.config_cls(**kw)
  assert "\n" not in str(e.value)


def test_full_preset_paths_are_one_line_errors(tmp_path):
  with pytest.raises(ValueError, match="vlm_path must be an existing LLaVA checkpoint directory") as e:
    EXP.run(EXP.presets["full"], str(tmp_path / "run"), False)
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match="needs an existing RAD JSON-lines file, found 'REQUIRED") as e:
    D.load_jsonl("REQUIRED: --set train_path=FILE", None)
  bad = tmp_path / "rad.jsonl"
  bad.write_text(json.dumps({"image": "a.png", "question": "q"}) + "\n")
  with pytest.raises(ValueError, match="row 0: expected keys") as e:
    D.load_jsonl(str(bad), None)
  assert "\n" not in str(e.value)


@pytest.mark.slow  # ~70 CPU seconds; CI's smoke reproduce runs the same preset
def test_smoke_preset_from_the_cli_writes_every_key(tmp_path):
  env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-m", "experiments", "run", "mind", "--preset", "smoke", "--root", "runs"],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  res = json.loads((tmp_path / "runs" / "mind" / "results.json").read_text())
  keys = [f"{k}.{m}" for k in ("accuracy", "accuracy_misleading") for m in ("sft_answer", "sft_rationale", "mind")]
  keys += ["correction_rate.mind", "mca_ablation.accuracy"]
  assert not [k for k in keys if k not in res]
  assert all(0 <= res[k] <= 1 for k in keys) and res["test.questions"] == EXP.presets["smoke"].n_test_scenes
  items = json.loads((tmp_path / "runs" / "mind" / "items.json").read_text())  # per question, for the intervals
  for k in keys[:6]:
    assert len(items[k]) == res["test.questions"] and np.mean(items[k]) == pytest.approx(res[k]), k
  assert np.mean(items["accuracy.mind_no_mca"]) == pytest.approx(res["mca_ablation.accuracy"])
  samples = json.loads((tmp_path / "runs" / "mind" / "samples.json").read_text())
  assert samples and {"question", "answer", "mind", "sft_rationale"} <= set(samples[0])


def test_scene_splits_are_disjoint_from_training_and_vlm_scenes(tmp_path):
  from experiments.mind import run as run_mind
  from experiments.runner import splits
  cfg = EXP.presets["smoke"]
  train, test, mis = D.scene_splits(cfg, cfg.train.scenes)
  assert len(test.captions) == cfg.n_test_scenes and not set(train.captions) & set(test.captions)
  assert [q.words for q in mis.questions] == [q.words for q in test.questions]
  # the training draw itself as `exclude`, at the training draw's seed and size: every first-draw scene is skipped
  forced = EXP.config_cls(n_train_scenes=4, n_test_scenes=cfg.n_train_scenes, seed=0, pretrained=False)
  first = S.generate(cfg.n_train_scenes, cfg.train.scenes, seed=202)
  tr, te, _ = D.scene_splits(forced, cfg.train.scenes, first.captions)
  assert not set(te.captions) & (set(first.captions) | set(tr.captions)) and len(te.captions) == cfg.n_train_scenes
  seen = ["a red circle at the top left on a black background ."]
  data = run_mind.record_splits(str(tmp_path), train, test, mis, seen)
  assert splits.overlaps(data) == [] and set(data) == {"train", "test", "misleading", "shared"}
  assert len(data["train"]["scenes"]) == cfg.n_train_scenes + 1
  assert len(data["test"]["questions"]) == len({(test.captions[q.scene], q.words) for q in test.questions})
  with pytest.raises(splits.SplitOverlap, match="scenes"):  # a test scene the VLM trained on is refused
    run_mind.record_splits(str(tmp_path), train, test, mis, [test.captions[0]])
  assert run_mind.vlm_training_captions(cfg) == []  # the smoke VLM is random
  cpu = EXP.presets["cpu"]
  assert run_mind.vlm_training_captions(cpu) == S.generate(cpu.train.n_train_scenes, cpu.train.scenes,
                                                           seed=cpu.train.seed + 2).captions


def test_split_items_of_a_file_split_name_images_by_content(tmp_path):
  from PIL import Image
  sc = S.generate(2, seed=5)
  for i in range(2):
    Image.fromarray((sc.images[i] * 255).astype(np.uint8)).save(tmp_path / f"{i}.png")
  rows = [{"image": f"{i % 2}.png", "question": f"how many red objects {i} ?", "answer": "one",
           "positives": ["x"], "negatives": []} for i in range(3)]
  (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
  ids = D.image_ids(str(tmp_path / "t.jsonl"))
  import hashlib
  assert ids == [hashlib.sha256((tmp_path / f"{i % 2}.png").read_bytes()).hexdigest() for i in range(3)]
  split = D.Split([rad.Question(i, "file", r["question"], (), "one", (("x",),), ()) for i, r in enumerate(rows)],
                  np.zeros((3, 1, 1, 3)))
  items = D.split_items(split, ids)
  assert items["images"] == ids and items["questions"][2] == {"image": ids[0], "question": rows[2]["question"]}
