"""experiments/stllm: every generated answer re-derived from the room by an independent function of the question
text, token rows (loss on the answer only, the aligner's question queries), the composed loss of each model
sharded over 8 devices equal to one device, scores against hand counts, registration and claims, one-line
config and path errors (exit code 2 from the CLI), and one smoke run through the CLI from a relative working
directory."""
import json
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments import registry
from experiments.runner import claims as claims_lib
from experiments.stllm import data as D, full, model as M, rea
from jaxlab import sharding
from jaxlab.data import load_tokenizer
from jaxlab.data.tasks import scenes as S
from experiments.stllm import rooms as R
from jaxlab.models import transformer as tfm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
registry.load_all()
EXP = registry.get("stllm")
from experiments.stllm import run as ST  # noqa: E402
SMOKE = EXP.presets["smoke"]


def side_of(pose, xy) -> str:
  """The side of xy from pose by the angle (degrees) in the agent's frame: |angle| <= 45 front, >= 135 back."""
  ang = math.degrees(math.atan2(xy[1] - pose[1], xy[0] - pose[0]) - pose[2])
  ang = (ang + 180) % 360 - 180
  if abs(ang) <= 45:
    return "front"
  if abs(ang) >= 135:
    return "back"
  return "left" if ang > 0 else "right"


def oracle(q: rea.Question, room: R.Room) -> str:
  """The answer from the question's words and the room (written apart from rea.py)."""
  w = q.question.split()
  end = room.poses[-1]
  furn = {f.name: f.centre for f in room.furniture}
  objs = {o.name: o.centre for o in room.objects}
  dist = lambda n: math.dist(furn[n][:2], end[:2])
  if w[:2] == ["where", "is"] and w[4] == "from":
    return side_of(end, objs[w[3]])
  if w[0] == "which":
    a, b = w[9], w[12]
    return a if dist(a) < dist(b) else b
  if w[:2] == ["where", "is"]:
    assert w[3] == room.item
    return {"pick": "in its hand", "use": f"on the {room.source}", "move": f"on the {room.target}"}[room.action]
  if w[0] == "should":
    a, b = w[8], w[11]
    return f"bring the {w[5]} to the {a if dist(a) < dist(b) else b}"
  assert w[:4] == ["how", "does", "the", "agent"], q.question
  s = side_of(end, furn[w[7]])
  return {"front": "walk ahead to", "left": "turn left and walk to", "right": "turn right and walk to",
          "back": "turn around and walk to"}[s] + f" the {w[7]}"


@pytest.fixture(scope="module")
def data():
  return rea.generate(40, SMOKE.room, seed=3)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  return load_tokenizer(S.save_tokenizer(str(tmp_path_factory.mktemp("tok")), rea.vocabulary()))


def text_cfg(tok, d=32):
  return tfm.Config(vocab_size=64, d_model=d, n_layers=1, n_heads=4, d_ff=2 * d, max_position_embeddings=160,
                    bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)


def test_every_answer_rederived_from_the_room(data):
  assert len(data.questions) == 5 * 40 and {q.task for q in data.questions} == set(rea.TASKS)
  for q in data.questions:
    assert oracle(q, data.rooms[q.room]) == q.answer, q
  # no near-ties in the distance questions, and every answer class occurs
  ans = {t: {q.answer.split()[0] for q in data.questions if q.task == t} for t in rea.TASKS}
  assert ans["relative_direction"] == set(rea.DIRECTIONS) and {"in", "on"} == ans["find_my_item"]
  for q in data.questions:
    if q.task == "relative_distance":
      end, furn = data.rooms[q.room].poses[-1], {f.name: f.centre for f in data.rooms[q.room].furniture}
      w = q.question.split()
      gap = abs(math.dist(furn[w[9]][:2], end[:2]) - math.dist(furn[w[12]][:2], end[:2]))
      assert gap >= rea.MIN_GAP or len(furn) == 2
  assert set(rea.vocabulary()) >= {w for q in data.questions for w in (q.question + " " + q.answer).split()}


