"""SCALE vs AdamW and the memory-efficient baselines: LLaMA pretraining at an equal token budget (arXiv 2506.16659).

Every optimizer of `OPTIMIZERS` trains the same model from the same initialization on the same token stream
(steps x batch x sequence tokens), with linear warmup then cosine decay to `lr_floor` of its own peak rate, no
clipping, weight decay 0 (the paper's recipe). The run writes `val_loss.png` (validation loss vs step, one line
per optimizer), `table.md` (final losses, learning rates, optimizer-state bytes) and results:
  val_loss.<opt>                 final validation loss (NaN when the run diverged; `diverged_at.<opt>` says where)
  state_bytes_ratio.<size>       SCALE's optimizer-state bytes over AdamW's for the LLaMA configs (shapes only)
  model_and_optimizer_ratio.<size>  the same for weights plus optimizer state (the paper's memory figure)
  step_time_ratio.scale_vs_adamw median step time of SCALE over AdamW, steps interleaved in this process on
                                 this run's model and batch
Presets: `smoke` (a few steps of a tiny model), `cpu` (a 0.9M-parameter LLaMA on the CPython standard library,
byte tokens, 200 steps of 16 x 128 tokens), `full` (the paper: `size` picks the LLaMA config and the SCALE
scripts' lr / warmup / steps, batch 512, sequence 256, cosine to 0.1x, bf16 compute, C4 or any corpus by path or
`hf:NAME`, the T5 tokenizer by path). Learning rates left at None follow the paper for `size`
(`paper_learning_rates`); the `cpu` rates are the best of a sweep at the cpu preset (`CPU_SWEEP`).

  python -m experiments run scale --preset cpu
  python -m experiments run scale --preset full --set size=llama-350m --set corpus.path=/data/c4 \\
      --set corpus.tokenizer=/tok/t5 --set val_path=/data/c4/en --set microbatches=4

Paper: arXiv 2506.16659. Code read beside it: OptimAI-Lab/Minimalist_LLM_Pretraining @ f5bd4e754eb9. Method, claims,
presets and departures from the paper: experiments/scale/README.md.
"""
from __future__ import annotations

import dataclasses
from typing import Literal

from experiments import registry
from experiments._shared import config as shared_cfg
from experiments.runner.claims import Claim
from experiments._shared.recipes import byte_model
from jaxlab import choices
from jaxlab import sharding as shd
from jaxlab.models import transformer as tfm
from jaxlab.train import schedules


Optimizer = Literal["adamw", "sgd", "sgd_colnorm", "colnorm_momentum", "scale", "galore", "apollo", "muon"]
OPTIMIZERS = choices.values(Optimizer)
Size = Literal["llama-60m", "llama-130m", "llama-350m", "llama-1b", "llama-7b"]
SIZES = choices.values(Size)
COLUMN_FAMILY = ("sgd", "sgd_colnorm", "colnorm_momentum", "scale")
# SCALE scripts of the reference code: peak lr, warmup, steps, AdamW lr on vectors (adam_lr).
PAPER_SCHEDULE = {"llama-60m": (1e-3, 1_100, 11_000, 2e-2), "llama-130m": (1e-3, 2_000, 20_000, 2e-2),
                  "llama-350m": (1e-3, 6_000, 60_000, 2e-2), "llama-1b": (2e-4, 10_000, 100_000, 1e-3),
                  "llama-7b": (1e-4, 15_000, 150_000, 1e-3)}
