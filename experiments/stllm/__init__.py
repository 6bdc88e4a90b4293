"""STLLM (Spatio-Temporal LLM, arXiv 2507.05258): questions that need both the room (a point cloud) and what the
agent just did in it (an egocentric clip), answered by video-only, points-only, STLLM-3D and STLLM-Aligner
models built on one LM.

Data (`experiments.stllm.rea`, over `experiments.stllm.rooms`): rooms of pybullet_data furniture and objects as
coloured point clouds, a clip rendered from the agent's moving camera in which it moves, picks up or uses an
object, and REA's five task types with exact answers: relative direction, relative distance, find-my-item,
furniture affordance and action planning (the last three free-form). Models (`experiments.stllm.model`): the LM
is a word-level decoder first trained here on the questions and answers as text (no room, no clip), then each
model starts from it and trains on the same rows for the same steps (every weight; at full all but the LM, which
stays frozen: `Config.trainable`):
  video_only     per-frame ViT patches + temporal position, through an MLP, spliced before the question
  points_only    set-abstraction tokens of the room (xyz, rgb and the normalized position per point), MLP
  stllm_3d       point tokens after an MLP concatenated with the video and text tokens
  stllm_aligner  the Q-Former aligner (learned latents + video-patch and question queries cross-attending to
                 the room's point features, both with their ray encoding) as an LM prefix, then the video tokens
Scores on held-out rooms: accuracy per task (`accuracy.<task>.<model>`: exact match, or with `--set
judge_path=DIR` the share a local LLM judge calls correct, `judge.py`, exact match then kept as
`exact.<task>.<model>`; `scorer` says which), their mean over the five tasks (`mean.<model>`) and over the four
that need both room and clip (`mean_both.<model>`), and corpus BLEU-4 and mean ROUGE-L on the free-form tasks
(`bleu4.<task>.<model>`, `rouge_l.<task>.<model>`).

The full preset takes the REA JSON, the point clouds and the EPIC-KITCHENS frames by path and a LLaVA-Video-class
LM (Qwen/Qwen2-7B-Instruct, or any transformers decoder directory with tokenizer.json); see
experiments/stllm/full.py.

  python -m experiments run stllm --preset cpu
  python -m experiments run stllm --preset full --set rea_path=qa_train.json \\
      --set rea_test_path=qa_val.json --set points_dir=PCD --set frames_dir=EPIC/rgb  # after hf download of the LM
  python -m experiments plan stllm --preset full --topology v5p-64

Paper: arXiv 2507.05258. Code read beside it: zoezheng126/Spatio-Temporal-LLM @ b1b123badc68. Method, claims,
presets and departures from the paper: experiments/stllm/README.md.
"""
from __future__ import annotations

import dataclasses

from experiments import registry
from experiments.runner.claims import Claim
from jaxlab import sharding as shd
from experiments.stllm import model as model_lib
from experiments.stllm import rooms


MODELS = model_lib.MODELS


