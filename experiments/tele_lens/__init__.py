"""Tele-Lens (arXiv 2602.02103): how far ahead a chat LM's hidden states plan its chain of thought.

The LM (SmolLM2-135M-Instruct by default) answers chat-formatted questions: Parity, Cycle, Subsum
(`jaxlab.data.tasks.reasoning`) and reasoning-gym's syllogism and ransom_note. With `cot="model"` it writes its
own CoTs, one greedy and `sampled_cots` sampled at `temperature` per question, cut where it starts to state the
answer ("Answer:", "the answer is"); with `cot="template"` it reads the task's templated CoT. Every CoT is then
followed by "\nAnswer:" and the gold one-token answer, and at every CoT position of every probed layer the hidden
state is extracted once (cached under the run directory); probes of `jaxlab.interp.probes` are trained on the
CoTs of the first half of each task's distinct questions and scored on the rest (a question drawn twice stays
on its first side; `splits.json` records both):
  horizon       top-5 accuracy of the token probe for delta = 1..8 tokens ahead (inside the CoT);
  final answer  accuracy of the answer probe (over the answer words of all tasks) at every CoT position;
  uncertainty   the LM's own answer after the CoT (its argmax over the task's answer words) is right or wrong;
                scores for being right: minus the pivot uncertainty (mean of the k = 5 lowest answer-probe
                entropies over the CoT, at `uncertainty_layer`), minus the mean of the k highest entropies of
                the LM's own next-token distribution over the CoT (the paper's probe-free top-k-highest
                baseline), the LM's self-certainty over the CoT, minus the CoT's perplexity; AUROC of each;
  CoT bypass    where the answer probe's entropy / log 20 (`entropy_norm`) falls below `bypass_threshold` within
                the first `bypass_window` (5) CoT positions, the probe's answer replaces the CoT's; rate and
                accuracy change;
  full vocab    the token probe read out through the whole LM head rather than the CoTs' vocabulary subset, on
                `full_vocab_positions` test positions at `uncertainty_layer` (how much the subset eases top-5).
A model's CoTs are planned by the model itself, so the horizon measures how far its states anticipate its own
words; a template's are fixed text it reads, far more predictable (the last command below shows the contrast).

  python -m experiments run tele_lens --preset smoke
  python -m experiments run tele_lens --preset cpu
  python -m experiments run tele_lens --preset cpu --set cot=template --set tasks=parity,cycle,subsum --set examples=48
  python -m experiments run tele_lens --preset full  # after: hf download lxucs/tele-lens-llm \
      --local-dir models/lxucs/tele-lens-llm

Paper: arXiv 2602.02103. Code read beside it: lxucs/tele-lens @ a4b49ca7d4a1. Method, claims, presets and departures
from the paper: experiments/tele_lens/README.md.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Literal

from experiments import registry
from experiments.runner.claims import Claim
from jaxlab import choices
from jaxlab.data.tasks import reasoning
from jaxlab.interp.probes import Activation, Schedule


INSTRUCTION = " Think step by step, then give the answer."
# where a model's CoT turns into stating its answer: "Answer:", "**Final answer**:", "the answer is"
ANSWER_RE = re.compile(r"(?i)\**\s*(?:the\s+)?(?:final\s+)?answer\**\s*(?::|is\b)")
Cot = Literal["template", "model"]
COTS = choices.values(Cot)


@dataclasses.dataclass(frozen=True)
class Config:
  """tele_lens settings: `examples` per task (half train the probes), probed `layers` (HF convention);
  `task_file`, a JSONL of {"question", "answer", "task", "cot"} rows (the paper's task files converted, say),
  replaces the generated `tasks`; every answer must be one token."""
  model: str = "smollm2-135m-instruct"
  dtype: Literal["float32", "bfloat16"] = "float32"  # the LM's weights as loaded
  tasks: tuple[str, ...] = ("parity", "cycle", "subsum", "syllogism", "ransom_note")
  examples: int = 32
  cot: Cot = "model"
  sampled_cots: int = 1
  temperature: float = 0.7
  max_cot_tokens: int = 96
  generate_batch: int = 16
  task_file: str = ""
  layers: tuple[int, ...] = (7, 15, 22, 30)  # SmolLM2's 30 layers a quarter apart
  uncertainty_layer: int = 22  # 3/4 depth, as the paper's layer 21 of 28
  horizon: int = 8
  rank: int = 256
  alpha: float = 256.0
  learning_rate: float = 1e-3
  probe_activation: Activation = "gelu"  # the paper's adapter activation
  probe_schedule: Schedule = "linear"  # the paper's linear decay (to 0 over the probe's steps)
  epochs: int = 8
  batch_size: int = 256
  pivot_k: int = 5
  bypass_threshold: float = 0.1  # on entropy / log(entropy_norm)
  bypass_window: int = 5  # the paper's first 5 CoT tokens
  entropy_norm: float = 20.0  # the paper's normalization, entropy / log 20
  full_vocab_positions: int = 4096
  seed: int = 0

  def __post_init__(self):
    known = sorted(reasoning.TASKS) + sorted(reasoning.GYM_TASKS)
    if not self.tasks or any(t not in known for t in self.tasks):
      raise ValueError(f"tasks must be names from {known}, found {self.tasks}")
    choices.check(self)
    if self.cot == "template" and not self.task_file and any(t in reasoning.GYM_TASKS for t in self.tasks):
      raise ValueError(f"cot='template' needs tasks with a templated CoT {sorted(reasoning.TASKS)}, "
                       f"found {self.tasks}")
    if self.sampled_cots < 0 or self.temperature <= 0 or self.max_cot_tokens < 1 or self.generate_batch < 1:
      raise ValueError(f"expected sampled_cots >= 0, temperature > 0, max_cot_tokens >= 1, generate_batch >= 1; "
                       f"found {self.sampled_cots}, {self.temperature}, {self.max_cot_tokens}, {self.generate_batch}")
    if self.entropy_norm <= 1 or self.bypass_window < 1:
      raise ValueError(f"expected entropy_norm > 1 and bypass_window >= 1, found {self.entropy_norm}, "
                       f"{self.bypass_window}")
    if self.examples < 4:
      raise ValueError(f"examples must be >= 4 per task (half train the probes), found {self.examples}")
    if not self.layers or list(self.layers) != sorted(set(self.layers)) or self.layers[0] < 0:
      raise ValueError(f"layers must be increasing distinct hidden-state indices >= 0, found {self.layers}")
    if self.uncertainty_layer not in self.layers:
      raise ValueError(f"uncertainty_layer must be one of layers {self.layers}, found {self.uncertainty_layer}")


PRESETS = {
    "smoke": Config(tasks=("parity", "syllogism"), examples=4, layers=(4, 15), uncertainty_layer=15, rank=32,
                    alpha=32.0, learning_rate=3e-3, epochs=2, max_cot_tokens=24),
    "cpu": Config(),
    # the paper's model (Qwen2.5-7B-Instruct trained with GRPO, 28 layers) probed at a quarter of its depth apart,
    # uncertainty and bypass at layer 21 as the paper reads them
    "full": Config(model=registry.Hub("lxucs/tele-lens-llm"), dtype="bfloat16", examples=400, epochs=20, sampled_cots=3,
                   max_cot_tokens=256, layers=(7, 14, 21, 28), uncertainty_layer=21),
}


registry.register(registry.Experiment(
    name="tele_lens", config_cls=Config, presets=PRESETS, run=registry.run_of("experiments.tele_lens.run"),
    description="Tele-Lens probes of SmolLM2 on its own CoTs (Parity/Cycle/Subsum, reasoning-gym): horizon, final "
                "answer, pivot AUROC, bypass",
    results=("horizon.top5.layer<l>.d<d>", "horizon.top5.mean.d<d>", "final_answer_acc.layer<l>", "auroc.pivot",
             "auroc.topk_highest", "auroc.self_certainty", "auroc.perplexity", "bypass.rate", "bypass.accuracy_change",
             "lm_answer_acc", "cot.mean_tokens", "cot.stated_rate", "cot.stated_acc", "positions", "vocab_subset",
             # the token probe through the whole LM head, where full_vocab_positions > 0
             "full_vocab.layer?", "full_vocab.positions?", "full_vocab.top5.d<d>?", "full_vocab.subset_top5.d<d>?"),
    paper="tele_lens", claims=(
        Claim("myopic", "probes predict the next token far better than the token 8 ahead (myopic horizon)",
              "top-5 accuracy falls steeply with the distance ahead",
              "{horizon.top5.mean.d1} >= 2 * {horizon.top5.mean.d8}"),
        Claim("pivot", "pivot uncertainty predicts CoT correctness better than self-certainty",
              "AUROC 0.69 vs 0.60", "{auroc.pivot} > {auroc.self_certainty}", measurable="{lm_answer_acc} > 0.5",
              why="the LM answers at chance (0.5 on these two-answer tasks), so whether it is right is noise that "
                  "no score predicts (every AUROC sits at 0.5)"),
    )))
