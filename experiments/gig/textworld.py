"""TextWorld cooking games (Microsoft TextWorld's `tw-cooking` challenge): the ALFWorld-style text env of GiG.

Games are generated offline from a seed and the challenge's settings (recipe size, ingredients to find, rooms,
whether food must be cut or cooked) and saved as TextWorld game JSON under a cache directory; they run on
TextWorld's own logic engine (`textworld.envs.TextWorldEnv`, no Inform7 compile), whose state is a set of logic
facts, so a copy of the engine steps ahead exactly (symbolic lookahead). The engine writes no room text without
Inform7, so observations are written here from the facts: what the player perceives in the room (furniture,
what lies on supporters and in open containers, item states), the inventory and the exits; the task states the
cookbook's recipe. Valid actions are the engine's admissible commands (minus
"examine", "look" and "inventory", which change no fact); the walkthrough (`walkthrough`) is the planner's upper
bound; `scene_graph` turns the facts into a jraph graph: entity nodes (TYPES one-hot, PROPERTIES flags, and the
recipe-ingredient flag), binary relations as typed edges with their reverses.

The env follows `jaxlab.envs.base`: `reset(seed)` returns the task with the first observation; `[action] <text>`
takes one of the valid actions; the episode ends with reward 1 when the meal is eaten, 0 when the game is lost.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings

import jraph
import numpy as np

from jaxlab import errors
from jaxlab.envs.base import Turn

TYPES = ("P", "I", "r", "d", "c", "s", "o", "k", "f", "oven", "stove", "toaster", "meal", "RECIPE", "ingredient",
         "object", "t")
PROPERTIES = ("open", "closed", "locked", "chopped", "sliced", "diced", "uncut", "raw", "cooked", "fried",
              "roasted", "grilled", "burned", "edible", "inedible", "cookable", "cuttable", "needs_cooking",
              "drinkable", "sharp", "consumed", "used")
RELATIONS = ("at", "in", "on", "base", "part_of", "cooking_location", "link", "free", "north_of", "south_of",
             "east_of", "west_of", "out")
NODE_FEATURES = len(TYPES) + len(PROPERTIES) + 1  # + "a recipe ingredient"
EDGE_FEATURES = 2 * len(RELATIONS)  # each relation and its reverse
INERT = ("examine", "look", "inventory")
SETTINGS = ("recipe", "take", "go", "open", "cook", "cut")


def _textworld():
  try:
    import textworld
    from textworld.envs import TextWorldEnv
  except ImportError as e:  # textworld, or a wheel of its stack (jericho, TatSu, ...), is missing
    missing = errors.missing_import(e, "experiments.gig.textworld", "textworld")
    if missing is None:
      raise
    raise missing from e
  return textworld, TextWorldEnv


def make_game(seed: int, cache_dir: str, *, recipe: int = 1, take: int = 1, go: int = 1, open: bool = False,
              cook: bool = False, cut: bool = False) -> str:
  """The path of the tw-cooking game of `seed` and these settings, generated into `cache_dir` on first use (the
  same seed and settings give the same game)."""
  settings = {"recipe": recipe, "take": take, "go": go, "open": open, "cook": cook, "cut": cut}
  if not 1 <= recipe <= 5 or not 0 <= take <= recipe or go not in (1, 6, 9, 12):
    raise ValueError(f"tw-cooking settings: expected 1 <= recipe <= 5, 0 <= take <= recipe, go in (1, 6, 9, 12); "
                     f"found {settings}")
  tag = hashlib.sha1(json.dumps([seed, settings], sort_keys=True).encode()).hexdigest()[:12]
  path = os.path.join(cache_dir, f"tw-cooking-{seed}-{tag}.json")
  if os.path.exists(path):
    return path
  textworld, _ = _textworld()
  from textworld.challenges.tw_cooking import cooking
  options = textworld.GameOptions()
  options.seeds = seed
  with warnings.catch_warnings():  # the walkthrough check runs the compiled game in Jericho, which warns
    warnings.simplefilter("ignore")
    game = cooking.make({**settings, "drop": False, "split": "train", "recipe_seed": seed}, options)
  os.makedirs(cache_dir, exist_ok=True)
  tmp = f"{path}.{os.getpid()}.tmp.json"
  game.save(tmp)
  os.replace(tmp, path)
  return path


def recipe(facts) -> list[tuple[str, list[str]]]:
  """The cookbook's recipe from the facts: (food, required states) per ingredient, in ingredient order."""
  props = {}
  for f in facts:
    if len(f.arguments) == 1 and f.arguments[0].type == "ingredient":
      props.setdefault(f.arguments[0].name, []).append(f.name)
  out = []
  for f in sorted((f for f in facts if f.name == "base"), key=lambda f: f.arguments[1].name):
    food, ing = f.arguments[0].name, f.arguments[1].name
    out.append((food, sorted(p for p in props.get(ing, ()) if p in PROPERTIES)))
  return out


