"""The run of gig: what `python -m experiments run gig` executes (its Config, presets and claims are in
`experiments/gig/__init__.py`, the paper and its departures in `experiments/gig/README.md`)."""
from __future__ import annotations

import dataclasses
import json
import os

import jax
import jraph
import numpy as np
import optax

from experiments import registry
from experiments._shared import records
from experiments._shared.chat_models import load_chat_model
from experiments.gig import CHOOSERS, Config, cooking, textworld
from experiments.gig import agents as agents_lib
from experiments.gig import loss as loss_lib
from experiments.gig.agents import METHODS, Kitchen, TextGame, play_agent
from experiments.gig.planner import Memory, Planner, shortest_plan
from experiments.runner import splits
from jaxlab.models import gnn


UNSEEN_SEED0 = 1000


def _problems(cfg: Config, seeds, mode: str | None = None) -> list[cooking.Problem]:
  return [cooking.generate(s, cfg.recipes[s % len(cfg.recipes)], mode or cfg.mode, distractors=cfg.distractors)
          for s in seeds]


def problem_text(problem: cooking.Problem) -> str:
  """A kitchen problem's canonical text, whatever its mode: stations, goal and the initial scene in words."""
  return json.dumps({"stations": problem.stations, "goal": repr(problem.goal),
                     "init": cooking.describe(problem, problem.init)})


def unseen_problems(cfg: Config, n: int, mode: str, seen: set[str]) -> list[cooking.Problem]:
  """The first `n` problems of seeds UNSEEN_SEED0.. whose `problem_text` is not in `seen` (the training problems)."""
  out, s = [], UNSEEN_SEED0
  while len(out) < n:
    p = _problems(cfg, [s], mode)[0]
    if problem_text(p) not in seen:
      out.append(p)
    s += 1
  return out


def game_text(env) -> list[str]:
  """A TextWorld game's canonical text, after `env.reset`: its initial facts, sorted."""
  return sorted(textworld.key(env.facts))


def _trace(problem):
  plan = shortest_plan(problem)
  if plan is None:
    raise RuntimeError(f"gig: no plan for {problem.goal}")
  states = [problem.init]
  for a in plan:
    states.append(cooking.step(problem, states[-1], a))
  return states, [a.text for a in plan]


def embed_fn(cfg: gnn.Config):
  """The jitted GAT forward the embedder calls: (params, padded graphs) -> [G, Z] unit embeddings."""
  return jax.jit(lambda p, g: gnn.forward(p, g, cfg))


class _Embedder:
  """Scene graphs -> embeddings, padded to fixed sizes so one compiled forward serves every call."""

  def __init__(self, cfg: gnn.Config, nodes: int, edges: int, graphs: int):
    self.sizes, self.d_embed = (nodes, edges, graphs), cfg.d_embed
    self.fn = embed_fn(cfg)

  def pad(self, graphs):
    n, e, g = self.sizes
    if len(graphs) >= g:
      raise ValueError(f"gig: {len(graphs)} graphs do not fit a batch of {g - 1}")
    return gnn.pad(gnn.batch(graphs), n, e, g)

  def __call__(self, params, graphs):
    out = []
    for i in range(0, len(graphs), self.sizes[2] - 1):
      chunk = graphs[i:i + self.sizes[2] - 1]
      out.append(np.asarray(self.fn(params, self.pad(chunk)))[:len(chunk)])
    return np.concatenate(out)


def triplet_metrics(z, lengths, margin: float, seed: int, n: int = 512) -> tuple[float, float]:
  """(accuracy: the next state nearer than another trace's state, triplet loss) on `n` sampled triplets."""
  t = gnn.sample_triplets(lengths, n, np.random.default_rng(seed))
  d_ap = np.sum((z[t[:, 0]] - z[t[:, 1]]) ** 2, axis=-1)
  d_an = np.sum((z[t[:, 0]] - z[t[:, 2]]) ** 2, axis=-1)
  return float(np.mean(d_ap < d_an)), float(np.mean(np.maximum(d_ap - d_an + margin, 0.0)))


