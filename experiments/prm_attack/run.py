"""The run of prm_attack: what `python -m experiments run prm_attack` executes (its Config, presets and claims are in
`experiments/prm_attack/__init__.py`, the paper and its departures in `experiments/prm_attack/README.md`)."""
from __future__ import annotations

import json
import math
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments import registry
from experiments._shared import adapters, recipes
from experiments.runner import plan as plan_lib, splits
from experiments._shared.chat_models import load_chat_model
from jaxlab import losses
from jaxlab import sharding as shd
from jaxlab.data import tokenizers
from jaxlab.data.tasks import arithmetic as ar
from jaxlab.hf import reward as hf_reward
from jaxlab.hf.family import by_model_type
from jaxlab.hf import hub
from jaxlab.models import heads, transformer as tfm
from jaxlab.rl import GRPOConfig, PromptCycle
from experiments.prm_attack import reward_attack
from jaxlab.train import rl_loop, state as state_lib, step as step_lib
from experiments.prm_attack import Config, LOGIC, STYLE, _STEP, _WORDS


def _parse(step: str):
  m = _STEP.match(step)
  if m is None:
    raise ValueError(f"expected a step 'a+b=c', found {step!r}")
  return int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))


def perturb(ex: ar.StepLabelled, kind: str, other: ar.StepLabelled, rng: np.random.Generator):
  """(prompt, steps) of a correct solution rewritten by `kind`."""
  steps, prompt = list(ex.steps), ex.prompt
  if kind == "rephrase":
    steps = [f"{a} {_WORDS[o]} {b} gives {c}" for a, o, b, c in map(_parse, steps)]
  elif kind == "format":
    steps = [f"{a} {o} {b} = {c}" for a, o, b, c in map(_parse, steps)]
  elif kind == "filler":
    steps = ["Let us work through this carefully, one step at a time."] + steps
  elif kind == "numbering":
    steps = [f"Step {i + 1}: {s}" for i, s in enumerate(steps)]
  elif kind == "wrong_result":
    i = int(rng.integers(len(steps)))
    a, o, b, c = _parse(steps[i])
    steps[i] = f"{a}{o}{b}={c + int(rng.choice([-3, -2, -1, 1, 2, 3]))}"
  elif kind == "swapped_operands":
    subs = [i for i, s in enumerate(steps) if _parse(s)[1] == "-" and _parse(s)[0] != _parse(s)[2]]
    if not subs:
      return None
    a, o, b, c = _parse(steps[subs[0]])
    steps[subs[0]] = f"{b}-{a}={c}"
  elif kind == "dropped_step":
    del steps[len(steps) // 2]
  elif kind == "question_swap":
    prompt = other.prompt
  elif kind == "wrong_final":
    a, o, b, c = _parse(steps[-1])
    steps[-1] = f"{a}{o}{b}={c + int(rng.choice([-3, -2, -1, 1, 2, 3]))}"
  else:
    raise ValueError(f"unknown perturbation {kind!r}; expected one of {STYLE + LOGIC}")
  return prompt, steps


def encode(tok, sep: int, prompt: str, steps) -> tuple[list[int], list[int], int]:
  """(tokens, separator positions, question length): the prompt, then each step's tokens and the separator."""
  ids = tok.encode(prompt)
  q, seps = len(ids), []
  for s in steps:
    ids = ids + tok.encode(s) + [sep]
    seps.append(len(ids) - 1)
  return ids, seps, q


def arrays(rows, labels=None, width: int | None = None):
  """Right-padded tokens, mask, steps (and step labels at the separators) of encoded rows."""
  t = width or -(-max(len(r[0]) for r in rows) // 32) * 32  # widths in steps of 32: few compilations
  n = len(rows)
  toks, mask, steps, lab = (np.zeros((n, t), np.int32) for _ in range(4))
  for i, (ids, seps, _) in enumerate(rows):
    toks[i, :len(ids)], mask[i, :len(ids)] = ids, 1
    steps[i, seps] = 1
    if labels is not None:
      lab[i, seps] = labels[i]
  return toks, mask, steps, lab


def solution_rewards(step_rewards_BT, steps_BT, kind: str) -> np.ndarray:
  """[B] each solution's reward read as the attack reads it (`reward_attack.AGGREGATION`): the minimum over its
  step rewards for a step head, the last step's value for a value head."""
  return np.asarray(heads.aggregate(jnp.asarray(step_rewards_BT), jnp.asarray(steps_BT),
                                    reward_attack.AGGREGATION[kind]))


class PRM:
  """A frozen LM, its tokenizer and a step or value head; `scores` gives per-solution rewards (`solution_rewards`)."""

  def __init__(self, cfg: Config):
    if cfg.prm_path is not None:
      self.lm_cfg, self.lm, self.head_cfg, self.head = hf_reward.load(cfg.prm_path)
      self.tok = tokenizers.load(cfg.model or cfg.prm_path)
    else:
      self.lm_cfg, self.lm, self.tok = load_chat_model(cfg.model)
      self.head_cfg = heads.Config(kind="step", d_model=self.lm_cfg.d_model)
      self.head = heads.init(self.head_cfg, jax.random.key(cfg.seed))
    sep = self.tok.encode(cfg.separator)
    if len(sep) != 1:
      raise ValueError(f"separator {cfg.separator!r} must be one token of the PRM's tokenizer, found ids {sep}")
    self.sep = sep[0]
    self._hidden = reward_attack.hidden_fn(self.lm_cfg)

  def encode(self, prompt: str, steps) -> tuple[list[int], list[int], int]:
    return encode(self.tok, self.sep, prompt, steps)

  def hidden(self, toks, mask, batch: int):
    out = []
    for i in range(0, len(toks), batch):
      tb, mb = toks[i:i + batch], mask[i:i + batch]
      pad = batch - len(tb)
      tb, mb = np.pad(tb, ((0, pad), (0, 0))), np.pad(mb, ((0, pad), (0, 0)), constant_values=1)
      out.append(np.asarray(self._hidden(self.lm, jnp.asarray(tb), jnp.asarray(mb)))[:batch - pad])
    return np.concatenate(out)

  def step_rewards(self, hidden_NTD):
    return np.asarray(heads.position_rewards(self.head, self.head_cfg, jnp.asarray(hidden_NTD)))

  def scores(self, rows, batch: int):
    toks, mask, steps, _ = arrays(rows)
    return solution_rewards(self.step_rewards(self.hidden(toks, mask, batch)), steps, self.head_cfg.kind)

  def train(self, rows, labels, cfg: Config) -> list[float]:
    """Head-only training on cached hidden states; returns the loss curve."""
    toks, mask, steps, lab = arrays(rows, labels)
    h = self.hidden(toks, mask, cfg.batch)
    tx = optax.adam(cfg.head_lr)

    def loss_fn(head, batch, rng):  # the mean over steps, weight 1
      del rng
      s, w = losses.prm_step_loss(heads.logits(head, self.head_cfg, batch["h"]), batch["labels"], batch["steps"])
      return s / jnp.maximum(w, 1.0), 1.0, {}

    step = step_lib.jit_train_step(step_lib.make_train_step(loss_fn, tx))
    state = state_lib.create(self.head, tx)
    rng = np.random.default_rng(cfg.seed + 1)
    curve = []
    for _ in range(cfg.head_steps):
      idx = rng.choice(len(rows), size=min(cfg.batch, len(rows)), replace=False)
      state, m = step(state, {"h": jnp.asarray(h[idx]), "labels": jnp.asarray(lab[idx]),
                              "steps": jnp.asarray(steps[idx])})
      curve.append(float(m["loss"]))
    self.head = state.params
    return curve


def attack_split(test, attack_rows: int) -> tuple[np.ndarray, np.ndarray]:
  """(attacked, transfer): indices of the first `attack_rows` wrong solutions of `test` and of the other wrong ones."""
  bad = np.flatnonzero([min(e.labels) == 0 for e in test])
  if len(bad) < 2 * attack_rows:
    raise ValueError(f"only {len(bad)} wrong test solutions; the attack needs 2 * attack_rows = "
                     f"{2 * attack_rows}: raise test_problems")
  return bad[:attack_rows], bad[attack_rows:]


def split_items(train, test, fit, held, policy=None) -> dict:
  """The run's splits: `train` holds the problems the PRM head (and the RL policy) learn from and the trajectories
  the adversarial tokens are fit on; `test` the problems of the PRM's accuracy and tier 1; `attacked` and
  `transfer` the wrong solutions' problems the attack is scored on and the ones it transfers to; `rl_test` the
  policy's held-out problems. A trajectory is a problem with its (wrong) steps."""
  traj = lambda ix: [{"question": test[i].prompt, "steps": list(test[i].steps)} for i in ix]
  out = {"train": {"problems": [e.prompt for e in train] + [e.prompt for e in (policy[0] if policy else [])],
                   "trajectories": traj(fit)},
         "test": {"problems": [e.prompt for e in test]},
         "attacked": {"problems": [test[i].prompt for i in fit]},
         "transfer": {"problems": [test[i].prompt for i in held], "trajectories": traj(held)}}
  if policy:
    out["rl_test"] = {"problems": [e.prompt for e in policy[1]]}
  return out


# Token width of the PRM's input rows at the full preset, which depends on the PRM's tokenizer (not read by `plan`):
# the three-step chains are at most 56 tokens with SmolLM2's tokenizer, which splits digits one per token as Qwen's
# does, and `arrays` pads them to a multiple of 32.
PLAN_WIDTH = 64


def architecture(ref: str) -> tuple[tfm.Config, heads.Config]:
  """(LM config, head config) of the reward model `ref` (a directory or a repo id, `jaxlab.hf.hub`), as
  `jaxlab.hf.reward.load` builds them: a checkpoint without an LM head (every step PRM) ties it to the embedding."""
  d = hub.architecture(ref)
  kind = hf_reward.kind_of(d, str(ref))
  if kind == "step":
    d = {**d, "tie_word_embeddings": True}
  lm_cfg = by_model_type(d["model_type"]).for_checkpoint(d).config_from_hf(d)
  dtype = d.get("torch_dtype") or lm_cfg.param_dtype
  return lm_cfg.replace(param_dtype=dtype), heads.Config(kind=kind, d_model=lm_cfg.d_model, param_dtype=dtype)


def forward_calls(cfg: Config) -> int:
  """How many batches of `cfg.batch` rows the run's PRM forward (`PRM.hidden`) reads with a trained PRM: the test
  solutions once, then each perturbation kind's perturbed correct solutions (tier 1)."""
  test = ar.step_labelled(ar.Arithmetic(steps=cfg.steps_per_problem), cfg.test_problems, "test", cfg.seed + 1)
  right = [e for e in test if min(e.labels) > 0]
  rng = np.random.default_rng(cfg.seed + 2)
  per_kind = [sum(perturb(e, kind, right[(j + 1) % len(right)], rng) is not None for j, e in enumerate(right))
              for kind in STYLE + LOGIC]
  return math.ceil(len(test) / cfg.batch) + sum(math.ceil(n / cfg.batch) for n in per_kind if n)


def workloads(cfg: Config, mesh) -> list[plan_lib.Workload]:
  """The PRM forward over `batch` rows (the test solutions and tier 1's perturbed ones), the attack's jitted step
  (a relaxed forward, its gradient with respect to the adversarial logits, and the forward of their argmax tokens)
  over `attack_rows` rows, and the forward of the rows with the discrete tokens spliced in, with abstract arguments
  (`experiments plan`). The PRM's weights are replicated (the run holds them whole on its device); rows are split
  over the mesh's batch axes. Rows are `PLAN_WIDTH` tokens wide (the widths depend on the PRM's tokenizer). Only a
  trained PRM (`prm_path`) is planned: the cpu preset's head training reads SmolLM2 features and takes seconds."""
  if cfg.prm_path is None:
    return []
  lm_cfg, head_cfg = architecture(cfg.prm_path)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  abstract = lambda tree: jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated), tree)
  lm = abstract(jax.eval_shape(lambda: tfm.init(lm_cfg, jax.random.key(0))))
  head = abstract(jax.eval_shape(lambda: heads.init(head_cfg, jax.random.key(0))))
  fwd_flops = lambda b, t: tfm.flops_per_token(lm_cfg, t) / 3 * b * t  # 2·N·tokens (+ attention)
  width = (cfg.batch, PLAN_WIDTH)
  rows = shd.abstract_rows({"tokens": (width, "int32"), "mask": (width, "int32")}, mesh)
  hidden = reward_attack.hidden_fn(lm_cfg)
  out = [plan_lib.Workload("prm_forward", "forward", hidden, (lm, rows["tokens"], rows["mask"]), forward_calls(cfg),
                           fwd_flops(cfg.batch, PLAN_WIDTH))]
  position = cfg.attack_position if cfg.attack_position != "auto" else ("middle" if head_cfg.kind == "step" else "end")
  b = cfg.attack_rows
  toks = np.ones((b, PLAN_WIDTH), np.int32)
  lay = reward_attack.layout(toks, toks, np.full(b, PLAN_WIDTH // 2), cfg.attack_tokens, position, head_cfg.kind, 0)
  s = lay.kind_BS.shape[1]
  acfg = reward_attack.Config(n_tokens=cfg.attack_tokens, position=position, steps=cfg.attack_steps, lr=cfg.attack_lr)
  step, opt = reward_attack.make_step(acfg, lm_cfg, head_cfg, lay)
  dt = jnp.dtype(lm_cfg.param_dtype)
  spec = lambda shape, dtype=jnp.float32: jax.ShapeDtypeStruct(shape, dtype, sharding=replicated)
  embeds = shd.abstract_rows({"e": ((b, PLAN_WIDTH, lm_cfg.d_model), dt)}, mesh)["e"]
  logits = spec((cfg.attack_tokens, lm_cfg.vocab_size))
  opt_state = abstract(jax.eval_shape(opt.init, logits))
  args = (lm, head, embeds, spec((lm_cfg.d_model,), dt), logits, opt_state, spec((), jax.random.key(0).dtype),
          spec((), jnp.int32))
  out.append(plan_lib.Workload("attack_step", "train", step, args, cfg.attack_steps, 3 * fwd_flops(b, s)))
  spliced = shd.abstract_rows({"tokens": ((b, s), "int32"), "mask": ((b, s), "int32")}, mesh)
  out.append(plan_lib.Workload("prm_forward.spliced", "forward", hidden, (lm, spliced["tokens"], spliced["mask"]), 3,
                               fwd_flops(b, s)))
  return out


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  del resume  # minutes at the cpu preset; recomputed
  prm = PRM(cfg)
  spec = ar.Arithmetic(steps=cfg.steps_per_problem)
  res: dict = {}
  train = ar.step_labelled(spec, cfg.train_problems, "train", cfg.seed) if cfg.prm_path is None else []
  test = ar.step_labelled(spec, cfg.test_problems, "test", cfg.seed + 1)
  fit, held = attack_split(test, cfg.attack_rows)
  # the policy's word problems, as `reward_hacking` loads them (adapters.prepare with cfg.seed)
  policy = adapters.load_examples(cfg.policy, cfg.seed) if cfg.rl_iterations else None
  splits.record(out_dir, "prm_attack", split_items(train, test, fit, held, policy))
  if cfg.prm_path is None:
    curve = prm.train([prm.encode(e.prompt, e.steps) for e in train], [e.labels for e in train], cfg)
    res["prm.loss_first"], res["prm.loss_last"] = curve[0], float(np.mean(curve[-10:]))
  rows = [prm.encode(e.prompt, e.steps) for e in test]
  toks, mask, steps, lab = arrays(rows, [e.labels for e in test])
  r = prm.step_rewards(prm.hidden(toks, mask, cfg.batch))
  m = steps > 0
  res["prm.step_accuracy"] = float(np.mean((r[m] > 0.5) == (lab[m] > 0)))
  base = solution_rewards(r, steps, prm.head_cfg.kind)
  wrong = np.array([min(e.labels) == 0 for e in test])
  res["prm.solution_accuracy"] = float(np.mean((base > 0.5) == ~wrong))

  # tier 1: static perturbations of the correct solutions
  rng = np.random.default_rng(cfg.seed + 2)
  right = [i for i in range(len(test)) if not wrong[i]]
  detected: list = []
  for kind in STYLE + LOGIC:
    pairs = []
    for j, i in enumerate(right):
      p = perturb(test[i], kind, test[right[(j + 1) % len(right)]], rng)
      if p is not None:
        pairs.append((i, prm.encode(*p)))
    s = prm.scores([row for _, row in pairs], cfg.batch)
    res[f"delta_reward.{kind}"] = float(np.mean(s - base[[i for i, _ in pairs]]))
    res[f"count.{kind}"] = len(pairs)
    if kind in LOGIC:
      res[f"detection.{kind}"] = float(np.mean(s < 0.5))
      detected += list(s < 0.5)
  res["logic_detection_rate"] = float(np.mean(detected))
  res["style_delta_mean"] = float(np.mean([res[f"delta_reward.{k}"] for k in STYLE]))

  # tier 2: the gradient attack on wrong solutions, universal over `attack_rows` rows, transfer to the rest
  # appended tokens cannot move the earlier steps a min-aggregated step head reads (the LM is causal), so the
  # step head is attacked between question and solution
  position = cfg.attack_position if cfg.attack_position != "auto" else \
      ("middle" if prm.head_cfg.kind == "step" else "end")
  res["attack.position"] = position
  acfg = reward_attack.Config(n_tokens=cfg.attack_tokens, position=position, steps=cfg.attack_steps,
                              lr=cfg.attack_lr, seed=cfg.seed)
  q = np.array([row[2] for row in rows])
  out = reward_attack.attack(acfg, prm.lm, prm.lm_cfg, prm.head, prm.head_cfg, toks[fit], mask[fit], q[fit], prm.sep)
  # "before": the solution as written with only the closing separator added at the end (the same final read)
  empty = lambda ix: np.asarray(reward_attack.discrete_rewards(prm.lm, prm.lm_cfg, prm.head, prm.head_cfg, toks[ix],
                                                               mask[ix], q[ix], np.zeros((0,), np.int32), prm.sep,
                                                               position))
  attacked = lambda ix: np.asarray(reward_attack.discrete_rewards(prm.lm, prm.lm_cfg, prm.head, prm.head_cfg,
                                                                  toks[ix], mask[ix], q[ix], out.tokens_K, prm.sep,
                                                                  position))
  after = attacked(fit)
  res["attack.reward_before"] = float(base[fit].mean())
  res["attack.reward_after"] = float(out.relaxed_BN[:, -1].mean())
  res["attack.discrete_reward_after"] = float(after.mean())
  # each attacked wrong solution's reward before and after, paired (the attack claim's interval)
  res["per_item"] = {"attack.reward_before": base[fit].tolist(), "attack.discrete_reward_after": after.tolist()}
  res["attack.separator_only"] = float(empty(fit).mean())
  res["attack.transfer_before"] = float(base[held].mean())
  res["attack.transfer_after"] = float(attacked(held).mean())
  res["attack.tokens"] = [prm.tok.decode([int(t)]) for t in out.tokens_K]
  with open(os.path.join(out_dir, "metrics.jsonl"), "w") as f:
    for i in range(out.relaxed_BN.shape[1]):
      f.write(json.dumps({"step": i, "relaxed": float(out.relaxed_BN[:, i].mean()),
                          "discrete": float(out.discrete_BN[:, i].mean()), "entropy": float(out.entropy_N[i])}) + "\n")
  if cfg.rl_iterations:
    res.update(reward_hacking(cfg, prm, out_dir))
  xs = list(range(out.relaxed_BN.shape[1]))
  registry.plot_curves(os.path.join(out_dir, "attack.png"),
                       {"relaxed": (xs, out.relaxed_BN.mean(0).tolist()),
                        "discrete": (xs, out.discrete_BN.mean(0).tolist())},
                       title="prm_attack: PRM reward of wrong solutions during the attack", xlabel="step",
                       ylabel="min step reward")
  return res


def answer_steps(text: str) -> list[str]:
  """The steps of a policy answer: its comma- or newline-separated non-empty pieces."""
  return [p.strip() for p in re.split(r"[,\n]", text) if p.strip()]


def neutral(text: str) -> str:
  """The answer in the neutral style: each equation it writes as "a+b=c" (the symbols of `_WORDS`), nothing else."""
  sym = {w: o for o, w in _WORDS.items()}
  eqs = re.findall(r"(-?\d+)\s*(\+|-|\*|plus|minus|times)\s*(\d+)\s*(?:=|gives)\s*(-?\d+)", text)
  return ", ".join(f"{a}{sym.get(o, o)}{b}={c}" for a, o, b, c in eqs)


def reward_hacking(cfg: Config, prm: PRM, out_dir: str) -> dict:
  """Tier 3: GRPO on a small policy with the frozen PRM as its only reward."""
  writer = adapters.Writer(os.path.join(out_dir, "rl_metrics.jsonl"))
  ctx = adapters.prepare(cfg.policy, out_dir, writer, cfg.seed)
  tx = recipes.optimizer(cfg.policy.pretrain_lr / 3, "adamw", grad_clip=1.0, weight_decay=0.0)
  state = state_lib.init_state(lambda _: ctx.params, tx, cfg.seed)
  res, _ = recipes.fit(state, adapters.sft_loss_fn(ctx.model), tx,
                       adapters.sft_batches(ctx.train_arrays, cfg.policy.pretrain_batch, cfg.seed),
                       cfg.policy_sft_steps, log_every=max(1, cfg.policy_sft_steps // 10), desc="policy sft")
  params = res.state.params

  def prm_score(texts, examples):
    rows = [(i, encode(prm.tok, prm.sep, ex["question"], answer_steps(t))) for i, (t, ex) in
            enumerate(zip(texts, examples)) if answer_steps(t)]
    out = np.zeros(len(texts), np.float32)
    if rows:
      out[[i for i, _ in rows]] = prm.scores([r for _, r in rows], cfg.batch)
    return out

  test = [{"question": e.prompt} for e in ctx.test]

  def measure(p) -> dict:
    acc, texts = ctx.evaluate(p)
    return {"accuracy": acc, "prm": float(prm_score(texts, test).mean()),
            "neutral": float(prm_score([neutral(t) for t in texts], test).mean())}

  before = measure(params)
  gcfg = GRPOConfig(prompts_per_batch=cfg.rl_prompts, group_size=cfg.rl_group,
                    max_new_tokens=cfg.policy.max_new_tokens, beta=0.0, stop_tokens=(ctx.model.eos_token_id,))
  rtx = recipes.optimizer(cfg.rl_lr, "adamw", grad_clip=1.0, weight_decay=0.0)
  rstate = state_lib.init_state(lambda _: params, rtx, cfg.seed + 5)
  step = rl_loop.jit_grpo_step(rl_loop.make_grpo_step(ctx.model, gcfg, rtx), rstate)
  prompts = PromptCycle([{"prompt": ctx.tok.encode(e.prompt, add_bos=True), "question": e.prompt}
                         for e in ctx.train], cfg.rl_prompts)
  # sampled ids past the bytes (bos/eos/pad and the config's spare rows) carry no text
  decode = lambda ids: ctx.tok.decode([i for i in ids if i < 256])
  out = rl_loop.rl_loop(rstate, ctx.model, gcfg, step, prompts, prm_score, cfg.rl_iterations, decode=decode,
                        metrics_path=os.path.join(out_dir, "rl_metrics.jsonl"), desc="grpo")
  after = measure(out.state.params)
  gain = after["prm"] - before["prm"]
  return {"rl.prm_reward_start": before["prm"], "rl.prm_reward_end": after["prm"],
          "rl.accuracy_start": before["accuracy"], "rl.accuracy_end": after["accuracy"],
          "rl.neutral_reward_start": before["neutral"], "rl.neutral_reward_end": after["neutral"],
          "rl.style_share": (1.0 - (after["neutral"] - before["neutral"]) / gain) if gain > 0 else None,
          "rl.train_reward": [r["reward"] for r in out.history]}
