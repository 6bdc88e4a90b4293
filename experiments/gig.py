"""GiG planning (Graph-in-Graph; papers/DIGEST.md "gig", no public code): the planner pieces that need no LLM.

The inner graphs are the scene graphs of `jaxlab.envs.cooking`, embedded by `jaxlab.models.gnn` into unit
vectors; the outer graph is the experience memory: one node per state embedding of a solved trace, linked to
the next state by the action taken. At a new state the planner
- retrieves the next action of the nearest remembered state when its distance is below `threshold` (0.1),
- warns of a loop when the episode comes back to a state it already visited,
- otherwise looks ahead symbolically: every valid action is expanded to depth `depth` with the env's own
  transitions; an action is rejected when it leads to a dead end (a state from which the recipe can no longer
  be made), and the actions that reach the goal within the depth are marked.
The registered experiment needs no LLM: it solves generated kitchen problems by breadth-first search over the
symbolic transitions, trains the GAT on those traces (triplet + uniformity loss), and measures (1) triplet
accuracy on held-out traces (adjacent step nearer than another trace's state) before and after training and (2)
the planner alone (retrieval, else lookahead, else the first allowed action) on seen and unseen problems, with
the trained memory and with an empty one. The LLM agent that GiG puts on top of these pieces is not here.

  python -m experiments run gig --preset cpu
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections import deque
from typing import NamedTuple, Sequence

import jax
import numpy as np
import optax

from experiments import registry
from experiments.runner.claims import Claim
from jaxlab.envs import cooking
from jaxlab.models import gnn

THRESHOLD = 0.1


class Retrieval(NamedTuple):
  action: str
  distance: float
  trace: int
  step: int


class Memory:
  """The outer graph: state embeddings [M, Z] with, for each, the action taken from it in its solved trace
  (edges to the next state's node); terminal states are stored without an outgoing action."""

  def __init__(self, d_embed: int):
    self.z = np.zeros((0, d_embed), np.float32)
    self.actions: list[str | None] = []
    self.where: list[tuple[int, int]] = []
    self.next: list[int | None] = []
    self.traces = 0

  def add_trace(self, z_TZ, actions: Sequence[str]) -> None:
    """A solved trace: T state embeddings and the T - 1 actions between them."""
    z_TZ = np.asarray(z_TZ, np.float32)
    if z_TZ.ndim != 2 or z_TZ.shape[1] != self.z.shape[1]:
      raise ValueError(f"Memory.add_trace: embeddings must be [T, {self.z.shape[1]}], found {z_TZ.shape}")
    if len(actions) != z_TZ.shape[0] - 1:
      raise ValueError(f"Memory.add_trace: {z_TZ.shape[0]} states need {z_TZ.shape[0] - 1} actions, found "
                       f"{len(actions)}")
    base = self.z.shape[0]
    self.z = np.concatenate([self.z, z_TZ])
    for t in range(z_TZ.shape[0]):
      last = t == z_TZ.shape[0] - 1
      self.actions.append(None if last else actions[t])
      self.next.append(None if last else base + t + 1)
      self.where.append((self.traces, t))
    self.traces += 1

  def nearest(self, z_Z) -> tuple[int, float] | None:
    """(node, Euclidean distance) of the nearest stored state that has an outgoing action."""
    live = np.flatnonzero([a is not None for a in self.actions])
    if live.size == 0:
      return None
    d = np.linalg.norm(self.z[live] - np.asarray(z_Z, np.float32)[None], axis=-1)
    j = int(np.argmin(d))
    return int(live[j]), float(d[j])

  def retrieve(self, z_Z, threshold: float = THRESHOLD) -> Retrieval | None:
    """The remembered next action when the nearest stored state is closer than `threshold`, else None."""
    hit = self.nearest(z_Z)
    if hit is None or hit[1] >= threshold:
      return None
    node, dist = hit
    return Retrieval(self.actions[node], dist, *self.where[node])


class LoopDetector:
  """Remembers this episode's states (any hashable key: the symbolic state, or a rounded embedding); `visit`
  returns a warning when the state was seen before. Exact repeats, not embedding distance: training pulls
  adjacent states together, so a distance threshold would flag ordinary progress as a loop."""

  def __init__(self):
    self.seen: dict = {}

  def visit(self, key, step: int) -> str | None:
    if key in self.seen:
      return f"loop warning: this state was already visited at step {self.seen[key]}; try a different action"
    self.seen[key] = step
    return None


def dead_end(problem: cooking.Problem, state: cooking.State) -> str | None:
  """Why the recipe can no longer be made from `state`, or None. Food in a pot stays there, so a stack item in
  a pot, a soup ingredient in another pot, or one added to the pot uncut (it can only be cut on a board) is lost."""
  g = problem.goal
  for i in g.items:
    pot = state.inside.get(i)
    if pot is None:
      continue
    if g.kind == "stack":
      return f"{i} is in {pot} and can no longer go on the {g.recipe.replace('_', ' ')}"
    if pot != g.pot:
      return f"{i} is in {pot}, not in {g.pot}"
    if i not in state.cut:
      return f"{i} went into {pot} uncut and can no longer be cut"
  return None


def _key(problem, state):
  """A hashable symbolic state (equal keys: equal states)."""
  del problem
  return (state.robot, state.holding, frozenset(state.below.items()), frozenset(state.inside.items()),
          frozenset(state.cut), frozenset(state.cooked), frozenset(state.water), frozenset(state.boiled),
          frozenset(state.timers.items()))


class Option(NamedTuple):
  action: str
  rejected: str | None
  goal_in: int | None  # actions to the goal through this one (<= depth), None if not within the depth


def lookahead(problem: cooking.Problem, state: cooking.State, depth: int) -> list[Option]:
  """Every valid action, expanded breadth-first with the symbolic transitions to `depth` actions in all:
  rejected (with the reason) when it leads to a dead end, and with the fewest actions to the goal when the goal
  is within the depth (dead-end states are not expanded)."""
  if depth < 1:
    raise ValueError(f"lookahead: depth must be >= 1, found {depth}")
  out = []
  for a in cooking.valid_actions(problem, state):
    s1 = cooking.step(problem, state, a, check=False)
    why = dead_end(problem, s1)
    if why is not None:
      out.append(Option(a.text, why, None))
      continue
    goal_in, seen, frontier = None, {_key(problem, s1)}, deque([(s1, 1)])
    while frontier:
      s, d = frontier.popleft()
      if cooking.success(problem, s):
        goal_in = d
        break
      if d == depth:
        continue
      for b in cooking.valid_actions(problem, s):
        s2 = cooking.step(problem, s, b, check=False)
        k = _key(problem, s2)
        if k not in seen and dead_end(problem, s2) is None:
          seen.add(k)
          frontier.append((s2, d + 1))
    out.append(Option(a.text, None, goal_in))
  return out


@dataclasses.dataclass
class Planner:
  """One decision per state: a retrieved action, else the lookahead's best (fewest actions to the goal, then
  the first valid one not rejected); the loop warning and the rejected actions go to the agent's prompt."""
  memory: Memory
  threshold: float = THRESHOLD
  depth: int = 2

  def __post_init__(self):
    self.loops = LoopDetector()

  def decide(self, problem: cooking.Problem, state: cooking.State, z_Z, step: int) -> dict:
    warning = self.loops.visit(_key(problem, state), step)
    hit = self.memory.retrieve(z_Z, self.threshold)
    options = lookahead(problem, state, self.depth)
    allowed = [o for o in options if o.rejected is None]
    if hit is not None and warning is None and any(o.action == hit.action for o in allowed):
      return {"action": hit.action, "source": "memory", "distance": hit.distance, "warning": None,
              "rejected": [o for o in options if o.rejected]}
    ranked = sorted(allowed, key=lambda o: (o.goal_in is None, o.goal_in or 0))
    return {"action": ranked[0].action if ranked else None, "source": "lookahead", "distance": None,
            "warning": warning, "rejected": [o for o in options if o.rejected]}


def shortest_plan(problem: cooking.Problem, state: cooking.State | None = None,
                  max_states: int = 200_000) -> list[cooking.Action] | None:
  """A shortest action sequence to the goal by breadth-first search over the symbolic transitions (None when
  there is none within `max_states` states)."""
  start = problem.init if state is None else state
  parent = {_key(problem, start): None}
  frontier = deque([start])
  while frontier and len(parent) <= max_states:
    s = frontier.popleft()
    if cooking.success(problem, s):
      plan, k = [], _key(problem, s)
      while parent[k] is not None:
        k, a = parent[k]
        plan.append(a)
      return plan[::-1]
    k0 = _key(problem, s)
    for a in cooking.valid_actions(problem, s):
      s2 = cooking.step(problem, s, a, check=False)
      k = _key(problem, s2)
      if k not in parent:
        parent[k] = (k0, a)
        frontier.append(s2)
  return None


# ---------------------------------------------------------------------------------------------- experiment

@dataclasses.dataclass(frozen=True)
class Config:
  """gig settings: `train_problems` solved problems (seeds 0..) train the GAT and fill the memory, `test_problems`
  (seeds 1000..) are unseen; `steps` Adam steps on `triplets` triplets each."""
  recipes: tuple[str, ...] = ("burger", "cheese_sandwich", "onion_soup")
  mode: str = "sync"
  train_problems: int = 6
  test_problems: int = 3
  distractors: int = 0
  model: str = "gig-tiny"
  steps: int = 100
  triplets: int = 16
  lr: float = 3e-3
  margin: float = 0.5
  uniformity_weight: float = 0.1
  threshold: float = THRESHOLD
  depth: int = 2
  max_steps: int = 40
  seed: int = 0

  def __post_init__(self):
    bad = [r for r in self.recipes if r not in cooking.RECIPES]
    if not self.recipes or bad:
      raise ValueError(f"recipes must be names from {sorted(cooking.RECIPES)}, found {list(self.recipes)}")
    if self.model not in gnn.PRESETS:
      raise ValueError(f"model must be one of {sorted(gnn.PRESETS)}, found {self.model!r}")
    if self.train_problems < 2 or self.test_problems < 2:
      raise ValueError(f"train_problems and test_problems must be >= 2 (negatives come from other traces), found "
                       f"{self.train_problems} and {self.test_problems}")


PRESETS = {
    "smoke": Config(recipes=("burger", "onion_soup"), train_problems=2, test_problems=2, steps=3, triplets=4,
                    max_steps=24, depth=1),
    "cpu": Config(train_problems=12, test_problems=6, steps=300, triplets=32),
    "full": Config(recipes=tuple(sorted(cooking.RECIPES)), train_problems=64, test_problems=32, distractors=1,
                   model="gig", steps=3000, triplets=64, depth=3, max_steps=80),
}


def _problems(cfg: Config, seeds) -> list[cooking.Problem]:
  return [cooking.generate(s, cfg.recipes[s % len(cfg.recipes)], cfg.mode, distractors=cfg.distractors)
          for s in seeds]


def _trace(problem):
  plan = shortest_plan(problem)
  if plan is None:
    raise RuntimeError(f"gig: no plan for {problem.goal}")
  states = [problem.init]
  for a in plan:
    states.append(cooking.step(problem, states[-1], a))
  return states, [a.text for a in plan]


class _Embedder:
  """Scene graphs -> embeddings, padded to fixed sizes so one compiled forward serves every call."""

  def __init__(self, cfg: gnn.Config, nodes: int, edges: int, graphs: int):
    self.sizes = (nodes, edges, graphs)
    self.fn = jax.jit(lambda p, g: gnn.forward(p, g, cfg))

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


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  del resume  # minutes of work at the cpu preset; recomputed
  train = _problems(cfg, range(cfg.train_problems))
  test = _problems(cfg, range(1000, 1000 + cfg.test_problems))
  traces = {"train": [_trace(p) for p in train], "test": [_trace(p) for p in test]}
  graphs = {k: [cooking.scene_graph(p, s) for p, (states, _) in zip(ps, traces[k]) for s in states]
            for k, ps in (("train", train), ("test", test))}
  lengths = {k: [len(states) for states, _ in v] for k, v in traces.items()}
  gcfg = dataclasses.replace(gnn.PRESETS[cfg.model], node_features=cooking.NODE_FEATURES,
                             edge_features=cooking.EDGE_FEATURES)
  max_n = max(int(g.n_node[0]) for g in graphs["train"] + graphs["test"])
  max_e = max(int(g.n_edge[0]) for g in graphs["train"] + graphs["test"])
  g_batch = 3 * cfg.triplets
  train_pad = (gnn.round_up(g_batch * max_n + 1, 64), gnn.round_up(g_batch * max_e, 64), gnn.round_up(g_batch + 1, 8))
  embed = _Embedder(gcfg, gnn.round_up(16 * max_n + 1, 64), gnn.round_up(16 * max_e, 64), 17)
  key = jax.random.PRNGKey(cfg.seed)
  params = gnn.init(gcfg, key)
  rng = np.random.default_rng(cfg.seed)
  acc_init, loss_init = triplet_metrics(embed(params, graphs["test"]), lengths["test"], cfg.margin, cfg.seed + 1)
  tx = optax.adam(cfg.lr)
  opt_state = tx.init(params)
  step = gnn.make_train_step(gcfg, tx, margin=cfg.margin, uniformity_weight=cfg.uniformity_weight)
  with open(os.path.join(out_dir, "metrics.jsonl"), "w") as f:
    losses = []
    for i in range(cfg.steps):
      trip = gnn.sample_triplets(lengths["train"], cfg.triplets, rng)
      flat = trip.T.reshape(-1)
      padded = gnn.pad(gnn.batch([graphs["train"][j] for j in flat]), *train_pad)
      b = cfg.triplets
      batch = {"graphs": padded, "anchor": np.arange(b, dtype=np.int32),
               "positive": np.arange(b, 2 * b, dtype=np.int32), "negative": np.arange(2 * b, 3 * b, dtype=np.int32)}
      params, opt_state, m = step(params, opt_state, jax.tree.map(jax.numpy.asarray, batch))
      losses.append(float(m["loss"]))
      f.write(json.dumps({"step": i, **{k: float(v) for k, v in m.items()}}) + "\n")
  acc_trained, loss_trained = triplet_metrics(embed(params, graphs["test"]), lengths["test"], cfg.margin,
                                              cfg.seed + 1)
  memory = Memory(gcfg.d_embed)
  z_train = embed(params, graphs["train"])
  start = np.concatenate([[0], np.cumsum(lengths["train"])[:-1]])
  for (_, actions), s0, n in zip(traces["train"], start, lengths["train"]):
    memory.add_trace(z_train[s0:s0 + n], actions)
  res = {"triplet_acc.init": acc_init, "triplet_acc.trained": acc_trained, "heldout_triplet_loss.init": loss_init,
         "heldout_triplet_loss.trained": loss_trained,
         "loss.first": losses[0] if losses else None, "loss.last": losses[-1] if losses else None}
  for split, ps in (("seen", train), ("unseen", test)):
    for name, mem in (("memory", memory), ("lookahead", Memory(gcfg.d_embed))):
      runs = [play(p, Planner(mem, cfg.threshold, cfg.depth), embed, params, cfg.max_steps) for p in ps]
      res[f"success.{split}.{name}"] = float(np.mean([r["success"] for r in runs]))
      res[f"steps.{split}.{name}"] = float(np.mean([r["steps"] for r in runs]))
      if name == "memory":
        res[f"memory_share.{split}"] = float(np.mean([r["memory_share"] for r in runs]))
  res["plan_length.mean"] = float(np.mean([len(a) for _, a in traces["train"] + traces["test"]]))
  if losses:
    registry.plot_curves(os.path.join(out_dir, "loss.png"), {"triplet + uniformity": (list(range(len(losses))),
                                                                                       losses)},
                         title="gig: GAT training loss on solved kitchen traces")
  return res


registry.register(registry.Experiment(
    name="gig", config_cls=Config, presets=PRESETS, run=run,
    description="GiG planner pieces on the kitchen: GAT trace embeddings, memory retrieval, symbolic lookahead",
    paper="gig", claims=(
        Claim("embed", "training lowers the triplet loss on held-out traces (next state nearer than other traces' "
              "states by the margin)", "triplet + uniformity training gives trace-aware state embeddings",
              "{heldout_triplet_loss.trained} < {heldout_triplet_loss.init}"),
        Claim("memory", "retrieving actions from solved traces solves seen tasks better than lookahead alone",
              "the experience memory raises success over planning without it",
              "{success.seen.memory} > {success.seen.lookahead}"),
    )))
