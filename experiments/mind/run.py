"""The run of mind: what `python -m experiments run mind` executes (its Config, presets and claims are in
`experiments/mind/__init__.py`, the paper and its departures in `experiments/mind/README.md`)."""
from __future__ import annotations

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from experiments._shared import recipes, vlm_pipeline as pipe
from experiments.mind import data as data_lib, rad
from experiments.runner import splits
from jaxlab import losses
from jaxlab import sharding as shd
from jaxlab.data import load_tokenizer
from jaxlab.data.tasks import scenes as scenes_lib
from jaxlab.models import vlm
from jaxlab.train import loop as loop_lib, metrics as metrics_lib, schedules, state as state_lib, step as step_lib
from experiments.mind import Config


FULL_DTYPES = ("float32", "bfloat16")  # a checkpoint's params (AdamW's master copy) and compute dtype
PLAN_TEST_QUESTIONS = 4241  # planning: questions of a test file (ScienceQA's test split, the paper's largest)
PLAN_QUESTION_TOKENS = 64  # planning: a question's tokens (a phase-2 prompt's given rationale included)
PLAN_NEW_TOKENS = 64  # planning: tokens generated per answer (rationale and answer)


def _vlm(cfg: Config, out_dir: str, resume: bool):
  if cfg.vlm_path is not None:
    return pipe.load_checkpoint(cfg.vlm_path, *FULL_DTYPES, remat=True), "checkpoint"
  if not cfg.pretrained:
    words = scenes_lib.vocabulary(cfg.train.scenes)
    tok_dir = scenes_lib.save_tokenizer(os.path.join(out_dir, "scene_tokenizer"), words)
    vcfg = vlm.Config(vision=cfg.train.vision, text=cfg.train.text, image_token_id=words.index("<image>"),
                      feature_layers=(-1,))
    return pipe.Artifacts(vcfg, vlm.init(vcfg, jax.random.PRNGKey(cfg.seed)), load_tokenizer(tok_dir), {},
                          cfg.train.scenes), "random"
  for d in pipe.source_dirs(cfg.source, out_dir):
    art = pipe.load_artifacts(d, cfg.train)
    if art is not None:
      return art, "reused"
  art = pipe.load_artifacts(out_dir, cfg.train) if resume else None
  if art is not None:
    return art, "reused"
  return pipe.train_vlm(cfg.train, out_dir, resume), "trained"


def _optimizer(cfg: Config):
  sched = schedules.get("constant", cfg.lr, 1, cfg.warmup)
  return recipes.optimizer(sched, "adamw", grad_clip=1.0, b2=0.98, weight_decay=1e-4), sched


AXES = vlm.AXES + losses.MCA_AXES  # the VLM's params and, under MCA, the token projection `mca_head`


def with_mca_head(params, vcfg: vlm.Config, seed: int) -> dict:
  """The VLM's params and a fresh `mca_head` (MIND's token projection, trained in phase 1 and then dropped)."""
  dt = jax.tree.leaves(params["lm"]["embed"])[0].dtype
  return {**params, "mca_head": losses.mca_head_init(jax.random.PRNGKey(seed), vcfg.text.d_model, dt)}


def _init(vcfg: vlm.Config, loss: str, key):
  params = vlm.init(vcfg, key)
  return with_mca_head(params, vcfg, 0) if loss == "mca" else params


def train_steps(cfg: Config, vcfg: vlm.Config, tx, sched, mesh=None, states=None) -> dict:
  """{"ce": step, "mca": step}: the jitted train steps of CE alone and of CE + alpha * MCA (its params with
  `mca_head`). With `mesh`, each sharded like `states[loss]` (arrays or ShapeDtypeStructs), the state donated and
  params cast to the compute dtype inside the loss."""
  fns = {"ce": losses.mind_loss_fn(vcfg, alpha=0.0),
         "mca": losses.mind_loss_fn(vcfg, alpha=cfg.alpha, margin=cfg.margin, top_k=cfg.top_k)}
  if mesh is None:
    return {k: jax.jit(step_lib.make_train_step(fn, tx, schedule=sched)) for k, fn in fns.items()}
  return {k: recipes.train_step(fn, tx, states[k], mesh, cfg.strategy, axes=AXES,
                                compute=recipes.compute_dtype(vcfg.text), schedule=sched) for k, fn in fns.items()}


def abstract_states(cfg: Config, vcfg: vlm.Config, tx, mesh) -> dict:
  """{"ce", "mca"}: the abstract train states of the two steps on `mesh`."""
  return {k: state_lib.abstract_state(functools.partial(_init, vcfg, k), tx, mesh, cfg.strategy, axes=AXES)
          for k in ("ce", "mca")}


