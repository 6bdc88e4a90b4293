"""experiments/latentlens.py, experiments/lost_in_attention.py and experiments/_shared/vlm_pipeline.py: one shared smoke
run of each (every results key, values in range, means equal to their parts), the judge and chance level
against brute force, the full presets on the smoke run's own llava directory (stub judge; captions file) and
their errors, and interventions restricted to no layer = the plain model."""
import itertools
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from experiments._shared import vlm_pipeline as pipe
from experiments import latentlens as ll
from experiments.latentlens import run as run_ll
from experiments import lost_in_attention as lia
from experiments.lost_in_attention import run as run_lia
from experiments import registry
from experiments.runner import splits
from jaxlab.data.tasks import scenes as S

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE_LAYERS = pipe.TRAIN_PRESETS["smoke"].text.n_layers
SMOKE_JUDGED = run_ll.default_judged_layers(SMOKE_LAYERS)  # the paper's judged layers the smoke LM has


@pytest.fixture(scope="module")
def ll_run(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("latentlens") / "run")
  out, res = registry.run_experiment("latentlens", "smoke", out=out)
  return out, res


@pytest.fixture(scope="module")
def lia_run(ll_run, tmp_path_factory):
  out = str(tmp_path_factory.mktemp("lia") / "run")
  return registry.run_experiment("lost_in_attention", "smoke", [f"source={ll_run[0]}"], out=out)


