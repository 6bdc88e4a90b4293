"""The run of scale: what `python -m experiments run scale` executes (its Config, presets and claims are in
`experiments/scale/__init__.py`, the paper and its departures in `experiments/scale/README.md`)."""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import time

import jax
import numpy as np
import optax

from experiments import registry
from experiments._shared.data import load_corpus
from experiments._shared.records import dedupe
from experiments._shared.recipes import compute_dtype, optimizer, train_step as make_step
from experiments.runner import plan as plan_lib, splits
from jaxlab import data as data_lib
from jaxlab import losses
from jaxlab import sharding as shd
from jaxlab.models import transformer as tfm
from jaxlab.optim import memory
from jaxlab.train import loop as loop_lib
from jaxlab.train import metrics as metrics_lib
from jaxlab.train import schedules
from jaxlab.train import state as state_lib
from jaxlab.train import step as step_lib
from jaxlab.train.checkpoint import Checkpointer
from experiments.scale import COLUMN_FAMILY, Config, LearningRates, PAPER_RANK, PAPER_SCHEDULE


def paper_learning_rates(size: str) -> LearningRates:
  """The full-scale rates: the SCALE scripts' lr for the column-normalized family and AdamW (the paper trains
  Adam on the same schedule), GaLore lr 0.01 with scale 0.25 (GaLore paper), APOLLO lr 0.01 (APOLLO paper),
  Muon 0.02 on hidden matrices (its authors' default) with AdamW at the SCALE lr elsewhere. Plain SGD has no
  published rate at this scale: 100x the SCALE lr (about the ratio found by the cpu sweep); tune it."""
  lr, _, _, adam_lr = PAPER_SCHEDULE[size]
  return LearningRates(adamw=lr, sgd=100 * lr, sgd_colnorm=lr, colnorm_momentum=lr, scale=lr, galore=1e-2,
                       apollo=1e-2, muon=2e-2, vector=adam_lr, muon_adam=lr)


@dataclasses.dataclass(frozen=True)
class Plan:
  """A Config with every paper default filled in."""
  model: tfm.Config
  steps: int
  warmup_steps: int
  lr: dict
  rank: int


