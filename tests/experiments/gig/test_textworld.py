"""TextWorld cooking games (experiments.gig.textworld): TextWorld's own walkthrough wins through the env and its
`won` flag is the env's success; a generated game is the same from the same seed; copies step independently;
the observation shows only what the player perceives (not the inside of closed containers, not other rooms);
the scene graph has a node per entity and an edge per binary fact and its reverse."""
import json
import os
import re

import numpy as np
import pytest

pytest.importorskip("textworld")
from experiments.gig import textworld as tw

SETTINGS = {"recipe": 2, "take": 2, "go": 6, "open": True, "cut": True, "cook": True}


@pytest.fixture(scope="module")
def games(tmp_path_factory):
  return str(tmp_path_factory.mktemp("tw-games"))


def test_the_walkthrough_wins_and_a_wrong_command_is_refused(games):
  env = tw.TextWorldCooking(games, **SETTINGS)
  first = env.reset(3)
  assert "The cookbook's recipe: " in first and "Valid actions: " in first
  assert env.interact("action", "dance").info == {"valid": False}
  for i, command in enumerate(env.walkthrough):
    assert command in env.valid_actions(), (command, env.valid_actions())
    turn = env.interact("action", command)
    assert turn.done == (i == len(env.walkthrough) - 1) and bool(env.state["won"]) == turn.done
  assert turn.reward == 1.0 and turn.info["success"]


def test_same_seed_same_game_and_copies_step_independently(games, tmp_path):
  a = tw.make_game(3, games, **SETTINGS)
  b = tw.make_game(3, str(tmp_path), **SETTINGS)
  assert os.path.basename(a) == os.path.basename(b)
  assert json.load(open(a))["world"] == json.load(open(b))["world"]
  assert tw.make_game(4, games, **SETTINGS) != a
  env = tw.TextWorldCooking(games, **SETTINGS)
  env.reset(3)
  before = tw.key(env.facts)
  other = env.copy()
  other.step(env.walkthrough[0])
  assert tw.key(env.facts) == before and tw.key(other.facts) != before
  with pytest.raises(ValueError, match="tw-cooking settings"):
    tw.make_game(0, games, recipe=9)
  with pytest.raises(ValueError, match="unknown settings"):
    tw.TextWorldCooking(games, rooms=3)


def test_the_observation_shows_only_what_the_player_perceives(games):
  env = tw.TextWorldCooking(games, **SETTINGS)
  env.reset(3)
  hidden_seen = False
  for command in env.walkthrough:
    facts = env.facts
    room = next(f.arguments[1].name for f in facts if f.name == "at" and f.arguments[0].type == "P")
    text = tw.describe(facts)
    assert text.startswith(f"You are in the {room}.")
    here = {f.arguments[0].name for f in facts if f.name == "at" and f.arguments[1].name == room}
    is_open = {f.arguments[0].name for f in facts if f.name == "open"}
    for f in facts:
      if f.name == "in" and f.arguments[1].type == "c":
        item, box = f.arguments[0].name, f.arguments[1].name
        line = re.search(rf"^{re.escape(item)}( \([a-z_, ]+\))? is in the {re.escape(box)}\.$", text, re.M)
        assert (line is not None) == (box in here and box in is_open), (f, text)
        hidden_seen |= box in here and box not in is_open
    env.step(command)
  assert hidden_seen  # the walkthrough passes a closed container with food inside


def test_scene_graph_nodes_edges_and_reverses(games):
  env = tw.TextWorldCooking(games, **SETTINGS)
  env.reset(3)
  facts = env.facts
  g = tw.scene_graph(facts)
  names = sorted({v.name for f in facts for v in f.arguments})
  binary = [f for f in facts if len(f.arguments) == 2 and f.name in tw.RELATIONS]
  assert int(g.n_node[0]) == len(names) and int(g.n_edge[0]) == 2 * len(binary)
  assert g.nodes.shape[1] == tw.NODE_FEATURES and g.edges.shape[1] == tw.EDGE_FEATURES
  n = len(binary)
  np.testing.assert_array_equal(g.senders[:n], g.receivers[n:])
  np.testing.assert_array_equal(g.edges[:n, :len(tw.RELATIONS)], g.edges[n:, len(tw.RELATIONS):])
  player = names.index("P")
  assert g.nodes[player, tw.TYPES.index("P")] == 1.0
  for food, _ in tw.recipe(facts):
    assert g.nodes[names.index(food), -1] == 1.0


def test_outcomes_agree_with_stepping_a_copy(games):
  env = tw.TextWorldCooking(games, **SETTINGS)
  env.reset(3)
  seen = set()
  for command in env.walkthrough:
    out = env.outcomes()
    assert set(out) == set(env.valid_actions())
    for a, o in out.items():
      other = env.copy()
      other.step(a)
      assert o == ("won" if other.state["won"] else "lost" if other.state["lost"] else None), (a, o)
      seen.add(o)
    env.step(command)
  assert {"won", "lost"} <= seen  # eating the meal wins; eating a raw or unprepared item loses
