"""Pretrain a decoder LM (LLaMA architecture, arXiv 2302.13971) with next-token loss on a text corpus.

The default corpus is CPython's standard-library sources (present on every machine), byte-tokenized; the
`full` preset is the GaLore LLaMA-60M setting (arXiv 2403.03507: batch 512, sequence 256, lr 1e-3, 10%
warmup then cosine to 10%) on a corpus given by path. Checkpoints (train state + data iterator state) every
`checkpoint.every` steps; `--resume` continues from the latest complete one. `--resume --set steps=N` trains a
finished or interrupted run on to N steps: the learning-rate schedule is rebuilt for N total steps (warmup
unchanged), so a cosine continues from the rebuilt curve's value at the resumed step, not from where the old
curve ended.

  python -m experiments run lm_pretrain --preset cpu
  python -m experiments run lm_pretrain --preset full --set corpus.path=/data/c4.jsonl \\
      --set corpus.tokenizer=/tok/dir
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os

import jax

from experiments import registry
from experiments._shared import config as shared_cfg
from experiments._shared.data import load_corpus
from experiments._shared.records import dedupe, median
from experiments._shared.recipes import byte_model, compute_dtype, optimizer, train_step as make_step
from experiments.runner import plan as plan_lib
from jaxlab import data as data_lib
from jaxlab import losses, optim
from jaxlab import sharding as shd
from jaxlab.models import transformer as tfm
from jaxlab.train import loop as loop_lib
from jaxlab.train import metrics as metrics_lib
from jaxlab.train import schedules
from jaxlab.train import state as state_lib
from jaxlab.train import step as step_lib
from jaxlab.train.checkpoint import Checkpointer


def check_train_fields(cfg) -> None:
  """Validates the optimizer fields shared by training configs (optimizer, lr, warmup_steps, steps, grad_clip,
  weight_decay, mesh), naming the field."""
  if cfg.optimizer not in optim.names():
    raise ValueError(f"optimizer must be one of {optim.names()}, found {cfg.optimizer!r}")
  if not (math.isfinite(cfg.lr) and cfg.lr > 0):
    raise ValueError(f"lr must be a finite number > 0, found {cfg.lr}")
  if not 0 <= cfg.warmup_steps <= cfg.steps:
    raise ValueError(f"warmup_steps must be in [0, steps={cfg.steps}], found {cfg.warmup_steps}")
  if not cfg.grad_clip >= 0:
    raise ValueError(f"grad_clip must be >= 0 (0: no clipping), found {cfg.grad_clip}")
  if not cfg.weight_decay >= 0:
    raise ValueError(f"weight_decay must be >= 0, found {cfg.weight_decay}")
  if not 0.0 <= cfg.lr_floor <= 1.0:
    raise ValueError(f"lr_floor must be in [0, 1] (a fraction of lr), found {cfg.lr_floor}")
  shd.mesh_sizes(cfg.mesh, None)


@dataclasses.dataclass(frozen=True)
class Config:
  """lm_pretrain settings. batch_size is global (split over processes); lr is the peak rate."""
  model: tfm.Config = byte_model(64, 2, 4, 176, 512)
  steps: int = 30
  batch_size: int = 8
  seq_len: int = 64
  microbatches: int = 1
  optimizer: optim.Optimizer = "adamw"
  lr: float = 3e-3
  schedule: schedules.Schedule = "cosine"
  warmup_steps: int = 3
  lr_floor: float = 0.1
  weight_decay: float = 0.0
  b1: float = 0.9
  b2: float = 0.95
  grad_clip: float = 1.0
  corpus: shared_cfg.Corpus = shared_cfg.Corpus()
  eval: shared_cfg.Eval = shared_cfg.Eval()
  checkpoint: shared_cfg.Checkpoint = shared_cfg.Checkpoint()  # every 0: only at the end
  log_every: int = 10
  mesh: str | None = None
  strategy: shd.Strategy = "dp"
  seed: int = 0
  renamed_keys = shared_cfg.FLAT_KEYS

  def __post_init__(self):
    for name in ("steps", "batch_size", "seq_len", "microbatches", "log_every"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, found {getattr(self, name)}")
    if self.batch_size % self.microbatches:
      raise ValueError(f"batch_size ({self.batch_size}) must be divisible by microbatches ({self.microbatches})")
    if self.seq_len > self.model.max_position_embeddings:
      raise ValueError(f"seq_len ({self.seq_len}) exceeds model.max_position_embeddings "
                       f"({self.model.max_position_embeddings})")
    if self.strategy not in shd.RULES:
      raise ValueError(f"strategy must be one of {sorted(shd.RULES)}, found {self.strategy!r}")
    if self.schedule not in schedules.SCHEDULES:
      raise ValueError(f"schedule must be one of {sorted(schedules.SCHEDULES)}, found {self.schedule!r}")
    check_train_fields(self)


PRESETS = {
    "smoke": Config(corpus=shared_cfg.Corpus(max_docs=300), eval=shared_cfg.Eval(batches=2)),
    "cpu": Config(model=byte_model(256, 4, 4, 688, 512), steps=300, batch_size=16, seq_len=128, lr=2e-3,
                  warmup_steps=30, eval=shared_cfg.Eval(100, 8), checkpoint=shared_cfg.Checkpoint(100),
                  log_every=10),
    "full": Config(model=dataclasses.replace(tfm.PRESETS["llama-60m"], dtype="bfloat16"), steps=10_000,
                   batch_size=512, seq_len=256, lr=1e-3, warmup_steps=1000, b2=0.999, weight_decay=0.0,
                   corpus=shared_cfg.Corpus(registry.Required("--set corpus.path=PATH")),
                   eval=shared_cfg.Eval(1000, 20), checkpoint=shared_cfg.Checkpoint(1000), log_every=50,
                   mesh="fsdp:-1", strategy="fsdp"),
}


def _optimizer(cfg: Config):
  """(schedule, optimizer) of a run."""
  schedule = schedules.get(cfg.schedule, cfg.lr, cfg.steps, cfg.warmup_steps, cfg.lr_floor)
  hp = {"b1": cfg.b1, "b2": cfg.b2, "weight_decay": cfg.weight_decay} if cfg.optimizer == "adamw" else {}
  return schedule, optimizer(schedule, cfg.optimizer, cfg.grad_clip, axes=tfm.AXES, **hp)


def _steps(cfg: Config, tx, schedule, state, mesh):
  """The jitted train step (sharded like `state`, real or abstract) and eval step a run calls."""
  loss_fn = losses.lm_loss_fn(cfg.model)
  compute = compute_dtype(cfg.model)
  train_step = make_step(loss_fn, tx, state, mesh, cfg.strategy, axes=tfm.AXES, microbatches=cfg.microbatches,
                         compute=compute, schedule=schedule)
  return train_step, step_lib.make_eval_step(loss_fn, compute)


def workloads(cfg: Config, mesh) -> list[plan_lib.Workload]:
  """The train and eval steps a run calls, with abstract arguments at the preset's shapes (`experiments plan`)."""
  schedule, tx = _optimizer(cfg)
  state = state_lib.abstract_state(functools.partial(tfm.init, cfg.model), tx, mesh, cfg.strategy, axes=tfm.AXES)
  train_step, eval_step = _steps(cfg, tx, schedule, state, mesh)
  batch = shd.abstract_rows({k: ((cfg.batch_size, cfg.seq_len), "int32") for k in data_lib.KEYS}, mesh)
  train_flops = tfm.flops_per_token(cfg.model, cfg.seq_len) * cfg.batch_size * cfg.seq_len
  evals = (cfg.steps // cfg.eval.every if cfg.eval.every else 0) + (1 if cfg.eval.every == 0 or cfg.steps %
                                                                      cfg.eval.every else 0)
  return [plan_lib.Workload("train_step", "train", train_step, (state, batch), cfg.steps, train_flops),
          plan_lib.Workload("eval_step", "forward", eval_step, (state.params, batch), evals * cfg.eval.batches,
                            train_flops / 3)]


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  tok = data_lib.load_tokenizer(cfg.corpus.tokenizer)
  if cfg.model.vocab_size < tok.vocab_size:
    raise ValueError(f"model.vocab_size ({cfg.model.vocab_size}) is smaller than the tokenizer's "
                     f"({tok.vocab_size})")
  nproc = jax.process_count()
  if cfg.batch_size % nproc:
    raise ValueError(f"batch_size ({cfg.batch_size}) must be divisible by the process count ({nproc})")
  mesh = shd.make_mesh(cfg.mesh)
  docs = load_corpus(cfg.corpus.path, cfg.corpus.max_docs)
  local_b = cfg.batch_size // nproc
  train_it = data_lib.lm_batches(docs, tok, cfg.seq_len, local_b, seed=cfg.seed, split="train",
                                 val_fraction=cfg.corpus.val_fraction)
  val_it = data_lib.lm_batches(docs, tok, cfg.seq_len, local_b, split="val",
                               val_fraction=cfg.corpus.val_fraction,
                               num_epochs=None)  # repeats: every process evaluates eval.batches batches
  val_start = val_it.get_state()

  schedule, tx = _optimizer(cfg)
  init_params = functools.partial(tfm.init, cfg.model)
  ckpt = Checkpointer(os.path.join(out_dir, "checkpoints"), keep=cfg.checkpoint.keep)
  state = None
  if resume:
    restored = ckpt.restore_latest(target=state_lib.abstract_state(init_params, tx, mesh, cfg.strategy, axes=tfm.AXES))
    if restored is not None:
      if restored.step > cfg.steps:
        raise ValueError(f"--resume: the checkpoint is at step {restored.step}, past steps={cfg.steps}; "
                         f"steps may only grow on resume")
      state = state_lib.as_train_state(restored.state)
      if restored.data_state is not None:
        train_it.set_state(loop_lib.local_data_state(restored.data_state))
      print(f"resumed from step {restored.step} in {ckpt.directory}", flush=True)
  if state is None:
    state = state_lib.init_state(init_params, tx, cfg.seed, mesh, cfg.strategy, axes=tfm.AXES)

  train_step, eval_step = _steps(cfg, tx, schedule, state, mesh)
  shard = functools.partial(shd.shard_batch, mesh=mesh)

  def eval_fn(params):
    val_it.set_state(val_start)
    return {"val_loss": loop_lib.evaluate(eval_step, params, val_it, shard, cfg.eval.batches)}

  metrics_path = os.path.join(out_dir, "metrics.jsonl")
  fpt = tfm.flops_per_token(cfg.model, cfg.seq_len)
  result = loop_lib.train_loop(state, train_step, train_it, cfg.steps, shard_fn=shard, checkpointer=ckpt,
                               ckpt_every=cfg.checkpoint.every, eval_fn=eval_fn, eval_every=cfg.eval.every,
                               metrics_path=metrics_path, log_every=cfg.log_every, flops_per_token=fpt,
                               metadata={"experiment": "lm_pretrain"}, desc="lm_pretrain")
  ckpt.close()

  records = dedupe(metrics_lib.read_jsonl(metrics_path))
  train = [r for r in records if "loss" in r]
  val = [r for r in records if "val_loss" in r]
  this_run = result.history
  tps = median(r.get("tokens_per_s") for r in this_run)
  if jax.process_index() == 0:
    registry.plot_curves(os.path.join(out_dir, "loss.png"),
                         {"train": ([r["step"] for r in train], [r["loss"] for r in train]),
                          "val": ([r["step"] for r in val], [r["val_loss"] for r in val])},
                         title=f"lm_pretrain: {tfm.num_params(result.state.params) / 1e6:.2f}M params")
  return {
      "initial_train_loss": train[0]["loss"] if train else float("nan"),
      "final_train_loss": train[-1]["loss"] if train else float("nan"),
      "final_val_loss": result.last_eval.get("val_loss", float("nan")),
      "tokens_per_s": tps,
      "mfu": metrics_lib.mfu(fpt, tps) if math.isfinite(tps) else float("nan"),
      "steps": cfg.steps,
      "params": tfm.num_params(result.state.params),
      "flops_per_token": fpt,
      "peak_flops": metrics_lib.peak_flops(),
      "devices": jax.device_count(),
      "processes": nproc,
      "mesh": ",".join(f"{k}:{v}" for k, v in mesh.shape.items()),
  }


registry.register(registry.Experiment(
    name="lm_pretrain", config_cls=Config, presets=PRESETS, run=run,
    description="pretrain a LLaMA-style decoder LM on the stdlib corpus (byte tokens)",
    resume_may_change=("mesh", "strategy", "log_every", "steps"), plan=workloads,
    results=("initial_train_loss", "final_train_loss", "final_val_loss", "tokens_per_s", "mfu", "steps", "params",
             "flops_per_token", "peak_flops", "devices", "processes", "mesh")))