# GaLore / APOLLO ranks of their papers per size (arXiv 2403.03507 table 2, arXiv 2412.05270).
PAPER_RANK = {"llama-60m": 128, "llama-130m": 256, "llama-350m": 256, "llama-1b": 512, "llama-7b": 1024}
# Final val loss at the cpu preset (200 steps, seed 0) per peak lr, one run each (vector lr 3e-3 for the column
# family); each optimizer's cpu rate is its lowest loss. Rerun with --set lr.<opt>=... to extend the grid.
CPU_SWEEP = {
    "adamw": {5e-4: 2.612, 1e-3: 2.489, 2e-3: 2.573, 3e-3: 2.555, 1e-2: 2.740},
    "sgd": {3e-2: 2.945, 0.1: 2.983, 0.3: 3.139, 1.0: 3.166},
    "sgd_colnorm": {1e-3: 2.295, 2e-3: 2.263, 3e-3: 2.334},
    "colnorm_momentum": {1e-3: 2.647, 2e-3: 2.604, 3e-3: 2.653},
    "scale": {1e-3: 2.270, 1.5e-3: 2.247, 2e-3: 2.239, 3e-3: 2.410, 5e-3: 2.546},
    "galore": {1e-2: 2.256, 3e-2: 2.187, 5e-2: 2.192},
    "apollo": {1e-2: 2.125, 3e-2: 2.399},
    "muon": {1e-2: 2.223, 2e-2: 2.130},
}


@dataclasses.dataclass(frozen=True)
class LearningRates:
  """Peak learning rates per optimizer; None: the paper's rate for `Config.size` (`paper_learning_rates`).

  `vector` is the AdamW rate on vectors (norm gains) of the SCALE family, following the same schedule
  (the reference's adam_lr); `muon_adam` is Muon's AdamW rate for embeddings, LM head and vectors.
  """
  adamw: float | None = None
  sgd: float | None = None
  sgd_colnorm: float | None = None
  colnorm_momentum: float | None = None
  scale: float | None = None
  galore: float | None = None
  apollo: float | None = None
  muon: float | None = None
  vector: float | None = None
  muon_adam: float | None = None