def test_cli_lists_the_experiments_and_the_search_bench():
  proc = subprocess.run([sys.executable, "-m", "experiments", "list"], cwd=REPO, capture_output=True, text=True,
                        env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu"), timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  for name in ("latentlens", "lost_in_attention", "search"):
    assert f"  {name} " in proc.stdout
  failed = [line.split()[0] for line in proc.stdout.splitlines() if "FAILED TO IMPORT" in line]
  assert not {"latentlens", "lost_in_attention", "bench_search"} & set(failed), proc.stdout


@pytest.mark.slow
def test_latentlens_smoke_keys_and_ranges(ll_run):
  out, res = ll_run
  n_layers = len(SMOKE_JUDGED)
  for lens in ll.LENSES:
    per_layer = [res[f"interpretable.{lens}.layer{l}"] for l in SMOKE_JUDGED]
    assert all(0 <= v <= 1 for v in per_layer)
    assert f"interpretable.{lens}.layer{SMOKE_LAYERS}" not in res
    np.testing.assert_allclose(res[f"interpretable.{lens}.mean"], np.mean(per_layer), rtol=1e-9)
    share = res["object_patch_share"]  # the overall share mixes object and background patches
    np.testing.assert_allclose(res[f"interpretable.{lens}.mean"], share * res[f"interpretable_object.{lens}.mean"]
                               + (1 - share) * res[f"interpretable_background.{lens}.mean"], atol=1e-9)
  assert 0 < res["interpretable.random.mean"] < 1
  assert res["index_layers"] == ",".join(map(str, run_ll.default_index_layers(SMOKE_LAYERS)))
  assert res["judged_layers"] == ",".join(map(str, SMOKE_JUDGED))
  saved = splits.read(out)
  assert len(saved["test"]["scenes"]) == ll.PRESETS["smoke"].n_eval_scenes and splits.overlaps(saved) == []
  assert res["visual_tokens"] == ll.PRESETS["smoke"].n_eval_scenes * 16
  assert res["index_rows"] > 0 and 0 <= res["caption_attribute_accuracy"] <= 1
  with open(os.path.join(out, "interpretable.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    np.testing.assert_allclose(res[f"interpretable_object.{lens}.mean"],
                               np.mean([res[f"interpretable_object.{lens}.layer{l}"] for l in SMOKE_JUDGED]))
    items = registry.read_items(out)[f"interpretable_object.{lens}.mean"]  # per object patch: the claim's items
    assert len(items) == round(share * res["visual_tokens"])
    np.testing.assert_allclose(np.mean(items), res[f"interpretable_object.{lens}.mean"])
    assert res[f"interpretable_specific.{lens}.mean"] <= res[f"interpretable.{lens}.mean"] + 1e-12
  table = open(os.path.join(out, "table.md")).read()
  assert table.count("\n| ") == 3 * (n_layers + 1 + 1)  # 3 tables: header, layers, mean
  ex = json.load(open(os.path.join(out, "examples.json")))
  for e in ex:
    assert len(e["latentlens"]["layer0"]) == 5
    for l in SMOKE_JUDGED:  # each neighbour's context ends with the neighbour's own token, starred
      assert [c.rsplit("*", 2)[1] for c in e["latentlens_contexts"][f"layer{l}"]] == e["latentlens"][f"layer{l}"]
  stages = {json.loads(line).get("stage") for line in open(os.path.join(out, "metrics.jsonl"))}
  assert stages == {"text_lm", "vit", "connector"}


def test_ground_truth_judge_and_shares_match_brute_force():
  sc = S.generate(3, seed=4)
  vocab = S.vocabulary()
  rng = np.random.default_rng(0)
  ids = {"a": rng.integers(0, len(vocab), size=(2, 3, 16, 5)), "b": rng.integers(0, 40, size=(2, 3, 16, 5))}
  words = {k: np.asarray(vocab, dtype=object)[v] for k, v in ids.items()}
  out = run_ll.judge_layers(words, sc.images, 4, run_ll.GroundTruthJudge(sc))
  for lens, a in ids.items():
    want = np.zeros((2, 3, 16), bool)
    for l, i, p in itertools.product(range(2), range(3), range(16)):
      j = sc.patch_object[i, p]
      truth = ({"background", list(S.BACKGROUNDS)[sc.background[i]]} if j < 0 else
               {list(S.COLOURS)[sc.patch_colour[i, p]], S.SHAPES[sc.patch_shape[i, p]]})
      want[l, i, p] = any(vocab[t] in truth for t in a[l, i, p])
    np.testing.assert_array_equal(out["verdicts"][lens], want)
    np.testing.assert_allclose(out["shares"][lens], want.mean(axis=(1, 2)))
  assert out["verdicts"]["b"].any()
  strict = run_ll.judge_layers(words, sc.images, 4, run_ll.GroundTruthJudge(sc, generic=False))["verdicts"]
  for lens, a in ids.items():
    for l, i, p in itertools.product(range(2), range(3), range(16)):
      names = {vocab[t] for t in a[l, i, p]}
      bg = sc.patch_object[i, p] < 0
      want = (list(S.BACKGROUNDS)[sc.background[i]] in names) if bg else out["verdicts"][lens][l, i, p]
      assert strict[lens][l, i, p] == want
  sel = np.array([[0, 5], [1, 2], [15, 3]])
  part = run_ll.judge_layers(words, sc.images, 4, run_ll.GroundTruthJudge(sc), patches=sel)
  np.testing.assert_array_equal(part["verdicts"]["a"], out["verdicts"]["a"][:, np.arange(3)[:, None], sel])


def _reference_full_word(sentence, token):
  """LatentLens's evaluate_interpretability.py rule, transcribed as a loop over the sentence's word spans."""
  token = token.strip()
  if not sentence or not token:
    return token
  at = sentence.lower().find(token.lower())
  if at < 0:
    return token
  spans = [(m.start(), m.end()) for m in re.finditer(r"\w+", sentence)]
  if " " not in token:
    for a, b in spans:
      if a <= at and at + len(token) <= b and (a, b) != (at, at + len(token)):
        return sentence[a:b]
  return sentence[at:at + len(token)]


@pytest.mark.parametrize("sentence,token,want", [
    ("A man rendering a scene", "ing", "rendering"), ("A RED cube", "red", "RED"), ("the cone on the table", "on",
    "cone"), ("a red cube", "blue", "blue"), ("two dogs, running", " dogs", "dogs"), ("a snow_man here", "man",
    "snow_man"), ("New York city", "york c", "York c"), ("", "x", "x")])
def test_full_word_follows_the_reference_rule(sentence, token, want):
  assert run_ll.full_word(sentence, token) == want == _reference_full_word(sentence, token)


def test_lens_words_expand_latentlens_neighbours_in_their_context():
  from jaxlab.interp import lenses
  vocab = ["<pad>", "red", "ing", "cube"]
  ids = {"latentlens": np.array([[[[2, 1]]]]), "logitlens": np.array([[[[2, 3]]]])}
  nb = lenses.Neighbors(*(np.zeros((1, 1, 1, 2), np.int32) for _ in lenses.Neighbors._fields))
  nb = nb._replace(context=np.array([[[[1, 0]]]]))
  words = run_ll.lens_words(ids, vocab, nb, ["a red cube", "a man rendering"])
  assert words["latentlens"][0, 0, 0].tolist() == ["rendering", "red"]
  assert words["logitlens"][0, 0, 0].tolist() == ["ing", "cube"]


def test_chance_matches_enumeration():
  sc = S.generate(2, seed=1)
  brute = []  # all 3-subsets of a 9-word vocabulary in which words 0 .. |truth|-1 are the patch's truth words
  for i in range(2):
    for p in range(16):
      t = len(S.truth_words(sc, i, p))
      brute.append(np.mean([any(w < t for w in c) for c in itertools.combinations(range(9), 3)]))
  np.testing.assert_allclose(run_ll.chance(sc, 9, 3), np.mean(brute), rtol=1e-12)


def test_full_presets_fail_clearly(tmp_path):
  with pytest.raises(ValueError, match="judge"):
    run_ll.run(ll.PRESETS["full"], str(tmp_path / "a"), False)
  with pytest.raises(ValueError, match="vlm_path must be an existing LLaVA checkpoint directory"):
    run_lia.run(lia.PRESETS["full"], str(tmp_path / "b"), False)
  (tmp_path / "ckpt").mkdir()
  (tmp_path / "ckpt" / "config.json").write_text("{}")
  with pytest.raises(FileNotFoundError, match=r"missing \['tokenizer.json'\]"):
    pipe.load_checkpoint(str(tmp_path / "ckpt"))


@pytest.mark.slow
def test_full_preset_on_saved_llava_with_stub_judge(ll_run, tmp_path, monkeypatch):
  from PIL import Image
  out, _ = ll_run
  img_dir = tmp_path / "images"
  img_dir.mkdir()
  sc = S.generate(3, seed=11)
  for i, im in enumerate(sc.images):
    Image.fromarray((im * 255).astype(np.uint8)).save(img_dir / f"{i}.png")
  corpus = tmp_path / "phrases.txt"
  corpus.write_text("\n".join(S.text_corpus(40, seed=2)))
  mod = tmp_path / "stub_judge_mod.py"
  mod.write_text(textwrap.dedent("""
      CALLS = []
      class Judge:
        def __call__(self, items):
          CALLS.extend(items)
          return [it.words[0] in ("red", "background") for it in items]
  """))
  monkeypatch.syspath_prepend(str(tmp_path))
  import stub_judge_mod
  cfg = ll.Config(
      vlm_path=os.path.join(out, "artifacts", "vlm"), images_path=str(img_dir), corpus_path=str(corpus),
      judge="stub_judge_mod:Judge", prompt="<image> a", image_mean=(0.5,) * 3, image_std=(0.25,) * 3,
      index_texts=40, full_patches_per_image=3, n_eval_scenes=3)
  res = run_ll.run(cfg, str(tmp_path / "full"), False)
  calls = stub_judge_mod.CALLS
  assert len(calls) == 3 * len(SMOKE_JUDGED) * 3 * 3  # lenses x layers x images x patches
  assert {c.grid for c in calls} == {4} and all(len(c.words) == 5 for c in calls)
  for lens in ll.LENSES:
    mine = [c for c in calls if c.lens == lens]
    for l in SMOKE_JUDGED:
      v = np.mean([c.words[0] in ("red", "background") for c in mine if c.layer == l])
      np.testing.assert_allclose(res[f"interpretable.{lens}.layer{l}"], v)
  assert "interpretable.random.mean" not in res
  for lens in ll.LENSES:  # per judged patch, averaged over the layers: the claims' paired items
    items = res["per_item"][f"interpretable.{lens}.mean"]
    assert len(items) == 3 * 3 and np.mean(items) == pytest.approx(res[f"interpretable.{lens}.mean"])
  saved = splits.read(str(tmp_path / "full"))
  assert len(saved["test"]["images"]) == 3 and 0 < len(saved["train"]["texts"]) <= 40


@pytest.mark.slow
def test_lost_in_attention_smoke_keys_and_ranges(lia_run):
  out, res = lia_run
  assert res["vlm"] == "reused" and not os.path.exists(os.path.join(out, "artifacts"))
  for m in lia.MODULES:
    assert 0 <= res[f"rid.{m}"] <= 2 and np.isfinite(res[f"mixig.{m}"])
    np.testing.assert_allclose(res[f"rid.{m}"], np.mean([res[f"rid.{m}.layer{l}"] for l in range(SMOKE_LAYERS)]),
                               rtol=1e-5)
    np.testing.assert_allclose(res[f"rid.{m}"], res[f"delta_s.{m}"] + res[f"delta_d.{m}"], rtol=1e-5)
  for name in ("none",) + lia.INTERVENTIONS:
    assert 0 <= res[f"accuracy.{name}"] <= 1
  for name in lia.INTERVENTIONS:
    assert all(0 <= res[f"accuracy.{name}.layer{l}"] <= 1 for l in range(SMOKE_LAYERS))
  for png in ("geometry_per_layer.png", "accuracy_per_layer.png"):
    assert os.path.getsize(os.path.join(out, png)) > 1000


@pytest.mark.slow
def test_interventions_in_no_layer_leave_accuracy_unchanged(ll_run):
  import jax
  art = pipe.load_artifacts(ll_run[0])
  cfg = lia.PRESETS["smoke"]
  batch = run_lia._scene_data(cfg, art)
  base = run_lia.accuracy(art, batch, 8)
  vocab = pipe.token_strings(art.tokenizer, art.cfg.text.vocab_size)
  assert base == pipe.attribute_accuracy(art.params, art.cfg, batch, vocab)[0]
  for name in lia.INTERVENTIONS:
    iv, lm = run_lia._intervene(name, art, jax.random.PRNGKey(0), [], None)
    assert run_lia.accuracy(art, batch, 8, intervention=iv, lm_params=lm) == base, name


@pytest.mark.slow
def test_lost_in_attention_full_preset_reads_a_checkpoint_and_captions(ll_run, tmp_path):
  from PIL import Image
  sc = S.generate(2, seed=3)
  rows = []
  for i, im in enumerate(sc.images):
    Image.fromarray((im * 255).astype(np.uint8)).save(tmp_path / f"{i}.png")
    rows.append(json.dumps({"image": f"{i}.png", "caption": sc.captions[i]}))
  (tmp_path / "c.jsonl").write_text("\n".join(rows))
  cfg = lia.Config(vlm_path=os.path.join(ll_run[0], "artifacts", "vlm"), captions_path=str(tmp_path / "c.jsonl"),
                   prompt="<image>", per_layer=False, n_eval_scenes=2, eval_batch=2)
  art, origin = run_lia._trained(cfg, str(tmp_path / "out"), False)
  assert origin == "checkpoint" and art.cfg.tokens_per_image == 16
  batch = run_lia._full_data(cfg, art)
  assert batch["score_mask"].sum() == sum(len(c.split()) + 1 for c in sc.captions)  # caption words + <eos>
  tgt = batch["targets"][batch["score_mask"] > 0]
  assert list(tgt[:len(sc.captions[0].split())]) == art.tokenizer.encode(sc.captions[0])
  np.testing.assert_allclose(batch["pixels"][0], (sc.images[0] - np.asarray(lia.IMAGE_MEAN)) /
                             np.asarray(lia.IMAGE_STD), atol=3 / 255 / 0.26)  # 8-bit PNG round trip
  (tmp_path / "bad.jsonl").write_text(json.dumps({"image": "missing.png", "caption": "a"}))
  with pytest.raises(FileNotFoundError, match="missing.png"):
    run_lia._full_data(lia.Config(**{**cfg.__dict__, "captions_path": str(tmp_path / "bad.jsonl")}), art)
  (tmp_path / "bad2.jsonl").write_text(json.dumps({"img": "0.png"}))
  with pytest.raises(ValueError, match="expected keys image and caption"):
    run_lia._full_data(lia.Config(**{**cfg.__dict__, "captions_path": str(tmp_path / "bad2.jsonl")}), art)


@pytest.mark.slow
def test_lost_in_attention_trains_when_no_source(ll_run, tmp_path, monkeypatch):
  seen = []

  def fake_train(train_cfg, out_dir, resume):
    seen.append((train_cfg, out_dir, resume))
    return pipe.load_artifacts(ll_run[0])
  monkeypatch.setattr(pipe, "train_vlm", fake_train)
  cfg = lia.Config(source=str(tmp_path / "empty"))  # holds no artifacts
  art, origin = run_lia._trained(cfg, str(tmp_path), False)
  assert origin == "trained" and seen == [(cfg.train, str(tmp_path), False)]
  assert art.cfg.tokens_per_image == 16
  art2, origin2 = run_lia._trained(lia.Config(source=ll_run[0]), str(tmp_path / "x"), False)
  assert origin2 == "reused" and len(seen) == 1


@pytest.mark.slow
def test_lost_in_attention_reuses_only_a_vlm_trained_with_its_train_config(ll_run, tmp_path, monkeypatch):
  """A bare `source` is looked up beside the run; reproduce's seed siblings count; another config is retrained."""
  import dataclasses
  import shutil
  root = tmp_path / "runs"
  shutil.copytree(os.path.join(ll_run[0], "artifacts", "vlm"), root / "latentlens" / "artifacts" / "vlm")
  seed1 = dataclasses.replace(pipe.TRAIN_PRESETS["smoke"], seed=1)
  shutil.copytree(root / "latentlens", root / "latentlens.seed1")
  with open(root / "latentlens.seed1" / "artifacts" / "vlm" / "train.json", "w") as f:
    json.dump(json.loads(json.dumps(dataclasses.asdict(seed1))), f)
  trained = []
  monkeypatch.setattr(pipe, "train_vlm", lambda c, o, r: trained.append(c.seed) or pipe.load_artifacts(ll_run[0]))
  out = str(root / "lost_in_attention")
  assert run_lia._trained(lia.Config(source="latentlens"), out, False)[1] == "reused"
  assert pipe.source_dirs("latentlens", out) == [str(root / "latentlens"), str(root / "latentlens.seed1")]
  assert run_lia._trained(lia.Config(source="latentlens", train=seed1), out, False)[1] == "reused"
  assert trained == []
  seed2 = dataclasses.replace(seed1, seed=2)
  assert run_lia._trained(lia.Config(source="latentlens", train=seed2), out, False)[1] == "trained"
  os.remove(root / "latentlens" / "artifacts" / "vlm" / "train.json")  # a VLM that did not record its config
  assert run_lia._trained(lia.Config(source=str(root / "latentlens")), out, False)[1] == "trained"
  assert trained == [2, 0]


def _ulp(a, seed=0):
  """`a` with every element moved by about one float32 ulp (relative 2^-23, random sign)."""
  sign = np.random.default_rng(seed).choice([-1.0, 1.0], size=np.shape(a)).astype(np.float32)
  return (np.asarray(a, np.float32) * (1 + np.float32(2 ** -23) * sign)).astype(np.float32)


@pytest.mark.slow
def test_evaluation_stages_ignore_last_bit_perturbations(ll_run):
  """The lenses + judge and the update geometry turn 1-ulp changes of their inputs into (almost) no change of
  verdicts or RID: what another machine's rounding changes in these figures comes from training."""
  import jax.numpy as jnp
  from jaxlab.interp import lenses
  from experiments.lost_in_attention import geometry
  out, _ = ll_run
  art = pipe.load_artifacts(out)
  cfg = ll.PRESETS["smoke"]
  scenes, pixels, prompt, _, judge = run_ll._scene_inputs(cfg, art, {})
  vocab = pipe.token_strings(art.tokenizer, art.cfg.text.vocab_size)
  index = lenses.LatentIndex.load(os.path.join(out, "artifacts", "index"))
  hs = run_ll.visual_states(art.params, art.cfg, prompt, pixels, cfg.eval_batch)[:, :, -art.cfg.vision.n_patches:]
  words = lambda ids: {k: np.asarray(vocab, dtype=object)[v] for k, v in ids.items()}
  verdicts = [run_ll.judge_layers(words(run_ll.lens_ids(art.params["lm"], art.cfg.text, h, index, cfg.top_k)[0]),
                                  scenes.images, art.cfg.vision.grid, judge)["verdicts"] for h in (hs, _ulp(hs))]
  for lens in ll.LENSES:
    assert np.mean(verdicts[0][lens] != verdicts[1][lens]) <= 0.01, lens

  batch = run_lia._scene_data(lia.PRESETS["smoke"], art)
  n = int((batch["inputs"] != art.tokenizer.pad_id).sum(1).min())
  lm = _captured(art, batch, n)
  base = geometry.metrics_from_output(lm)
  moved = geometry.module_metrics(*(jnp.asarray(_ulp(a)) for a in (lm.hidden_states[:-1], lm.attn_updates,
                                                                      lm.mlp_updates)))
  for m in lia.MODULES:
    np.testing.assert_allclose(np.asarray(moved[m]["rid"]), np.asarray(base[m]["rid"]), atol=1e-4)


def _captured(art, batch, n):
  """The LM's hidden states and attention / MLP updates over the first n positions."""
  import jax.numpy as jnp
  from jaxlab.models import vlm
  return vlm.forward(art.params, jnp.asarray(batch["inputs"][:, :n]), jnp.asarray(batch["pixels"]), art.cfg,
                     capture=("hidden_states", "attn_updates", "mlp_updates")).lm
