"""PoLar (arXiv 2606.06574, "Skip a Layer or Loop It? Learning Program-of-Layers in LLMs") on a real chat LM.

A program of layers (`jaxlab.models.programs`) runs the LM's layers in another order: skipped, kept or run twice
in contiguous packs of <= `max_pack` layers. Each question is asked with an answer-only prompt; a program is
right when the answer's first token beats every other choice's at the last prompt position (`scoring="choices"`,
tasks with a closed answer set) or every other token of the vocabulary (`scoring="vocab"`). The margin (the
answer's logit minus the best other's) ranks programs.
  search     per training question, a beam over edits of the full program: each step adds one SKIP or REPEAT
             segment (start on a `stride` grid, size in `edit_sizes`) to each kept program, evaluates all new
             programs in batches with one compile per padded length (`programs.forward_batch`) and keeps the
             `beam` best by margin (then fewer executed layers); `search.shorter_correct_rate` is the share of
             questions with a right program that executes fewer layers than the LM has, `search.corrected_rate`
             the share of wrongly answered questions (full depth) that some program answers right.
  predictor  `jaxlab.models.program_predictor` over the frozen MiniLM token states of the question, trained on
             the right programs of the training questions (up to `max_paths` each, shortest first; the full
             path weighted `full_weight` when a shorter one is right, optional length weights exp(-beta len));
             beam decoding gives the top-5 programs of each held-out question: top-1 accuracy, pass@5, and
             as a baseline pass@5 of the full program plus 4 random single edits (with two answer words,
             several programs are right by chance).
Held-out questions come from the training tasks (other seeds; JSONL tasks: the records after the training ones) and
`ood.*` from the task `ood_task`, none of them a training question (`run.question_splits`, recorded in splits.json).
items.json holds each held-out figure as 0/1 per question, over which the claims' intervals are bootstrapped.

  python -m experiments run polar --preset smoke
  python -m experiments run polar --preset cpu
  python -m experiments run polar --preset full   # Qwen/Qwen2.5-3B-Instruct (hf download Qwen/Qwen2.5-3B-Instruct)
  python -m experiments run polar --preset full --set tasks='("jsonl:gsm8k:/p.jsonl",)'
  python -m experiments plan polar --preset full --topology v5e-8

Paper: arXiv 2606.06574. Code read beside it: tianyi-lab/PoLar @ 30d0efde953a. Method, claims, presets and
departures from the paper: experiments/polar/README.md.
"""
from __future__ import annotations

import dataclasses
from typing import Literal

from experiments import registry
from experiments.runner.claims import Claim
from jaxlab import choices as choices_lib
from jaxlab import sharding as shd
from jaxlab.data.tasks import reasoning


Scoring = Literal["choices", "vocab"]
SCORINGS = choices_lib.values(Scoring)


@dataclasses.dataclass(frozen=True)
class Config:
  """polar settings. Tasks: names in `reasoning.TASKS` or "jsonl:FORMAT:PATH" (`arithmetic.load_jsonl`, scored
  over the vocabulary). dtype: the LM's params and compute; mesh / strategy: the device mesh the LM is placed on
  (`jaxlab.sharding.make_mesh`; None: one device) and its sharding rules; a batch of programs is split over the
  mesh's batch axes."""
  model: str = "smollm2-135m-instruct"
  dtype: str = "float32"
  mesh: str | None = None
  strategy: shd.Strategy = "dp"
  embedder: str = "minilm-l6"
  tasks: tuple[str, ...] = ("cycle", "subsum")
  ood_task: str = "parity"
  train_questions: int = 48
  test_questions: int = 32
  ood_questions: int = 24
  scoring: Scoring = "choices"
  max_pack: int = 4
  edit_sizes: tuple[int, ...] = (1, 2, 4)
  stride: int = 2
  beam: int = 2
  depth: int = 1
  candidates: int = 11  # programs sampled per beam step (0: every edit)
  program_batch: int = 12
  max_paths: int = 4
  full_weight: float = 0.30
  length_beta: float = 0.0
  d_model: int = 256
  n_heads: int = 4
  n_blocks: int = 2
  learning_rate: float = 5e-4
  epochs: int = 40
  batch_size: int = 32
  top_k: int = 5
  top_ops: int = 2
  random_baseline: bool = True  # also pass@k of the full program plus random single edits
  seed: int = 0

  def __post_init__(self):
    choices_lib.check(self)
    for t in (*self.tasks, self.ood_task):
      if not (t in reasoning.TASKS or (t.startswith("jsonl:") and t.count(":") >= 2)):
        raise ValueError(f"task must be one of {sorted(reasoning.TASKS)} or 'jsonl:FORMAT:PATH', found {t!r}")
    if not self.tasks:
      raise ValueError("tasks must name at least one task, found ()")
    if not self.edit_sizes or not all(1 <= s <= self.max_pack for s in self.edit_sizes):
      raise ValueError(f"edit_sizes must be in [1, max_pack={self.max_pack}], found {self.edit_sizes}")
    if min(self.train_questions, self.test_questions, self.beam, self.depth, self.stride, self.top_k) < 1:
      raise ValueError("train_questions, test_questions, beam, depth, stride and top_k must be >= 1")