@dataclasses.dataclass(frozen=True)
class Config:
  """scale settings. With `size` set, fields left at None (model, steps, warmup_steps, rates, rank) follow the
  paper for that LLaMA size; batch_size is global."""
  model: tfm.Config | None = None
  size: Size | None = None
  optimizers: tuple[Optimizer, ...] = OPTIMIZERS
  steps: int | None = None
  warmup_steps: int | None = None
  batch_size: int = 512
  seq_len: int = 256
  microbatches: int = 1
  lr: LearningRates = LearningRates()
  schedule: schedules.Schedule = "cosine"
  lr_floor: float = 0.1
  weight_decay: float = 0.0
  grad_clip: float = 0.0
  momentum: float = 0.9
  rank: int | None = None  # GaLore / APOLLO rank; None: the paper's for `size`, else d_model // 4
  update_proj_gap: int = 200
  galore_scale: float = 0.25
  apollo_scale: float = 1.0
  corpus: shared_cfg.Corpus = shared_cfg.Corpus()
  eval: shared_cfg.Eval = shared_cfg.Eval()
  # a validation corpus of its own (C4's validation split at full), read as the reference reads it: shuffled
  # (seed 42), each document truncated and padded to seq_len, batches until `val_tokens` real tokens; None: a hash
  # split of `corpus` (packed, `eval.batches` batches)
  val_path: str | None = None
  val_tokens: int = 10_000_000
  log_every: int = 10
  checkpoint: shared_cfg.Checkpoint = shared_cfg.Checkpoint()  # every 0: none (resume redoes unfinished runs)
  timing_steps: int = 10  # interleaved steps per optimizer for step_time_ratio (0: skip, NaN)
  memory_sizes: tuple[str, ...] = SIZES
  mesh: str | None = None
  strategy: shd.Strategy = "dp"
  seed: int = 0
  renamed_keys = shared_cfg.FLAT_KEYS

  def __post_init__(self):
    choices.check(self, nested=False)
    if self.size is None:
      missing = [f for f in ("model", "steps", "warmup_steps") if getattr(self, f) is None]
      missing += [f"lr.{o}" for o in (*self.optimizers, "vector", "muon_adam") if getattr(self.lr, o) is None]
      if missing:
        raise ValueError(f"without size, these must be given: {missing}")
    if not self.optimizers:
      raise ValueError(f"optimizers must be a non-empty subset of {OPTIMIZERS}, found ()")
    for s in self.memory_sizes:
      if s not in tfm.PRESETS:
        raise ValueError(f"memory_sizes: {s!r} is not a transformer preset ({sorted(tfm.PRESETS)})")
    for name in ("batch_size", "seq_len", "microbatches", "log_every", "update_proj_gap", "val_tokens"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, found {getattr(self, name)}")
    if self.steps is not None and self.steps < 1:
      raise ValueError(f"steps must be >= 1, found {self.steps}")
    if self.batch_size % self.microbatches:
      raise ValueError(f"batch_size ({self.batch_size}) must be divisible by microbatches ({self.microbatches})")


PRESETS = {
    "smoke": Config(model=byte_model(32, 1, 2, 64, 64), steps=4, warmup_steps=1, batch_size=8, seq_len=32,
                    lr=LearningRates(adamw=3e-3, sgd=0.3, sgd_colnorm=3e-3, colnorm_momentum=3e-3, scale=3e-3,
                                     galore=1e-2, apollo=1e-2, muon=2e-2, vector=3e-3, muon_adam=3e-3),
                    corpus=shared_cfg.Corpus(max_docs=200), eval=shared_cfg.Eval(batches=1), log_every=2,
                    timing_steps=3),
    "cpu": Config(model=byte_model(128, 4, 4, 344, 128), steps=200, warmup_steps=20, batch_size=16, seq_len=128,
                  lr=LearningRates(**{o: min(v, key=v.get) for o, v in CPU_SWEEP.items()}, vector=3e-3,
                                   muon_adam=3e-3),
                  eval=shared_cfg.Eval(40, 8), log_every=20, timing_steps=30),
    "full": Config(size="llama-60m",
                   corpus=shared_cfg.Corpus(
                       registry.Required("--set corpus.path=PATH: a C4 JSONL/parquet directory or hf:NAME"),
                       registry.Required("--set corpus.tokenizer=PATH: the T5 tokenizer.json or its directory")),
                   val_path=registry.Required("--set val_path=PATH: C4 en validation (c4-validation.*.json.gz: hf "
                                              "download allenai/c4 --repo-type dataset --include 'en/c4-validation*' "
                                              "--local-dir data/c4)"),
                   eval=shared_cfg.Eval(1000, 20), log_every=50, checkpoint=shared_cfg.Checkpoint(1000),
                   strategy="fsdp", timing_steps=10),
}

registry.register(registry.Experiment(
    name="scale", config_cls=Config, presets=PRESETS, run=registry.run_of("experiments.scale.run"),
    description="SCALE vs AdamW, SGD rungs, GaLore, APOLLO, Muon: LLaMA pretraining at equal tokens",
    resume_may_change=("mesh", "strategy", "log_every", "timing_steps"),
    results=("val_loss.<optimizer>", "diverged_at.<optimizer>?", "initial_val_loss", "state_bytes_ratio.<size>?",
             "model_and_optimizer_ratio.<size>?", "step_time_s.<optimizer>?", "step_time_ratio.scale_vs_adamw",
             "scale_vs_adamw_val_loss_rel?", "tokens", "params"),
    paper="scale", claims=(
        Claim("matches_adamw", "SCALE reaches AdamW's validation loss (within 2%) at an equal token budget",
              "C4 ppl 30.81 vs Adam 30.05 at 60M; better than Adam from 130M",
              "{val_loss.scale} <= 1.02 * {val_loss.adamw}"),
        Claim("below_galore", "SCALE reaches a lower validation loss than GaLore at an equal token budget",
              "below GaLore, Fira and APOLLO at every size", "{val_loss.scale} < {val_loss.galore}"),
        Claim("state_memory", "SCALE's weights plus optimizer state are at most 45% of AdamW's (LLaMA-1B shapes)",
              "total memory 35-45% of Adam's", "{model_and_optimizer_ratio.llama-1b} <= 0.45",
              presets=("smoke", "cpu", "full")),
        Claim("step_time", "a SCALE step is no slower than an AdamW step", "no slower than Adam",
              "{step_time_ratio.scale_vs_adamw} <= 1.0"),
    )))
