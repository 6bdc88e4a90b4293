"""The bao pipeline (package docstring): data, the policy, pretraining, the two SFT warm starts, GRPO for
UserRL and BAO, and evaluation."""
from __future__ import annotations

import functools
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments import registry
from experiments._shared import recipes
from experiments._shared.chat_models import answer, generate_workload, load_chat_model, model_config, place
from experiments.bao import agent, train
from experiments.bao import function as fn_gym
from experiments.bao import turtle as tt_gym
from experiments.runner import splits
from experiments.runner import plan as plan_lib
from jaxlab import losses
from jaxlab import sharding as shd
from experiments.bao import telepathy as tp_gym
from jaxlab.models import transformer as tfm
from experiments.bao import objective as bao_lib
from jaxlab.rl import grpo as grpo_lib
from experiments.bao import turns as turns_lib
from jaxlab.train import metrics as metrics_lib
from jaxlab.train import loop as loop_lib
from jaxlab.train import schedules
from jaxlab.train import state as state_lib
from jaxlab.train import step as step_lib


EVAL_SEED0, RL_SEED0 = 1_000_000, 2_000_000
SYSTEM = ("You are an agent solving a task through one tool. Reply with your reasoning, then exactly one call: "
          "'[action] CONTENT' talks to the user or probes the world, '[search] CONTENT' looks something up, "
          "'[answer] CONTENT' answers ('[answer] calc EXPR' answers the value of an arithmetic expression), "
          "'[finish]' ends the episode.")


def user_generate(path: str, max_new_tokens: int = 32):
  """An LM user simulator `generate(messages) -> str` from a chat model path (greedy)."""
  cfg, params, tok = load_chat_model(path)

  def generate(messages):
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return answer(cfg, params, tok, [ids], max_new_tokens)[0][0]
  return generate


