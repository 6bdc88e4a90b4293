"""A Robotouille-like kitchen for GiG planning (experiments/gig/README.md): stations, ingredients, a pot, recipes.

A robot moves between stations (stoves, cutting boards, tables, a sink), picks up and places items, stacks them,
cuts vegetables on a board, cooks patties on a stove, fills the pot at the sink, boils it on a stove and adds
ingredients to it. A task is one recipe: a stack served on a table (burgers, sandwiches: named items from the
bottom up, with the states they must be in) or a soup (the pot, boiled, holding cut ingredients, on a table).

Two modes, as Robotouille has them: "sync" (every action's effect is immediate) and "async" (cooking takes
`cook_time` actions and boiling `boil_time`, counting the one that starts it; meanwhile the robot works
elsewhere or waits; picking the item or pot up stops it). Every state exports to STRIPS PDDL (`DOMAIN`,
`pddl_problem`, `atoms`): the sync transitions are exactly the domain's operators (an async state reads as its
sync abstraction, an item still cooking being raw), so a classical planner (pyperplan) plans for the env. Every
state also gives a scene graph (`scene_graph`: robot, station and item nodes with typed features; at / holding /
on / in edges, each with its reverse) as a jraph.GraphsTuple for `jaxlab.models.gnn`.

The env follows `jaxlab.envs.base`: `reset(seed)` draws a problem and returns the task with the first
observation; `[action] <action text>` takes one of the valid actions the observation lists; the episode ends with
reward 1 when the recipe is done, or on `[finish]`.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Literal, NamedTuple

import jraph
import numpy as np

from jaxlab import choices
from jaxlab.envs.base import Turn

STATION_KINDS = ("stove", "board", "table", "sink")
ITEM_KINDS = ("bottombun", "topbun", "bread", "patty", "lettuce", "tomato", "cheese", "onion", "potato", "pot")
CUTTABLE = frozenset({"lettuce", "tomato", "onion", "potato"})
COOKABLE = frozenset({"patty"})
SOUP_INGREDIENTS = frozenset({"onion", "potato", "tomato"})
Mode = Literal["sync", "async"]
MODES = choices.values(Mode)

# A stack recipe lists (kind, required state) from the bottom up; a soup recipe lists its ingredients.
RECIPES = {
    "burger": ("stack", (("bottombun", None), ("patty", "cooked"), ("topbun", None))),
    "lettuce_burger": ("stack", (("bottombun", None), ("patty", "cooked"), ("lettuce", "cut"), ("topbun", None))),
    "cheeseburger": ("stack", (("bottombun", None), ("patty", "cooked"), ("cheese", None), ("topbun", None))),
    "sandwich": ("stack", (("bread", None), ("lettuce", "cut"), ("tomato", "cut"), ("bread", None))),
    "cheese_sandwich": ("stack", (("bread", None), ("cheese", None), ("bread", None))),
    "onion_soup": ("soup", ("onion",)),
    "potato_soup": ("soup", ("potato", "onion")),
}

NODE_KINDS = ("robot",) + STATION_KINDS + ITEM_KINDS
FLAGS = ("cut", "cooked", "water", "boiled", "progress", "held")
INSTANCE_SLOTS = 4  # one-hot of the instance number (table1, table2, ...); numbers above share the last slot
NODE_FEATURES = len(NODE_KINDS) + len(FLAGS) + INSTANCE_SLOTS
EDGE_TYPES = ("at", "hosts", "holding", "held_by", "on", "under", "in", "contains")
EDGE_FEATURES = len(EDGE_TYPES)


class Action(NamedTuple):
  """kind: move | pick-up | place | unstack | stack | cut | cook | fill | boil | add | wait; args as in the PDDL
  operator of the same name (the robot's station last, or (from, to) for move)."""
  kind: str
  args: tuple

  @property
  def text(self) -> str:
    return _TEXT[self.kind].format(*self.args)

  @property
  def pddl(self) -> str:
    return f"({' '.join((self.kind,) + tuple(self.args))})"


_TEXT = {"move": "move to {1}", "pick-up": "pick up {0}", "place": "place {0} on {1}",
         "unstack": "unstack {0} from {1}", "stack": "stack {0} on {1}", "cut": "cut {0}", "cook": "cook {0}",
         "fill": "fill {0} with water", "boil": "boil {0}", "add": "add {0} to {1}", "wait": "wait"}


@dataclasses.dataclass(frozen=True)
class Goal:
  """kind "stack": `items` from the bottom up with `states` (None | "cooked" | "cut") on `table`; kind "soup":
  `pot` boiled, holding the cut `items`, on `table`."""
  recipe: str
  kind: str
  table: str
  items: tuple
  states: tuple = ()
  pot: str | None = None


@dataclasses.dataclass
class State:
  """robot: its station; holding: the held item or None; below: item -> the station or item it rests on; inside:
  item -> pot; timers: item or pot -> steps left (async cooking / boiling)."""
  robot: str
  holding: str | None = None
  below: dict = dataclasses.field(default_factory=dict)
  inside: dict = dataclasses.field(default_factory=dict)
  cut: set = dataclasses.field(default_factory=set)
  cooked: set = dataclasses.field(default_factory=set)
  water: set = dataclasses.field(default_factory=set)
  boiled: set = dataclasses.field(default_factory=set)
  timers: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Problem:
  stations: tuple  # ((name, kind), ...)
  items: tuple  # ((name, kind), ...)
  goal: Goal
  init: State = dataclasses.field(compare=False)
  mode: str = "sync"
  cook_time: int = 3
  boil_time: int = 3

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(f"cooking.Problem: mode must be one of {MODES}, found {self.mode!r}")
    if self.cook_time < 1 or self.boil_time < 1:
      raise ValueError(f"cooking.Problem: cook_time and boil_time must be >= 1, found {self.cook_time}, "
                       f"{self.boil_time}")
    for name, kind in self.stations:
      if kind not in STATION_KINDS:
        raise ValueError(f"cooking.Problem: station {name!r} has kind {kind!r}, expected one of {STATION_KINDS}")
    for name, kind in self.items:
      if kind not in ITEM_KINDS:
        raise ValueError(f"cooking.Problem: item {name!r} has kind {kind!r}, expected one of {ITEM_KINDS}")

  @property
  def station_kind(self) -> dict:
    return dict(self.stations)

  @property
  def item_kind(self) -> dict:
    return dict(self.items)


# ---------------------------------------------------------------------------------------- state queries

def base_station(problem: Problem, state: State, item: str) -> str | None:
  """The station under `item`'s stack (None when held or in a pot)."""
  kinds = problem.station_kind
  x = item
  while x in state.below:
    x = state.below[x]
    if x in kinds:
      return x
  return None


def _top_free(state: State, x: str) -> bool:
  return x not in state.below.values()


def valid_actions(problem: Problem, state: State) -> list[Action]:
  """Every action the robot can take in `state`, sorted by text (a "wait" last in async mode)."""
  sk, ik = problem.station_kind, problem.item_kind
  here, held, out = state.robot, state.holding, []
  out += [Action("move", (here, s)) for s, _ in problem.stations if s != here]
  on_here = [i for i, _ in problem.items if state.below.get(i) == here]
  at_here = [i for i, _ in problem.items if i in state.below and base_station(problem, state, i) == here]
  if held is None:
    for i in at_here:
      if _top_free(state, i):
        b = state.below[i]
        out.append(Action("pick-up", (i, here)) if b == here else Action("unstack", (i, b, here)))
    for i in on_here:
      kind = ik[i]
      if sk[here] == "board" and kind in CUTTABLE and i not in state.cut and _top_free(state, i):
        out.append(Action("cut", (i, here)))
      if sk[here] == "stove" and kind in COOKABLE and i not in state.cooked and i not in state.timers:
        out.append(Action("cook", (i, here)))
      if kind == "pot" and sk[here] == "sink" and i not in state.water:
        out.append(Action("fill", (i, here)))
      if kind == "pot" and sk[here] == "stove" and i in state.water and i not in state.boiled \
          and i not in state.timers:
        out.append(Action("boil", (i, here)))
  else:
    if _top_free(state, here):
      out.append(Action("place", (held, here)))
    if ik[held] != "pot":
      for j in at_here:
        if ik[j] != "pot" and _top_free(state, j):
          out.append(Action("stack", (held, j, here)))
      if ik[held] in SOUP_INGREDIENTS:
        out += [Action("add", (held, p, here)) for p in on_here if ik[p] == "pot"]
  out.sort(key=lambda a: a.text)
  if problem.mode == "async":
    out.append(Action("wait", ()))
  return out


def copy_state(state: State) -> State:
  return State(state.robot, state.holding, dict(state.below), dict(state.inside), set(state.cut), set(state.cooked),
               set(state.water), set(state.boiled), dict(state.timers))


def step(problem: Problem, state: State, action: Action, check: bool = True) -> State:
  """The state after `action` (a new State; raises ValueError when `action` is not valid in `state`, unless
  `check` is False for an action taken from `valid_actions(problem, state)`). In async mode every running timer
  then ticks once, the action's own included."""
  if check and action not in valid_actions(problem, state):
    raise ValueError(f"cooking.step: {action.text!r} is not a valid action here; valid: "
                     f"{[a.text for a in valid_actions(problem, state)]}")
  s = copy_state(state)
  k, a = action.kind, action.args
  asyn = problem.mode == "async"
  if k == "move":
    s.robot = a[1]
  elif k in ("pick-up", "unstack"):
    del s.below[a[0]]
    s.holding = a[0]
    s.timers.pop(a[0], None)
  elif k in ("place", "stack"):
    s.below[a[0]] = a[1]
    s.holding = None
  elif k == "add":
    s.inside[a[0]] = a[1]
    s.holding = None
  elif k == "cut":
    s.cut.add(a[0])
  elif k == "fill":
    s.water.add(a[0])
  elif k == "cook":
    if asyn:
      s.timers[a[0]] = problem.cook_time
    else:
      s.cooked.add(a[0])
  elif k == "boil":
    if asyn:
      s.timers[a[0]] = problem.boil_time
    else:
      s.boiled.add(a[0])
  if asyn:
    for x in list(s.timers):
      s.timers[x] -= 1
      if s.timers[x] == 0:
        del s.timers[x]
        (s.boiled if problem.item_kind[x] == "pot" else s.cooked).add(x)
  return s


def success(problem: Problem, state: State) -> bool:
  """The recipe is done: the goal stack stands on its table in the required states, or the soup is served."""
  g = problem.goal
  if g.kind == "stack":
    for n, (item, need) in enumerate(zip(g.items, g.states)):
      if state.below.get(item) != (g.table if n == 0 else g.items[n - 1]):
        return False
      if (need == "cooked" and item not in state.cooked) or (need == "cut" and item not in state.cut):
        return False
    return True
  return (state.below.get(g.pot) == g.table and g.pot in state.boiled
          and all(state.inside.get(i) == g.pot and i in state.cut for i in g.items))


def parse_action(problem: Problem, state: State, text: str) -> Action | None:
  """The valid action whose text is `text` (case and surrounding spaces and a final period ignored)."""
  t = " ".join(text.strip().rstrip(".").lower().split())
  return next((a for a in valid_actions(problem, state) if a.text == t), None)


# ------------------------------------------------------------------------------------------------ PDDL

DOMAIN = """(define (domain kitchen)
  (:requirements :strips :typing)
  (:types station item)
  (:predicates (robot-at ?s - station) (handempty) (holding ?i - item) (connected ?a - station ?b - station)
    (on-station ?i - item ?s - station) (on-item ?i - item ?j - item) (item-at ?i - item ?s - station)
    (clear ?i - item) (station-clear ?s - station) (in ?i - item ?p - item)
    (is-stove ?s - station) (is-board ?s - station) (is-table ?s - station) (is-sink ?s - station)
    (food ?i - item) (is-pot ?i - item) (cuttable ?i - item) (cookable ?i - item) (addable ?i - item)
    (cut ?i - item) (uncut ?i - item) (cooked ?i - item) (raw ?i - item)
    (has-water ?p - item) (no-water ?p - item) (boiled ?p - item) (unboiled ?p - item))
  (:action move :parameters (?from - station ?to - station)
    :precondition (and (robot-at ?from) (connected ?from ?to))
    :effect (and (robot-at ?to) (not (robot-at ?from))))
  (:action pick-up :parameters (?i - item ?s - station)
    :precondition (and (robot-at ?s) (handempty) (on-station ?i ?s) (clear ?i))
    :effect (and (holding ?i) (station-clear ?s) (not (handempty)) (not (on-station ?i ?s)) (not (item-at ?i ?s))))
  (:action place :parameters (?i - item ?s - station)
    :precondition (and (robot-at ?s) (holding ?i) (station-clear ?s))
    :effect (and (on-station ?i ?s) (item-at ?i ?s) (handempty) (not (holding ?i)) (not (station-clear ?s))))
  (:action unstack :parameters (?i - item ?j - item ?s - station)
    :precondition (and (robot-at ?s) (handempty) (on-item ?i ?j) (clear ?i) (item-at ?i ?s))
    :effect (and (holding ?i) (clear ?j) (not (handempty)) (not (on-item ?i ?j)) (not (item-at ?i ?s))))
  (:action stack :parameters (?i - item ?j - item ?s - station)
    :precondition (and (robot-at ?s) (holding ?i) (food ?i) (food ?j) (clear ?j) (item-at ?j ?s))
    :effect (and (on-item ?i ?j) (item-at ?i ?s) (handempty) (not (holding ?i)) (not (clear ?j))))
  (:action cut :parameters (?i - item ?s - station)
    :precondition (and (robot-at ?s) (is-board ?s) (handempty) (on-station ?i ?s) (clear ?i) (cuttable ?i)
      (uncut ?i))
    :effect (and (cut ?i) (not (uncut ?i))))
  (:action cook :parameters (?i - item ?s - station)
    :precondition (and (robot-at ?s) (is-stove ?s) (handempty) (on-station ?i ?s) (cookable ?i) (raw ?i))
    :effect (and (cooked ?i) (not (raw ?i))))
  (:action fill :parameters (?p - item ?s - station)
    :precondition (and (robot-at ?s) (is-sink ?s) (handempty) (on-station ?p ?s) (is-pot ?p) (no-water ?p))
    :effect (and (has-water ?p) (not (no-water ?p))))
  (:action boil :parameters (?p - item ?s - station)
    :precondition (and (robot-at ?s) (is-stove ?s) (handempty) (on-station ?p ?s) (has-water ?p) (unboiled ?p))
    :effect (and (boiled ?p) (not (unboiled ?p))))
  (:action add :parameters (?i - item ?p - item ?s - station)
    :precondition (and (robot-at ?s) (holding ?i) (addable ?i) (is-pot ?p) (on-station ?p ?s))
    :effect (and (in ?i ?p) (handempty) (not (holding ?i)))))
"""


def static_atoms(problem: Problem) -> set[str]:
  out = {f"(connected {a} {b})" for (a, _), (b, _) in itertools.permutations(problem.stations, 2)}
  out |= {f"(is-{k} {s})" for s, k in problem.stations}
  for i, k in problem.items:
    out.add(f"(is-pot {i})" if k == "pot" else f"(food {i})")
    out |= {f"({p} {i})" for p, kinds in (("cuttable", CUTTABLE), ("cookable", COOKABLE),
                                           ("addable", SOUP_INGREDIENTS)) if k in kinds}
  return out


def atoms(problem: Problem, state: State) -> set[str]:
  """The dynamic PDDL atoms true in `state` (an item still cooking or a pot still boiling reads as raw / unboiled)."""
  sk = problem.station_kind
  out = {f"(robot-at {state.robot})", "(handempty)" if state.holding is None else f"(holding {state.holding})"}
  out |= {f"(station-clear {s})" for s, _ in problem.stations if _top_free(state, s)}
  for i, k in problem.items:
    if _top_free(state, i):
      out.add(f"(clear {i})")
    if i in state.below:
      b = state.below[i]
      out.add(f"(on-station {i} {b})" if b in sk else f"(on-item {i} {b})")
      out.add(f"(item-at {i} {base_station(problem, state, i)})")
    if i in state.inside:
      out.add(f"(in {i} {state.inside[i]})")
    if k in CUTTABLE:
      out.add(f"(cut {i})" if i in state.cut else f"(uncut {i})")
    if k in COOKABLE:
      out.add(f"(cooked {i})" if i in state.cooked else f"(raw {i})")
    if k == "pot":
      out.add(f"(has-water {i})" if i in state.water else f"(no-water {i})")
      out.add(f"(boiled {i})" if i in state.boiled else f"(unboiled {i})")
  return out


def goal_atoms(problem: Problem) -> set[str]:
  g = problem.goal
  if g.kind == "stack":
    out = {f"(on-station {g.items[0]} {g.table})"}
    out |= {f"(on-item {b} {a})" for a, b in zip(g.items, g.items[1:])}
    out |= {f"({need} {i})" for i, need in zip(g.items, g.states) if need is not None}
    return out
  return ({f"(on-station {g.pot} {g.table})", f"(boiled {g.pot})"} | {f"(in {i} {g.pot})" for i in g.items}
          | {f"(cut {i})" for i in g.items})


def pddl_problem(problem: Problem, state: State | None = None, name: str = "kitchen-task") -> str:
  """A STRIPS problem of DOMAIN starting from `state` (default: the problem's initial state)."""
  state = problem.init if state is None else state
  objs = " ".join(s for s, _ in problem.stations) + " - station " + " ".join(i for i, _ in problem.items) + " - item"
  init = " ".join(sorted(static_atoms(problem) | atoms(problem, state)))
  goal = " ".join(sorted(goal_atoms(problem)))
  return (f"(define (problem {name}) (:domain kitchen)\n  (:objects {objs})\n  (:init {init})\n"
          f"  (:goal (and {goal})))\n")


# ----------------------------------------------------------------------------------------- scene graph

def scene_graph(problem: Problem, state: State) -> jraph.GraphsTuple:
  """One graph: nodes robot, stations, items (in problem order) with one-hot NODE_KINDS, FLAGS ("progress" is the
  fraction of a running cook / boil done) and the one-hot instance number (so the robot at table1 and at table2
  are different graphs); edges robot-at-station, robot-holding-item,
  item-on-station/item, item-in-pot, each with its reverse, one-hot over EDGE_TYPES."""
  names = ["robot"] + [s for s, _ in problem.stations] + [i for i, _ in problem.items]
  kinds = ["robot"] + [k for _, k in problem.stations] + [k for _, k in problem.items]
  idx = {n: j for j, n in enumerate(names)}
  nodes = np.zeros((len(names), NODE_FEATURES), np.float32)
  for j, (n, k) in enumerate(zip(names, kinds)):
    nodes[j, NODE_KINDS.index(k)] = 1.0
    f = len(NODE_KINDS)
    nodes[j, f:f + len(FLAGS)] = [n in state.cut, n in state.cooked, n in state.water, n in state.boiled, 0.0,
                                  n == state.holding]
    number = int(n[len(k):]) if n[len(k):].isdigit() else 1
    nodes[j, f + len(FLAGS) + min(max(number, 1), INSTANCE_SLOTS) - 1] = 1.0
    if n in state.timers:
      total = problem.boil_time if k == "pot" else problem.cook_time
      nodes[j, f + FLAGS.index("progress")] = 1.0 - state.timers[n] / total
  rel = [("at", "robot", state.robot)]
  if state.holding is not None:
    rel.append(("holding", "robot", state.holding))
  rel += [("on", i, b) for i, b in state.below.items()] + [("in", i, p) for i, p in state.inside.items()]
  reverse = {"at": "hosts", "holding": "held_by", "on": "under", "in": "contains"}
  triples = [t for r, a, b in rel for t in ((r, a, b), (reverse[r], b, a))]
  edges = np.zeros((len(triples), EDGE_FEATURES), np.float32)
  for e, (r, _, _) in enumerate(triples):
    edges[e, EDGE_TYPES.index(r)] = 1.0
  return jraph.GraphsTuple(
      nodes=nodes, edges=edges, senders=np.array([idx[a] for _, a, _ in triples], np.int32).reshape(-1),
      receivers=np.array([idx[b] for _, _, b in triples], np.int32).reshape(-1),
      n_node=np.array([len(names)], np.int32), n_edge=np.array([len(triples)], np.int32), globals=None)


# ------------------------------------------------------------------------------------------ generation

def generate(seed: int, recipe: str | None = None, mode: str = "sync", *, distractors: int = 1,
             cook_time: int = 3, boil_time: int = 3) -> Problem:
  """A seeded problem: the recipe (drawn when None), a kitchen with the stations it needs (1-2 of each kind,
  a sink for soups), its ingredients plus `distractors` other items, placed on random stations or stacked on
  other food; the robot at a random station. The goal never holds at the start."""
  if recipe is not None and recipe not in RECIPES:
    raise ValueError(f"cooking.generate: recipe must be one of {sorted(RECIPES)}, found {recipe!r}")
  rng = np.random.default_rng(seed)
  recipe = recipe or sorted(RECIPES)[int(rng.integers(len(RECIPES)))]
  kind, spec = RECIPES[recipe]
  counts = {"stove": int(rng.integers(1, 3)), "board": int(rng.integers(1, 3)), "table": int(rng.integers(1, 3)),
            "sink": 1 if kind == "soup" else int(rng.integers(0, 2))}
  stations = tuple((f"{k}{n + 1}", k) for k in STATION_KINDS for n in range(counts[k]))
  need = [k for k, _ in spec] if kind == "stack" else list(spec) + ["pot"]
  food = [k for k in ITEM_KINDS if k != "pot"]
  need += [food[int(rng.integers(len(food)))] for _ in range(distractors)]
  seen: dict = {}
  items = []
  for k in need:
    seen[k] = seen.get(k, 0) + 1
    items.append((f"{k}{seen[k]}", k))
  table = f"table{int(rng.integers(counts['table'])) + 1}"
  first = {}
  for name, k in items:
    first.setdefault(k, []).append(name)
  if kind == "stack":
    used = {k: 0 for k in first}
    names = []
    for k, _ in spec:
      names.append(first[k][used[k]])
      used[k] += 1
    goal = Goal(recipe, "stack", table, tuple(names), tuple(s for _, s in spec))
  else:
    goal = Goal(recipe, "soup", table, tuple(first[k][0] for k in spec), pot=first["pot"][0])
  kinds = dict(items)
  while True:
    init = State(robot=stations[int(rng.integers(len(stations)))][0])
    tops = []
    for name, k in [items[j] for j in rng.permutation(len(items))]:
      free = [s for s, _ in stations if _top_free(init, s)]
      stackable = [t for t in tops if kinds[t] != "pot" and _top_free(init, t)] if k != "pot" else []
      if stackable and (not free or rng.random() < 0.3):
        init.below[name] = stackable[int(rng.integers(len(stackable)))]
      elif free:
        init.below[name] = free[int(rng.integers(len(free)))]
      else:
        init.below[name] = stackable[int(rng.integers(len(stackable)))]
      tops.append(name)
    problem = Problem(stations, tuple(items), goal, init, mode, cook_time, boil_time)
    if not success(problem, init):
      return problem


def describe(problem: Problem, state: State) -> str:
  """The state in words: every station's stack from the bottom up, the pot's contents, the robot."""
  kinds = problem.item_kind
  def tags(i):
    t = [w for w, on in (("cut", i in state.cut), ("cooked", i in state.cooked), ("water", i in state.water),
                         ("boiled", i in state.boiled)) if on]
    if i in state.timers:
      t.append(f"{'boiling' if kinds[i] == 'pot' else 'cooking'}, {state.timers[i]} steps left")
    inside = [x for x, p in state.inside.items() if p == i]
    if inside:
      t.append("holds " + ", ".join(inside))
    return i + (f" ({'; '.join(t)})" if t else "")
  lines = []
  for s, _k in problem.stations:
    stack, x = [], s
    while (nxt := next((i for i, b in state.below.items() if b == x), None)) is not None:
      stack.append(tags(nxt))
      x = nxt
    lines.append(f"{s}: " + (" < ".join(stack) if stack else "empty"))
  held = tags(state.holding) if state.holding else "nothing"
  return f"You are at {state.robot}, holding {held}.\n" + "\n".join(lines)


def task_text(problem: Problem) -> str:
  g = problem.goal
  if g.kind == "stack":
    parts = [i + (f" ({s})" if s else "") for i, s in zip(g.items, g.states)]
    what = f"Make a {g.recipe.replace('_', ' ')} on {g.table}: from the bottom up, " + ", ".join(parts) + "."
  else:
    what = (f"Make {g.recipe.replace('_', ' ')}: fill {g.pot} with water, boil it, add " + ", ".join(
        f"{i} (cut)" for i in g.items) + f", and serve {g.pot} on {g.table}.")
  timing = (f" Cooking takes {problem.cook_time} steps and boiling {problem.boil_time}; you can act elsewhere "
            "meanwhile." if problem.mode == "async" else "")
  return what + timing + " Act with '[action] <one of the valid actions>'."


class CookingEnv:
  """One kitchen episode at a time (`jaxlab.envs.base.Env`)."""
  name = "cooking"

  def __init__(self, mode: str = "sync", recipe: str | None = None, max_turns: int = 60, *, distractors: int = 1,
               cook_time: int = 3, boil_time: int = 3):
    if mode not in MODES:
      raise ValueError(f"CookingEnv: mode must be one of {MODES}, found {mode!r}")
    self.mode, self.recipe, self.max_turns, self.distractors = mode, recipe, max_turns, distractors
    self.cook_time, self.boil_time = cook_time, boil_time
    self.problem: Problem | None = None
    self.state: State | None = None

  def reset(self, seed: int) -> str:
    self.problem = generate(seed, self.recipe, self.mode, distractors=self.distractors, cook_time=self.cook_time,
                            boil_time=self.boil_time)
    self.state = copy_state(self.problem.init)
    return task_text(self.problem) + "\n" + self.observation()

  def observation(self) -> str:
    acts = "; ".join(a.text for a in valid_actions(self.problem, self.state))
    return describe(self.problem, self.state) + "\nValid actions: " + acts

  def valid_actions(self) -> list[Action]:
    return valid_actions(self.problem, self.state)

  def interact(self, choice: str, content: str) -> Turn:
    if self.problem is None:
      raise RuntimeError("CookingEnv: call reset(seed) before interact")
    if choice == "finish":
      return Turn("episode finished", 0.0, True, {"success": False})
    if choice != "action":
      return Turn("use '[action] <one of the valid actions>' or '[finish]'\n" + self.observation(), 0.0, False,
                  {"valid": False})
    action = parse_action(self.problem, self.state, content)
    if action is None:
      return Turn(f"'{content}' is not a valid action.\n" + self.observation(), 0.0, False, {"valid": False})
    self.state = step(self.problem, self.state, action)
    done = success(self.problem, self.state)
    obs = ("The recipe is done!\n" if done else "") + self.observation()
    return Turn(obs, 1.0 if done else 0.0, done, {"valid": True, "action": action.text, "success": done})
