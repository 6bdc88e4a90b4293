"""The cooking env against a STRIPS planner (pyperplan on its PDDL export): plans found on generated problems
succeed in the env action by action, the env's valid actions and transitions equal the grounded operators on
random walks, and its success check equals the PDDL goal; async timing on a hand-made episode; scene graphs."""
import copy
import dataclasses
import os

import jax
import numpy as np
import pytest

pyperplan = pytest.importorskip("pyperplan")
from pyperplan import grounding  # noqa: E402
from pyperplan.pddl.parser import Parser  # noqa: E402
from pyperplan.search import breadth_first_search  # noqa: E402

from experiments.gig import cooking
from jaxlab.envs.base import parse_call  # noqa: E402


def ground(problem, tmp_path, prune=True):
  dom, prob = os.path.join(tmp_path, "domain.pddl"), os.path.join(tmp_path, "problem.pddl")
  with open(dom, "w") as f:
    f.write(cooking.DOMAIN)
  with open(prob, "w") as f:
    f.write(cooking.pddl_problem(problem))
  parser = Parser(dom, prob)
  return grounding.ground(parser.parse_problem(parser.parse_domain()), remove_irrelevant_operators=prune)


def by_pddl(problem, state):
  return {a.pddl: a for a in cooking.valid_actions(problem, state)}


CASES = [(seed, recipe, 0) for seed, recipe in enumerate(sorted(cooking.RECIPES))] + [(10 + s, None, 1)
                                                                                      for s in range(3)]


@pytest.mark.parametrize("seed,recipe,distractors", CASES)
def test_pyperplan_plans_succeed_in_the_env(seed, recipe, distractors, tmp_path):
  """Breadth-first search: the plans are shortest, so every step matters."""
  problem = cooking.generate(seed, recipe, distractors=distractors)
  task = ground(problem, tmp_path)
  plan = breadth_first_search(task)
  assert plan, f"no plan for seed {seed} ({problem.goal.recipe})"
  env = cooking.CookingEnv(recipe=recipe, max_turns=len(plan) + 5, distractors=distractors)
  env.reset(seed)
  assert env.problem == problem
  facts = task.initial_state
  for n, op in enumerate(plan):
    assert not cooking.success(problem, env.state)
    action = by_pddl(problem, env.state).get(op.name)
    assert action is not None, f"plan step {op.name} not valid in the env: {sorted(by_pddl(problem, env.state))}"
    turn = env.interact(*parse_call(f"I will do this. [action] {action.text}"))
    facts = op.apply(facts)
    assert turn.done == (n == len(plan) - 1) == task.goal_reached(facts)
    assert frozenset(cooking.atoms(problem, env.state)) & task.facts == facts  # facts: the goal-relevant ones
  assert turn.reward == 1.0 and turn.info["success"]


@pytest.mark.parametrize("seed", range(4))
def test_valid_actions_transitions_and_goal_equal_the_grounded_domain(seed, tmp_path):
  """On a random walk (one per recipe kind), the env's valid actions are exactly the applicable grounded
  operators, each action's successor exports to the operator's successor, and success == goal reached."""
  problem = cooking.generate(seed, ("lettuce_burger", "sandwich", "potato_soup", "cheeseburger")[seed], distractors=0)
  task = ground(problem, tmp_path, prune=False)
  rng = np.random.default_rng(seed)
  state = problem.init
  for _ in range(100):
    facts = frozenset(cooking.atoms(problem, state))
    applicable = {op.name: op for op in task.operators if op.applicable(facts)}
    env_actions = by_pddl(problem, state)
    assert set(env_actions) == set(applicable)
    for name, action in env_actions.items():
      assert frozenset(cooking.atoms(problem, cooking.step(problem, state, action))) == applicable[name].apply(facts)
    assert cooking.success(problem, state) == task.goal_reached(facts)
    names = sorted(env_actions)
    state = cooking.step(problem, state, env_actions[names[int(rng.integers(len(names)))]])
  # the goal check is also compared on goal states: plan to the goal from the walk's last state
  plan_task = ground(dataclasses.replace(problem, init=copy.deepcopy(state)), tmp_path)
  plan = breadth_first_search(plan_task)
  for op in plan or []:
    state = cooking.step(problem, state, by_pddl(problem, state)[op.name])
  assert plan is not None and cooking.success(problem, state)
  assert task.goal_reached(frozenset(cooking.atoms(problem, state)))