def entity_pool(cfg) -> tuple:
  """Telepathy's entities: `cfg.entities`, or `entity_pool` of them spread evenly over it."""
  pool = tp_gym.load_entities(cfg.entities)
  n = cfg.entity_pool or len(pool)
  if n > len(pool):
    raise ValueError(f"bao: entity_pool must be <= the {len(pool)} {cfg.entities} entities, found {n}")
  return tuple(pool[i * len(pool) // n] for i in range(n))


def held_out(items: tuple, share: float, seed) -> tuple[tuple, tuple]:
  """(train, test): a seeded permutation of `items` cut so that test holds ceil(share * n) of them (at least one,
  leaving at least one for training), each side in the pool's order."""
  if len(items) < 2:
    raise ValueError(f"bao: a gym's pool needs >= 2 items to hold some out, found {len(items)}")
  n_test = min(len(items) - 1, max(1, math.ceil(share * len(items))))
  test = set(np.random.default_rng(seed).permutation(len(items))[:n_test].tolist())
  return (tuple(x for i, x in enumerate(items) if i not in test), tuple(x for i, x in enumerate(items) if i in test))


def pools(cfg) -> dict:
  """{"train" | "test": {gym: items}}: each gym's rules, entities or puzzles split by `held_out`."""
  full = {"function": fn_gym.RULES, "telepathy": entity_pool(cfg), "turtle": tt_gym.PUZZLES}
  cut = {g: held_out(tuple(full[g]), cfg.test_share, [cfg.seed, 21, i]) for i, g in enumerate(agent.GYMS)}
  return {split: {g: cut[g][j] for g in cfg.gyms} for j, split in enumerate(("train", "test"))}


KINDS = {"function": "rules", "telepathy": "entities", "turtle": "puzzles"}


def split_items(pooled: dict) -> dict:
  """`pools` as splits.record wants them: {split: {kind: canonical texts}} (an entity by its name, a puzzle by its
  title and surface)."""
  text = {"function": lambda r: r, "telepathy": lambda e: e.name, "turtle": lambda p: f"{p.title}: {p.surface}"}
  return {split: {KINDS[g]: [text[g](x) for x in items] for g, items in gyms.items()} for split, gyms in pooled.items()}


def env_makers(cfg, pool: dict, max_turns: int | None = None, scripted: bool = False) -> dict:
  """One maker per gym of `cfg.gyms` drawing from `pool` ({gym: items}, one split of `pools`), with the gym's turn
  limit (or `max_turns`) and `cfg.user` (or the scripted users)."""
  gen = None if cfg.user == "scripted" or scripted else user_generate(cfg.user)
  turns_of = {g: max_turns or t for g, t in zip(agent.GYMS, cfg.max_turns)}
  kw = {"function": lambda g: {"rules": pool[g]}, "telepathy": lambda g: {"entities": pool[g], "generate": gen},
        "turtle": lambda g: {"puzzles": pool[g], "generate": gen}}
  return {g: (lambda g=g: agent.make_env(g, turns_of[g], **kw[g](g))) for g in cfg.gyms}


def corpora(cfg, makes, pool: dict) -> dict:
  """Episodes per kind: "random" (format pretraining, at most `pretrain_turns` turns, scripted users), "plain" and
  "enhanced" (expert SFT), seeds 0.. per gym, all from `pool` (the training split)."""
  out = {"random": [], "plain": [], "enhanced": []}
  shorts = env_makers(cfg, pool, cfg.pretrain_turns, scripted=True)
  for g, make in makes.items():
    out["random"] += [agent.random_episode(shorts[g], g, s) for s in range(cfg.pretrain_episodes)]
    for kind in ("plain", "enhanced"):
      out[kind] += [agent.expert_episode(make, g, s, kind == "enhanced") for s in range(cfg.sft_episodes)]
  return out


def policy_model(cfg, data, mesh=None):
  """(model config, params, codec): the small word-level model (fresh) or a chat model by path or repo id (float32
  params computing in cfg.compute, placed on `mesh` by cfg.strategy)."""
  if cfg.policy == "word":
    codec = agent.WordCodec([m["content"] for kind in data.values() for e in kind for m in e.history])
    model = tfm.Config(vocab_size=codec.vocab_size, d_model=cfg.d_model, n_layers=cfg.layers, n_heads=cfg.heads,
                       d_ff=cfg.d_ff, max_position_embeddings=cfg.max_len, bos_token_id=agent.BOS,
                       eos_token_id=agent.EOS, pad_token_id=agent.PAD)
    return model, tfm.init(model, jax.random.PRNGKey(cfg.seed)), codec
  model, params, tok = load_chat_model(cfg.policy, compute=cfg.compute)
  return model, place(params, mesh, cfg.strategy), agent.ChatCodec(tok, SYSTEM)


def steps(cfg, model, n_gyms: int, mesh=None):
  """(SFT step, its optimizer, GRPO step, its optimizer), jitted, over `model` (layers rematerialized with
  cfg.remat, cfg.microbatches parts per batch, kept on `mesh`'s batch axes): one compiled SFT step for the
  pretraining and both warm starts (each phase's optimizer state restarts the warmup-cosine schedule), one GRPO
  step (`jaxlab.train.rl_loop.make_grpo_step`'s loss and update) for both GRPO methods."""
  model = model.replace(remat=cfg.remat)
  lr = schedules.warmup_cosine(cfg.lr, cfg.sft_steps, max(1, cfg.sft_steps // 20))
  tx = recipes.optimizer(lr, "adamw", grad_clip=1.0, weight_decay=0.0)
  step = step_lib.make_train_step(losses.sft_loss_fn(model), tx, microbatches=cfg.microbatches, mesh=mesh)
  gcfg = grpo_lib.GRPOConfig(prompts_per_batch=cfg.prompts_per_gym * n_gyms, group_size=cfg.group,
                             max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, beta=0.0,
                             aggregation="token_mean", updates_per_batch=cfg.updates_per_batch)
  rtx = recipes.optimizer(cfg.rl_lr, "adamw", grad_clip=1.0, weight_decay=0.0)
  grpo_loss = losses.grpo_loss_fn(model, beta=gcfg.beta, clip_low=gcfg.clip_low, clip_high=gcfg.clip_high,
                                  aggregation=gcfg.aggregation, max_len=gcfg.max_new_tokens,
                                  temperature=gcfg.temperature)
  rstep = step_lib.make_train_step(grpo_loss, rtx, microbatches=cfg.microbatches, mesh=mesh, advance_rng=False)
  return step_lib.jit_train_step(step), tx, step_lib.jit_train_step(rstep), rtx


def _copy(params):
  """A copy of `params` in the same placement (a train step donates the params it starts from)."""
  return jax.tree.map(jnp.copy, params)


def fit(cfg, step, tx, params, codec, episodes, steps: int, seed: int, phase: str, writer, mesh=None):
  """`steps` of next-token training on the policy's reply tokens of `episodes` with the jitted `step` (batch rows
  placed on `mesh`)."""
  if steps == 0:
    return params
  rows = [r for e in episodes for r in agent.sft_rows(codec, e.history)]
  state = state_lib.state_from_params(_copy(params), tx, seed)  # the step donates its state
  batches = train.lm_batches(rows, cfg.batch, cfg.max_len, seed, cfg.bucket)
  res = loop_lib.train_loop(state, step, batches, steps, shard_fn=lambda b: shd.shard_rows(b, mesh),
                            log_every=max(1, steps // 5), desc=phase)
  for h in res.history:
    writer.write({"phase": phase, **{k: v for k, v in h.items() if isinstance(v, (int, float))}})
  return res.state.params


def evaluate(cfg, policy, params, makes, writer, method: str) -> dict:
  out = {}
  for g, make in makes.items():
    eps = train.play(policy, params, make, g, [EVAL_SEED0 + i for i in range(cfg.eval_episodes)])
    m = train.metrics(eps)
    writer.write({"phase": "eval", "method": method, "gym": g, **m})
    out.update({f"{k}.{g}.{method}": m[k] for k in ("score", "pass_u1", "user_rate")})
  return out


def grpo(cfg, step, tx, params, policy, makes, reg: bao_lib.Regularizers, writer, phase: str):
  """`rl_iterations` GRPO iterations from `params` with turn-level advantages of the `reg`-penalized rewards."""
  credit = turns_lib.TurnCredit(gamma=cfg.gamma, credit=cfg.credit, score=cfg.score)
  state = state_lib.state_from_params(_copy(params), tx, cfg.seed)  # the step donates its state
  # the same training seeds and sampling keys for every method; minibatch order drawn apart from them
  rng, order, key = np.random.default_rng([cfg.seed, 11]), np.random.default_rng([cfg.seed, 12]), \
      jax.random.PRNGKey(cfg.seed + 1)
  curve = []
  for it in range(cfg.rl_iterations):
    t0, eps, gids = time.time(), [], []
    for gi, (g, make) in enumerate(makes.items()):
      seeds = RL_SEED0 + rng.integers(0, 10**6, size=cfg.prompts_per_gym)
      eps += train.play(policy, state.params, make, g, [int(s) for s in seeds for _ in range(cfg.group)],
                        jax.random.fold_in(key, it * len(agent.GYMS) + gi), cfg.temperature)
      gids += [gi * cfg.prompts_per_gym + j // cfg.group for j in range(cfg.prompts_per_gym * cfg.group)]
    advs = train.episode_advantages(eps, gids, reg, credit)
    losses_ = []
    for _ in range(cfg.updates_per_batch):
      for batch in train.minibatches(eps, advs, cfg.minibatch, cfg.max_new_tokens, cfg.bucket,
                                     cfg.max_len - cfg.max_new_tokens, order):
        state, m = step(state, shd.shard_rows(batch, policy.mesh))
        losses_.append(float(m["loss"]))
    pen = [sum(bao_lib.penalized_rewards([t.reward for t in e.turns], [t.user for t in e.turns],
                                         [t.reward > 0 for t in e.turns], sum(len(t.reply) for t in e.turns), reg))
           for e in eps]
    rec = {"phase": phase, "iteration": it, **train.metrics(eps), "objective": float(np.mean(pen)),
           "loss": float(np.mean(losses_)), "rows": int(sum(len(e.turns) for e in eps)), "seconds": time.time() - t0}
    curve.append(rec)
    writer.write(rec)
  return state.params, curve


def run(cfg, out_dir: str, resume: bool) -> dict:
  del resume  # each run is short; a rerun starts over
  pooled = pools(cfg)
  splits.record(out_dir, "bao", split_items(pooled))
  makes, tests = env_makers(cfg, pooled["train"]), env_makers(cfg, pooled["test"])
  data = corpora(cfg, makes, pooled["train"])
  mesh = shd.make_mesh(cfg.mesh) if cfg.mesh else None
  model, params, codec = policy_model(cfg, data, mesh)
  writer = metrics_lib.MetricsWriter(os.path.join(out_dir, "metrics.jsonl"))
  policy = train.Policy(model, codec, cfg.max_new_tokens, cfg.max_len - cfg.max_new_tokens,
                        cfg.prompts_per_gym * cfg.group, cfg.bucket, mesh)
  step, tx, rstep, rtx = steps(cfg, model, len(makes), mesh)
  base = fit(cfg, step, tx, params, codec, data["random"], cfg.pretrain_steps, cfg.seed, "pretrain", writer, mesh)
  need = set(cfg.methods)
  enhanced = fit(cfg, step, tx, base, codec, data["enhanced"], cfg.sft_steps, cfg.seed + 1, "sft", writer, mesh) \
      if need & {"sft", "bao"} else None
  plain = fit(cfg, step, tx, base, codec, data["plain"], cfg.sft_steps, cfg.seed + 2, "sft_plain", writer, mesh) \
      if "grpo_userrl" in need else None
  res: dict = {}
  if "prompt_only" in need:
    res.update(evaluate(cfg, policy, base, tests, writer, "prompt_only"))
  if "sft" in need:
    res.update(evaluate(cfg, policy, enhanced, tests, writer, "sft"))
  curves = {}
  if plain is not None:
    evaluate(cfg, policy, plain, tests, writer, "sft_plain")
    p, curves["grpo_userrl"] = grpo(cfg, rstep, rtx, plain, policy, makes, bao_lib.Regularizers(), writer,
                                    "grpo_userrl")
    res.update(evaluate(cfg, policy, p, tests, writer, "grpo_userrl"))
  if "bao" in need:
    reg = bao_lib.Regularizers(cfg.user_weight, cfg.info_penalty, cfg.think_budget, cfg.think_weight)
    p, curves["bao"] = grpo(cfg, rstep, rtx, enhanced, policy, makes, reg, writer, "bao")
    res.update(evaluate(cfg, policy, p, tests, writer, "bao"))
  writer.close()
  for key, label in (("score", "training score"), ("user_rate", "user-involvement rate")):
    registry.plot_curves(os.path.join(out_dir, f"rl_{key}.png"),
                         {m: ([r["iteration"] for r in c], [r[key] for r in c]) for m, c in curves.items()},
                         xlabel="GRPO iteration", ylabel=label, title=f"bao: {label} of sampled episodes")
  return res


# ------------------------------------------------------------------------------------------------ plan

def call_counts(cfg) -> dict:
  """Upper bounds on how many times a run calls each compiled program (every episode running to its gym's turn
  limit): "rollout" (sampled turns of the GRPO iterations, one batch of prompts_per_gym x group episodes per gym
  and turn), "eval" (greedy turns of the evaluations: prompt_only, sft, sft_plain and grpo_userrl, bao; batches
  of prompts_per_gym x group of the eval_episodes), "grpo" (minibatches of every turn of every episode) and
  "sft" (pretraining and the two warm starts)."""
  need = set(cfg.methods)
  rl = len(need & {"grpo_userrl", "bao"})
  turns = sum(t for g, t in zip(agent.GYMS, cfg.max_turns) if g in cfg.gyms)
  batch = cfg.prompts_per_gym * cfg.group
  evals = len(need & {"prompt_only", "sft", "bao"}) + 2 * ("grpo_userrl" in need)
  sft = cfg.pretrain_steps + cfg.sft_steps * (bool(need & {"sft", "bao"}) + ("grpo_userrl" in need))
  return {"rollout": rl * cfg.rl_iterations * turns, "eval": evals * turns * -(-cfg.eval_episodes // batch),
          "grpo": rl * cfg.rl_iterations * cfg.updates_per_batch * -(-batch * turns // cfg.minibatch), "sft": sft}


def workloads(cfg, mesh) -> list[plan_lib.Workload]:
  """What a run computes at `cfg`, for `experiments plan`: the SFT step (batch x max_len rows), the sampled rollout
  turns and the greedy evaluation turns (`train.Policy.act`: prompts_per_gym x group prompts of the longest bucket,
  max_len - max_new_tokens tokens, max_new_tokens new) and the GRPO step (minibatch turns of that prompt and reply),
  built by `steps` over the policy's params and AdamW state, abstract and sharded by cfg.strategy over `mesh`;
  rows as `shard_rows` places them. Counts are `call_counts`' upper bounds. Only a chat policy can be planned: the
  word-level policy's vocabulary is built from the episodes at run time."""
  if cfg.policy == "word":
    raise ValueError("bao: only a chat policy can be planned (the word-level policy's vocabulary is built from the "
                     "episodes at run time); --set policy=ORG/NAME or PATH")
  model = model_config(cfg.policy, "float32", cfg.compute)
  step, tx, rstep, rtx = steps(cfg, model, len(cfg.gyms), mesh)
  counts, batch = call_counts(cfg), cfg.prompts_per_gym * cfg.group
  prompt = cfg.max_len - cfg.max_new_tokens
  fwd = tfm.flops_per_token(model, cfg.max_len) / 3 * cfg.max_len  # one row's forward
  init = functools.partial(tfm.init, model)
  sft_state = state_lib.abstract_state(init, tx, mesh, cfg.strategy, axes=tfm.AXES)
  rl_state = state_lib.abstract_state(init, rtx, mesh, cfg.strategy, axes=tfm.AXES)
  i32 = np.int32
  sft_batch = shd.abstract_rows({k: ((cfg.batch, cfg.max_len), i32) for k in ("inputs", "targets", "loss_mask")}, mesh)
  grpo_batch = shd.abstract_rows({"prompt": ((cfg.minibatch, prompt), i32), "prompt_mask": ((cfg.minibatch, prompt), i32),
                                  "tokens": ((cfg.minibatch, cfg.max_new_tokens), i32),
                                  "completion_mask": ((cfg.minibatch, cfg.max_new_tokens), i32),
                                  "old_logp": ((cfg.minibatch, cfg.max_new_tokens), np.float32),
                                  "advantages": ((cfg.minibatch,), np.float32)}, mesh)
  stop = (model.eos_token_id,) if isinstance(model.eos_token_id, int) else tuple(model.eos_token_id or ())
  gen = functools.partial(generate_workload, cfg=model, params=rl_state.params, batch=batch, prompt_len=prompt,
                          max_new=cfg.max_new_tokens, stop=stop, pad_id=agent.PAD)
  return [plan_lib.Workload("sft_step", "train", step, (sft_state, sft_batch), counts["sft"], 3 * cfg.batch * fwd),
          gen("rollout", steps=counts["rollout"], temperature=cfg.temperature, return_logprobs=True),
          plan_lib.Workload("grpo_step", "train", rstep, (rl_state, grpo_batch), counts["grpo"],
                            3 * cfg.minibatch * fwd),
          gen("eval_generate", steps=counts["eval"])]
