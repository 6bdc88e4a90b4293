"""GiG's planner pieces (experiments/gig/README.md): the experience memory (the outer graph), loop warnings, the
kitchen's bounded symbolic lookahead, the planner that needs no LLM, and the shortest plan (A*), the upper bound.

The outer graph has one node per state embedding of a solved trace, linked to the next state by the action taken.
At a new state the planner
- retrieves the next action of the nearest remembered state when its distance is below `threshold` (0.1),
- warns of a loop when the episode comes back to a state it already visited,
- otherwise looks ahead symbolically: every valid action is expanded to depth `depth` with the env's own
  transitions; an action is rejected when it leads to a dead end (a state from which the recipe can no longer
  be made), and the actions that reach the goal within the depth are marked.
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections import deque
from typing import NamedTuple, Sequence

import numpy as np

from experiments.gig import cooking

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
  """Remembers this episode's states (any hashable key: the symbolic state, or a rounded embedding) and the
  actions taken from each (`took`); `visit` returns a warning when the state was seen before. Exact repeats, not
  embedding distance: training pulls adjacent states together, so a distance threshold would flag ordinary
  progress as a loop."""

  def __init__(self):
    self.seen: dict = {}
    self.tried: dict = {}

  def took(self, key, action: str) -> None:
    self.tried.setdefault(key, set()).add(action)

  def untried(self, key, actions: Sequence[str]) -> list[str]:
    """`actions` not yet taken from the state `key` in this episode."""
    done = self.tried.get(key, ())
    return [a for a in actions if a not in done]

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


def state_key(problem, state):
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
    goal_in, seen, frontier = None, {state_key(problem, s1)}, deque([(s1, 1)])
    while frontier:
      s, d = frontier.popleft()
      if cooking.success(problem, s):
        goal_in = d
        break
      if d == depth:
        continue
      for b in cooking.valid_actions(problem, s):
        s2 = cooking.step(problem, s, b, check=False)
        k = state_key(problem, s2)
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
    warning = self.loops.visit(state_key(problem, state), step)
    hit = self.memory.retrieve(z_Z, self.threshold)
    options = lookahead(problem, state, self.depth)
    allowed = [o for o in options if o.rejected is None]
    if hit is not None and warning is None and any(o.action == hit.action for o in allowed):
      return {"action": hit.action, "source": "memory", "distance": hit.distance, "warning": None,
              "rejected": [o for o in options if o.rejected]}
    ranked = sorted(allowed, key=lambda o: (o.goal_in is None, o.goal_in or 0))
    return {"action": ranked[0].action if ranked else None, "source": "lookahead", "distance": None,
            "warning": warning, "rejected": [o for o in options if o.rejected]}


def actions_left(problem: cooking.Problem, state: cooking.State) -> int:
  """A lower bound on the actions from `state` to the goal (admissible, so `shortest_plan`'s A* stays optimal): each
  goal item's own remaining actions (a cut or cook, the pick-up after it, the place or stack or add that puts it
  where the goal wants it, one more pick-up or place where it is not held or held), the pot's fill, boil and
  serving, and one move to each kind of station (sink, stove, board, the goal's table) still needed and not here."""
  g, h, need_at = problem.goal, 0, set()
  if g.kind == "stack":
    for n, (item, want) in enumerate(zip(g.items, g.states)):
      held = state.holding == item
      done = want is None or item in (state.cut if want == "cut" else state.cooked)
      if not done:
        h += 2 if item in state.timers else 3 + held
        if item not in state.timers:
          need_at.add("board" if want == "cut" else "stove")
      elif state.below.get(item) != (g.table if n == 0 else g.items[n - 1]):
        h += 1 + (not held)
      else:
        continue
      need_at.add(g.table)
  else:
    pot = g.pot
    if pot not in state.water:
      h, need_at = h + 1, need_at | {"sink"}
    if pot not in state.boiled and pot not in state.timers:
      h, need_at = h + 1, need_at | {"stove"}
    if state.below.get(pot) != g.table:
      h, need_at = h + 1 + (state.holding != pot), need_at | {g.table}
    for item in g.items:
      if state.inside.get(item) != pot:
        held = state.holding == item
        h += 1 + (not held) if item in state.cut else 3 + held
      if item not in state.cut:
        need_at.add("board")
  return h + len(need_at) - (state.robot in need_at or problem.station_kind[state.robot] in need_at)


def shortest_plan(problem: cooking.Problem, state: cooking.State | None = None,
                  max_states: int = 1_000_000) -> list[cooking.Action] | None:
  """A shortest action sequence to the goal (None when there is none within `max_states` states): A* over the
  symbolic transitions with the `actions_left` bound, never entering a `dead_end` state (none leads to the goal).
  Breadth-first search runs out of states on a soup or a sandwich in a kitchen of two stoves, boards and tables."""
  start = problem.init if state is None else state
  k0 = state_key(problem, start)
  parent, cost, tie = {k0: None}, {k0: 0}, itertools.count()
  heap = [(actions_left(problem, start), next(tie), 0, start)]
  while heap and len(parent) <= max_states:
    _, _, d, s = heapq.heappop(heap)
    k = state_key(problem, s)
    if d > cost[k]:
      continue
    if cooking.success(problem, s):
      plan = []
      while parent[k] is not None:
        k, a = parent[k]
        plan.append(a)
      return plan[::-1]
    for a in cooking.valid_actions(problem, s):
      s2 = cooking.step(problem, s, a, check=False)
      k2 = state_key(problem, s2)
      if d + 1 < cost.get(k2, d + 2) and dead_end(problem, s2) is None:
        parent[k2], cost[k2] = (k, a), d + 1
        heapq.heappush(heap, (d + 1 + actions_left(problem, s2), next(tie), d + 1, s2))
  return None