def play(problem, planner: Planner, embed, params, max_steps: int) -> dict:
  state, sources = problem.init, []
  for t in range(max_steps):
    if cooking.success(problem, state):
      break
    z = embed(params, [cooking.scene_graph(problem, state)])[0]
    out = planner.decide(problem, state, z, t)
    if out["action"] is None:
      break
    sources.append(out["source"])
    state = cooking.step(problem, state, cooking.parse_action(problem, state, out["action"]))
  return {"success": cooking.success(problem, state), "steps": len(sources),
          "memory_share": float(np.mean([s == "memory" for s in sources])) if sources else 0.0}


def _tw_settings(cfg: Config) -> dict:
  return {"recipe": cfg.tw_recipe, "take": cfg.tw_take, "go": cfg.tw_go, "open": cfg.tw_open, "cut": cfg.tw_cut,
          "cook": cfg.tw_cook}


EMBED_GRAPHS = 16  # graphs per call of the embedder (one more, empty, holds the padding)


def pad_sizes(cfg: Config, max_n: int, max_e: int) -> tuple[tuple, tuple]:
  """((nodes, edges, graphs) of a padded training batch, the same of an embedder call) for graphs of at most
  `max_n` nodes and `max_e` edges: a batch holds 3 x `triplets` graphs (anchors, positives, negatives)."""
  g_batch = 3 * cfg.triplets
  return ((gnn.round_up(g_batch * max_n + 1, 64), gnn.round_up(g_batch * max_e, 64), gnn.round_up(g_batch + 1, 8)),
          (gnn.round_up(EMBED_GRAPHS * max_n + 1, 64), gnn.round_up(EMBED_GRAPHS * max_e, 64), EMBED_GRAPHS + 1))


def train_step(cfg: Config, gcfg: gnn.Config):
  """(the jitted GAT step `fit_gat` runs, its Adam)."""
  tx = optax.adam(cfg.lr)
  return loss_lib.make_train_step(gcfg, tx, margin=cfg.margin, uniformity_weight=cfg.uniformity_weight,
                                  uniformity=cfg.uniformity), tx


def fit_gat(cfg: Config, gcfg: gnn.Config, graphs, lengths, more_graphs, log_path: str):
  """(params, embedder, losses): the GAT trained by `cfg.steps` Adam steps on triplets of the traces `graphs`
  (consecutive runs of `lengths`); the embedder is sized for these graphs and `more_graphs` too."""
  every = list(graphs) + list(more_graphs)
  max_n, max_e = max(int(g.n_node[0]) for g in every), max(int(g.n_edge[0]) for g in every)
  train_pad, embed_pad = pad_sizes(cfg, max_n, max_e)
  embed = _Embedder(gcfg, *embed_pad)
  params = gnn.init(gcfg, jax.random.PRNGKey(cfg.seed))
  rng = np.random.default_rng(cfg.seed)
  step, tx = train_step(cfg, gcfg)
  opt_state = tx.init(params)
  b, losses = cfg.triplets, []
  with open(log_path, "w") as f:
    for i in range(cfg.steps):
      flat = gnn.sample_triplets(lengths, b, rng).T.reshape(-1)
      batch = {"graphs": gnn.pad(gnn.batch([graphs[j] for j in flat]), *train_pad),
               "anchor": np.arange(b, dtype=np.int32), "positive": np.arange(b, 2 * b, dtype=np.int32),
               "negative": np.arange(2 * b, 3 * b, dtype=np.int32)}
      params, opt_state, m = step(params, opt_state, jax.tree.map(jax.numpy.asarray, batch))
      losses.append(float(m["loss"]))
      f.write(json.dumps({"step": i, **{k: float(v) for k, v in m.items()}}) + "\n")
  return params, embed, losses


def _score(res: dict, env: str, method: str, runs: list[dict]) -> None:
  for k in ("pass1", "calls", "tokens", "steps"):
    res[f"{k}.{env}.{method}"] = float(np.mean([r["success" if k == "pass1" else k] for r in runs]))
  res.setdefault("per_item", {})[f"pass1.{env}.{method}"] = [float(r["success"]) for r in runs]  # paired by world
  if method == "gig":
    res[f"memory_share.{env}"] = float(np.mean([r["memory_share"] for r in runs]))


