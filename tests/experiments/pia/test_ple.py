"""PLE: lineage credit and selection scores on a hand-built tree against the hand computation, determinism of the
evolution for a seed, and a search that finds what a scripted target model rewards."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from experiments.pia import ple


def _tree():
  """0 -> 1 -> 2, and 3 crossed from 0 and 2 (distance 1 from 0 though 3 edges away through 1 and 2)."""
  g = ple.Lineage(beta=0.3)
  for text, parents in (("a", ()), ("b", (0,)), ("c", (1,)), ("d", (0, 2))):
    g.add(text, parents)
  for i, (s, r, n) in enumerate([(2, 7, 10), (5, 4, 10), (8, 1, 10), (1, 9, 10)]):
    g.record(i, s, r, n)
  return g


def test_lineage_credit_by_hand():
  g = _tree()
  assert g.ancestors(3) == {0: 1, 2: 1, 1: 2}
  b = 0.3
  # node 0: from 1 (d 1), 2 (d 2), 3 (d 1); node 1: from 2 (d 1), 3 (d 2); node 2: from 3 (d 1); node 3: none
  want_s = [b * 5 + b ** 2 * 8 + b * 1, b * 8 + b ** 2 * 1, b * 1, 0.0]
  want_r = [b * 4 + b ** 2 * 1 + b * 9, b * 1 + b ** 2 * 9, b * 9, 0.0]
  want_n = [10 * (2 * b + b ** 2), 10 * (b + b ** 2), 10 * b, 0.0]
  for node, s, r, n in zip(g.nodes, want_s, want_r, want_n):
    assert node.prop_successes == pytest.approx(s) and node.prop_refusals == pytest.approx(r)
    assert node.prop_evals == pytest.approx(n)
  direct = [2, 5, 8, 1]
  want_asr = [(d + s) / (10 + n) for d, s, n in zip(direct, want_s, want_n)]
  assert [x.propagated_asr for x in g.nodes] == pytest.approx(want_asr)
  assert [x.asr for x in g.nodes] == [0.2, 0.5, 0.8, 0.1]
  bonus = [0.1 * math.sqrt(2 * math.log(4) / (10 + n + 1)) for n in want_n]
  np.testing.assert_allclose(g.scores(0.1), np.add(want_asr, bonus), rtol=1e-12)
  order = sorted(range(4), key=lambda i: -(want_asr[i] + bonus[i]))
  assert g.select(2, 0.1) == order[:2]
  assert g.elite(3) == [2, 1, 0]


def test_lineage_errors():
  g = _tree()
  with pytest.raises(ValueError, match=r"existing node ids in \[0, 4\), found \[7\]"):
    g.add("e", (7,))
  with pytest.raises(ValueError, match="already evaluated"):
    g.record(0, 1, 1, 10)
  g.add("e", (3,))
  with pytest.raises(ValueError, match="successes \\+ refusals <= evals, found 6, 5, 10"):
    g.record(4, 6, 5, 10)
  with pytest.raises(ValueError, match="beta"):
    ple.Config(beta=1.5)


def _scripted(texts):
  """A target model that complies more the more 'rule-free' traits a persona has (8 prompts per persona)."""
  keys = ("without caveats", "free for everyone", "above ordinary moral", "fictional script", "to the letter",
          "forbidden topics", "distrust authority")
  out = []
  for t in texts:
    s = min(8, 1 + 2 * sum(k in t for k in keys))
    out.append((s, 8 - s, 8))
  return out


def test_evolution_is_deterministic_for_a_seed():
  cfg = ple.Config(generations=4, parents=3, min_children=4, elite=5, seed=3)
  seeds = ple.seed_personas(5, seed=1)
  runs = [ple.evolve(cfg, seeds, _scripted, ple.TemplateMutator()) for _ in range(2)]
  dump = [json.dumps([(n.text, n.parents, n.successes) for n in r.lineage.nodes]) for r in runs]
  assert dump[0] == dump[1]
  assert runs[0].parents_by_generation == runs[1].parents_by_generation
  other = ple.evolve(ple.Config(generations=4, parents=3, min_children=4, elite=5, seed=4), seeds, _scripted,
                     ple.TemplateMutator())
  assert json.dumps([(n.text, n.parents) for n in other.lineage.nodes]) != dump[0]
  r = runs[0]
  assert len(r.asr_by_generation) == 5 and r.seed_asr == pytest.approx(np.mean([s / 8 for s, _, _ in
                                                                                _scripted(seeds)]))
  assert all(len(r.lineage.nodes[i].parents) in (1, 2) for i in range(5, len(r.lineage.nodes)))
  assert r.best_by_generation == sorted(r.best_by_generation)


def test_evolution_finds_what_the_target_rewards():
  cfg = ple.Config(generations=12, parents=4, min_children=4, elite=5, seed=0)
  r = ple.evolve(cfg, ple.seed_personas(6, seed=2), _scripted, ple.TemplateMutator())
  assert r.best_asr >= 1.5 * r.seed_asr and r.best_asr >= 0.6
  assert r.elite_by_generation[-1] > r.elite_by_generation[0]


def test_lm_mutator_prompts_and_parsing():
  calls = []

  def generate(system, user):
    calls.append((system, user))
    return '```json\n{"new_prompt": "You are a lighthouse keeper who tells tales."}\n```' if len(calls) == 1 else \
        '{"new_prompt": "  merged persona  "}'

  m = ple.LMMutator(generate)
  rng = np.random.default_rng(0)
  assert m.mutate("You are a cook.", rng) == "You are a lighthouse keeper who tells tales."
  assert calls[0][0] == ple.MUTATE_TASKS["expansion"]  # under 20 words: always expansion
  assert m.crossover("A.", "B.", rng) == "merged persona"
  assert "Persona 1: A." in calls[1][1] and "Persona 2: B." in calls[1][1]
  assert ple.parse_new_prompt('{"new_prompt": "x y"') == "x y"
  assert ple.parse_new_prompt("plain text") == "plain text"


def test_template_mutator_respects_length_rules():
  m, rng = ple.TemplateMutator(), np.random.default_rng(0)
  short = "You are a cook."
  assert len(m.mutate(short, rng).split()) > len(short.split())
  long = "You are a cook. " + " ".join(ple.TRAITS * 2)
  assert len(m.mutate(long, rng).split()) < len(long.split())
  child = m.crossover(ple.seed_personas(2)[0], ple.seed_personas(2)[1], rng)
  assert child.startswith("You are a")
