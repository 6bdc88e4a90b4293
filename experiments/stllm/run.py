"""The run of stllm: what `python -m experiments run stllm` executes (its Config, presets and claims are in
`experiments/stllm/__init__.py`, the paper and its departures in `experiments/stllm/README.md`)."""
from __future__ import annotations

import collections
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments._shared import recipes, records, vlm_pipeline as pipe
from experiments.runner import splits
from experiments.stllm import data as data_lib, full, judge as judge_lib, model as model_lib, rea
from jaxlab import losses
from jaxlab import sharding as shd
from jaxlab.data import load_tokenizer
from jaxlab.data.tasks import scenes as scenes_lib
from experiments.stllm import rooms
from experiments.stllm import overlap
from jaxlab.models import multimodal as mm, pointcloud, qformer, transformer as tfm, video as video_lib, vit
from jaxlab.train import loop as loop_lib, metrics as metrics_lib, schedules, state as state_lib, step as step_lib
from experiments.stllm import Config, MODELS


def model_config(cfg: Config, kind: str, text: tfm.Config, video_id: int, points_id: int) -> model_lib.ModelConfig:
  rc = cfg.room
  v = vit.clip_config(image_size=rc.image_size, patch_size=cfg.patch, d_model=cfg.vit_width, n_layers=1,
                      n_heads=4, d_ff=2 * cfg.vit_width)
  video = video_lib.Config(features=mm.VitFeatures(vision=v, feature_layers=(-1,)), n_frames=rc.n_frames,
                           spatial_pool=cfg.video_pool)
  (w1, w2), (c1, c2) = cfg.point_widths, cfg.point_centres
  s = rc.size
  points = pointcloud.Config(n_points=rc.n_points, in_features=6, ray_freqs=cfg.ray_freqs if kind == "stllm_aligner"
                             else 0, stages=(pointcloud.Stage(c1, 8, 0.15 * s, (w1, w1)),
                                             pointcloud.Stage(c2, 8, 0.4 * s, (w2, w2))))
  d = text.d_model
  aligner = qformer.Config(d_model=d, n_layers=cfg.aligner_layers, n_heads=4, d_ff=2 * d, encoder_width=w2,
                           cross_every=min(2, cfg.aligner_layers), n_latents=cfg.n_latents, out_width=d,
                           video_width=video.width, text_width=d)
  return model_lib.ModelConfig(kind, text, video, points, aligner, video_id, points_id,
                               video_ray_freqs=cfg.ray_freqs if kind == "stllm_aligner" else 0)


def point_features(d: rea.Data, size: float) -> rea.Data:
  """rgb -> [rgb, xyz / size - 0.5]: the absolute position as a point feature (set abstraction sees only
  offsets from its centres)."""
  return d._replace(rgb=np.concatenate([d.rgb, d.xyz / size - 0.5], -1).astype(np.float32))


PLAN_QUESTION_TOKENS = 64  # planning: a question's tokens (the file decides at run time)
PLAN_ANSWER_TOKENS = 32  # planning: the longest answer's tokens + eos, the new tokens of greedy decoding
PLAN_TEST_QUESTIONS = 1000  # planning: questions of the evaluation file


def _optimizer(lr, steps, warmup, frozen: tuple[str, ...] = ()):
  """(schedule, AdamW with clipping): warmup then cosine to 0.1x; the top-level param groups named in `frozen` get
  no update (no weight decay either) and no optimizer state, and count in no gradient norm."""
  sched = schedules.get("cosine", lr, steps, warmup, 0.1)
  tx = recipes.optimizer(sched, "adamw", grad_clip=1.0, b2=0.98, weight_decay=1e-4)
  if not frozen:
    return sched, tx
  labels = lambda params: {k: "frozen" if k in frozen else "train" for k in params}
  return sched, optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)


def frozen_groups(params, trained: tuple[str, ...]) -> tuple[str, ...]:
  """The top-level groups of `params` outside `trained`; a one-line ValueError when `trained` names a group that
  `params` lack."""
  missing = [g for g in trained if g not in params]
  if missing:
    raise ValueError(f"stllm: trained groups {tuple(missing)} are not among the model's param groups {tuple(params)}")
  return tuple(g for g in params if g not in trained)