@dataclasses.dataclass(frozen=True)
class Config:
  """stllm settings: the rooms, the model widths, the LM's text pretraining and the shared fine-tuning.
  `trainable`: the top-level param groups that fine-tune (`model.ALL_GROUPS`: "lm", "video", "points", "aligner";
  each model trains those it has, the others keep their initial weights); None trains every weight.
  `judge_path`: a local chat model (transformers directory or .gguf) that judges answers correct or wrong, as the
  paper's GPT-4o judge does (`judge.py`); None scores by exact string match."""
  room: rooms.RoomConfig = rooms.RoomConfig(points_per_furniture=32, points_per_object=8, image_size=16)
  d_model: int = 32
  n_layers: int = 2
  vit_width: int = 16
  patch: int = 8
  video_pool: int = 1  # average-pool stride over each frame's patch grid (LLaVA-Video pools 2 x 2)
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
  trainable: tuple[str, ...] | None = None
  eval_batch: int = 16
  log_every: int = 10
  rea_path: str | None = None
  rea_test_path: str | None = None
  points_dir: str | None = None
  frames_dir: str | None = None
  lm_path: str | None = None
  judge_path: str | None = None
  judge_new_tokens: int = 4
  judge_batch: int = 16
  mesh: str | None = None  # full: every model's train state laid out on this mesh (`jaxlab.sharding.make_mesh`)
  strategy: shd.Strategy = "dp"  # and by these sharding rules
  seed: int = 0

  def __post_init__(self):
    for name in ("d_model", "n_layers", "vit_width", "patch", "video_pool", "n_latents", "aligner_layers", "n_train_rooms",
                 "n_test_rooms", "lm_rooms", "lm_steps", "steps", "batch", "eval_batch", "log_every",
                 "judge_new_tokens", "judge_batch"):
      if getattr(self, name) < 1:
        raise ValueError(f"stllm.Config: {name} must be >= 1, found {getattr(self, name)}")
    if self.lr <= 0 or self.warmup < 0 or self.ray_freqs < 0:
      raise ValueError(f"stllm.Config: expected lr > 0, warmup >= 0, ray_freqs >= 0, found lr={self.lr}, "
                       f"warmup={self.warmup}, ray_freqs={self.ray_freqs}")
    if self.room.image_size % self.patch or (self.room.image_size // self.patch) % self.video_pool:
      raise ValueError(f"stllm.Config: patch ({self.patch}) must divide room.image_size ({self.room.image_size}) and "
                       f"video_pool ({self.video_pool}) the patch grid")
    if self.d_model % 4 or self.vit_width % 4:
      raise ValueError(f"stllm.Config: d_model and vit_width must be multiples of 4 (heads), found {self.d_model}, "
                       f"{self.vit_width}")
    for kind in MODELS:
      model_lib.trained_groups(kind, self.trainable)
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
    # the LM: Qwen2-7B-Instruct, the architecture of LLaVA-Video-7B-Qwen2's LM (whose checkpoint is not in a layout
    # jaxlab loads); fp32 master params, bf16 compute, remat, the train state sharded over every chip. The LM stays
    # frozen as in the reference's mm_tunable_parts; the video tower and point encoders train too (fresh here) at
    # the reference's lr 1e-4
    "full": Config(rea_path=registry.Required(
                       "--set rea_path=FILE: REA's training questions (qa_train.json, from the data release linked "
                       "at github.com/zoezheng126/Spatio-Temporal-LLM)"),
                   rea_test_path=registry.Required("--set rea_test_path=FILE: REA's evaluation questions (qa_val.json, "
                                                   "same release)"),
                   points_dir=registry.Required("--set points_dir=DIR: the REA scene point clouds (.npy, same "
                                                "release)"),
                   frames_dir=registry.Required(
                       "--set frames_dir=DIR: EPIC-KITCHENS-100 RGB frames (P01/P01_01/frame_%010d.jpg; the "
                       "epic-kitchens-download-scripts at github.com/epic-kitchens)"),
                   lm_path=registry.Hub("Qwen/Qwen2-7B-Instruct"), mesh="fsdp:-1", strategy="fsdp",
                   room=rooms.RoomConfig(points_per_furniture=256, points_per_object=64, image_size=336,
                                         n_frames=16),
                   vit_width=1152, patch=14, video_pool=2, point_widths=(256, 768), point_centres=(512, 128), ray_freqs=127,
                   n_latents=32, aligner_layers=6, steps=3000, batch=8, lr=1e-4, warmup=100, eval_batch=8,
                   trainable=("video", "points", "aligner")),
}


def _beats(model: str) -> dict:
  """The rule and the paired intervals (per question, against each baseline) of "`model` beats both"."""
  return {"check": f"{{mean_both.{model}}} > max({{mean_both.video_only}}, {{mean_both.points_only}})",
          "diff": tuple((f"mean_both.{model}", f"mean_both.{b}") for b in ("video_only", "points_only"))}


# a ranking of the inputs shows only where some model answers above the answer prior (each task's most common
# training answer, the score of a model that ignores its inputs)
ABOVE_PRIOR = ("max({mean_both.video_only}, {mean_both.points_only}, {mean_both.stllm_3d}, "
               "{mean_both.stllm_aligner}) > {mean_both.answer_prior}")
PRIOR_WHY = "no model answers above the answer prior (each task's most common training answer): none uses its inputs"


registry.register(registry.Experiment(
    name="stllm", config_cls=Config, presets=PRESETS, run=registry.run_of("experiments.stllm.run"),
    description="STLLM: point cloud + egocentric clip + text (STLLM-3D, STLLM-Aligner) vs single-modality models",
    resume_may_change=("eval_batch",), seed_key="seed",
    results=("train.questions", "test.questions", "scorer", "accuracy.<task>.<model>", "exact.<task>.<model>?",
             "judge_invalid.<model>?", "bleu4.<task>.<model>?", "rouge_l.<task>.<model>?", "mean.<model>",
             "mean_both.<model>", "steps"),
    paper="stllm", claims=(
        Claim("stllm_3d", "STLLM-3D answers the room-and-clip questions better than video-only and points-only",
              "STLLM-3D above the video-only MLLM baselines on REA (main table)", **_beats("stllm_3d"),
              measurable=ABOVE_PRIOR, why=PRIOR_WHY),
        Claim("stllm_aligner", "STLLM-Aligner answers the room-and-clip questions better than video-only and "
              "points-only", "STLLM-Aligner best on REA's spatio-temporal tasks (main table)",
              **_beats("stllm_aligner"), measurable=ABOVE_PRIOR, why=PRIOR_WHY),
    )))