def _log(f, env: str, method: str, r: dict) -> None:
  f.write(json.dumps({"env": env, "method": method, **{k: v for k, v in r.items() if k != "graphs"}}) + "\n")


def evaluate_agents(cfg: Config, env: str, worlds, upper_bounds, llm, memory: Memory, embed, gparams, f) -> dict:
  """Every method on `worlds` (fresh per method: `worlds()` yields them in seed order); `upper_bounds` holds the
  planner's action list per world (None when it finds none). GiG's memory grows by each episode it solves."""
  res = {}
  for method in METHODS:
    runs = []
    for world, plan in zip(worlds(), upper_bounds):
      if method == "planner":
        r = {"success": plan is not None and len(plan) <= cfg.llm_max_steps, "steps": len(plan or ()), "calls": 0,
             "tokens": 0, "memory_share": 0.0, "actions": list(plan or ())}
      else:
        r = play_agent(world, method, llm, depth=cfg.depth, max_steps=cfg.llm_max_steps, memory=memory,
                       embed=embed, gparams=gparams, threshold=cfg.threshold, retrieval=cfg.retrieval)
        if method == "gig" and r["success"]:
          memory.add_trace(embed(gparams, r["graphs"]), r["actions"])
      runs.append(r)
      _log(f, env, method, r)
    _score(res, env, method, runs)
  return res


def _memory(d_embed: int, z, lengths, traces) -> Memory:
  """A memory of solved traces: `z` holds their state embeddings back to back (consecutive runs of `lengths`)."""
  memory = Memory(d_embed)
  for (_, actions), s0, n in zip(traces, np.cumsum([0] + list(lengths[:-1])), lengths):
    memory.add_trace(z[s0:s0 + n], actions)
  return memory


def _kitchen_agents(cfg: Config, llm, embed, gparams, memory_of, problems_of, f) -> dict:
  """The kitchen part; `memory_of(mode)` is a fresh memory of the mode's training traces, `problems_of[mode]` the
  mode's unseen problems."""
  res = {}
  for env in (e for e in cfg.llm_envs if e.startswith("cooking_")):
    mode = env.split("_")[1]
    memory = memory_of(mode)
    problems = problems_of[mode]
    plans = [[a.text for a in plan] if (plan := shortest_plan(p)) is not None else None for p in problems]
    records.merge(res, evaluate_agents(cfg, env, lambda problems=problems: [Kitchen(p) for p in problems], plans,
                                       llm, memory, embed, gparams, f))
  return res


def _textworld_games(cfg: Config, out_dir: str) -> dict:
  """The TextWorld games: `tw_train_games` training games (seeds 0..) and `llm_problems` unseen ones (seeds
  UNSEEN_SEED0.., skipping any whose initial facts equal a training game's), with their canonical texts."""
  games = cfg.tw_games or os.path.join(out_dir, "textworld_games")
  env = textworld.TextWorldCooking(games, **_tw_settings(cfg))
  train = {}
  for seed in range(cfg.tw_train_games):
    env.reset(seed)
    train[seed] = game_text(env)
  seen, test, s = {json.dumps(t) for t in train.values()}, {}, UNSEEN_SEED0
  while len(test) < cfg.llm_problems:
    env.reset(s)
    if json.dumps(game_text(env)) not in seen:
      test[s] = game_text(env)
    s += 1
  return {"dir": games, "train": train, "test": test}