class Trainer:
  """One jitted step per loss (CE only; CE + MCA), reused by every method and phase of the same shapes; with
  `mesh`, the state is sharded by `cfg.strategy` and each fit starts from a copy of its params (the step donates)."""

  def __init__(self, cfg: Config, vcfg, out_dir: str, mesh=None):
    self.cfg, self.vcfg, self.out_dir, self.mesh = cfg, vcfg, out_dir, mesh
    self.tx, sched = _optimizer(cfg)
    states = None if mesh is None else abstract_states(cfg, vcfg, self.tx, mesh)
    self.steps = train_steps(cfg, vcfg, self.tx, sched, mesh, states)

  def fit(self, name: str, params, sampler, steps: int, loss: str = "ce"):
    """Trains `params` for `steps` under `loss` ("ce" or "mca"); returns the VLM's params (without `mca_head`)."""
    if loss == "mca":
      params = with_mca_head(params, self.vcfg, self.cfg.seed + 17)
    if self.mesh is None:
      state = state_lib.create(params, self.tx, self.cfg.seed)
    else:
      sh = shd.param_shardings(params, self.mesh, self.cfg.strategy, axes=AXES)
      params = jax.tree.map(lambda x, s: jax.device_put(x, s, may_alias=False), params, sh)
      state = state_lib.state_from_params(params, self.tx, self.cfg.seed, self.mesh, self.cfg.strategy,
                                          axes=AXES)
    step = self.steps[loss]
    with open(os.path.join(self.out_dir, "metrics.jsonl"), "a") as f:
      for s in range(steps):
        state, m = step(state, next(sampler))
        if not bool(m["finite"]):  # the step left the state as it was; a run that silently skips is no result
          msg, leaf = loop_lib.nonfinite_message(s + 1, jax.device_get(m), step_lib.leaf_paths(params), None)
          f.write(metrics_lib.json_line({"stage": name, "step": s, "event": "non_finite", "message": msg}))
          raise loop_lib.NonFiniteError(f"{name}: {msg}", s + 1, leaf)
        if s % self.cfg.log_every == 0 or s == steps - 1:
          f.write(metrics_lib.json_line({"stage": name, "step": s, "loss": float(m["loss"]),
                                         "grad_norm": float(m["grad_norm"])}))
    return {k: v for k, v in state.params.items() if k != "mca_head"}