def test_rows_put_the_loss_on_the_answer_and_the_queries_on_the_question(data, tok):
  cfg = ST.model_config(SMOKE, "stllm_3d", text_cfg(tok), tok.encode("<image>")[0], tok.encode(rea.POINTS)[0])
  rows = D.Rows(tok, cfg, ST.point_features(data, 4.0), 8)
  b = rows.train_batch([0, 7])
  for r, i in enumerate([0, 7]):
    q = data.questions[i]
    toks = np.asarray(b["tokens"][r])
    assert (toks == cfg.video_id).sum() == cfg.video.n_tokens and (toks == cfg.points_id).sum() == cfg.points.n_tokens
    target = np.asarray(b["targets"][r])[np.asarray(b["loss_mask"][r]) > 0]
    assert target.tolist() == tok.encode(q.answer) + [tok.eos_id]
    assert tok.decode(toks[np.asarray(b["question_mask"][r])].tolist()).split() == q.question.split()
  assert b["rgb"].shape[-1] == 6 and b["frames"].shape[1:] == (SMOKE.room.n_frames, 16, 16, 3)


@pytest.mark.parametrize("kind", ["stllm_3d", "stllm_aligner"])  # together they run every part of the four
def test_composed_loss_sharded_equals_single_device(kind, data, tok):
  cfg = ST.model_config(SMOKE, kind, text_cfg(tok), tok.encode("<image>")[0], tok.encode(rea.POINTS)[0])
  params = M.init(cfg, jax.random.PRNGKey(1))
  batch = D.Rows(tok, cfg, ST.point_features(data, 4.0), 8).train_batch(list(range(8)))
  fn = jax.jit(lambda p, b: M.loss_fn(cfg)(p, b, None)[:2])
  single, n1 = fn(params, batch)
  mesh = sharding.make_mesh("fsdp:4,tensor:2")
  sp = sharding.shard_params(params, mesh, "fsdp_tp", axes=M.AXES)
  lm_up = sp["lm"]["layers"]["mlp"]["up"]["kernel"]
  assert lm_up.addressable_shards[0].data.size < lm_up.size
  multi, n8 = fn(sp, sharding.shard_batch(batch, mesh))
  assert float(n8) == float(n1) == float(np.asarray(batch["loss_mask"]).sum())
  np.testing.assert_allclose(float(multi), float(single), rtol=2e-5)


def test_aligner_video_queries_carry_each_patch_ray_by_brute_force(data, tok):
  """Each video token's ray term: its patch's pixel rays (relative to the first camera, then times its world
  rotation, as the reference), averaged, [d, sin(d 2^l), cos(d 2^l)], through the linear map; frame-major."""
  cfg = ST.model_config(SMOKE, "stllm_aligner", text_cfg(tok), 3, 5)
  assert cfg.video_ray_freqs == SMOKE.ray_freqs == 4
  p = M.init(cfg, jax.random.PRNGKey(2))["aligner"]["video_rays"]["ray_proj"]
  got = np.asarray(M.video_rays({"ray_proj": p}, data.c2w[:2], data.k[:2], cfg))
  size, patch = SMOKE.room.image_size, SMOKE.patch
  g, n_f = size // patch, SMOKE.room.n_frames
  assert got.shape == (2, n_f * g * g, cfg.video.width)
  for b in range(2):
    c2w, k = data.c2w[b].astype(np.float64), data.k[b].astype(np.float64)
    for f in range(n_f):
      rel = np.linalg.inv(c2w[0]) @ c2w[f]
      for i in range(g):
        for j in range(g):
          d = np.zeros(3)
          for y in range(i * patch, (i + 1) * patch):
            for x in range(j * patch, (j + 1) * patch):
              ray = rel[:3, :3] @ [(x + 0.5 - k[0, 2]) / k[0, 0], (y + 0.5 - k[1, 2]) / k[1, 1], 1.0]
              d += (ray / np.linalg.norm(ray)) @ c2w[0][:3, :3] / patch ** 2
          df = (d[:, None] * 2.0 ** np.arange(4)).reshape(-1)
          want = np.concatenate([d, np.sin(df), np.cos(df)]) @ np.asarray(p["kernel"]) + np.asarray(p["bias"])
          np.testing.assert_allclose(got[b, f * g * g + i * g + j], want, atol=2e-5)
  rows = D.Rows(tok, cfg, ST.point_features(data, 4.0), 8)
  batch = rows.train_batch([0, 1])
  np.testing.assert_array_equal(batch["intrinsics"], data.k[[data.questions[0].room, data.questions[1].room]])
  params = M.init(cfg, jax.random.PRNGKey(1))
  moved = {**batch, "intrinsics": batch["intrinsics"] * np.array([2.0, 2.0, 1.0])[:, None]}
  assert not np.allclose(M.forward(params, batch, cfg), M.forward(params, moved, cfg))
  with pytest.raises(ValueError, match="video_ray_freqs .* encodes the aligner's video queries only"):
    M.ModelConfig("stllm_3d", cfg.text, cfg.video, cfg.points, cfg.aligner, video_ray_freqs=4)


