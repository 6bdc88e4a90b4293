"""The run of mind: what `python -m experiments run mind` executes (its Config, presets and claims are in
`experiments/mind/__init__.py`, the paper and its departures in `experiments/mind/README.md`)."""
from __future__ import annotations

import json
import os

import jax
import numpy as np

from experiments._shared import recipes, vlm_pipeline as pipe
from experiments.mind import data as data_lib, rad
from experiments.runner import splits
from jaxlab import losses
from jaxlab.data import load_tokenizer
from jaxlab.data.tasks import scenes as scenes_lib
from jaxlab.models import vlm
from jaxlab.train import loop as loop_lib, metrics as metrics_lib, schedules, state as state_lib, step as step_lib
from experiments.mind import Config


def _vlm(cfg: Config, out_dir: str, resume: bool):
  if cfg.vlm_path is not None:
    return pipe.load_checkpoint(cfg.vlm_path), "checkpoint"
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


class Trainer:
  """One jitted step per loss (CE only; CE + MCA), reused by every method and phase of the same shapes."""

  def __init__(self, cfg: Config, vcfg, out_dir: str):
    self.cfg, self.out_dir = cfg, out_dir
    self.tx, sched = _optimizer(cfg)
    ce = losses.mind_loss_fn(vcfg, alpha=0.0)
    mca = losses.mind_loss_fn(vcfg, alpha=cfg.alpha, margin=cfg.margin, top_k=cfg.top_k)
    self.steps = {"ce": jax.jit(step_lib.make_train_step(ce, self.tx, schedule=sched)),
                  "mca": jax.jit(step_lib.make_train_step(mca, self.tx, schedule=sched))}

  def fit(self, name: str, params, sampler, steps: int, loss: str = "ce"):
    state = state_lib.create(params, self.tx, self.cfg.seed)
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
    return state.params


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
  trainer = Trainer(cfg, vcfg, out_dir)
  k = max(len(q.positives) for q in train_q.questions)
  b, steps = cfg.questions_per_step, cfg.phase1_steps + cfg.phase2_steps
  res = {"vlm": origin, "train.questions": len(train_q.questions), "test.questions": len(test_q.questions)}
  fit_seed = cfg.seed + 11
  models = {}
  for method, style in (("sft_answer", "answer"), ("sft_rationale", "rationale")):
    models[method] = trainer.fit(method, params0, enc.sft_sampler(train_q, style, b, k, fit_seed), steps)
  for name, alpha in (("mind", cfg.alpha), ("mind_no_mca", 0.0)):
    p1 = trainer.fit(f"{name}.phase1", params0, enc.phase1_sampler(train_q, cfg.questions_per_step, k,
                                                                    negatives=alpha > 0, seed=fit_seed),
                     cfg.phase1_steps, "mca" if alpha > 0 else "ce")
    p2 = trainer.fit(f"{name}.phase2", p1, enc.phase2_sampler(train_q, b, k, fit_seed), cfg.phase2_steps)
    models[name] = (p1, p2)

  new1 = enc.max_target(train_q, 1) + 4
  new2 = enc.max_target(train_q, 2) + 4
  # one decoder length per phase over every split (one compilation each)
  longest = max(len(enc.prompt(q)) for split in (test_q, test_mis) if split for q in split.questions)
  len1, len2 = longest + new1, longest + new1 + 2 + new2
  evals = {"": test_q} if test_mis is None else {"": test_q, "_misleading": test_mis}
  outputs = {}
  for suffix, split in evals.items():
    answers = [q.answer for q in split.questions]
    for method, new in (("sft_answer", 4), ("sft_rationale", new1)):
      out = outputs[method + suffix] = enc.generate(models[method], split, None, cfg.eval_batch, new, len1)
      res[f"accuracy{suffix}.{method}"] = _accuracy([data_lib.final_answer(o) for o in out], answers)
    for name in ("mind", "mind_no_mca") if not suffix else ("mind",):
      p1, p2 = models[name]
      r1 = outputs[f"{name}.phase1{suffix}"] = enc.generate(p1, split, None, cfg.eval_batch, new1, len1)
      given = [data_lib.rationale_of(o) for o in r1]
      out = outputs[name + suffix] = enc.generate(p2, split, given, cfg.eval_batch, new2, len2)
      acc = _accuracy([data_lib.final_answer(o) for o in out], answers)
      res[f"accuracy{suffix}.{name}.phase1"] = _accuracy([data_lib.final_answer(o) for o in r1], answers)
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
  res["steps"] = steps
  if jax.process_index() == 0:
    with open(os.path.join(out_dir, "samples.json"), "w") as f:
      json.dump([{"question": q.prompt, "answer": q.answer, "given_negative": given[i],
                  **{k: " ".join(v[i]) for k, v in outputs.items() if i < len(v)}}
                 for i, q in enumerate(test_q.questions[:12])], f, indent=1)
  return res
