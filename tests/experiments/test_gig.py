"""GiG planner pieces: memory retrieval against a brute-force nearest neighbour and the threshold, loop warnings on
a revisited kitchen state, and the bounded lookahead against pyperplan's breadth-first search (dead ends have no
plan; the steps to the goal equal the shortest plan's)."""
import os

import jax
import numpy as np
import pytest

pytest.importorskip("pyperplan")
from pyperplan import grounding  # noqa: E402
from pyperplan.pddl.parser import Parser  # noqa: E402
from pyperplan.search import breadth_first_search  # noqa: E402

from experiments import gig  # noqa: E402
from jaxlab.envs import cooking  # noqa: E402
from jaxlab.models import gnn  # noqa: E402


def shortest_plan(problem, state, tmp_path):
  dom, prob = os.path.join(tmp_path, "d.pddl"), os.path.join(tmp_path, "p.pddl")
  with open(dom, "w") as f:
    f.write(cooking.DOMAIN)
  with open(prob, "w") as f:
    f.write(cooking.pddl_problem(problem, state))
  parser = Parser(dom, prob)
  return breadth_first_search(grounding.ground(parser.parse_problem(parser.parse_domain())))


def replay(problem, plan):
  states, actions = [problem.init], []
  for op in plan:
    a = next(a for a in cooking.valid_actions(problem, states[-1]) if a.pddl == op.name)
    actions.append(a.text)
    states.append(cooking.step(problem, states[-1], a))
  return states, actions


def embed(problem, states, cfg, params):
  graphs = [cooking.scene_graph(problem, s) for s in states]
  n = sum(int(g.n_node[0]) for g in graphs)
  e = sum(int(g.n_edge[0]) for g in graphs)
  padded = gnn.pad(gnn.batch(graphs), gnn.round_up(n + 1, 64), gnn.round_up(e, 64), gnn.round_up(len(graphs) + 1, 8))
  return np.asarray(jax.jit(lambda p, g: gnn.forward(p, g, cfg))(params, padded))[:len(graphs)]


CFG = gnn.Config(node_features=cooking.NODE_FEATURES, edge_features=cooking.EDGE_FEATURES, d_model=16, n_heads=2,
                 n_layers=2, d_embed=16, init_std=0.5)


def test_memory_retrieves_the_trace_action_and_nothing_beyond_the_threshold(tmp_path):
  problem = cooking.generate(0, "burger", distractors=0)
  states, actions = replay(problem, shortest_plan(problem, problem.init, tmp_path))
  z = embed(problem, states, CFG, gnn.init(CFG, jax.random.PRNGKey(0)))
  d = np.linalg.norm(z[:, None] - z[None], axis=-1)
  assert d[~np.eye(len(z), dtype=bool)].min() > 1e-3  # every state of the trace embeds apart
  memory = gig.Memory(CFG.d_embed)
  memory.add_trace(z, actions)
  for t in range(len(actions)):
    hit = memory.retrieve(z[t])
    assert hit is not None and hit.action == actions[t] and hit.step == t and hit.distance < 1e-5
  assert memory.retrieve(z[-1]) is None or memory.retrieve(z[-1]).distance > 0  # the goal state has no action
  rng = np.random.default_rng(0)
  for t in range(len(actions)):
    u = rng.normal(size=CFG.d_embed)
    u -= (u @ z[t]) * z[t]
    u /= np.linalg.norm(u)
    for r in (0.05, 0.15, 0.5):
      q = z[t] + r * u
      d = np.linalg.norm(memory.z - q, axis=-1)
      d[[a is None for a in memory.actions]] = np.inf
      hit = memory.retrieve(q, threshold=0.1)
      if d.min() < 0.1:
        assert hit is not None and hit.action == memory.actions[int(np.argmin(d))]
        np.testing.assert_allclose(hit.distance, d.min(), rtol=1e-5)
      else:
        assert hit is None
  with pytest.raises(ValueError, match="need 2 actions, found 1"):
    memory.add_trace(z[:3], actions[:1])


def test_loop_warning_on_a_revisited_state():
  problem = cooking.generate(1, "sandwich", distractors=0)
  here = problem.init.robot
  there = next(s for s, _ in problem.stations if s != here)
  states = [problem.init]
  for text in (f"move to {there}", f"move to {here}", f"move to {there}"):
    states.append(cooking.step(problem, states[-1], cooking.parse_action(problem, states[-1], text)))
  loops = gig.LoopDetector()
  warnings = [loops.visit(frozenset(cooking.atoms(problem, s)), t) for t, s in enumerate(states)]
  assert warnings[0] is None and warnings[1] is None
  assert "visited at step 0" in warnings[2] and "visited at step 1" in warnings[3]


