"""STLLM (Spatio-Temporal LLM, arXiv 2507.05258): questions that need both the room (a point cloud) and what the
agent just did in it (an egocentric clip), answered by video-only, points-only, STLLM-3D and STLLM-Aligner
models built on one LM.

Data (`experiments.stllm.rea`, over `experiments.stllm.rooms`): rooms of pybullet_data furniture and objects as
coloured point clouds, a clip rendered from the agent's moving camera in which it moves, picks up or uses an
object, and REA's five task types with exact answers: relative direction, relative distance, find-my-item,
furniture affordance and action planning (the last three free-form). Models (`experiments.stllm.model`): the LM
is a word-level decoder first trained here on the questions and answers as text (no room, no clip), then each
model starts from it and trains all its weights on the same rows for the same steps:
  video_only     per-frame ViT patches + temporal position, through an MLP, spliced before the question
  points_only    set-abstraction tokens of the room (xyz, rgb and the normalized position per point), MLP
  stllm_3d       point tokens after an MLP concatenated with the video and text tokens
  stllm_aligner  the Q-Former aligner (learned latents + video-patch and question queries cross-attending to
                 the room's point features with their ray encoding) as an LM prefix, then the video tokens
Scores on held-out rooms: exact-match accuracy per task (`accuracy.<task>.<model>`), their mean over the five
tasks (`mean.<model>`) and over the four that need both room and clip (`mean_both.<model>`), and corpus BLEU-4
and mean ROUGE-L on the free-form tasks (`bleu4.<task>.<model>`, `rouge_l.<task>.<model>`).

The full preset takes the REA JSON, the point clouds and the EPIC-KITCHENS frames by path and a LLaVA-Video-class
LM (a transformers directory with tokenizer.json); see experiments/stllm/full.py.

  python -m experiments run stllm --preset cpu
  python -m experiments run stllm --preset full --set rea_path=qa_train.json \\
      --set rea_test_path=qa_val.json --set points_dir=PCD --set frames_dir=EPIC/rgb --set lm_path=/ckpt/lm
"""
from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np

from experiments import registry
from experiments._shared import recipes, vlm_pipeline as pipe
from experiments.runner.claims import Claim
from experiments.stllm import data as data_lib, full, model as model_lib, rea
from jaxlab import losses
from jaxlab.data import load_tokenizer
from jaxlab.data.tasks import scenes as scenes_lib
from experiments.stllm import rooms
from experiments.stllm import overlap
from jaxlab.models import multimodal as mm, pointcloud, qformer, transformer as tfm, video as video_lib, vit
from jaxlab.train import loop as loop_lib, metrics as metrics_lib, schedules, state as state_lib, step as step_lib

MODELS = model_lib.MODELS


@dataclasses.dataclass(frozen=True)
class Config:
  """stllm settings: the rooms, the model widths, the LM's text pretraining and the shared fine-tuning."""
  room: rooms.RoomConfig = rooms.RoomConfig(points_per_furniture=32, points_per_object=8, image_size=16)
  d_model: int = 32
  n_layers: int = 2
  vit_width: int = 16
  patch: int = 8
  point_widths: tuple[int, int] = (16, 32)
  point_centres: tuple[int, int] = (32, 8)
  ray_freqs: int = 4
  n_latents: int = 8
  aligner_layers: int = 2
  n_train_rooms: int = 24
  n_test_rooms: int = 6
  lm_rooms: int = 40
  lm_steps: int = 4
  steps: int = 4
  batch: int = 8
  lr: float = 2e-3
  warmup: int = 1
  eval_batch: int = 16
  log_every: int = 10
  rea_path: str | None = None
  rea_test_path: str | None = None
  points_dir: str | None = None
  frames_dir: str | None = None
  lm_path: str | None = None
  seed: int = 0

  def __post_init__(self):
    for name in ("d_model", "n_layers", "vit_width", "patch", "n_latents", "aligner_layers", "n_train_rooms",
                 "n_test_rooms", "lm_rooms", "lm_steps", "steps", "batch", "eval_batch", "log_every"):
      if getattr(self, name) < 1:
        raise ValueError(f"stllm.Config: {name} must be >= 1, found {getattr(self, name)}")
    if self.lr <= 0 or self.warmup < 0 or self.ray_freqs < 0:
      raise ValueError(f"stllm.Config: expected lr > 0, warmup >= 0, ray_freqs >= 0, found lr={self.lr}, "
                       f"warmup={self.warmup}, ray_freqs={self.ray_freqs}")
    if self.room.image_size % self.patch:
      raise ValueError(f"stllm.Config: patch ({self.patch}) must divide room.image_size ({self.room.image_size})")
    if self.d_model % 4 or self.vit_width % 4:
      raise ValueError(f"stllm.Config: d_model and vit_width must be multiples of 4 (heads), found {self.d_model}, "
                       f"{self.vit_width}")
    n1, n2 = self.point_centres
    if not n2 <= n1 <= self.room.n_points or min(self.point_widths) < 1:
      raise ValueError(f"stllm.Config: point_centres must satisfy centres[1] <= centres[0] <= {self.room.n_points} "
                       f"points and point_widths be positive, found {self.point_centres}, {self.point_widths}")


