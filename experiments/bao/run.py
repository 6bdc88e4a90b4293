"""The bao pipeline (package docstring): data, the policy, pretraining, the two SFT warm starts, GRPO for
UserRL and BAO, and evaluation."""
from __future__ import annotations

import math
import os
import time

import jax
import numpy as np

from experiments import registry
from experiments._shared import recipes
from experiments._shared.chat_models import answer, load_chat_model
from experiments.bao import agent, train
from experiments.bao import function as fn_gym
from experiments.bao import turtle as tt_gym
from experiments.runner import splits
from jaxlab import losses
from experiments.bao import telepathy as tp_gym
from jaxlab.models import transformer as tfm
from experiments.bao import objective as bao_lib
from jaxlab.rl import grpo as grpo_lib
from experiments.bao import turns as turns_lib
from jaxlab.train import metrics as metrics_lib
from jaxlab.train import loop as loop_lib
from jaxlab.train import rl_loop, schedules
from jaxlab.train import state as state_lib


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


def policy_model(cfg, data):
  """(model config, params, codec): the small word-level model (fresh) or a chat model by path."""
  if cfg.policy == "word":
    codec = agent.WordCodec([m["content"] for kind in data.values() for e in kind for m in e.history])
    model = tfm.Config(vocab_size=codec.vocab_size, d_model=cfg.d_model, n_layers=cfg.layers, n_heads=cfg.heads,
                       d_ff=cfg.d_ff, max_position_embeddings=cfg.max_len, bos_token_id=agent.BOS,
                       eos_token_id=agent.EOS, pad_token_id=agent.PAD)
    return model, tfm.init(model, jax.random.PRNGKey(cfg.seed)), codec
  model, params, tok = load_chat_model(cfg.policy)
  return model, params, agent.ChatCodec(tok, SYSTEM)


def fit(cfg, step, tx, params, codec, episodes, steps: int, seed: int, phase: str, writer):
  """`steps` of next-token training on the policy's reply tokens of `episodes` with the jitted `step`."""
  if steps == 0:
    return params
  rows = [r for e in episodes for r in agent.sft_rows(codec, e.history)]
  state = state_lib.init_state(lambda _: params, tx, seed)
  batches = train.lm_batches(rows, cfg.batch, cfg.max_len, seed, cfg.bucket)
  res = loop_lib.train_loop(state, step, batches, steps, log_every=max(1, steps // 5), desc=phase)
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
  state = state_lib.init_state(lambda _: params, tx, cfg.seed)
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
        state, m = step(state, batch)
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
  model, params, codec = policy_model(cfg, data)
  writer = metrics_lib.MetricsWriter(os.path.join(out_dir, "metrics.jsonl"))
  policy = train.Policy(model, codec, cfg.max_new_tokens, cfg.max_len - cfg.max_new_tokens,
                        cfg.prompts_per_gym * cfg.group, cfg.bucket)
  # one compiled step for the three phases; each phase's optimizer state restarts the warmup-cosine schedule
  lr = schedules.warmup_cosine(cfg.lr, cfg.sft_steps, max(1, cfg.sft_steps // 20))
  tx = recipes.optimizer(lr, "adamw", grad_clip=1.0, weight_decay=0.0)
  step = recipes.train_step(losses.sft_loss_fn(model), tx)
  base = fit(cfg, step, tx, params, codec, data["random"], cfg.pretrain_steps, cfg.seed, "pretrain", writer)
  need = set(cfg.methods)
  enhanced = fit(cfg, step, tx, base, codec, data["enhanced"], cfg.sft_steps, cfg.seed + 1, "sft", writer) \
      if need & {"sft", "bao"} else None
  plain = fit(cfg, step, tx, base, codec, data["plain"], cfg.sft_steps, cfg.seed + 2, "sft_plain", writer) \
      if "grpo_userrl" in need else None
  gcfg = grpo_lib.GRPOConfig(prompts_per_batch=cfg.prompts_per_gym * len(makes), group_size=cfg.group,
                             max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, beta=0.0,
                             aggregation="token_mean", updates_per_batch=cfg.updates_per_batch)
  rtx = recipes.optimizer(cfg.rl_lr, "adamw", grad_clip=1.0, weight_decay=0.0)
  rstep = rl_loop.jit_grpo_step(rl_loop.make_grpo_step(model, gcfg, rtx))
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