def soup_problem(holding_cut: bool):
  stations = (("stove1", "stove"), ("board1", "board"), ("table1", "table"), ("sink1", "sink"))
  items = (("onion1", "onion"), ("pot1", "pot"))
  goal = cooking.Goal("onion_soup", "soup", "table1", ("onion1",), pot="pot1")
  init = cooking.State(robot="sink1", holding="onion1", below={"pot1": "sink1"},
                       cut={"onion1"} if holding_cut else set())
  return cooking.Problem(stations, items, goal, init)


def test_lookahead_rejects_dead_ends_that_have_no_plan(tmp_path):
  problem = soup_problem(holding_cut=False)
  options = {o.action: o for o in gig.lookahead(problem, problem.init, 2)}
  assert options["add onion1 to pot1"].rejected == "onion1 went into pot1 uncut and can no longer be cut"
  assert [a for a, o in options.items() if o.rejected] == ["add onion1 to pot1"]
  dead = cooking.step(problem, problem.init, cooking.parse_action(problem, problem.init, "add onion1 to pot1"))
  assert shortest_plan(problem, dead, tmp_path) is None
  assert shortest_plan(problem, problem.init, tmp_path)
  cut = soup_problem(holding_cut=True)
  assert all(o.rejected is None for o in gig.lookahead(cut, cut.init, 1))


@pytest.mark.parametrize("seed,recipe,back", [(2, "cheeseburger", 3), (3, "onion_soup", 3)])
def test_lookahead_steps_to_goal_equal_shortest_plans(seed, recipe, back, tmp_path):
  problem = cooking.generate(seed, recipe, distractors=0)
  states, _ = replay(problem, shortest_plan(problem, problem.init, tmp_path))
  state = states[-1 - back]
  depth = back
  for o in gig.lookahead(problem, state, depth):
    s1 = cooking.step(problem, state, cooking.parse_action(problem, state, o.action))
    plan = shortest_plan(problem, s1, tmp_path)
    want = None if plan is None or len(plan) + 1 > depth else len(plan) + 1
    assert o.goal_in == want, o
  assert min(o.goal_in for o in gig.lookahead(problem, state, depth) if o.goal_in) == back


def test_planner_prefers_memory_then_lookahead(tmp_path):
  problem = cooking.generate(0, "burger", distractors=0)
  states, actions = replay(problem, shortest_plan(problem, problem.init, tmp_path))
  z = embed(problem, states, CFG, gnn.init(CFG, jax.random.PRNGKey(0)))
  memory = gig.Memory(CFG.d_embed)
  memory.add_trace(z, actions)
  planner = gig.Planner(memory, threshold=1e-3, depth=1)
  out = planner.decide(problem, states[0], z[0], 0)
  assert out["source"] == "memory" and out["action"] == actions[0]
  empty = gig.Planner(gig.Memory(CFG.d_embed), threshold=1e-3, depth=1)
  out = empty.decide(problem, states[-2], z[-2], 0)
  assert out["source"] == "lookahead" and out["action"] == actions[-1]


@pytest.mark.parametrize("seed,recipe", [(0, "burger"), (4, "onion_soup")])
def test_shortest_plan_is_as_short_as_pyperplans_and_succeeds(seed, recipe, tmp_path):
  problem = cooking.generate(seed, recipe, distractors=0)
  plan = gig.shortest_plan(problem)
  assert len(plan) == len(shortest_plan(problem, problem.init, tmp_path))
  state = problem.init
  for a in plan:
    state = cooking.step(problem, state, a)
  assert cooking.success(problem, state)


def test_experiment_smoke_run_replays_seen_traces_from_memory(tmp_path):
  cfg = gig.Config(recipes=("onion_soup",), train_problems=2, test_problems=2, steps=2, triplets=4, max_steps=30,
                   depth=1)
  res = gig.run(cfg, str(tmp_path), resume=False)
  assert res["success.seen.memory"] == 1.0 and res["memory_share.seen"] == 1.0
  assert 0.0 <= res["triplet_acc.trained"] <= 1.0 and np.isfinite(res["heldout_triplet_loss.trained"])
  with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
    assert len(f.readlines()) == 2
  with pytest.raises(ValueError, match="recipes must be names from"):
    gig.Config(recipes=("pizza",))