def vlm_config(cfg: Config) -> vlm.Config:
  """The VLM a run at `cfg` fine-tunes, without weights: the checkpoint's (`vlm_path`) as the run loads it, else the
  scene VLM of `cfg.train` with the RAD words added."""
  if cfg.vlm_path is not None:
    return pipe.checkpoint_config(cfg.vlm_path, *FULL_DTYPES, remat=True)
  vcfg = pipe.scene_vlm_config(cfg.train)
  vocab = -(-len(rad.vocabulary(cfg.train.scenes)) // 16) * 16
  return vcfg.replace(text=vcfg.text.replace(vocab_size=max(vocab, vcfg.text.vocab_size)))


def workloads(cfg: Config, mesh) -> list:
  """The two train steps (`train_steps`: CE rows [questions_per_step, max_positives, seq_len]; CE + MCA on the same
  rows as [questions_per_step * max_positives, 1, seq_len] with each row's sampled positives' and negatives' tokens,
  one image per row) and the greedy decoder (`data.decoder`), with abstract arguments at the
  preset's shapes (`experiments plan`). Rows are planned at `seq_len` (with `trim_rows` a run pads to its longest
  row, at most that); the decoder's buffer, new tokens and test questions are the `PLAN_*` estimates."""
  from experiments.runner import plan as plan_lib
  vcfg = vlm_config(cfg)
  tx, sched = _optimizer(cfg)
  states = abstract_states(cfg, vcfg, tx, mesh)
  steps = train_steps(cfg, vcfg, tx, sched, mesh, states)
  b, k, t, s = cfg.questions_per_step, cfg.rad.max_positives, cfg.seq_len, vcfg.vision.image_size
  g, r = b * k, min(cfg.mca_rationales, k) + min(cfg.mca_rationales, len(rad.FLAWS))
  i32, f32 = "int32", "float32"
  ce = shd.abstract_rows({"inputs": ((b, k, t), i32), "targets": ((b, k, t), i32), "loss_mask": ((b, k, t), i32),
                          "pixels": ((b * k, s, s, 3), f32)}, mesh)
  mca = shd.abstract_rows({"inputs": ((g, 1, t), i32), "targets": ((g, 1, t), i32), "loss_mask": ((g, 1, t), i32),
                           "mca_targets": ((g, r, t), i32), "mca_role": ((g, r), i32), "pixels": ((g, s, s, 3), f32)},
                          mesh)
  p1, p2 = cfg.phase1_steps, cfg.phase2_steps
  e = cfg.eval_batch
  length = min(t, -(-(1 + vcfg.tokens_per_image + PLAN_QUESTION_TOKENS + PLAN_NEW_TOKENS) // 16) * 16)
  gen = shd.abstract_rows({"tokens": ((e, length), i32), "lengths": ((e,), i32),
                           "pixels": ((e, s, s, 3), f32)}, mesh)
  calls = 7 if cfg.vlm_path is not None else 11  # test split: 6 decodes + given negatives; + 4 on misleading cues
  questions = PLAN_TEST_QUESTIONS if cfg.vlm_path is not None else cfg.n_test_scenes * len(cfg.rad.kinds)
  state = states["ce"]
  return [plan_lib.Workload("train_step.ce", "train", steps["ce"], (state, ce), 3 * p1 + 3 * p2,
                            pipe.forward_flops(vcfg, b * k, b * k, t, train=True)),
          plan_lib.Workload("train_step.mca", "train", steps["mca"], (states["mca"], mca), p1,
                            pipe.forward_flops(vcfg, g, g, t, train=True)),
          plan_lib.Workload("generate", "generate", data_lib.decoder(vcfg, length, 0),
                            (state.params, gen["tokens"], gen["lengths"], gen["pixels"],
                             jax.ShapeDtypeStruct((), jnp.int32)), calls * -(-questions // e),
                            PLAN_NEW_TOKENS * pipe.forward_flops(vcfg, e, e, length), PLAN_NEW_TOKENS)]


def _accuracy(preds, answers) -> float:
  return float(np.mean([p == a for p, a in zip(preds, answers)])) if answers else 0.0


def vlm_training_captions(cfg: Config) -> list[str]:
  """The scenes (captions) the scene VLM trained on before MIND's training: none for a random or a checkpoint VLM."""
  if cfg.vlm_path is not None or not cfg.pretrained:
    return []
  from experiments._shared.vlm_pipeline import training_captions
  return training_captions(cfg.train, cfg.train.scenes)


def record_splits(out_dir: str, train_q, test_q, test_mis, vlm_captions=(), ids=None) -> dict:
  """Records the training questions and scenes (with the VLM's own training scenes) as `train`, the test ones as
  `test` and `misleading`; `ids` (full preset): the image ids of (train, test)."""
  train = data_lib.split_items(train_q, None if ids is None else ids[0])
  if vlm_captions:
    train["scenes"] = list(train["scenes"]) + list(vlm_captions)
  out = {"train": train, "test": data_lib.split_items(test_q, None if ids is None else ids[1])}
  if test_mis is not None:
    out["misleading"] = data_lib.split_items(test_mis, None if ids is None else ids[1])
  return splits.record(out_dir, "mind", out)


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  os.makedirs(out_dir, exist_ok=True)
  if cfg.vlm_path is None:  # the scenes the reused, trained or random VLM has
    seen = vlm_training_captions(cfg)
    drawn = data_lib.scene_splits(cfg, cfg.train.scenes, seen)
    record_splits(out_dir, *drawn, seen)
  art, origin = _vlm(cfg, out_dir, resume)
  if cfg.vlm_path is not None:
    enc = data_lib.Encoder(art.tokenizer, art.cfg, cfg.seq_len, cfg.trim_rows)
    vcfg, params0 = art.cfg, art.params
    train_q, test_q = data_lib.load_jsonl(cfg.train_path, art.cfg), data_lib.load_jsonl(cfg.test_path, art.cfg)
    test_mis = test_q._replace(questions=data_lib.mislead(test_q.questions, cfg.seed + 3)) if all(
        q.answer in rad.NUMBERS + ("yes", "no") for q in test_q.questions) else None
    record_splits(out_dir, train_q, test_q, test_mis,
                  ids=(data_lib.image_ids(cfg.train_path), data_lib.image_ids(cfg.test_path)))
  else:
    sc_cfg = art.scenes or cfg.train.scenes
    vcfg, params0, tok = data_lib.extend_vocab(art, rad.vocabulary(sc_cfg), os.path.join(out_dir, "tokenizer"),
                                               cfg.seed)
    enc = data_lib.Encoder(tok, vcfg, cfg.seq_len, cfg.trim_rows)
    train_q, test_q, test_mis = drawn if sc_cfg == cfg.train.scenes else data_lib.scene_splits(cfg, sc_cfg, seen)
  trainer = Trainer(cfg, vcfg, out_dir, None if cfg.mesh is None else shd.make_mesh(cfg.mesh))
  k = min(cfg.rad.max_positives, max(len(q.positives) for q in train_q.questions))
  b, steps = cfg.questions_per_step, cfg.phase1_steps + cfg.phase2_steps
  res = {"vlm": origin, "train.questions": len(train_q.questions), "test.questions": len(test_q.questions)}
  fit_seed = cfg.seed + 11
  models = {}
  for method, style in (("sft_answer", "answer"), ("sft_rationale", "rationale")):
    models[method] = trainer.fit(method, params0, enc.sft_sampler(train_q, style, b, k, fit_seed), steps)
  # phase 2 does not read alpha and starts from the same weights: the ablation shares MIND's phase-2 model
  p2 = trainer.fit("mind.phase2", params0, enc.phase2_sampler(train_q, b, k, fit_seed), cfg.phase2_steps)
  for name, alpha in (("mind", cfg.alpha), ("mind_no_mca", 0.0)):
    sampler = enc.phase1_sampler(train_q, b, k, cfg.mca_rationales, negatives=alpha > 0, seed=fit_seed)
    p1 = trainer.fit(f"{name}.phase1", params0, sampler, cfg.phase1_steps, "mca" if alpha > 0 else "ce")
    models[name] = (p1, p2)

  new1 = enc.max_target(train_q, 1) + 4
  new2 = enc.max_target(train_q, 2) + 4
  # one decoder length per phase over every split (one compilation each)
  longest = max(len(enc.prompt(q)) for split in (test_q, test_mis) if split for q in split.questions)
  len1, len2 = longest + new1, longest + new1 + 2 + new2
  evals = {"": test_q} if test_mis is None else {"": test_q, "_misleading": test_mis}
  outputs, items = {}, {}  # items: each test question's 0/1 per method, in question order (the claims' intervals)
  for suffix, split in evals.items():
    answers = [q.answer for q in split.questions]

    def score(key, out, answers=answers):
      right = [float(data_lib.final_answer(o) == a) for o, a in zip(out, answers)]
      items[key] = right
      return float(np.mean(right)) if right else 0.0

    for method, new in (("sft_answer", 4), ("sft_rationale", new1)):
      out = outputs[method + suffix] = enc.generate(models[method], split, None, cfg.eval_batch, new, len1)
      res[f"accuracy{suffix}.{method}"] = score(f"accuracy{suffix}.{method}", out)
    for name in ("mind", "mind_no_mca") if not suffix else ("mind",):
      p1, p2 = models[name]
      r1 = outputs[f"{name}.phase1{suffix}"] = enc.generate(p1, split, None, cfg.eval_batch, new1, len1)
      given = [data_lib.rationale_of(o) for o in r1]
      out = outputs[name + suffix] = enc.generate(p2, split, given, cfg.eval_batch, new2, len2)
      acc = score(f"accuracy{suffix}.{name}", out)
      if name == "mind":
        res[f"accuracy{suffix}.mind"] = acc
        res[f"verdict_wrong_share{suffix}.mind"] = float(np.mean([data_lib.verdict(o) == "wrong" for o in out]))
      else:
        res["mca_ablation.accuracy"] = acc
  given, flaws = data_lib.given_negatives(test_q, cfg.seed)
  out = outputs["mind.given_negative"] = enc.generate(models["mind"][1], test_q, given, cfg.eval_batch, new2, len2)
  fixed = [data_lib.verdict(o) == "wrong" and data_lib.final_answer(o) == q.answer
           for o, q in zip(out, test_q.questions)]
  res["correction_rate.mind"] = _accuracy(fixed, [True] * len(fixed))
  res["verdict_wrong_share.mind.given_negative"] = float(np.mean([data_lib.verdict(o) == "wrong" for o in out]))
  for flaw in rad.FLAWS:
    got = [f for f, fl in zip(fixed, flaws) if fl == flaw]
    if got:
      res[f"correction_rate.mind.{flaw}"] = float(np.mean(got))
  res["steps"], res["per_item"] = steps, items
  if jax.process_index() == 0:
    with open(os.path.join(out_dir, "samples.json"), "w") as f:
      json.dump([{"question": q.prompt, "answer": q.answer, "given_negative": given[i],
                  **{k: " ".join(v[i]) for k, v in outputs.items() if i < len(v)}}
                 for i, q in enumerate(test_q.questions[:12])], f, indent=1)
  return res
