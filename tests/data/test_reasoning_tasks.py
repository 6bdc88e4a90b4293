"""Reasoning tasks (jaxlab.data.tasks.reasoning): answers and every CoT step against independent oracles.

Oracles: the bit count (Parity), networkx's forest test and connected components (Cycle), enumeration of all
subsets (Subsum); the prompt is parsed back into the problem; reasoning-gym's own scorer for its problems.
"""
import itertools
import re

import networkx as nx
import numpy as np
import pytest

from jaxlab.data.tasks import reasoning as rs


def _sets(text):
  return [set(map(int, s.split(", "))) for s in re.findall(r"\{([\d, ]+)\}", text)]


def test_parity_answers_and_running_counts():
  for ex in rs.generate("parity", 60, seed=1):
    bits = [int(b) for b in re.search(r"1s in ([01 ]+) even", ex.prompt).group(1).split()]
    assert tuple(bits) == ex.problem and len(ex.steps) == len(bits)
    assert ex.answer == ("odd" if sum(bits) % 2 else "even")
    for i, step in enumerate(ex.steps):
      count = sum(bits[:i + 1])
      assert step == f"Bit {i + 1} is {bits[i]}: count {count}, {'odd' if count % 2 else 'even'}."


def test_cycle_answers_and_union_find_steps():
  for ex in rs.generate(rs.Cycle(min_nodes=3, max_nodes=8, edge_ratio=0.9), 80, seed=2):
    n, edges = ex.problem
    listed = re.search(r"edges (.*)\. Does", ex.prompt).group(1)
    assert [tuple(map(int, e.split("-"))) for e in listed.split(", ")] == list(edges)
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from(edges)
    assert ex.answer == ("no" if nx.is_forest(g) else "yes")
    prefix = nx.Graph()
    prefix.add_nodes_from(range(n))
    for (a, b), step in zip(edges, ex.steps):
      if nx.has_path(prefix, a, b):
        assert step.endswith("closes a cycle.") and step is ex.steps[-1]
        break
      left, right, merged = _sets(step)
      assert left == nx.node_connected_component(prefix, a) and right == nx.node_connected_component(prefix, b)
      prefix.add_edge(a, b)
      assert merged == nx.node_connected_component(prefix, a)
    else:
      assert ex.steps[-1].startswith("No edge") and len(ex.steps) == len(edges) + 1


def test_subsum_answers_and_reachable_sets():
  for ex in rs.generate("subsum", 80, seed=3):
    nums, target = ex.problem
    m = re.fullmatch(r"Can a subset of ([\d, ]+) sum to (\d+)\?", ex.prompt)
    assert tuple(map(int, m.group(1).split(", "))) == nums and int(m.group(2)) == target
    reachable = any(sum(c) == target for k in range(1, len(nums) + 1) for c in itertools.combinations(nums, k))
    assert ex.answer == ("yes" if reachable else "no")
    for i, step in enumerate(ex.steps[1:-1]):
      brute = {sum(c) for k in range(i + 2) for c in itertools.combinations(nums[:i + 1], k)}
      assert _sets(step) == [{s for s in brute if s <= target}]
    assert ex.steps[-1] == f"{target} is {'' if reachable else 'not '}reachable."
    assert ex.completion == ex.cot + f"\nAnswer: {ex.answer}"


@pytest.mark.parametrize("name", sorted(rs.TASKS))
def test_seeded_and_balanced(name):
  a, b, c = (rs.generate(name, 20, seed=s) for s in (7, 7, 8))
  assert a == b and a != c
  answers = [ex.answer for ex in a]
  task = rs.TASKS[name]
  assert answers == [task.answers[i % 2] for i in range(20)]
  free = [ex.answer for ex in rs.generate(name, 200, seed=0, balanced=False)]
  assert set(free) == set(task.answers)  # both answers occur naturally
  lengths = [len(ex.steps) for ex in a]
  assert len(set(lengths)) > 1  # CoT lengths vary


def test_bad_arguments_fail_clearly():
  with pytest.raises(ValueError, match="unknown reasoning task 'sort'"):
    rs.generate("sort", 1)
  with pytest.raises(ValueError, match="min_bits <= max_bits"):
    rs.Parity(min_bits=5, max_bits=3)
  with pytest.raises(ValueError, match="3 <= min_nodes"):
    rs.Cycle(min_nodes=2)
  with pytest.raises(ValueError, match="no problem with answer 'no'"):
    rs.generate(rs.Subsum(min_numbers=1, max_numbers=1, max_value=1), 2, max_tries=50)
  np.testing.assert_equal(len(rs.generate("cycle", 0)), 0)


@pytest.mark.parametrize("name", sorted(rs.GYM_TASKS))
def test_gym_problems_are_balanced_seeded_and_scored_right_by_the_gym(name):
  import reasoning_gym
  exs = rs.from_gym(name, 10, seed=3)
  assert [e.answer for e in exs] == [rs.GYM_TASKS[name][i % 2] for i in range(10)]
  assert exs == rs.from_gym(name, 10, seed=3) and exs != rs.from_gym(name, 10, seed=4)
  data = reasoning_gym.create_dataset(name, size=1, seed=0)  # the scorer reads only the entry it is given
  for e in exs:
    entry, = e.problem
    assert e.steps == () and e.prompt == entry["question"].strip() and e.task == name
    assert data.score_answer(e.answer, entry) == 1.0
    assert data.score_answer(next(a for a in rs.GYM_TASKS[name] if a != e.answer), entry) == 0.0
  with pytest.raises(ValueError, match="unknown reasoning-gym task 'sudoku'"):
    rs.from_gym("sudoku", 2)