def test_every_model_parameter_has_axis_names(tok):
  for kind in M.MODELS:
    cfg = ST.model_config(SMOKE, kind, text_cfg(tok), 3, 5)
    shapes = jax.eval_shape(lambda cfg=cfg: M.init(cfg, jax.random.PRNGKey(0)))
    sharding.param_specs(shapes, "fsdp_tp", axes=M.AXES)  # raises on a parameter without logical names
    assert set(shapes) == set(M.GROUPS[kind])  # the groups `trainable` names are the ones init builds


def test_frozen_groups_stay_bit_identical_and_trained_ones_move(data, tok, tmp_path):
  import dataclasses
  cfg = dataclasses.replace(SMOKE, trainable=("video", "points", "aligner"))
  mcfg = ST.model_config(cfg, "stllm_aligner", text_cfg(tok), tok.encode("<image>")[0], tok.encode(rea.POINTS)[0])
  start = M.init(mcfg, jax.random.PRNGKey(1))
  frozen = ST.frozen_groups(start, M.trained_groups("stllm_aligner", cfg.trainable))
  assert frozen == ("lm",)
  rows = D.Rows(tok, mcfg, ST.point_features(data, 4.0), 8)
  host = jax.tree.map(np.array, start)
  end = ST._fit("t", M.loss_fn(mcfg), start, rows.sampler(4, 0), 3, 1e-2, 1, 1, str(tmp_path), 0, frozen=frozen)
  same = lambda a, b: all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  assert same(end["lm"], host["lm"])
  for g in ("video", "aligner"):
    moved = [not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(end[g]), jax.tree.leaves(host[g]))]
    assert np.mean(moved) > 0.9, g
  # the frozen LM keeps no optimizer state: Adam's two moments cover the trained groups only
  count = lambda tree: sum(int(np.size(x)) for x in jax.tree.leaves(tree))
  opt = ST._optimizer(1e-2, 3, 1, frozen)[1].init(start)
  trained = count({g: start[g] for g in ("video", "aligner")})
  assert 2 * trained <= count(opt) <= 2 * trained + 8


def test_trainable_names_are_checked_against_the_model_groups():
  with pytest.raises(ValueError, match=r"trained groups \('points',\) are not among the model's param groups "
                                       r"\('lm', 'video'\)") as e:
    ST.frozen_groups({"lm": 0, "video": 0}, ("points",))
  assert "\n" not in str(e.value)
  assert M.trained_groups("points_only", None) == ("lm", "points")
  assert M.trained_groups("points_only", ("lm", "video")) == ("lm",)


def test_full_preset_freezes_the_lm_as_the_reference():
  full_cfg = EXP.presets["full"]
  assert full_cfg.lr == 1e-4 and EXP.presets["cpu"].trainable is None
  assert {k: M.trained_groups(k, full_cfg.trainable) for k in M.MODELS} == {
      "video_only": ("video",), "points_only": ("points",), "stllm_3d": ("video", "points"),
      "stllm_aligner": ("video", "aligner")}
  from experiments.runner import overrides
  assert overrides.apply_overrides(SMOKE, ["trainable=video,aligner,points"]).trainable == ("video", "aligner", "points")
  with pytest.raises(overrides.OverrideError, match="trainable must name param groups among"):
    overrides.apply_overrides(SMOKE, ["trainable=llm"])