PRESETS = {
    "smoke": Config(model="tiny-random:6", tasks=("subsum",), train_questions=4, test_questions=4, ood_questions=2,
                    edit_sizes=(1, 2), stride=1, beam=2, depth=2, candidates=8, program_batch=16, max_pack=2,
                    d_model=32, epochs=4, batch_size=8),
    # ~1,250 program runs of SmolLM2 at 60-95 prompt tokens (1.4 s each on 2 busy cores, less on idle ones):
    # 48 questions x 12 in the search, 56 held-out x <= 12 in the evaluation
    "cpu": Config(),
    "full": Config(model=registry.Hub("Qwen/Qwen2.5-3B-Instruct"), dtype="bfloat16", mesh="data",
                   train_questions=1250, test_questions=250, ood_questions=250, stride=1, beam=4, depth=3,
                   candidates=0, program_batch=64, epochs=30),
}


# ------------------------------------------------------------------------------------------- questions


# -------------------------------------------------------------------------------------------- scoring


# --------------------------------------------------------------------------------------------- search


# ------------------------------------------------------------------------------------------ predictor


# ------------------------------------------------------------------------------------------------ run


registry.register(registry.Experiment(
    name="polar", config_cls=Config, presets=PRESETS, run=registry.run_of("experiments.polar.run"),
    description="PoLar: program-of-layers search on SmolLM2 and a MiniLM-conditioned program predictor",
    results=("search.shorter_correct_rate", "search.corrected_rate", "search.programs_per_question", "train.examples",
             "predictor.loss_first", "predictor.loss_last", "acc.full_forward", "acc.predictor_top1", "pass5.predictor",
             "layers.full", "layers.predictor_top1", "top1_is_full_rate", "pass5.full_plus_random_edits?", "lm_calls",
             "ood.<figure>?"),
    paper="polar", claims=(
        Claim("pass5", "the predictor's top-5 programs answer more questions than the full forward",
              "pass@5 above the base model's accuracy", "{pass5.predictor} > {acc.full_forward}",
              measurable="{pass5.full_plus_random_edits} <= {acc.full_forward}",
              why="random programs' pass@5 (the full program plus 4 random single edits) already beats the full "
                  "forward, so pass@5 above it is chance (pass5_vs_chance compares with them)",
              diff=("pass5.predictor", "acc.full_forward")),
        Claim("top1", "the predictor's top-1 program beats the full forward (a reproduction finds it falls back "
              "to the full forward)", "top-1 above the base model's accuracy",
              "{acc.predictor_top1} > {acc.full_forward}", diff=("acc.predictor_top1", "acc.full_forward")),
        Claim("pass5_vs_chance", "the predictor's top-5 programs beat the full program plus 4 random single edits",
              "not in the paper (a chance baseline for pass@5)",
              "{pass5.predictor} > {pass5.full_plus_random_edits}",
              measurable="{acc.full_forward} > 0.5 and {pass5.full_plus_random_edits} < 1",
              why="the full forward answers the two-answer tasks at chance (0.5; the presets' cycle and subsum) or "
                  "random programs' pass@5 is at the ceiling 1",
              diff=("pass5.predictor", "pass5.full_plus_random_edits")),
    )))
