"""gig at paper scale: every recipe of the full preset has a shortest plan (the planner once ran out of states on
potato_soup), and the full preset plans on cpu-8 (the GAT's train step and forward, the LLM agents' decisions)."""
import pytest

from experiments import registry
from experiments.gig import cooking
from experiments.gig import run as gig_run
from experiments.gig.planner import shortest_plan
from experiments.runner import plan as plan_lib


def _full_problem(seed: int, mode: str) -> cooking.Problem:
  cfg = registry.config_for("gig", "full", required=False)
  return gig_run._problems(cfg, [seed], mode)[0]


@pytest.mark.slow
def test_every_recipe_of_the_full_preset_has_a_plan():
  cfg = registry.config_for("gig", "full", required=False)
  recipes = cfg.recipes
  seeds = {r: recipes.index(r) for r in recipes}  # the first training problem of each recipe
  cases = [(s, "sync") for s in seeds.values()] + [(12, "sync"), (5, "async")]  # potato_soup's, unsolved by BFS
  for seed, mode in cases:
    problem = _full_problem(seed, mode)
    plan = shortest_plan(problem)
    assert plan, (seed, mode, problem.goal.recipe)
    state = problem.init
    for a in plan:
      state = cooking.step(problem, state, a)
    assert cooking.success(problem, state)
  assert {_full_problem(s, "sync").goal.recipe for s, _ in cases} == set(recipes) == set(cooking.RECIPES)


@pytest.mark.slow
def test_full_preset_plans_the_gat_and_the_llm_agents_on_cpu_8():
  p = plan_lib.plan("gig", "full", "cpu-8")
  assert [w["name"] for w in p["workloads"]] == ["gat_train_step", "gat_embed", "llm_letter"]
  assert isinstance(p["fits"], bool)
  train, embed, llm = p["workloads"]
  assert train["kind"] == "train" and train["steps"] == 3000
  assert 0.65 <= train["flops_per_step"] / train["analytic_flops_per_step"] <= 1.5
  assert 0.65 <= embed["flops_per_step"] / embed["analytic_flops_per_step"] <= 1.5
  cfg = registry.config_for("gig", "full", required=False)
  assert llm["steps"] == len(cfg.llm_envs) * cfg.llm_problems * 3 * cfg.llm_max_steps
  assert 0.65 <= llm["flops_per_step"] / llm["analytic_flops_per_step"] <= 1.5
  assert llm["bytes_per_chip"] > 7e9 * 4  # Qwen2.5-7B's fp32 weights on every chip, as the run holds them