def test_scores_by_hand():
  qs = [rea.Question(0, "relative_direction", "q", "left"), rea.Question(0, "relative_direction", "q", "back"),
        rea.Question(0, "find_my_item", "q", "on the desk"), rea.Question(0, "find_my_item", "q", "in its hand")]
  res = ST.scores(["left", "front", "on the desk", "on the table"], qs, "m")
  assert res["accuracy.relative_direction.m"] == 0.5 and res["accuracy.find_my_item.m"] == 0.5
  assert res["mean.m"] == 0.5 and res["mean_both.m"] == 0.5
  assert res["rouge_l.find_my_item.m"] == pytest.approx((1 + 0) / 2)
  # BLEU-2 would be nonzero; BLEU-4 needs a 4-gram match: "on the desk" has none -> 0
  assert res["bleu4.find_my_item.m"] == 0.0 and "bleu4.relative_direction.m" not in res
  # per item: the room-and-clip questions only, weighted so that their mean is mean_both over unequal tasks
  qs.append(rea.Question(0, "relative_distance", "q", "near"))
  res = ST.scores(["left", "front", "on the desk", "on the table", "near"], qs, "m")
  items = res["per_item"]["mean_both.m"]
  assert len(items) == 3 and res["mean_both.m"] == 0.75 and np.mean(items) == pytest.approx(0.75)


def test_registered_with_presets_and_claims():
  assert set(EXP.presets) >= {"smoke", "cpu", "full"} and EXP.paper == "stllm"
  by_id = {c.id: c for c in EXP.claims}
  good = {"mean_both.stllm_3d": 0.6, "mean_both.stllm_aligner": 0.55, "mean_both.video_only": 0.5,
          "mean_both.points_only": 0.52}
  assert claims_lib.holds(by_id["stllm_3d"], good) and claims_lib.holds(by_id["stllm_aligner"], good)
  bad = dict(good, **{"mean_both.points_only": 0.58})
  assert claims_lib.holds(by_id["stllm_3d"], bad) and not claims_lib.holds(by_id["stllm_aligner"], bad)
  assert claims_lib.holds(by_id["stllm_3d"], {"mean_both.stllm_3d": 0.6}) is None
  # measurable only where some model answers above the answer prior
  assert claims_lib.measurable(by_id["stllm_3d"], dict(good, **{"mean_both.answer_prior": 0.5})) is True
  assert claims_lib.measurable(by_id["stllm_aligner"], dict(good, **{"mean_both.answer_prior": 0.6})) is False


def test_answer_prior_is_each_tasks_most_common_training_answer():
  q = lambda task, answer: rea.Question(0, task, "?", answer)
  train = [q("find_my_item", a) for a in ("sink", "table", "table", "sink", "bed")] + \
      [q("relative_direction", a) for a in ("left", "right", "right")]
  test = [q("relative_direction", "left"), q("find_my_item", "bed"), q("action_planning", "go")]
  assert ST.answer_prior(train, test) == ["right", "sink", ""]  # a tie goes to the first in sorted order


@pytest.mark.parametrize("kw,match", [({"steps": 0}, "steps must be >= 1, found 0"), ({"lr": 0.0}, "expected lr > 0"),
                                      ({"patch": 5}, r"patch \(5\) must divide room.image_size \(16\)"),
                                      ({"video_pool": 3}, r"video_pool \(3\) the patch grid"),
                                      ({"point_centres": (8, 32)}, "point_centres must satisfy"),
                                      ({"trainable": ("llm",)}, r"trainable must name param groups among \('lm', "
                                       r"'video', 'points', 'aligner'\), found \('llm',\)"),
                                      ({"trainable": ("aligner",)}, "leaves video_only nothing to train"),
                                      ({"trainable": ()}, "trainable must name param groups")])