PRESETS = {
    "smoke": Config(n_layers=1, aligner_layers=1),
    # measured: 1313 s at nice 5 on 2 cores that three other runs kept at load ~8 (steps of 0.15-0.6 s from
    # points_only to stllm_aligner at batch 24); batch 16 x 700 steps at lr 3e-3 took as long and trained worse
    "cpu": Config(room=rooms.RoomConfig(points_per_furniture=64, points_per_object=16, image_size=24),
                  d_model=64, n_layers=2, vit_width=32, patch=8, point_widths=(32, 64), point_centres=(64, 16),
                  n_latents=16, aligner_layers=2, n_train_rooms=1500, n_test_rooms=100, lm_rooms=4000,
                  lm_steps=800, steps=450, batch=24, lr=2e-3, warmup=30, eval_batch=100, log_every=50),
    "full": Config(rea_path=registry.Required("--set rea_path=FILE"),
                   rea_test_path=registry.Required("--set rea_test_path=FILE"),
                   points_dir=registry.Required("--set points_dir=DIR"),
                   frames_dir=registry.Required("--set frames_dir=DIR"), lm_path=registry.Required("--set lm_path=DIR"),
                   room=rooms.RoomConfig(points_per_furniture=256, points_per_object=64, image_size=336,
                                         n_frames=16),
                   vit_width=1152, patch=14, point_widths=(256, 768), point_centres=(512, 128), ray_freqs=127,
                   n_latents=32, aligner_layers=6, steps=3000, batch=8, lr=2e-5, warmup=100, eval_batch=8),
}


def model_config(cfg: Config, kind: str, text: tfm.Config, video_id: int, points_id: int) -> model_lib.ModelConfig:
  rc = cfg.room
  v = vit.clip_config(image_size=rc.image_size, patch_size=cfg.patch, d_model=cfg.vit_width, n_layers=1,
                      n_heads=4, d_ff=2 * cfg.vit_width)
  video = video_lib.Config(features=mm.VitFeatures(vision=v, feature_layers=(-1,)), n_frames=rc.n_frames)
  (w1, w2), (c1, c2) = cfg.point_widths, cfg.point_centres
  s = rc.size
  points = pointcloud.Config(n_points=rc.n_points, in_features=6, ray_freqs=cfg.ray_freqs if kind == "stllm_aligner"
                             else 0, stages=(pointcloud.Stage(c1, 8, 0.15 * s, (w1, w1)),
                                             pointcloud.Stage(c2, 8, 0.4 * s, (w2, w2))))
  d = text.d_model
  aligner = qformer.Config(d_model=d, n_layers=cfg.aligner_layers, n_heads=4, d_ff=2 * d, encoder_width=w2,
                           cross_every=min(2, cfg.aligner_layers), n_latents=cfg.n_latents, out_width=d,
                           video_width=video.width, text_width=d)
  return model_lib.ModelConfig(kind, text, video, points, aligner, video_id, points_id)


def point_features(d: rea.Data, size: float) -> rea.Data:
  """rgb -> [rgb, xyz / size - 0.5]: the absolute position as a point feature (set abstraction sees only
  offsets from its centres)."""
  return d._replace(rgb=np.concatenate([d.rgb, d.xyz / size - 0.5], -1).astype(np.float32))


def _fit(name, loss, params, sampler, steps, lr, warmup, log_every, out_dir, seed):
  sched = schedules.get("cosine", lr, steps, warmup, 0.1)
  tx = recipes.optimizer(sched, "adamw", grad_clip=1.0, b2=0.98, weight_decay=1e-4)
  step = jax.jit(step_lib.make_train_step(loss, tx, schedule=sched))
  state = state_lib.create(params, tx, seed)
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


def _lm(cfg: Config, tok, text: tfm.Config, out_dir: str):
  """The word-level LM trained on questions and answers as text (fresh rooms, nothing rendered)."""
  rng = np.random.default_rng(cfg.seed + 7)
  qs = [q for i in range(cfg.lm_rooms) for q in rea.questions(rooms.generate_room(cfg.room, rng), i, cfg.room, rng)]
  arr = pipe.lm_data([f"{q.question} {q.answer}" for q in qs], tok, text.max_position_embeddings)
  rs = np.random.default_rng(cfg.seed + 8)

  def sampler():
    while True:
      idx = rs.integers(0, len(qs), cfg.batch)
      yield {k: v[idx] for k, v in arr.items()}
  return _fit("text_lm", losses.lm_loss_fn(text), tfm.init(text, jax.random.PRNGKey(cfg.seed)), sampler(),
              cfg.lm_steps, cfg.lr, cfg.warmup, cfg.log_every, out_dir, cfg.seed)