def _textworld_agents(cfg: Config, games: dict, out_dir: str, llm, f) -> dict:
  """The TextWorld part (`games` from `_textworld_games`): walkthroughs of the training games train a GAT on fact
  graphs and fill the memory; the agents play the unseen games."""
  env = textworld.TextWorldCooking(games["dir"], **_tw_settings(cfg))
  graphs, lengths, traces = [], [], []
  for seed in games["train"]:
    env.reset(seed)
    walk, trace = list(env.walkthrough), [textworld.scene_graph(env.facts)]
    for a in walk:
      env.step(a)
      trace.append(textworld.scene_graph(env.facts))
    if not env.state["won"]:
      raise RuntimeError(f"gig: TextWorld's walkthrough of game {seed} does not win")
    graphs += trace
    lengths.append(len(trace))
    traces.append((trace, walk))
  gcfg = dataclasses.replace(gnn.PRESETS[cfg.model], node_features=textworld.NODE_FEATURES,
                             edge_features=textworld.EDGE_FEATURES)
  seeds = list(games["test"])
  test = []
  for s in seeds:
    env.reset(s)
    test.append((textworld.scene_graph(env.facts), list(env.walkthrough)))
  params, embed, losses = fit_gat(cfg, gcfg, graphs, lengths, [g for g, _ in test],
                                  os.path.join(out_dir, "metrics_textworld.jsonl"))
  memory = _memory(gcfg.d_embed, embed(params, graphs), lengths, traces)
  worlds = lambda: [TextGame(textworld.TextWorldCooking(games["dir"], **_tw_settings(cfg)), s)  # noqa: E731
                    for s in seeds]
  res = evaluate_agents(cfg, "textworld", worlds, [w for _, w in test], llm, memory, embed, params, f)
  res["textworld.gat_loss.first"], res["textworld.gat_loss.last"] = losses[0], losses[-1]
  return res


def kitchen_gat(cfg: Config) -> gnn.Config:
  """The GAT over kitchen scene graphs."""
  return dataclasses.replace(gnn.PRESETS[cfg.model], node_features=cooking.NODE_FEATURES,
                             edge_features=cooking.EDGE_FEATURES)


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  del resume  # minutes of work at the cpu preset; recomputed
  modes = [e.split("_")[1] for e in cfg.llm_envs if e.startswith("cooking_")] if cfg.llm else []
  modes = list(dict.fromkeys([cfg.mode] + modes))  # the GAT trains on every mode played, cfg.mode's traces first
  by_mode = {m: _problems(cfg, range(cfg.train_problems), m) for m in modes}
  train, train_all = by_mode[cfg.mode], [p for m in modes for p in by_mode[m]]
  seen = {problem_text(p) for p in train_all}
  test = unseen_problems(cfg, cfg.test_problems, cfg.mode, seen)
  agents = {m: unseen_problems(cfg, cfg.llm_problems, m, seen) for m in modes if f"cooking_{m}" in cfg.llm_envs} \
      if cfg.llm else {}
  games = _textworld_games(cfg, out_dir) if cfg.llm and "textworld" in cfg.llm_envs else None
  # train: the problems whose traces train the GAT and fill the memory (the "seen" check replays them, a validation
  # check, not an evaluation split); test: the unseen problems the claims score
  split = {"train": {"problems": [problem_text(p) for p in train_all]},
           "test": {"problems": [problem_text(p) for p in test + [q for ps in agents.values() for q in ps]]}}
  if games:
    split["train"]["games"], split["test"]["games"] = list(games["train"].values()), list(games["test"].values())
  splits.record(out_dir, "gig", split)
  traces = {"train": [_trace(p) for p in train_all], "test": [_trace(p) for p in test]}
  graphs = {k: [cooking.scene_graph(p, s) for p, (states, _) in zip(ps, traces[k]) for s in states]
            for k, ps in (("train", train_all), ("test", test))}
  lengths = {k: [len(states) for states, _ in v] for k, v in traces.items()}
  gcfg = kitchen_gat(cfg)
  init = gnn.init(gcfg, jax.random.PRNGKey(cfg.seed))  # fit_gat's own copy: its train step donates the params
  params, embed, losses = fit_gat(cfg, gcfg, graphs["train"], lengths["train"], graphs["test"],
                                  os.path.join(out_dir, "metrics.jsonl"))
  acc_init, loss_init = triplet_metrics(embed(init, graphs["test"]), lengths["test"], cfg.margin, cfg.seed + 1)
  acc_trained, loss_trained = triplet_metrics(embed(params, graphs["test"]), lengths["test"], cfg.margin,
                                              cfg.seed + 1)
  z_train = embed(params, graphs["train"])
  k, ends = cfg.train_problems, np.cumsum([0] + lengths["train"])

  def memory_of(mode: str) -> Memory:
    """A fresh memory of `mode`'s training traces (the k traces of its place in `modes`)."""
    i = modes.index(mode) * k
    return _memory(gcfg.d_embed, z_train[ends[i]:ends[i + k]], lengths["train"][i:i + k], traces["train"][i:i + k])
  memory = memory_of(cfg.mode)
  res = {"triplet_acc.init": acc_init, "triplet_acc.trained": acc_trained, "heldout_triplet_loss.init": loss_init,
         "heldout_triplet_loss.trained": loss_trained,
         "loss.first": losses[0] if losses else None, "loss.last": losses[-1] if losses else None}
  for split, ps in (("seen", train), ("unseen", test)):
    for name, mem in (("memory", memory), ("lookahead", Memory(gcfg.d_embed))):
      runs = [play(p, Planner(mem, cfg.threshold, cfg.depth), embed, params, cfg.max_steps) for p in ps]
      res[f"success.{split}.{name}"] = float(np.mean([r["success"] for r in runs]))
      res.setdefault("per_item", {})[f"success.{split}.{name}"] = [float(r["success"]) for r in runs]  # paired
      res[f"steps.{split}.{name}"] = float(np.mean([r["steps"] for r in runs]))
      if name == "memory":
        res[f"memory_share.{split}"] = float(np.mean([r["memory_share"] for r in runs]))
  res["plan_length.mean"] = float(np.mean([len(a) for _, a in traces["train"][:len(train)] + traces["test"]]))
  if cfg.llm:
    mcfg, lparams, tok = load_chat_model(cfg.llm)
    llm = CHOOSERS[cfg.chooser](mcfg, lparams, tok)
    with open(os.path.join(out_dir, "episodes.jsonl"), "w") as f:
      records.merge(res, _kitchen_agents(cfg, llm, embed, params, memory_of, agents, f))
      if games:
        records.merge(res, _textworld_agents(cfg, games, out_dir, llm, f))
  if losses:
    registry.plot_curves(os.path.join(out_dir, "loss.png"), {"triplet + uniformity": (list(range(len(losses))),
                                                                                       losses)},
                         title="gig: GAT training loss on solved kitchen traces")
  return res