def frozen_loss(loss, frozen: tuple[str, ...]):
  """`loss` with the gradients of the top-level param groups in `frozen` stopped."""
  if not frozen:
    return loss

  def fn(params, batch, rng):
    return loss({k: jax.lax.stop_gradient(v) if k in frozen else v for k, v in params.items()}, batch, rng)
  return fn


def train_step(loss, tx, sched, mesh=None, strategy: str = "dp", state=None, compute=None):
  """The jitted train step of `loss`; with `mesh`, sharded like `state` (arrays or ShapeDtypeStructs) by the
  models' axes, the state donated, params cast to `compute` inside the loss."""
  if mesh is None:
    return jax.jit(step_lib.make_train_step(loss, tx, schedule=sched))
  return recipes.train_step(loss, tx, state, mesh, strategy, axes=model_lib.AXES, compute=compute, schedule=sched)


def _fit(name, loss, params, sampler, steps, lr, warmup, log_every, out_dir, seed, mesh=None, strategy="dp",
         compute=None, frozen: tuple[str, ...] = ()):
  """`params` after `steps` steps of `loss`, the top-level groups named in `frozen` left as they are."""
  sched, tx = _optimizer(lr, steps, warmup, frozen)
  loss = frozen_loss(loss, frozen)
  if mesh is None:
    state = state_lib.create(params, tx, seed)
  else:  # a copy: the step donates its state, and the LM's params start every model
    sh = shd.param_shardings(params, mesh, strategy, axes=model_lib.AXES)
    params = jax.tree.map(lambda x, s: jax.device_put(x, s, may_alias=False), params, sh)
    state = state_lib.state_from_params(params, tx, seed, mesh, strategy, axes=model_lib.AXES)
  step = train_step(loss, tx, sched, mesh, strategy, state, compute)
  with open(os.path.join(out_dir, "metrics.jsonl"), "a") as f:
    for s in range(steps):
      state, m = step(state, next(sampler))
      if not bool(m["finite"]):
        msg, leaf = loop_lib.nonfinite_message(s + 1, jax.device_get(m), step_lib.leaf_paths(params), None)
        f.write(metrics_lib.json_line({"stage": name, "step": s, "event": "non_finite", "message": msg}))
        raise loop_lib.NonFiniteError(f"{name}: {msg}", s + 1, leaf)
      if s % log_every == 0 or s == steps - 1:
        f.write(metrics_lib.json_line({"stage": name, "step": s, "loss": float(m["loss"])}))
        f.flush()
  return state.params


def _flops(mcfg: model_lib.ModelConfig, rows: int, length: int, train: bool, frozen: tuple[str, ...] = ()) -> float:
  """6·N·tokens (train) or 2·N·tokens of one model over `rows` rows of `length` tokens: the LM over the rows and the
  prefix (`transformer.flops_per_token`), each encoder's and connector's params over the inputs they see (ViT: every
  frame's tokens; point encoders: every point; Q-Former: its latents, the video tokens and the row as queries). In
  training a frozen LM counts 4·N (its input gradients still flow), a frozen encoder group 2·N."""
  shapes = jax.eval_shape(functools.partial(model_lib.init, mcfg), jax.random.PRNGKey(0))
  count = lambda tree: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))
  per_n = lambda group: 2 if group in frozen else 6
  t = length + mcfg.n_prefix
  per_row = tfm.flops_per_token(mcfg.text, t) * t * (4 / 6 if "lm" in frozen else 1)
  n = mcfg.points.n_points
  if mcfg.uses_video:
    v = shapes["video"]
    per_row += per_n("video") * (count(v["encoder"]) * mcfg.video.n_frames * mcfg.video.features.vision.seq_len +
                                 count(v["connector"]) * mcfg.video_tokens)
  if mcfg.point_tokens:
    p = shapes["points"]
    per_row += per_n("points") * (count(p["encoder"]) * n + count(p["connector"]) * mcfg.point_tokens)
  if mcfg.n_prefix:
    a = shapes["aligner"]
    per_row += per_n("aligner") * (count(a["points"]) * n +
                                   count(a["qformer"]) * (mcfg.n_prefix + mcfg.video_tokens + length) +
                                   count(a.get("video_rays", {})) * mcfg.video_tokens)
  return per_row * rows / (1 if train else 3)