def describe(facts) -> str:
  """What the player perceives, from the facts: the room, its furniture, what lies on its supporters, in its open
  containers and on its floor, the states of those items, the inventory and the exits (closed doors named)."""
  room = next(f.arguments[1].name for f in facts if f.name == "at" and f.arguments[0].type == "P")
  props = {}
  for f in facts:
    if len(f.arguments) == 1 and f.name in PROPERTIES and f.arguments[0].type not in ("ingredient", "RECIPE"):
      props.setdefault(f.arguments[0].name, []).append(f.name)
  def tag(x):
    return x + (f" ({', '.join(sorted(props[x]))})" if x in props else "")
  at_room = sorted((f.arguments[0].name, f.arguments[0].type) for f in facts if f.name == "at"
                   and f.arguments[1].name == room and f.arguments[0].type != "P")
  furniture = [n for n, t in at_room if t in ("c", "s", "oven", "stove", "toaster")]
  lines = [f"You are in the {room}. Here: " + (", ".join(tag(x) for x in furniture) or "nothing") + "."]
  floor = [n for n, t in at_room if n not in furniture]
  if floor:
    lines.append("On the floor: " + ", ".join(tag(x) for x in floor) + ".")
  is_open = {f.arguments[0].name for f in facts if f.name == "open"}
  for f in sorted(facts, key=str):
    holder = f.arguments[1].name if f.name in ("in", "on") else None
    if holder in furniture and (f.name == "on" or holder in is_open or f.arguments[1].type == "s"):
      lines.append(f"{tag(f.arguments[0].name)} is {f.name} the {holder}.")
  carried = sorted(f.arguments[0].name for f in facts if f.name == "in" and f.arguments[1].type == "I")
  lines.append("You carry: " + (", ".join(tag(x) for x in carried) or "nothing") + ".")
  exits = sorted(f"{f.name.split('_')[0]}: {f.arguments[0].name}" for f in facts
                 if f.name.endswith("_of") and f.arguments[1].name == room and f.arguments[0].type == "r")
  doors = sorted(f"{tag(f.arguments[1].name)}" for f in facts if f.name == "link" and f.arguments[0].name == room)
  if exits or doors:
    lines.append("Exits: " + "; ".join(exits) + (f". Doors: {', '.join(doors)}" if doors else "") + ".")
  return "\n".join(lines)


def recipe_text(facts) -> str:
  return "; ".join(food + (f" ({', '.join(s)})" if s else "") for food, s in recipe(facts))


def key(facts) -> frozenset:
  """A hashable state (equal keys: equal fact sets)."""
  return frozenset(str(f) for f in facts)


def scene_graph(facts) -> jraph.GraphsTuple:
  """The facts as one graph: a node per entity (sorted by name) with its TYPES one-hot, PROPERTIES flags and
  whether it is a recipe ingredient; an edge per binary RELATIONS fact and its reverse, one-hot over
  EDGE_FEATURES (relation r at index r, its reverse at len(RELATIONS) + r)."""
  ents = sorted({(v.name, v.type) for f in facts for v in f.arguments})
  idx = {n: j for j, (n, _) in enumerate(ents)}
  nodes = np.zeros((len(ents), NODE_FEATURES), np.float32)
  for j, (_, t) in enumerate(ents):
    if t in TYPES:
      nodes[j, TYPES.index(t)] = 1.0
  needed = {food for food, _ in recipe(facts)}
  for f in facts:
    if len(f.arguments) == 1 and f.name in PROPERTIES:
      nodes[idx[f.arguments[0].name], len(TYPES) + PROPERTIES.index(f.name)] = 1.0
  for food in needed:
    nodes[idx[food], -1] = 1.0
  triples = [(RELATIONS.index(f.name), f.arguments[0].name, f.arguments[1].name) for f in sorted(facts, key=str)
             if len(f.arguments) == 2 and f.name in RELATIONS]
  both = [(r, a, b) for r, a, b in triples] + [(len(RELATIONS) + r, b, a) for r, a, b in triples]
  edges = np.zeros((len(both), EDGE_FEATURES), np.float32)
  edges[np.arange(len(both)), [r for r, _, _ in both]] = 1.0
  return jraph.GraphsTuple(
      nodes=nodes, edges=edges, senders=np.array([idx[a] for _, a, _ in both], np.int32).reshape(-1),
      receivers=np.array([idx[b] for _, _, b in both], np.int32).reshape(-1),
      n_node=np.array([len(ents)], np.int32), n_edge=np.array([len(both)], np.int32), globals=None)