PLAN_LLM_PROMPT = 512  # planning: a decision prompt's tokens, bucketed (task, state, notes, lettered actions)
PLAN_LLM_OPTIONS, PLAN_LLM_OPTION_TOKENS = 16, 16  # planning, chooser "likelihood": actions scored a call, their tokens
PLAN_TRACE_STATES = 25  # states per solved kitchen trace at full (its shortest plans' mean length is about 24)


def gat_flops(gcfg: gnn.Config, nodes: int, edges: int, graphs: int) -> float:
  """Matmul FLOPs of one GAT forward over padded sizes: input projection, per layer the node and edge projections,
  the output projection."""
  d = gcfg.d_model
  return 2.0 * (nodes * gcfg.node_features * d + gcfg.n_layers * (nodes * d * d + edges * gcfg.edge_features * d)
                + graphs * d * gcfg.d_embed)


def workloads(cfg: Config, mesh) -> list:
  """What a run computes at `cfg` on the accelerator, for `experiments plan`: the kitchen GAT's train step
  (`train_step`, `steps` calls on 3 x `triplets` padded scene graphs) and its forward (`embed_fn`, EMBED_GRAPHS
  graphs a call), padded as `pad_sizes` pads them for the largest kitchen of the preset's training and test
  problems (every state of a problem has its nodes; at most 2 x (1 + items) edges: the robot's station and each
  item's support, pot or holder, each with its reverse). Forward calls: the held-out and training traces
  embedded (PLAN_TRACE_STATES states each), and one call per planner step at `max_steps` (an upper bound) for
  the seen and unseen problems with and without memory. With `llm`, the LLM agents' decision (`agents.choice_fn`
  or `agents.likelihood_fn`, as `chooser` picks) on prompts of PLAN_LLM_PROMPT tokens, once per step of each LLM
  agent (llm, llm_lookahead, gig) at `llm_max_steps` on `llm_problems` problems of every env (an upper bound: gig
  asks only when memory does not answer); TextWorld's GAT is not planned. GiG's and the LLM's params are replicated
  over `mesh` (the run keeps them on one device, the LLM in fp32). Analytic FLOPs: `gat_flops`, x3 for a train
  step; the LLM's forward FLOPs per token."""
  from experiments.runner import plan as plan_lib
  gcfg = kitchen_gat(cfg)
  probs = _problems(cfg, range(cfg.train_problems)) + unseen_problems(cfg, cfg.test_problems, cfg.mode, set())
  max_n = max(1 + len(p.stations) + len(p.items) for p in probs)
  max_e = max(2 * (1 + len(p.items)) for p in probs)
  (tn, te, tg), (en, ee, eg) = pad_sizes(cfg, max_n, max_e)
  rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  def replicated(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), tree)

  def graphs(n, e, g):
    f32, i32 = np.float32, np.int32
    return replicated(jraph.GraphsTuple(
        nodes=jax.ShapeDtypeStruct((n, gcfg.node_features), f32), edges=jax.ShapeDtypeStruct((e, gcfg.edge_features),
                                                                                            f32),
        senders=jax.ShapeDtypeStruct((e,), i32), receivers=jax.ShapeDtypeStruct((e,), i32),
        n_node=jax.ShapeDtypeStruct((g,), i32), n_edge=jax.ShapeDtypeStruct((g,), i32), globals=None))
  step, tx = train_step(cfg, gcfg)
  params = replicated(jax.eval_shape(lambda: gnn.init(gcfg, jax.random.PRNGKey(cfg.seed))))
  opt_state = replicated(jax.eval_shape(tx.init, params))
  b = cfg.triplets
  index = replicated(jax.ShapeDtypeStruct((b,), np.int32))
  batch = {"graphs": graphs(tn, te, tg), "anchor": index, "positive": index, "negative": index}
  states = PLAN_TRACE_STATES * cfg.train_problems, PLAN_TRACE_STATES * cfg.test_problems
  calls = (2 * -(-states[1] // EMBED_GRAPHS) + -(-states[0] // EMBED_GRAPHS)
           + 2 * (cfg.train_problems + cfg.test_problems) * cfg.max_steps)
  out = [plan_lib.Workload("gat_train_step", "train", step, (params, opt_state, batch), cfg.steps,
                           3 * gat_flops(gcfg, tn, te, tg)),
         plan_lib.Workload("gat_embed", "forward", embed_fn(gcfg), (params, graphs(en, ee, eg)), calls,
                           gat_flops(gcfg, en, ee, eg))]
  if cfg.llm:
    from experiments._shared.chat_models import abstract_params, model_config
    from jaxlab.models import transformer as tfm
    mcfg = model_config(cfg.llm)
    lparams = abstract_params(mcfg, mesh, "dp")
    w, i32 = PLAN_LLM_PROMPT, np.int32
    prompt = replicated(jax.ShapeDtypeStruct((1, w), i32))
    asks = len(cfg.llm_envs) * cfg.llm_problems * 3 * cfg.llm_max_steps
    if cfg.chooser == "letter":
      args, tokens = (lparams, prompt, prompt, replicated(jax.ShapeDtypeStruct((), i32))), w
      fn = agents_lib.choice_fn(mcfg, range(len(agents_lib.LABELS)))
    else:
      opts = replicated(jax.ShapeDtypeStruct((PLAN_LLM_OPTIONS, PLAN_LLM_OPTION_TOKENS), i32))
      args, tokens = (lparams, prompt, prompt, opts, opts), w + PLAN_LLM_OPTIONS * PLAN_LLM_OPTION_TOKENS
      fn = agents_lib.likelihood_fn(mcfg)
    out.append(plan_lib.Workload(f"llm_{cfg.chooser}", "forward", fn, args, asks,
                                 tfm.flops_per_token(mcfg, w) / 3 * tokens))
  return out