def resolve(cfg: Config, vocab_size: int = 0) -> Plan:
  """Fills the fields left at None from the paper's values for `cfg.size`; the model's vocab grows to
  `vocab_size` when the tokenizer has more ids (the T5 tokenizer's 32100 vs the LLaMA configs' 32000)."""
  paper = PAPER_SCHEDULE.get(cfg.size)
  model = cfg.model or tfm.PRESETS[cfg.size].replace(dtype="bfloat16")
  if vocab_size > model.vocab_size:
    model = model.replace(vocab_size=vocab_size)
  if cfg.seq_len > model.max_position_embeddings:
    raise ValueError(f"seq_len ({cfg.seq_len}) exceeds model.max_position_embeddings "
                     f"({model.max_position_embeddings})")
  defaults = paper_learning_rates(cfg.size) if paper else LearningRates()
  lr = {f.name: getattr(cfg.lr, f.name) if getattr(cfg.lr, f.name) is not None else getattr(defaults, f.name)
        for f in dataclasses.fields(LearningRates)}
  rank = cfg.rank or (PAPER_RANK[cfg.size] if cfg.size else max(1, model.d_model // 4))
  steps = cfg.steps if cfg.steps is not None else paper[2]
  warmup = cfg.warmup_steps if cfg.warmup_steps is not None else paper[1]
  if not 0 <= warmup <= steps:
    raise ValueError(f"warmup_steps must be in [0, steps={steps}], found {warmup}")
  return Plan(model, steps, warmup, lr, rank)


def make_optimizer(name: str, cfg: Config, plan: Plan) -> optax.GradientTransformation:
  """Optimizer `name` with its peak rate on the run's warmup-cosine schedule (and clipping when asked)."""
  sched = lambda peak: schedules.get(cfg.schedule, peak, plan.steps, plan.warmup_steps, cfg.lr_floor)
  lr, wd = plan.lr[name], cfg.weight_decay
  if name == "adamw":
    hp = {}
  elif name in COLUMN_FAMILY:
    hp = {"adam_lr": plan.lr["vector"], "peak_lr": lr}
    hp.update({"momentum": cfg.momentum} if name in ("scale", "colnorm_momentum") else {})
  elif name == "galore":
    hp = {"rank": plan.rank, "update_proj_gap": cfg.update_proj_gap, "scale": cfg.galore_scale}
  elif name == "apollo":
    hp = {"rank": plan.rank, "update_proj_gap": cfg.update_proj_gap, "scale": cfg.apollo_scale, "seed": cfg.seed}
  else:
    hp = {"adam_lr": sched(plan.lr["muon_adam"])}
  return optimizer(sched(lr), name, cfg.grad_clip, axes=tfm.AXES, weight_decay=wd, **hp)


def split_documents(docs, val_fraction: float):
  """(training, evaluation) documents: the hash split of `docs` (`lm_batches`' "train" / "val"), less every
  evaluation document whose text is also a training document's (an empty file, a copy), so they share no text."""
  train, val = docs.split("train", val_fraction), docs.split("val", val_fraction)
  seen = {splits.digest(t) for t in train}
  keep = [i for i in range(len(val)) if splits.digest(val[i]) not in seen]
  if not keep:
    raise ValueError(f"corpus.val_fraction={val_fraction} leaves no evaluation document outside the training ones")
  return train, val.subset(keep, f"{val.name}[held out]")


def truncated_rows(docs, tok, seq_len: int, batch: int, tokens: int, seed: int = 42,
                   exclude: frozenset = frozenset()) -> tuple[list[dict], list]:
  """The reference's validation set (`torchrun_main_DDP.py:evaluate_model`): documents in a seeded shuffle, each
  tokenized with eos, cut to its first `seq_len` tokens (eos kept last, as the T5 tokenizer truncates) and padded;
  batches of `batch` rows are taken while fewer than `tokens` real tokens have been taken (so the last batch crosses
  it). A row's position i predicts its token i + 1. Returns (host batches {inputs, targets, loss_mask} [batch,
  seq_len], a last short one padded with empty rows; the documents they hold). Documents whose digest
  (`splits.digest`) is in `exclude` (the training documents') are skipped."""
  order = np.random.RandomState(seed).permutation(len(docs))
  out, rows, used, taken = [], [], [], 0
  for i in order:
    if taken >= tokens and not rows:
      break
    doc = docs[int(i)]  # read once (a corpus may read its documents from disk)
    if exclude and splits.digest(doc) in exclude:
      continue
    ids = tok.encode(doc, add_eos=tok.eos_id is not None)
    if len(ids) > seq_len:
      ids = ids[:seq_len - 1] + ids[-1:] if tok.eos_id is not None else ids[:seq_len]
    if len(ids) < 2:
      continue
    rows.append(ids)
    used.append(doc)
    taken += len(ids)
    if len(rows) == batch:
      out.append(rows)
      rows = []
  if rows:
    out.append(rows)
  pad = tok.batch_pad_id
  batches = []
  for rs in out:
    b = {k: np.full((batch, seq_len), pad if k != "loss_mask" else 0, np.int32) for k in ("inputs", "targets",
                                                                                           "loss_mask")}
    for r, ids in enumerate(rs):
      b["inputs"][r, :len(ids) - 1], b["targets"][r, :len(ids) - 1] = ids[:-1], ids[1:]
      b["loss_mask"][r, :len(ids) - 1] = 1
    batches.append(b)
  return batches, used


def state_bytes_ratios(sizes) -> dict:
  """SCALE's optimizer-state bytes over AdamW's, and params + state over AdamW's, per LLaMA size (fp32 params)."""
  out = {}
  for size in sizes:
    shapes = memory.param_shapes(tfm.PRESETS[size])
    p = memory.tree_bytes(shapes)
    s_scale, s_adam = memory.state_bytes("scale", shapes), memory.state_bytes("adamw", shapes)
    out[f"state_bytes_ratio.{size}"] = s_scale / s_adam
    out[f"model_and_optimizer_ratio.{size}"] = (p + s_scale) / (p + s_adam)
  return out


def median_step_times(steps: dict, batch, n: int) -> dict:
  """Median seconds per step of each compiled `(train_step, state)`, interleaved on one batch (order alternating
  per round so neither optimizer always runs first)."""
  states, times = {k: s for k, (_, s) in steps.items()}, {k: [] for k in steps}
  for k, (f, _) in steps.items():  # warm-up: compiles a step not yet compiled
    states[k], m = f(states[k], batch)
    jax.block_until_ready((states[k], m))
  order = list(steps)
  for i in range(n):
    for k in order if i % 2 == 0 else order[::-1]:
      t0 = time.perf_counter()
      states[k], m = steps[k][0](states[k], batch)
      jax.block_until_ready((states[k], m))
      times[k].append(time.perf_counter() - t0)
  return {k: float(np.median(v)) for k, v in times.items()}


def fresh_state(params0, tx, seed: int, mesh, rules) -> state_lib.TrainState:
  """`state_lib.init_state`'s state from a copy of the shared initial params (the train step donates its
  state), so the model's init compiles once for all optimizers."""
  params = jax.tree.map(lambda x: jax.device_put(x, x.sharding, may_alias=False), params0)
  return state_lib.state_from_params(params, tx, seed, mesh, rules, axes=tfm.AXES)


def _train_step(cfg: Config, plan: Plan, tx, state, mesh):
  """The jitted train step of one optimizer (sharded like `state`, real or abstract)."""
  return make_step(losses.lm_loss_fn(plan.model), tx, state, mesh, cfg.strategy, axes=tfm.AXES,
                   microbatches=cfg.microbatches, compute=compute_dtype(plan.model))


PLAN_VAL_ROW_TOKENS = 230  # planning: real tokens of a truncated C4 validation row of 256 (most documents are longer)


def workloads(cfg: Config, mesh) -> list[plan_lib.Workload]:
  """Each optimizer's train step and the eval step a run calls, with abstract arguments at the preset's shapes
  (`experiments plan`; the model's vocabulary as configured, before a tokenizer with more ids widens it)."""
  plan = resolve(cfg)
  init_params = functools.partial(tfm.init, plan.model)
  batch = shd.abstract_rows({k: ((cfg.batch_size, cfg.seq_len), "int32") for k in data_lib.KEYS}, mesh)
  flops = tfm.flops_per_token(plan.model, cfg.seq_len) * cfg.batch_size * cfg.seq_len
  evals = (plan.steps // cfg.eval.every if cfg.eval.every else 0) + 2  # every `every` steps, at the end, at init
  out, state = [], None
  for name in cfg.optimizers:
    tx = make_optimizer(name, cfg, plan)
    state = state_lib.abstract_state(init_params, tx, mesh, cfg.strategy, axes=tfm.AXES)
    out.append(plan_lib.Workload(f"train_step.{name}", "train", _train_step(cfg, plan, tx, state, mesh),
                                 (state, batch), plan.steps, flops))
  eval_step = step_lib.make_eval_step(losses.lm_loss_fn(plan.model), compute_dtype(plan.model))
  per_eval = cfg.eval.batches if cfg.val_path is None else -(-cfg.val_tokens // (PLAN_VAL_ROW_TOKENS * cfg.batch_size))
  out.append(plan_lib.Workload("eval_step", "forward", eval_step, (state.params, batch),
                               evals * len(cfg.optimizers) * per_eval, flops / 3))
  return out


def _train_one(name, cfg, plan, mesh, docs, tok, eval_fn, opt_dir, resume, init_params, params0):
  """Trains one optimizer; returns (summary dict, metrics records, (train_step, final state) or None)."""
  os.makedirs(opt_dir, exist_ok=True)
  done_path = os.path.join(opt_dir, "done.json")
  records_path = os.path.join(opt_dir, "metrics.jsonl")
  if resume and os.path.exists(done_path):
    with open(done_path) as f:
      return json.load(f), dedupe(metrics_lib.read_jsonl(records_path)), None
  tx = make_optimizer(name, cfg, plan)
  local_b = cfg.batch_size // jax.process_count()
  train_it = data_lib.lm_batches(docs, tok, cfg.seq_len, local_b, seed=cfg.seed,
                                 split=None if cfg.val_path is not None else "train",
                                 val_fraction=cfg.corpus.val_fraction)
  ckpt = (Checkpointer(os.path.join(opt_dir, "checkpoints"), keep=cfg.checkpoint.keep) if cfg.checkpoint.every
          else None)
  state = None
  if resume and ckpt is not None:
    restored = ckpt.restore_latest(target=state_lib.abstract_state(init_params, tx, mesh, cfg.strategy, axes=tfm.AXES))
    if restored is not None:
      state = state_lib.as_train_state(restored.state)
      if restored.data_state is not None:
        train_it.set_state(loop_lib.local_data_state(restored.data_state))
  if state is None:
    if os.path.exists(records_path):
      os.remove(records_path)
    state = fresh_state(params0, tx, cfg.seed, mesh, cfg.strategy)
  train_step = _train_step(cfg, plan, tx, state, mesh)
  summary = {"diverged_at": None}
  try:
    result = loop_lib.train_loop(state, train_step, train_it, plan.steps,
                                 shard_fn=functools.partial(shd.shard_batch, mesh=mesh), checkpointer=ckpt,
                                 ckpt_every=cfg.checkpoint.every, eval_fn=eval_fn, eval_every=cfg.eval.every,
                                 metrics_path=records_path, log_every=cfg.log_every,
                                 metadata={"experiment": "scale", "optimizer": name}, desc=f"scale:{name}")
    summary["val_loss"] = result.last_eval.get("val_loss", float("nan"))
    kept = (train_step, result.state)
  except loop_lib.NonFiniteError as e:
    summary.update(val_loss=float("nan"), diverged_at=e.step)
    kept = None
  finally:
    if ckpt is not None:
      ckpt.close()
  records = dedupe(metrics_lib.read_jsonl(records_path))
  train = [r for r in records if "loss" in r]
  summary["train_loss"] = train[-1]["loss"] if train else float("nan")
  if jax.process_index() == 0:
    with open(done_path, "w") as f:
      json.dump(summary, f)
  return summary, records, kept


def _write_table(path, cfg, plan, summaries, state_bytes, ratios) -> None:
  lines = [f"Equal token budget: {plan.steps} steps x {cfg.batch_size} x {cfg.seq_len} tokens; model "
           f"d_model={plan.model.d_model}, layers={plan.model.n_layers}, vocab={plan.model.vocab_size}.", "",
           "| optimizer | peak lr | final val loss | final train loss | diverged at | state bytes | state / AdamW |",
           "|---|---|---|---|---|---|---|"]
  adam = state_bytes.get("adamw") or memory.state_bytes("adamw", memory.param_shapes(plan.model))
  for name, s in summaries.items():
    lines.append(f"| {name} | {plan.lr[name]:.3g} | {s['val_loss']:.4f} | {s['train_loss']:.4f} | "
                 f"{s['diverged_at'] or '-'} | {state_bytes[name]} | {state_bytes[name] / adam:.3f} |")
  lines += ["", "| LLaMA size | SCALE state / AdamW state | (params + SCALE state) / (params + AdamW state) |",
            "|---|---|---|"]
  for size in cfg.memory_sizes:
    lines.append(f"| {size} | {ratios[f'state_bytes_ratio.{size}']:.4f} | "
                 f"{ratios[f'model_and_optimizer_ratio.{size}']:.4f} |")
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  tok = data_lib.load_tokenizer(cfg.corpus.tokenizer)
  plan = resolve(cfg, tok.vocab_size)
  if cfg.batch_size % jax.process_count():
    raise ValueError(f"batch_size ({cfg.batch_size}) must be divisible by the process count "
                     f"({jax.process_count()})")
  mesh = shd.make_mesh(cfg.mesh)
  docs = load_corpus(cfg.corpus.path, cfg.corpus.max_docs)
  local_b = cfg.batch_size // jax.process_count()
  shard = functools.partial(shd.shard_batch, mesh=mesh)
  compute = compute_dtype(plan.model)
  eval_step = step_lib.make_eval_step(losses.lm_loss_fn(plan.model), compute)
  if cfg.val_path is not None:  # a validation corpus of its own, truncated and padded as the reference reads C4's
    seen = frozenset(splits.digest(d) for d in docs)  # a validation document that is also a training one is skipped
    val_rows, val_docs = truncated_rows(load_corpus(cfg.val_path, None), tok, cfg.seq_len, cfg.batch_size,
                                        cfg.val_tokens, exclude=seen)
    splits.record(out_dir, "scale", {"train": {"documents": list(docs)}, "test": {"documents": val_docs}})
    p, n = jax.process_index(), jax.process_count()
    local = [{k: v[p * local_b:(p + 1) * local_b] for k, v in b.items()} for b in val_rows] if n > 1 else val_rows

    def eval_fn(params):
      return {"val_loss": loop_lib.evaluate(eval_step, params, local, shard)}
  else:
    train_docs, val_docs = split_documents(docs, cfg.corpus.val_fraction)
    splits.record(out_dir, "scale", {"train": {"documents": list(train_docs)},
                                     "test": {"documents": list(val_docs)}})
    val_it = data_lib.lm_batches(val_docs, tok, cfg.seq_len, local_b, split=None, num_epochs=None, shuffle=False,
                                 drop_remainder=False)
    val_start = val_it.get_state()

    def eval_fn(params):
      val_it.set_state(val_start)
      return {"val_loss": loop_lib.evaluate(eval_step, params, val_it, shard, cfg.eval.batches)}

  init_params = functools.partial(tfm.init, plan.model)
  params0 = shd.sharded_init(init_params, mesh, cfg.strategy, jax.random.PRNGKey(cfg.seed), axes=tfm.AXES)
  init_val = eval_fn(params0)["val_loss"]
  summaries, curves, kept = {}, {}, {}
  for name in cfg.optimizers:
    s, records, k = _train_one(name, cfg, plan, mesh, docs, tok, eval_fn, os.path.join(out_dir, name), resume,
                               init_params, params0)
    summaries[name] = s
    val = [r for r in records if "val_loss" in r]
    curves[name] = ([0] + [r["step"] for r in val], [init_val] + [r["val_loss"] for r in val])
    if name in ("adamw", "scale") and k is not None:
      kept[name] = k

  results = {f"val_loss.{n}": s["val_loss"] for n, s in summaries.items()}
  results.update({f"diverged_at.{n}": s["diverged_at"] for n, s in summaries.items() if s["diverged_at"]})
  results["initial_val_loss"] = init_val
  ratios = state_bytes_ratios(cfg.memory_sizes)
  results.update(ratios)
  shapes = memory.param_shapes(plan.model)
  state_bytes = {n: memory.state_bytes(make_optimizer(n, cfg, plan), shapes) for n in cfg.optimizers}

  ratio = float("nan")
  if cfg.timing_steps > 0:
    batch = shard(next(iter(data_lib.lm_batches(docs, tok, cfg.seq_len, local_b, seed=cfg.seed + 1,
                                                split="train", val_fraction=cfg.corpus.val_fraction))))
    pairs = {}
    for name in ("adamw", "scale"):
      if name in kept:
        pairs[name] = kept.pop(name)
      else:  # not trained in this invocation (resumed or not selected): a fresh state, compiled here
        tx = make_optimizer(name, cfg, plan)
        state = fresh_state(params0, tx, cfg.seed, mesh, cfg.strategy)
        pairs[name] = (_train_step(cfg, plan, tx, state, mesh), state)
    times = median_step_times(pairs, batch, cfg.timing_steps)
    ratio = times["scale"] / times["adamw"]
    results.update({"step_time_s.adamw": times["adamw"], "step_time_s.scale": times["scale"]})
  results["step_time_ratio.scale_vs_adamw"] = ratio
  if "adamw" in summaries and "scale" in summaries:
    results["scale_vs_adamw_val_loss_rel"] = summaries["scale"]["val_loss"] / summaries["adamw"]["val_loss"] - 1
  results.update(tokens=plan.steps * cfg.batch_size * cfg.seq_len, params=tfm.num_params(shapes))

  if jax.process_index() == 0:
    with open(os.path.join(out_dir, "metrics.jsonl"), "w") as f:
      for name in cfg.optimizers:
        for r in metrics_lib.read_jsonl(os.path.join(out_dir, name, "metrics.jsonl")):
          f.write(metrics_lib.json_line({"optimizer": name, **r}))
    registry.plot_curves(os.path.join(out_dir, "val_loss.png"), curves, ylabel="validation loss",
                         title=f"{tfm.num_params(shapes):,} params, {results['tokens']:,} tokens per optimizer")
    _write_table(os.path.join(out_dir, "table.md"), cfg, plan, summaries, state_bytes, ratios)
  return results