def test_bad_config_is_a_one_line_error(kw, match):
  with pytest.raises(ValueError, match=match) as e:
    EXP.config_cls(**kw)
  assert "\n" not in str(e.value)


def test_full_preset_pools_each_frame_as_llava_video():
  full_cfg = EXP.presets["full"]
  mcfg = ST.model_config(full_cfg, "video_only", tfm.Config(vocab_size=64, d_model=32, n_layers=1, n_heads=4,
                                                             d_ff=64), 62, 63)
  assert mcfg.video.features.vision.grid == 24 and mcfg.video.tokens_per_frame == 12 * 12
  assert mcfg.video_tokens == full_cfg.room.n_frames * 144


def test_full_preset_paths_are_one_line_errors(tmp_path):
  env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-m", "experiments", "run", "stllm", "--preset", "full", "--root", "runs"],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  err = proc.stderr.strip().splitlines()
  assert len(err) == 1 and "stllm --preset full: rea_path is required (--set rea_path=FILE" in err[0]
  assert not (tmp_path / "runs").exists()
  bad = tmp_path / "rea.json"
  bad.write_text(json.dumps([{"scene_id": "P01_01", "pointcloud": "a.npy", "conversations": [{"value": "q"}]}]))
  with pytest.raises(ValueError, match="row 0: expected scene_id, pointcloud, two conversations") as e:
    full.read_rows(str(bad))
  assert "\n" not in str(e.value)
  bad.write_text(json.dumps([{"scene_id": "P01_01", "pointcloud": "a.npy", "conversations": [{}, {}],
                              "metadata": {"query_start_frame": 1, "query_stop_frame": 9, "task": "counting"}}]))
  with pytest.raises(ValueError, match="question_type must be one of .* found 'counting'"):
    full.read_rows(str(bad))
  cfg = EXP.presets["full"]
  import dataclasses
  with pytest.raises(ValueError, match="rea_test_path must be an existing file"):
    full.check_paths(dataclasses.replace(cfg, rea_path=str(bad)))


def test_full_preset_reads_rea_rows_points_frames_and_cameras(tmp_path):
  from PIL import Image
  import dataclasses
  pts = np.concatenate([np.random.RandomState(0).rand(50, 3), np.full((50, 3), 255.0)], 1)
  (tmp_path / "pcd").mkdir()
  np.save(tmp_path / "pcd" / "P01_vert.npy", pts)
  (tmp_path / "pcd" / "poses").mkdir()
  np.savetxt(tmp_path / "pcd" / "poses" / "10.txt", np.diag([1.0, 2.0, 3.0, 1.0]))
  frames = tmp_path / "rgb" / "P01" / "P01_01"
  frames.mkdir(parents=True)
  for k in range(10, 41):
    Image.fromarray(np.full((8, 8, 3), k, np.uint8)).save(frames / f"frame_{k:010d}.jpg")
  np.savetxt(tmp_path / "pcd" / "K.txt", [[6.0, 0, 4.0], [0, 5.0, 3.0], [0, 0, 1]])
  rows = [{"scene_id": "P01_01", "pointcloud": "P01_vert.npy", "c2ws": "poses", "K": "K.txt",
           "conversations": [{"value": "<image>\n<pointcloud> where is the cup  ?"}, {"value": "on the  table"}],
           "metadata": {"query_start_frame": 10, "query_stop_frame": 40, "question_type": "find my item"}}]
  (tmp_path / "rea.json").write_text(json.dumps(rows))
  room = R.RoomConfig(points_per_furniture=16, points_per_object=8, image_size=16)  # 88 points
  cfg = dataclasses.replace(SMOKE, room=room, points_dir=str(tmp_path / "pcd"), frames_dir=str(tmp_path / "rgb"))
  d = full.load_split(str(tmp_path / "rea.json"), cfg)
  assert d.questions == [rea.Question(0, "find_my_item", "where is the cup ?", "on the table")]
  assert d.xyz.shape == (1, 88, 3) and d.mask.sum() == 50 and np.all(d.rgb[0][d.mask[0]] == 1.0)
  assert {tuple(p) for p in d.xyz[0][d.mask[0]].round(6)} == {tuple(p) for p in pts[:, :3].astype(np.float32).round(6)}
  assert d.frames.shape == (1, 4, 16, 16, 3)  # frames 10, 20, 30, 40
  np.testing.assert_allclose(d.frames[0, :, 0, 0, 0] * 255, [10, 20, 30, 40], atol=2)
  np.testing.assert_allclose(d.c2w[0, 0], np.diag([1.0, 2.0, 3.0, 1.0]))
  np.testing.assert_allclose(d.c2w[0, 1], np.eye(4))  # no pose file for frame 20
  np.testing.assert_allclose(d.k[0], [[12.0, 0, 8.0], [0, 10.0, 6.0], [0, 0, 1]])  # 8 x 8 frames read at 16 x 16
  del rows[0]["K"]
  (tmp_path / "rea.json").write_text(json.dumps(rows))
  with pytest.raises(ValueError, match=r"row 0: no \"K\" .* ray_freqs=4 needs for the video patches' rays"):
    full.load_split(str(tmp_path / "rea.json"), cfg)
  assert full.load_split(str(tmp_path / "rea.json"), dataclasses.replace(cfg, ray_freqs=0)).k.shape == (1, 3, 3)