class TextWorldCooking:
  """One tw-cooking episode at a time (`jaxlab.envs.base.Env`) on TextWorld's logic engine."""
  name = "textworld"

  def __init__(self, cache_dir: str, max_turns: int = 50, **settings):
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
      raise ValueError(f"TextWorldCooking: unknown settings {unknown}; expected some of {SETTINGS}")
    self.cache_dir, self.max_turns, self.settings = cache_dir, max_turns, settings
    self.engine, self.state, self.path = None, None, None

  def reset(self, seed: int) -> str:
    textworld, engine_cls = _textworld()
    self.path = make_game(seed, self.cache_dir, **self.settings)
    self.engine = engine_cls(textworld.EnvInfos(facts=True, admissible_commands=True, won=True, lost=True,
                                                policy_commands=True, objective=True))
    self.engine.load(self.path)
    self.state = self.engine.reset()
    self.walkthrough = list(self.state["policy_commands"])
    return self.task() + "\n" + self.observation()

  def task(self) -> str:
    """The goal, with the cookbook's recipe (read for the agent: "examine" is not among the valid actions)."""
    return (f"Cook the meal of the cookbook and eat it. The cookbook's recipe: {recipe_text(self.facts)}. Find the "
            "ingredients, get each into the states listed, then prepare meal and eat meal. Act with "
            "'[action] <one of the valid actions>'.")

  @property
  def facts(self):
    return self.state["facts"]

  def valid_actions(self) -> list[str]:
    return sorted(c for c in self.state["admissible_commands"] if not c.startswith(INERT))

  def observation(self) -> str:
    return describe(self.facts) + "\nValid actions: " + "; ".join(self.valid_actions())

  def done(self) -> bool:
    return bool(self.state["won"] or self.state["lost"])

  def step(self, command: str) -> None:
    """Takes `command` (one of `valid_actions()`) on this env's engine."""
    self.state, _, _ = self.engine.step(command)

  def outcomes(self) -> dict[str, str | None]:
    """Per valid action, "won" or "lost" when taking it ends the game so, else None: the action applied to a copy
    of the game's progression (its logic state and quests; the engine's `won` and `lost` are these flags)."""
    progress = self.engine._game_progression  # textworld 1.7's engine: commands align with its valid actions
    commands = list(self.state["_valid_commands"])
    out = {}
    for command in self.valid_actions():
      after = progress.copy()
      after.update(progress.valid_actions[commands.index(command)])
      out[command] = "won" if after.completed else "lost" if after.failed else None
    return out

  def copy(self) -> "TextWorldCooking":
    """An independent env in the same state (its engine copied)."""
    other = TextWorldCooking(self.cache_dir, self.max_turns, **self.settings)
    other.engine, other.state, other.path = self.engine.copy(), self.state, self.path
    other.walkthrough = self.walkthrough
    return other

  def interact(self, choice: str, content: str) -> Turn:
    if self.engine is None:
      raise RuntimeError("TextWorldCooking: call reset(seed) before interact")
    if choice == "finish":
      return Turn("episode finished", 0.0, True, {"success": False})
    command = content.strip().lower()
    if choice != "action" or command not in self.valid_actions():
      return Turn(f"'{content}' is not a valid action.\n" + self.observation(), 0.0, False, {"valid": False})
    self.step(command)
    won, lost = bool(self.state["won"]), bool(self.state["lost"])
    obs = ("You ate the meal: you won!\n" if won else "You lost the game.\n" if lost else "") + self.observation()
    return Turn(obs, 1.0 if won else 0.0, won or lost, {"valid": True, "action": command, "success": won})