def scores(preds, qs, model: str) -> dict:
  """accuracy / mean / mean_both, and BLEU-4 / ROUGE-L on the free-form tasks, for one model's answers."""
  res, by = {}, rea.answers_by_task(qs)
  for task, idx in by.items():
    if idx:
      res[f"accuracy.{task}.{model}"] = float(np.mean([preds[i] == qs[i].answer for i in idx]))
      if task in rea.FREE_FORM:
        cand, ref = [preds[i].split() for i in idx], [qs[i].answer.split() for i in idx]
        res[f"bleu4.{task}.{model}"] = overlap.corpus_bleu(cand, ref)
        res[f"rouge_l.{task}.{model}"] = overlap.rouge_l(cand, ref)
  res[f"mean.{model}"] = float(np.mean([res[f"accuracy.{t}.{model}"] for t in rea.TASKS if by[t]]))
  both = [res[f"accuracy.{t}.{model}"] for t in rea.NEEDS_BOTH if by[t]]
  res[f"mean_both.{model}"] = float(np.mean(both)) if both else 0.0
  return res


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  del resume
  os.makedirs(out_dir, exist_ok=True)
  if cfg.rea_path is not None:
    train, test, tok, text, lm_params, vid, pid = full.load(cfg)
  else:
    tok = load_tokenizer(scenes_lib.save_tokenizer(os.path.join(out_dir, "tokenizer"), rea.vocabulary()))
    n_pos = 8 + cfg.n_latents + cfg.room.n_frames * (cfg.room.image_size // cfg.patch) ** 2 + cfg.point_centres[1] + 40
    text = tfm.Config(vocab_size=-(-tok.vocab_size // 16) * 16, d_model=cfg.d_model, n_layers=cfg.n_layers,
                      n_heads=4, d_ff=4 * cfg.d_model, max_position_embeddings=n_pos, bos_token_id=tok.bos_id,
                      eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
    train = rea.generate(cfg.n_train_rooms, cfg.room, cfg.seed + 1)
    test = rea.generate(cfg.n_test_rooms, cfg.room, cfg.seed + 2)
    lm_params = _lm(cfg, tok, text, out_dir)
    vid, pid = tok.encode("<image>")[0], tok.encode(rea.POINTS)[0]
  train, test = (point_features(d, cfg.room.size) for d in (train, test))
  res = {"train.questions": len(train.questions), "test.questions": len(test.questions)}
  max_new = data_lib.answer_length(train.questions + test.questions, tok)
  samples = {"question": [q.question for q in test.questions], "answer": [q.answer for q in test.questions]}
  for kind in MODELS:
    mcfg = model_config(cfg, kind, text, vid, pid)
    rows = data_lib.Rows(tok, mcfg, train, max_new)
    # one key for every model: the parts they share (video encoder, point encoder) start equal
    params = model_lib.init(mcfg, jax.random.PRNGKey(cfg.seed + 100), lm_params)
    params = _fit(kind, model_lib.loss_fn(mcfg), params, rows.sampler(cfg.batch, cfg.seed + 11), cfg.steps, cfg.lr,
                  cfg.warmup, cfg.log_every, out_dir, cfg.seed)
    preds = data_lib.Rows(tok, mcfg, test, max_new).generate(
        params, model_lib.greedy(mcfg, data_lib.banned(tok, mcfg)), min(cfg.eval_batch, len(test.questions)))
    res.update(scores(preds, test.questions, kind))
    samples[kind] = preds
  if jax.process_index() == 0:
    with open(os.path.join(out_dir, "samples.json"), "w") as f:
      json.dump([{k: v[i] for k, v in samples.items()} for i in range(min(25, len(test.questions)))], f, indent=1)
  res["steps"] = cfg.steps
  return res


def _beats(model: str) -> str:
  return f"{{mean_both.{model}}} > max({{mean_both.video_only}}, {{mean_both.points_only}})"


registry.register(registry.Experiment(
    name="stllm", config_cls=Config, presets=PRESETS, run=run,
    description="STLLM: point cloud + egocentric clip + text (STLLM-3D, STLLM-Aligner) vs single-modality models",
    resume_may_change=("eval_batch",), seed_key="seed",
    results=("train.questions", "test.questions", "accuracy.<task>.<model>", "bleu4.<task>.<model>?",
             "rouge_l.<task>.<model>?", "mean.<model>", "mean_both.<model>", "steps"),
    paper="stllm", claims=(
        Claim("stllm_3d", "STLLM-3D answers the room-and-clip questions better than video-only and points-only",
              "STLLM-3D above the video-only MLLM baselines on REA (main table)", _beats("stllm_3d")),
        Claim("stllm_aligner", "STLLM-Aligner answers the room-and-clip questions better than video-only and "
              "points-only", "STLLM-Aligner best on REA's spatio-temporal tasks (main table)",
              _beats("stllm_aligner")),
    )))
