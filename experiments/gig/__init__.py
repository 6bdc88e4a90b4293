"""GiG planning (Graph-in-Graph; experiments/gig/README.md, no public code) on the kitchen and on TextWorld.

The inner graphs are scene graphs (`experiments.gig.cooking`'s kitchen; `experiments.gig.textworld`'s facts), embedded
by `jaxlab.models.gnn`'s GAT into unit vectors; the outer graph is the experience memory of solved traces
(`planner`). The experiment solves generated kitchen problems by A* search (shortest plans) over the symbolic
transitions, trains the GAT on those traces (triplet + uniformity loss) and measures (1) triplet accuracy on
held-out traces before and after training, (2) the planner alone (retrieval, else lookahead, else the first
allowed action) on seen and unseen problems, with the trained memory and with an empty one, and (3) the LLM
agents of `agents` (`llm`: the LLM alone; `llm_lookahead`; `gig`: memory, loop guard, lookahead, then the LLM)
and the planner's upper bound on unseen problems of each env of `llm_envs` ("cooking_sync", "cooking_async",
"textworld"): Pass@1, LLM calls and prompt tokens per episode. For TextWorld a second GAT trains on the
walkthroughs of `tw_train_games` games (the memory), and the upper bound is TextWorld's own walkthrough. GiG's
memory grows by every episode it solves, in seed order.

  python -m experiments run gig --preset cpu

Paper: arXiv 2601.21841. Code read beside it: none public. Method, claims, presets and departures from the paper:
experiments/gig/README.md.
"""
from __future__ import annotations

import dataclasses
from typing import Literal

from experiments import registry
from experiments.gig.agents import (LABELS, METHODS, RETRIEVALS, ChoiceLLM, Kitchen, LikelihoodLLM, TextGame,
                                    decision_prompt, play_agent)
from experiments.gig.planner import (THRESHOLD, LoopDetector, Memory, Option, Planner, Retrieval, dead_end,
                                     lookahead, shortest_plan, state_key)
from experiments.runner.claims import Check, Claim
from experiments.gig import cooking
from experiments.gig.loss import Uniformity
from jaxlab import choices
from jaxlab.models import gnn


__all__ = ["LABELS", "METHODS", "THRESHOLD", "ChoiceLLM", "Config", "Kitchen", "LikelihoodLLM", "LoopDetector",
           "Memory", "Option",
           "Planner", "Retrieval", "TextGame", "dead_end", "decision_prompt", "lookahead", "play_agent", "run",
           "shortest_plan", "state_key"]
Env = Literal["cooking_sync", "cooking_async", "textworld"]
ENVS = choices.values(Env)
CHOOSERS = {"letter": ChoiceLLM, "likelihood": LikelihoodLLM}
Chooser = Literal["letter", "likelihood"]
RetrievalMode = Literal["prompt", "execute"]
choices.same(CHOOSERS, Chooser)
choices.same(RETRIEVALS, RetrievalMode)

@dataclasses.dataclass(frozen=True)
class Config:
  """gig settings: `train_problems` solved problems (seeds 0..) train the GAT and fill the memory, `test_problems`
  (seeds 1000.., skipping any problem equal to a training one) are unseen; `steps` Adam steps on `triplets`
  triplets each. The LLM agents (`llm`: a registered chat model or a path; "" skips them; `chooser`: "letter" picks
  the lettered action whose letter is likeliest, "likelihood" the action whose text is) play `llm_problems` unseen
  problems (chosen alike) in each of `llm_envs`;
  the kitchen GAT trains on the traces of every kitchen mode played. TextWorld games (`tw_*` settings of
  `experiments.gig.textworld.make_game`) are generated into `tw_games` (default: the run directory's
  textworld_games/). The GAT's loss: triplet with `margin` plus `uniformity_weight` x `uniformity` ("cosine2": the
  paper's mean squared cosine similarity; "log_mean_exp": Wang & Isola's, an ablation). `retrieval`: GiG's
  remembered action goes into the LLM's prompt ("prompt", the paper's) or is taken without a call ("execute", an
  ablation)."""
  recipes: tuple[str, ...] = ("burger", "cheese_sandwich", "onion_soup")
  mode: cooking.Mode = "sync"
  train_problems: int = 6
  test_problems: int = 3
  distractors: int = 0
  model: str = "gig-tiny"
  steps: int = 100
  triplets: int = 16
  lr: float = 3e-3
  margin: float = 1.0
  uniformity_weight: float = 0.1
  uniformity: Uniformity = "cosine2"
  threshold: float = THRESHOLD
  depth: int = 2
  max_steps: int = 40
  llm: str = "smollm2-135m-instruct"
  llm_envs: tuple[Env, ...] = ENVS
  chooser: Chooser = "letter"
  retrieval: RetrievalMode = "prompt"
  llm_problems: int = 6
  llm_max_steps: int = 30
  tw_games: str = ""
  tw_train_games: int = 8
  tw_recipe: int = 1
  tw_take: int = 1
  tw_go: int = 1
  tw_open: bool = True
  tw_cut: bool = True
  tw_cook: bool = False
  seed: int = 0

  def __post_init__(self):
    bad = [r for r in self.recipes if r not in cooking.RECIPES]
    if not self.recipes or bad:
      raise ValueError(f"recipes must be names from {sorted(cooking.RECIPES)}, found {list(self.recipes)}")
    if self.model not in gnn.PRESETS:
      raise ValueError(f"model must be one of {sorted(gnn.PRESETS)}, found {self.model!r}")
    choices.check(self)
    if self.llm_problems < 1 or self.llm_max_steps < 1:
      raise ValueError(f"llm_problems and llm_max_steps must be >= 1, found {self.llm_problems}, {self.llm_max_steps}")
    if self.tw_train_games < 2:
      raise ValueError(f"tw_train_games must be >= 2 (negatives come from other traces), found {self.tw_train_games}")
    if self.train_problems < 2 or self.test_problems < 2:
      raise ValueError(f"train_problems and test_problems must be >= 2 (negatives come from other traces), found "
                       f"{self.train_problems} and {self.test_problems}")


