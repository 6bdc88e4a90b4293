"""GiG planning (Graph-in-Graph; papers/DIGEST.md "gig", no public code): the planner pieces that need no LLM.

The inner graphs are the scene graphs of `jaxlab.envs.cooking`, embedded by `jaxlab.models.gnn` into unit
vectors; the outer graph is the experience memory: one node per state embedding of a solved trace, linked to
the next state by the action taken. At a new state the planner
- retrieves the next action of the nearest remembered state when its distance is below `threshold` (0.1),
- warns of a loop when the state's embedding is within `threshold` of one already visited in this episode,
- otherwise looks ahead symbolically: every valid action is expanded to depth `depth` with the env's own
  transitions; an action is rejected when it leads to a dead end (a state from which the recipe can no longer
  be made), and the actions that reach the goal within the depth are marked.
This module holds those pieces; the registered experiment (an LLM agent using them on the kitchen) is not here.
"""
from __future__ import annotations

import dataclasses
from collections import deque
from typing import NamedTuple, Sequence

import numpy as np

from jaxlab.envs import cooking

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
  """Remembers this episode's state embeddings; `visit` returns a warning when the state was seen before."""

  def __init__(self, threshold: float = THRESHOLD):
    self.threshold, self.seen = threshold, []

  def visit(self, z_Z, step: int) -> str | None:
    z_Z = np.asarray(z_Z, np.float32)
    for z, t in self.seen:
      if np.linalg.norm(z - z_Z) < self.threshold:
        self.seen.append((z_Z, step))
        return f"loop warning: this state was already visited at step {t}; try a different action"
    self.seen.append((z_Z, step))
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
  return frozenset(cooking.atoms(problem, state)), tuple(sorted(state.timers.items()))


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
    s1 = cooking.step(problem, state, a)
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
        s2 = cooking.step(problem, s, b)
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
    self.loops = LoopDetector(self.threshold)

  def decide(self, problem: cooking.Problem, state: cooking.State, z_Z, step: int) -> dict:
    warning = self.loops.visit(z_Z, step)
    hit = self.memory.retrieve(z_Z, self.threshold)
    options = lookahead(problem, state, self.depth)
    allowed = [o for o in options if o.rejected is None]
    if hit is not None and warning is None and any(o.action == hit.action for o in allowed):
      return {"action": hit.action, "source": "memory", "distance": hit.distance, "warning": None,
              "rejected": [o for o in options if o.rejected]}
    ranked = sorted(allowed, key=lambda o: (o.goal_in is None, o.goal_in or 0))
    return {"action": ranked[0].action if ranked else None, "source": "lookahead", "distance": None,
            "warning": warning, "rejected": [o for o in options if o.rejected]}