@pytest.mark.slow  # CI's smoke reproduce runs the same preset
def test_smoke_preset_from_the_cli_writes_every_key(tmp_path):
  env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-m", "experiments", "run", "stllm", "--preset", "smoke", "--root", "runs"],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  res = json.loads((tmp_path / "runs" / "stllm" / "results.json").read_text())
  keys = [f"accuracy.{t}.{m}" for t in rea.TASKS for m in M.MODELS] + [f"mean.{m}" for m in M.MODELS]
  assert not [k for k in keys if k not in res] and all(0 <= res[k] <= 1 for k in keys)
  for m in M.MODELS:
    assert res[f"mean.{m}"] == pytest.approx(np.mean([res[f"accuracy.{t}.{m}"] for t in rea.TASKS]))
  assert res["test.questions"] == 5 * SMOKE.n_test_rooms
  samples = json.loads((tmp_path / "runs" / "stllm" / "samples.json").read_text())
  assert samples and {"question", "answer", *M.MODELS} <= set(samples[0])


def test_cpu_splits_keep_training_and_text_lm_rooms_apart_from_the_test_rooms(tmp_path):
  import dataclasses
  from experiments.runner import splits
  cfg = dataclasses.replace(SMOKE, n_train_rooms=6, n_test_rooms=3, lm_rooms=10)
  train, test = rea.generate(6, cfg.room, cfg.seed + 1), rea.generate(3, cfg.room, cfg.seed + 2)
  corpus = ST.lm_corpus(cfg)
  items = ST.split_items(train, test, corpus)
  hashes = splits.hashed(items)
  assert [len(hashes["train"]["scenes"]), len(hashes["test"]["scenes"])] == [16, 3]
  assert [len(hashes["train"]["questions"]), len(hashes["test"]["questions"])] == [80, 15]
  assert splits.overlaps(hashes) == []
  # the same room in both splits is caught
  leak = ST.split_items(train, train, corpus)
  assert {(s, k) for s, k, _ in splits.overlaps(splits.hashed(leak))} == {("test", "scenes"), ("test", "questions")}
  with pytest.raises(splits.SplitOverlap):
    splits.record(str(tmp_path), "stllm", leak)
  # the LM's text corpus is the one the run trains on: rooms drawn by the same generator in the same order
  rng = np.random.default_rng(cfg.seed + 7)
  first = R.generate_room(cfg.room, rng)
  assert rea.scene_key(first) == rea.scene_key(corpus[0][0]) and corpus[0][1] == rea.questions(first, 0, cfg.room, rng)