def hand_made(mode, cook_time=3, boil_time=2):
  stations = (("stove1", "stove"), ("board1", "board"), ("table1", "table"), ("sink1", "sink"))
  items = (("bottombun1", "bottombun"), ("patty1", "patty"), ("lettuce1", "lettuce"), ("topbun1", "topbun"),
           ("pot1", "pot"))
  goal = cooking.Goal("lettuce_burger", "stack", "table1", ("bottombun1", "patty1", "lettuce1", "topbun1"),
                      (None, "cooked", "cut", None))
  init = cooking.State(robot="stove1", below={"patty1": "stove1", "lettuce1": "board1", "bottombun1": "table1",
                                              "topbun1": "bottombun1", "pot1": "sink1"})
  return cooking.Problem(stations, items, goal, init, mode, cook_time, boil_time)


def run(problem, texts):
  state = problem.init
  for t in texts:
    a = cooking.parse_action(problem, state, t)
    assert a is not None, f"{t!r} not valid; valid: {[x.text for x in cooking.valid_actions(problem, state)]}"
    state = cooking.step(problem, state, a)
    yield a, state


def test_async_cooking_runs_while_the_robot_works_elsewhere():
  problem = hand_made("async", cook_time=3)
  seq = ["cook patty1", "move to board1", "cut lettuce1", "move to table1", "unstack topbun1 from bottombun1",
         "move to board1", "stack topbun1 on lettuce1"]
  states = [s for _, s in run(problem, seq)]
  cooked = ["patty1" in s.cooked for s in states]
  assert cooked == [False, False, True, True, True, True, True]  # done after 3 actions, counting "cook"
  assert [s.timers.get("patty1") for s in states[:3]] == [2, 1, None]
  assert "cook patty1" not in [a.text for a in cooking.valid_actions(problem, states[0])]  # already cooking
  # the same actions in sync mode cook at once; async with cook_time 1 is sync
  assert ["patty1" in s.cooked for _, s in run(hand_made("sync"), seq)] == [True] * 7
  assert all(a.cooked == b.cooked for (_, a), (_, b) in zip(run(hand_made("async", 1, 1), seq),
                                                         run(hand_made("sync"), seq)))


def test_async_picking_up_stops_cooking_and_wait_ticks():
  problem = hand_made("async", cook_time=3, boil_time=2)
  states = [s for _, s in run(problem, ["cook patty1", "pick up patty1", "place patty1 on stove1", "wait",
                                        "wait", "wait"])]
  assert [("patty1" in s.cooked, s.timers.get("patty1")) for s in states] == [
      (False, 2), (False, None), (False, None), (False, None), (False, None), (False, None)]
  states = [s for _, s in run(problem, ["cook patty1", "wait", "wait"])]
  assert "patty1" in states[-1].cooked
  # boiling: fill at the sink, carry to a free stove, boil; two actions later the pot has boiled
  seq = ["pick up patty1", "move to table1", "stack patty1 on topbun1", "move to sink1", "fill pot1 with water",
         "pick up pot1", "move to stove1", "place pot1 on stove1", "boil pot1", "wait"]
  states = [s for _, s in run(problem, seq)]
  assert [("pot1" in s.boiled) for s in states[-2:]] == [False, True]
  assert "wait" not in [a.text for a in cooking.valid_actions(hand_made("sync"), hand_made("sync").init)]