PRESETS = {
    "smoke": Config(recipes=("burger", "onion_soup"), train_problems=2, test_problems=2, steps=3, triplets=4,
                    max_steps=24, depth=1, llm_envs=("cooking_sync", "textworld"), llm_problems=1, llm_max_steps=3,
                    tw_train_games=2),
    "cpu": Config(train_problems=12, test_problems=6, steps=300, triplets=32),
    "full": Config(recipes=tuple(sorted(cooking.RECIPES)), train_problems=64, test_problems=32, distractors=1,
                   model="gig", steps=3000, triplets=64, depth=3, max_steps=80,
                   llm=registry.Hub("Qwen/Qwen2.5-7B-Instruct")),
}


def _requires(cfg: Config) -> tuple[str, ...]:
  """TextWorld's wheels (.ci/no-deps.txt), reached only after the GAT has trained."""
  return ("textworld", "jericho", "TatSu", "hashids", "mementos") if cfg.llm and "textworld" in cfg.llm_envs else ()


registry.register(registry.Experiment(
    name="gig", config_cls=Config, presets=PRESETS, run=registry.run_of("experiments.gig.run"), requires=_requires,
    description="GiG on the kitchen (sync, async) and TextWorld: GAT trace memory, loop guard and symbolic "
                "lookahead under an LLM planner (SmolLM2), against the LLM alone, LLM + lookahead and a planner",
    results=("triplet_acc.init", "triplet_acc.trained", "heldout_triplet_loss.init", "heldout_triplet_loss.trained",
             "loss.first", "loss.last", "success.<split>.<planner>", "steps.<split>.<planner>", "memory_share.<split>",
             "plan_length.mean", "pass1.<env>.<method>?", "calls.<env>.<method>?", "tokens.<env>.<method>?",
             "memory_share.<env>?", "textworld.gat_loss.first?", "textworld.gat_loss.last?"),
    paper="gig", claims=(
        Claim("embed", "training lowers the triplet loss on held-out traces (next state nearer than other traces' "
              "states by the margin)", "triplet + uniformity training gives trace-aware state embeddings",
              "{heldout_triplet_loss.trained} < {heldout_triplet_loss.init}"),
        Claim("memory", "on unseen problems, the planner with the memory of solved traces succeeds more often than "
              "lookahead alone", "the experience memory raises success over planning without it",
              "{success.unseen.memory} > {success.unseen.lookahead}",
              diff=("success.unseen.memory", "success.unseen.lookahead"),
              measurable="{success.unseen.lookahead} < 1 and max({success.unseen.memory}, "
                         "{success.unseen.lookahead}) > 0",
              why="lookahead alone solves every unseen problem (the ceiling) or neither planner solves one (the "
                  "floor)"),
        Claim("sync", "GiG solves more synchronous kitchen tasks than the LLM alone and than LLM + lookahead, at no "
              "more LLM calls", "+22 points Pass@1 over the best baseline (Robotouille synchronous)",
              "{pass1.cooking_sync.gig} > {pass1.cooking_sync.llm_lookahead} and {pass1.cooking_sync.gig} > "
              "{pass1.cooking_sync.llm} and {calls.cooking_sync.gig} <= {calls.cooking_sync.llm}",
              diff=(("pass1.cooking_sync.gig", "pass1.cooking_sync.llm_lookahead"),
                    ("pass1.cooking_sync.gig", "pass1.cooking_sync.llm")),
              given="{calls.cooking_sync.gig} <= {calls.cooking_sync.llm}",
              measurable="{pass1.cooking_sync.planner} > 0 and max({pass1.cooking_sync.gig}, "
                         "{pass1.cooking_sync.llm_lookahead}, {pass1.cooking_sync.llm}) > 0",
              why="no LLM agent solves a problem (the floor; or the planner finds no plan within the step limit)"),
        Claim("async", "GiG solves more asynchronous kitchen tasks than the LLM alone and than LLM + lookahead, at "
              "no more LLM calls", "+37 points Pass@1 over the best baseline (Robotouille asynchronous)",
              "{pass1.cooking_async.gig} > {pass1.cooking_async.llm_lookahead} and {pass1.cooking_async.gig} > "
              "{pass1.cooking_async.llm} and {calls.cooking_async.gig} <= {calls.cooking_async.llm}",
              diff=(("pass1.cooking_async.gig", "pass1.cooking_async.llm_lookahead"),
                    ("pass1.cooking_async.gig", "pass1.cooking_async.llm")),
              given="{calls.cooking_async.gig} <= {calls.cooking_async.llm}",
              measurable="{pass1.cooking_async.planner} > 0 and max({pass1.cooking_async.gig}, "
                         "{pass1.cooking_async.llm_lookahead}, {pass1.cooking_async.llm}) > 0",
              why="no LLM agent solves a problem (the floor; or the planner finds no plan within the step limit)"),
    ), checks=(
        Check("memory_seen", "retrieving actions from solved traces solves the problems they were solved on better "
              "than lookahead alone", "(validation: the memory returns the traces it was filled with)",
              "{success.seen.memory} > {success.seen.lookahead}"),
    )))