def test_full_splits_are_rea_scenes_and_questions(tmp_path):
  import dataclasses
  (tmp_path / "lm").mkdir()
  for f in ("config.json", "tokenizer.json"):
    (tmp_path / "lm" / f).write_text("{}")
  for d in ("pcd", "rgb"):
    (tmp_path / d).mkdir()
  row = lambda scene, q: {"scene_id": scene, "pointcloud": "p.npy", "conversations": [{"value": f"<image> {q}"},
                                                                                         {"value": "a"}],
                          "metadata": {"query_start_frame": 1, "query_stop_frame": 9, "question_type": "find my item"}}
  (tmp_path / "train.json").write_text(json.dumps([row("P01_01", "where is the cup ?"), row("P02_01", "where ?")]))
  (tmp_path / "val.json").write_text(json.dumps([row("P03_01", "where is the cup ?")]))
  cfg = dataclasses.replace(EXP.presets["full"], rea_path=str(tmp_path / "train.json"),
                            rea_test_path=str(tmp_path / "val.json"), points_dir=str(tmp_path / "pcd"),
                            frames_dir=str(tmp_path / "rgb"), lm_path=str(tmp_path / "lm"))
  items = full.split_items(cfg)
  assert items["train"]["scenes"] == ["P01_01", "P02_01"] and items["test"]["scenes"] == ["P03_01"]
  assert items["test"]["questions"] == [{"scene": "P03_01", "start": 1, "stop": 9, "question": "where is the cup ?"}]
  from experiments.runner import splits
  assert splits.overlaps(splits.hashed(items)) == []


def test_judge_verdicts_prompts_and_scores(monkeypatch, tmp_path):
  import dataclasses
  from experiments._shared import chat_models
  from experiments.stllm import judge as J
  assert [J.verdict(r) for r in ("Correct", " wrong.", "Incorrect", "The answer is correct", "maybe", "")] == \
      [True, False, False, True, None, None]
  asked = []

  def answer(cfg, params, tok, ids, n):
    asked.extend(ids)
    return ["correct" if "Predicted answer: the desk" in p or "Predicted answer: on the desk" in p else
            "wrong" if "Predicted answer: on the bed" in p else "hmm" for p in ids], None
  monkeypatch.setattr(chat_models, "load_chat_model", lambda path: (None, None, None))
  monkeypatch.setattr(chat_models, "chat_ids", lambda tok, p, system: f"{system}|{p}")
  monkeypatch.setattr(chat_models, "answer", answer)
  judge = J.LMJudge("/judge", batch=2)
  qs = [rea.Question(0, "find_my_item", "where is the cup now ?", "on the desk")] * 4 + [
      rea.Question(1, "relative_direction", "where is the mug from the agent now ?", "left")]
  preds = ["the desk", "on the bed", "the desk", "???", "left"]
  judged = judge([(q.task, q.question, q.answer, p) for q, p in zip(qs, preds)])
  assert judged == [True, False, True, None, None] and len(asked) == 4  # the repeated item is asked once
  assert asked[0].startswith(J.SYSTEM + "|") and "Question: where is the cup now ?" in asked[0]
  assert "Ground truth answer: on the desk" in asked[0] and J.TASK_TEXT["find_my_item"] in asked[0]
  res = ST.scores(preds, qs, "m", judged)
  # judged: find_my_item 2 of 4 correct (exact match: 0 of 4); relative_direction's reply is invalid -> wrong
  assert res["accuracy.find_my_item.m"] == 0.5 and res["exact.find_my_item.m"] == 0.0
  assert res["accuracy.relative_direction.m"] == 0.0 and res["exact.relative_direction.m"] == 1.0
  assert res["judge_invalid.m"] == pytest.approx(2 / 5)
  assert "exact.find_my_item.m" not in ST.scores(preds, qs, "m")  # no judge: exact match is the accuracy
  with pytest.raises(FileNotFoundError, match="neither a registered real model"):
    ST.run(dataclasses.replace(SMOKE, judge_path=str(tmp_path / "none")), str(tmp_path / "run"), False)
  assert not (tmp_path / "run" / "splits.json").exists()  # it fails before choosing data or training