def test_a_sync_plan_needs_waiting_in_async(tmp_path):
  """The PDDL abstraction of async is sync: replayed in async mode, the sync plan serves a raw patty (picking it
  up stops the cooking), and succeeds once the robot waits out the cooking after "cook patty1"."""
  sync = hand_made("sync")
  task = ground(sync, tmp_path)
  texts, state = [], sync.init
  for op in breadth_first_search(task):
    texts.append(by_pddl(sync, state)[op.name].text)
    state = cooking.step(sync, state, by_pddl(sync, state)[op.name])
  assert cooking.success(sync, state) and "cook patty1" in texts
  asyn = hand_made("async", cook_time=20)
  final = list(run(asyn, texts))[-1][1]
  assert not cooking.success(asyn, final) and "patty1" not in final.cooked
  waited = [w for t in texts for w in ([t] + ["wait"] * 19 if t == "cook patty1" else [t])]
  assert cooking.success(asyn, list(run(asyn, waited))[-1][1])


def test_scene_graph_nodes_edges_and_features():
  problem = hand_made("async", cook_time=5)
  state = list(run(problem, ["cook patty1", "move to table1", "unstack topbun1 from bottombun1"]))[-1][1]
  g = cooking.scene_graph(problem, state)
  names = ["robot", "stove1", "board1", "table1", "sink1", "bottombun1", "patty1", "lettuce1", "topbun1", "pot1"]
  assert g.nodes.shape == (10, cooking.NODE_FEATURES) and g.n_node.tolist() == [10]
  kinds = g.nodes[:, :len(cooking.NODE_KINDS)]
  assert kinds.sum(1).tolist() == [1.0] * 10 and cooking.NODE_KINDS[int(kinds[6].argmax())] == "patty"
  f = len(cooking.NODE_KINDS)
  assert g.nodes[6, f + cooking.FLAGS.index("progress")] == pytest.approx(1 - 2 / 5)  # 3 of 5 cooking steps done
  assert g.nodes[8, f + cooking.FLAGS.index("held")] == 1.0
  instance = g.nodes[:, f + len(cooking.FLAGS):]
  assert instance.sum(1).tolist() == [1.0] * 10 and instance[:, 0].tolist() == [1.0] * 10  # all are number 1
  rel = {(cooking.EDGE_TYPES[int(e.argmax())], names[s], names[r]) for e, s, r in zip(g.edges, g.senders, g.receivers)}
  want = {("at", "robot", "table1"), ("holding", "robot", "topbun1"), ("on", "patty1", "stove1"),
          ("on", "lettuce1", "board1"), ("on", "bottombun1", "table1"), ("on", "pot1", "sink1")}
  reverse = {"at": "hosts", "holding": "held_by", "on": "under"}
  assert rel == want | {(reverse[t], b, a) for t, a, b in want}
  # scene graphs of several states batch and embed with the GNN
  from jaxlab.models import gnn
  cfg = gnn.Config.tiny(node_features=cooking.NODE_FEATURES, edge_features=cooking.EDGE_FEATURES)
  graphs = gnn.pad(gnn.batch([cooking.scene_graph(problem, problem.init), g]), 24, 24, 4)
  z = gnn.forward(gnn.init(cfg, jax.random.PRNGKey(0)), graphs, cfg)
  assert z.shape == (4, cfg.d_embed) and np.isfinite(np.asarray(z)).all()


def test_env_protocol_and_bad_input():
  env = cooking.CookingEnv(recipe="burger", max_turns=10)
  text = env.reset(3)
  assert text.startswith("Make a burger on table") and "Valid actions:" in text
  assert env.reset(3) == text and cooking.generate(3, "burger") == cooking.generate(3, "burger")
  turn = env.interact("action", "juggle the knives")
  assert not turn.done and turn.info["valid"] is False and "not a valid action" in turn.observation
  turn = env.interact("action", env.valid_actions()[0].text.upper() + ".")
  assert turn.info["valid"] and not turn.done
  assert env.interact("finish", "").done
  with pytest.raises(ValueError, match="recipe must be one of"):
    cooking.generate(0, "pizza")
  with pytest.raises(ValueError, match="mode must be one of"):
    cooking.CookingEnv(mode="realtime")
  problem = hand_made("sync")
  with pytest.raises(ValueError, match="'cut lettuce1' is not a valid action here"):
    cooking.step(problem, problem.init, cooking.Action("cut", ("lettuce1", "board1")))