def _row_shapes(rc: rooms.RoomConfig, mcfg: model_lib.ModelConfig, n: int, length: int,
                keys=("tokens", "targets", "loss_mask", "question_mask")) -> dict:
  """name -> (shape, dtype) of `n` rows of `data.Rows` batches: the token arrays named by `keys` and the inputs the
  model reads (frames; points with their full-preset features: rgb and the normalized position)."""
  shapes = {"tokens": ((n, length), "int32"), "targets": ((n, length), "int32"), "loss_mask": ((n, length), "int32"),
            "question_mask": ((n, length), "bool")}
  shapes = {k: shapes[k] for k in keys}
  if mcfg.uses_video:
    shapes["frames"] = ((n, rc.n_frames, rc.image_size, rc.image_size, 3), "float32")
  if mcfg.point_tokens or mcfg.n_prefix:
    shapes.update(xyz=((n, rc.n_points, 3), "float32"), rgb=((n, rc.n_points, 6), "float32"),
                  mask=((n, rc.n_points), "bool"), c2w=((n, rc.n_frames, 4, 4), "float32"))
  if mcfg.video_ray_freqs:
    shapes["intrinsics"] = ((n, 3, 3), "float32")
  return shapes


def workloads(cfg: Config, mesh) -> list:
  """Each model's train step (`train_step`) and greedy decoding (`model.greedy`), with abstract arguments at the
  preset's shapes (`experiments plan`). The full preset's LM is `lm_path`'s architecture (`jaxlab.hf.hub.config`) as
  `full.lm_config` trains it; its rows are planned at the `PLAN_*` question and answer lengths (the REA files
  decide them at run time), after the video and point placeholders. The cpu presets' word-level LM pretraining is
  not planned."""
  from experiments.runner import plan as plan_lib
  from jaxlab.hf import hub
  if cfg.lm_path is None:
    raise ValueError("stllm plans its full preset (a checkpoint's LM, `lm_path`); the cpu presets' LM is trained "
                     "by the run")
  text = full.lm_config(hub.config(cfg.lm_path))
  vid, pid = text.vocab_size - 1, text.vocab_size - 2
  rc, b, e = cfg.room, cfg.batch, cfg.eval_batch
  out = []
  for kind in MODELS:
    mcfg = model_config(cfg, kind, text, vid, pid)
    init = functools.partial(model_lib.init, mcfg)
    frozen = frozen_groups(jax.eval_shape(init, jax.random.PRNGKey(0)), model_lib.trained_groups(kind, cfg.trainable))
    sched, tx = _optimizer(cfg.lr, cfg.steps, cfg.warmup, frozen)
    length = -(-(1 + mcfg.video_tokens + mcfg.point_tokens + PLAN_QUESTION_TOKENS + PLAN_ANSWER_TOKENS) // 8) * 8
    state = state_lib.abstract_state(init, tx, mesh, cfg.strategy, axes=model_lib.AXES)
    step = train_step(frozen_loss(model_lib.loss_fn(mcfg), frozen), tx, sched, mesh, cfg.strategy, state,
                      recipes.compute_dtype(text))
    out.append(plan_lib.Workload(f"train_step.{kind}", "train", step,
                                 (state, shd.abstract_rows(_row_shapes(rc, mcfg, b, length), mesh)), cfg.steps,
                                 _flops(mcfg, b, length, True, frozen)))
    gen = shd.abstract_rows({**_row_shapes(rc, mcfg, e, length, ("tokens", "question_mask")),
                             "lengths": ((e,), "int32")}, mesh)
    lengths = gen.pop("lengths")
    banned = tuple(sorted({text.pad_token_id or 0, text.bos_token_id or 0, vid, pid}))
    out.append(plan_lib.Workload(f"generate.{kind}", "generate", model_lib.greedy(mcfg, banned),
                                 (state.params, gen, lengths, jax.ShapeDtypeStruct((), jnp.int32)),
                                 -(-PLAN_TEST_QUESTIONS // e), PLAN_ANSWER_TOKENS * _flops(mcfg, e, length, False),
                                 PLAN_ANSWER_TOKENS))
  return out


def lm_corpus(cfg: Config) -> list[tuple[rooms.Room, list]]:
  """The rooms (nothing rendered) whose questions and answers the word-level LM is trained on, with the questions."""
  rng = np.random.default_rng(cfg.seed + 7)
  out = []
  for i in range(cfg.lm_rooms):
    room = rooms.generate_room(cfg.room, rng)
    out.append((room, rea.questions(room, i, cfg.room, rng)))
  return out


def split_items(train: rea.Data, test: rea.Data, lm: list[tuple[rooms.Room, list]]) -> dict:
  """The cpu run's splits: rooms (`scenes`) and questions about a room (`questions`, with their room's digest);
  `train` holds the fine-tuning rooms and the text LM's rooms, `test` the held-out rooms."""
  def items(pairs):
    keys = [(rea.scene_key(r), qs) for r, qs in pairs]
    return {"scenes": [k for k, _ in keys],
            "questions": [{"scene": splits.digest(k), "task": q.task, "question": q.question, "answer": q.answer}
                          for k, qs in keys for q in qs]}
  by_room = lambda d: [(r, [q for q in d.questions if q.room == i]) for i, r in enumerate(d.rooms)]
  tr, lm_items = items(by_room(train)), items(lm)
  return {"train": {k: tr[k] + lm_items[k] for k in tr}, "test": items(by_room(test))}


def _lm(cfg: Config, tok, text: tfm.Config, out_dir: str, corpus):
  """The word-level LM trained on the questions and answers of `corpus` (`lm_corpus`) as text."""
  qs = [q for _, room_qs in corpus for q in room_qs]
  arr = pipe.lm_data([f"{q.question} {q.answer}" for q in qs], tok, text.max_position_embeddings)
  rs = np.random.default_rng(cfg.seed + 8)

  def sampler():
    while True:
      idx = rs.integers(0, len(qs), cfg.batch)
      yield {k: v[idx] for k, v in arr.items()}
  return _fit("text_lm", losses.lm_loss_fn(text), tfm.init(text, jax.random.PRNGKey(cfg.seed)), sampler(),
              cfg.lm_steps, cfg.lr, cfg.warmup, cfg.log_every, out_dir, cfg.seed)


def answer_prior(train_qs, test_qs) -> list[str]:
  """Each test question answered with its task's most common training answer (ties: the first in sorted order): the
  score a model reaches without using its inputs."""
  common = {}
  for task, idx in rea.answers_by_task(train_qs).items():
    counts = collections.Counter(train_qs[i].answer for i in idx)
    common[task] = min(counts, key=lambda a: (-counts[a], a)) if counts else ""
  return [common[q.task] for q in test_qs]


def scores(preds, qs, model: str, judged=None) -> dict:
  """accuracy / mean / mean_both, and BLEU-4 / ROUGE-L on the free-form tasks, for one model's answers. Accuracy is
  exact string match, or, given the judge's verdicts (`judged`, True / False / None per answer), the share judged
  correct (a reply that says neither counts as wrong), with exact match kept as `exact.<task>.<model>`. Under
  "per_item": each room-and-clip question's score, weighted so that their mean is mean_both (the claims' intervals,
  paired across models: the same questions in the same order)."""
  res, by = {}, rea.answers_by_task(qs)
  for task, idx in by.items():
    if idx:
      exact = float(np.mean([preds[i] == qs[i].answer for i in idx]))
      if judged is None:
        res[f"accuracy.{task}.{model}"] = exact
      else:
        res[f"accuracy.{task}.{model}"] = float(np.mean([judged[i] is True for i in idx]))
        res[f"exact.{task}.{model}"] = exact
      if task in rea.FREE_FORM:
        cand, ref = [preds[i].split() for i in idx], [qs[i].answer.split() for i in idx]
        res[f"bleu4.{task}.{model}"] = overlap.corpus_bleu(cand, ref)
        res[f"rouge_l.{task}.{model}"] = overlap.rouge_l(cand, ref)
  res[f"mean.{model}"] = float(np.mean([res[f"accuracy.{t}.{model}"] for t in rea.TASKS if by[t]]))
  both = [res[f"accuracy.{t}.{model}"] for t in rea.NEEDS_BOTH if by[t]]
  res[f"mean_both.{model}"] = float(np.mean(both)) if both else 0.0
  if judged is not None:
    res[f"judge_invalid.{model}"] = float(np.mean([v is None for v in judged]))
  both = [i for t in rea.NEEDS_BOTH for i in by[t]]
  right = [judged[i] is True if judged is not None else preds[i] == qs[i].answer for i in both]
  res["per_item"] = {f"mean_both.{model}": records.macro_items(right, [qs[i].task for i in both])}
  return res


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  del resume
  os.makedirs(out_dir, exist_ok=True)
  if cfg.judge_path is not None:  # a missing judge fails before anything trains
    from experiments._shared import chat_models
    chat_models.resolve_model(cfg.judge_path)
  if cfg.rea_path is not None:
    splits.record(out_dir, "stllm", full.split_items(cfg))
    train, test, tok, text, lm_params, vid, pid = full.load(cfg)
  else:
    tok = load_tokenizer(scenes_lib.save_tokenizer(os.path.join(out_dir, "tokenizer"), rea.vocabulary()))
    n_pos = 8 + cfg.n_latents + cfg.room.n_frames * (cfg.room.image_size // cfg.patch // cfg.video_pool) ** 2 + \
        cfg.point_centres[1] + 40
    text = tfm.Config(vocab_size=-(-tok.vocab_size // 16) * 16, d_model=cfg.d_model, n_layers=cfg.n_layers,
                      n_heads=4, d_ff=4 * cfg.d_model, max_position_embeddings=n_pos, bos_token_id=tok.bos_id,
                      eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
    train = rea.generate(cfg.n_train_rooms, cfg.room, cfg.seed + 1)
    test = rea.generate(cfg.n_test_rooms, cfg.room, cfg.seed + 2)
    corpus = lm_corpus(cfg)
    splits.record(out_dir, "stllm", split_items(train, test, corpus))
    lm_params = _lm(cfg, tok, text, out_dir, corpus)
    vid, pid = tok.encode("<image>")[0], tok.encode(rea.POINTS)[0]
  train, test = (point_features(d, cfg.room.size) for d in (train, test))
  mesh = None if cfg.mesh is None else shd.make_mesh(cfg.mesh)
  res = {"train.questions": len(train.questions), "test.questions": len(test.questions),
         "scorer": "exact" if cfg.judge_path is None else "judge"}
  max_new = data_lib.answer_length(train.questions + test.questions, tok)
  samples = {"question": [q.question for q in test.questions], "answer": [q.answer for q in test.questions]}
  for kind in MODELS:
    mcfg = model_config(cfg, kind, text, vid, pid)
    rows = data_lib.Rows(tok, mcfg, train, max_new)
    # one key for every model: the parts they share (video encoder, point encoder) start equal
    params = model_lib.init(mcfg, jax.random.PRNGKey(cfg.seed + 100), lm_params)
    frozen = frozen_groups(params, model_lib.trained_groups(kind, cfg.trainable))
    params = _fit(kind, model_lib.loss_fn(mcfg), params, rows.sampler(cfg.batch, cfg.seed + 11), cfg.steps, cfg.lr,
                  cfg.warmup, cfg.log_every, out_dir, cfg.seed, mesh, cfg.strategy, recipes.compute_dtype(text), frozen)
    samples[kind] = data_lib.Rows(tok, mcfg, test, max_new).generate(
        params, model_lib.greedy(mcfg, data_lib.banned(tok, mcfg)), min(cfg.eval_batch, len(test.questions)))
  judge = None if cfg.judge_path is None else judge_lib.LMJudge(cfg.judge_path, cfg.judge_new_tokens,
                                                                 cfg.judge_batch)
  samples["answer_prior"] = answer_prior(train.questions, test.questions)
  for kind in (*MODELS, "answer_prior"):
    preds = samples[kind]
    judged = None if judge is None else judge([(q.task, q.question, q.answer, p)
                                               for q, p in zip(test.questions, preds)])
    records.merge(res, scores(preds, test.questions, kind, judged))
  if jax.process_index() == 0:
    with open(os.path.join(out_dir, "samples.json"), "w") as f:
      json.dump([{k: v[i] for k, v in samples.items()} for i in range(min(25, len(test.questions)))], f, indent=1)
  res["steps"] = cfg.steps
  return res
