"""ConPress, Learning from Contextual Pressure (see experiments/conpress/README.md; no public code): self-compression
of a chat LM's reasoning when several questions share one prompt, and SFT on the compressed traces.

Phenomenon: N = 1, 2, 4, 8 independent questions are packed into one prompt of a fixed format (`pack_prompt`):

  Solve the following 4 problems. For each problem k, write "Problem k:", explain the steps, then write
  "Answer k:" followed by the final answer.

  Problem 1: <question>
  ...

The same held-out questions are asked at every N (consecutive groups of N; with `prompts_per_n` only the first
that many prompts of each N), greedily, with a budget of
`max_new_tokens * N` new tokens. `tokens_per_question.n<N>` is the mean completion-mask sum of `sample` (the
stop token included) divided by N; `accuracy.n<N>` the share of questions whose parsed answer is right.
`position_tokens.<i>` / `position_accuracy.<i>` are the tokens of the parsed trace of the i-th question and its
accuracy in the prompts of the largest N (the position bias); `parsed.n<N>` is the share of questions with an
answer parsed.

Parsing (`parse_packed`) never guesses: sections start at line-leading headers ("Problem k", "Question k",
"Q k", markdown decoration allowed; bare "k." / "k)" only when no keyword header occurs and N > 1, so numbered
steps inside a section are not headers); a number with two headers is unanswered; a section that names another
question's label ("Answer j:", "Problem j:") or begins by restating another question's numbers is dropped; a
section ends at the next header, after the first paragraph that states an answer, or before a paragraph
restating another question (a trailing summary is not the question's). A question's answer is its unique
"Answer k" label anywhere, else the single value its section states ("answer: x", "the answer is x",
<answer>x</answer>, \\boxed{x} with nested braces), else the number after the section's last "="; conflicting values
leave it unanswered. With N = 1 a text without headers is question 1's section. A completion with a
`<think>...</think>` block is parsed after the block; each question's reasoning is the whole block (N = 1) or the
block's header section of its number, and a question whose reasoning cannot be attributed so keeps its answer but
has no trace. JSONL answers are right when equal as strings or, by math-verify, as mathematics (`\\dfrac12` =
`\\frac{1}{2}`).

Method: training questions (disjoint from the held-out ones: `run.tasks` skips held-out questions) are asked alone
and packed `train_n` at a time (`packings` random groupings); a packed trace is kept when it is correct and concise,
i.e. its tokens are fewer than `max_ratio` times that question's single-question completion tokens (`build_sft`;
the shortest kept trace per question). SFT rows: the single-question prompt -> "Problem 1: " + the trace (answer
labels renumbered to 1), after its reasoning in a `<think>` block when it has one, then a LoRA (q, k, v, o)
fine-tune with the completion-only loss (`jaxlab.losses.sft_loss_fn`, `jaxlab.train` loop), and single-question
tokens and accuracy on the held-out questions before (`sft.*_before` = the N = 1 figures) and after.
Baselines: multi-question prompts at test time (`baseline.tokens` / `baseline.accuracy`, the held-out figures at
N = `train_n`, `baseline.n`), and rejection-sampling fine-tuning (`rft.*`, the paper's shortest-trace baseline:
the same fine-tune on each training question's shortest correct single-question answer, `build_rft`, then the same
held-out measurement). With no kept example a fine-tune is skipped and its `*_after` figures are NaN.

cpu preset: SmolLM2-135M-Instruct on reasoning-gym chain_sum (sums and differences of 2-3 one-digit terms, asked
as "State the final answer to the following arithmetic problem: 4 - 1 =", which the model answers directly more
often than basic_arithmetic's "Calculate 4 - 1."), short budgets. smoke: the same model on one prompt per N and
two training questions with 4 new tokens per question, all generation in one compiled shape (at that budget no
trace is usually kept, so the fine-tune is exercised by the tests on a tiny model). full: Qwen3-4B
(Qwen/Qwen3-4B, fetched with `hf download`; any other GGUF / transformers chat model with --set model=PATH) in bf16,
FSDP-sharded, and MATH500 / AIME / GSM8K JSONL files by path, ~8k training questions (the paper: -59%
tokens on MATH500, -33% on AIME25).

  python -m experiments run conpress --preset smoke
  python -m experiments run conpress --preset cpu
  hf download Qwen/Qwen3-4B --local-dir models/Qwen/Qwen3-4B
  python -m experiments run conpress --preset full \\
      --set task=jsonl:/data/math500.jsonl --set train_task=jsonl:/data/gsm8k_train.jsonl

Paper: arXiv 2602.01472. Code read beside it: none public. Method, claims, presets and departures from the paper:
experiments/conpress/README.md.
"""
from __future__ import annotations

import dataclasses

from experiments import registry
from experiments.conpress.parsing import Parsed, parse_packed, sft_completion  # noqa: F401  (public here too)
from experiments.runner.claims import Claim
from jaxlab import sharding as shd
from jaxlab.nn import layers


NS = (1, 2, 4, 8)
HEAD = ('Solve the following {what}. For each problem k, write "Problem k:", explain the steps, then write '
        '"Answer k:" followed by the final answer.')


@dataclasses.dataclass(frozen=True)
class Config:
  """conpress settings. task / train_task: a reasoning-gym dataset name (`terms`, `digits` as its min/max
  ranges for chain_sum / basic_arithmetic) or "jsonl:PATH" (`read_jsonl`: GSM8K, MATH500, AIME rows); train_task
  "" = the task with another seed."""
  model: str = "smollm2-135m-instruct"
  task: str = "chain_sum"
  train_task: str = ""
  terms: tuple[int, int] = (2, 3)
  digits: tuple[int, int] = (1, 1)
  test_questions: int = 64  # held-out, asked at every N; a multiple of max(ns)
  prompts_per_n: int = 0  # 0: every held-out question at every N; k: the first k prompts of each N
  train_questions: int = 48
  ns: tuple[int, ...] = NS
  train_n: int = 4
  packings: int = 1
  max_new_tokens: int = 32  # per question: a prompt of N questions gets N times this
  max_ratio: float = 1.0
  gen_batch: int = 16
  one_shape: bool = False  # one compiled shape for every generation (rows cut at their budgets)
  lora_rank: int = 8
  lora_alpha: float = 16.0
  steps: int = 16
  batch_size: int = 4
  lr: float = 1e-3
  dtype: layers.DType = "float32"  # the model's param and compute dtype
  remat: bool = False  # layers rematerialized in the fine-tune's backward pass
  mesh: str | None = None  # params sharded over it by `strategy` (generation and the fine-tune)
  strategy: shd.Strategy = "dp"
  seed: int = 0

  def __post_init__(self):
    for name in ("terms", "digits", "ns"):
      object.__setattr__(self, name, tuple(getattr(self, name)))
    if self.task.startswith("jsonl:") and not self.train_task:
      raise ValueError("a jsonl task needs its own train_task file (--set train_task=jsonl:PATH), found ''")
    if tuple(sorted(set(self.ns))) != self.ns or not self.ns or self.ns[0] < 1:
      raise ValueError(f"ns must be increasing positive question counts, found {self.ns}")
    if self.prompts_per_n < 0:
      raise ValueError(f"prompts_per_n must be >= 0 (0: all), found {self.prompts_per_n}")
    for name in ("test_questions", "train_questions", "train_n", "packings", "max_new_tokens", "gen_batch",
                 "lora_rank", "steps", "batch_size"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, found {getattr(self, name)}")
    if self.test_questions % self.ns[-1]:
      raise ValueError(f"test_questions must be a multiple of max(ns) = {self.ns[-1]}, found {self.test_questions}")
    if self.train_n not in self.ns:
      raise ValueError(f"train_n must be one of ns {self.ns} (it is the test-time baseline), found {self.train_n}")
    if self.train_questions < self.train_n:
      raise ValueError(f"train_questions must be >= train_n ({self.train_n}), found {self.train_questions}")
    if self.max_ratio <= 0:
      raise ValueError(f"max_ratio must be > 0, found {self.max_ratio}")
    if len(self.terms) != 2 or len(self.digits) != 2:
      raise ValueError(f"terms and digits are (min, max) pairs, found {self.terms} and {self.digits}")


MATH500 = ("--set task=jsonl:FILE: MATH500 (hf download HuggingFaceH4/MATH-500 --repo-type dataset --local-dir "
           "data/MATH-500; its test.jsonl), or AIME / GSM8K test rows")
TRAIN_QUESTIONS = ("--set train_task=jsonl:FILE: training questions with answers, e.g. GSM8K train (hf download "
                   "openai/gsm8k --repo-type dataset --local-dir data/gsm8k; its main/train-*.parquet rows as JSONL)")

PRESETS = {
    # one prompt per N (the first N held-out questions), 2 training questions; one compiled generation shape
    "smoke": Config(test_questions=8, prompts_per_n=1, train_questions=2, train_n=2, max_new_tokens=4,
                    gen_batch=8, one_shape=True, steps=1, batch_size=2, terms=(2, 2), digits=(1, 1)),
    # 120 held-out prompts (64 questions at N = 1, 2, 4, 8), 48 training questions alone and in 12 packs of 4,
    # 16 LoRA steps of 4 rows, 64 single-question prompts after: ~11 minutes on 2 idle cores
    "cpu": Config(),
    "full": Config(model=registry.Hub("Qwen/Qwen3-4B"), task=registry.Required(MATH500),
                   train_task=registry.Required(TRAIN_QUESTIONS), dtype="bfloat16", remat=True, mesh="fsdp:-1",
                   strategy="fsdp",
                   test_questions=496, train_questions=8000, packings=2, max_new_tokens=512, gen_batch=64,
                   lora_rank=16, lora_alpha=32.0, steps=2000, batch_size=16, lr=2e-4),
}


# ------------------------------------------------------------------------------------------------- prompts


# ---------------------------------------------------------------------------------------------- generation


# --------------------------------------------------------------------------------------------- SFT data


# ------------------------------------------------------------------------------------------------------ run


registry.register(registry.Experiment(
    name="conpress", config_cls=Config, presets=PRESETS, run=registry.run_of("experiments.conpress.run"),
    description="multi-question prompts: per-question tokens/accuracy by N and position; SFT on compressed traces",
    results=("tokens_per_question.n<n>", "accuracy.n<n>", "parsed.n<n>", "position_tokens.<i>", "position_accuracy.<i>",
             "sft.examples", "sft.candidates", "sft.correct_candidates", "sft.train_single_tokens", "sft.target_tokens",
             "sft.tokens_before", "sft.accuracy_before", "baseline.n", "baseline.tokens", "baseline.accuracy",
             "sft.loss_first?", "sft.loss_last?", "sft.tokens_after", "sft.accuracy_after", "rft.examples",
             "rft.target_tokens", "rft.loss_first?", "rft.loss_last?", "rft.tokens_after", "rft.accuracy_after",
             "seconds", "seconds.<phase>"),
    paper="conpress", claims=(
        Claim("sft", "SFT on correct concise multi-question traces cuts single-question tokens by >= 30% with "
              "accuracy within 2 points", "-59% tokens on MATH500 at matched accuracy",
              "{sft.tokens_after} <= 0.7 * {sft.tokens_before} and "
              "{sft.accuracy_before} - {sft.accuracy_after} <= 0.02",
              diff=("sft.accuracy_after", "accuracy.n1"), effect=-0.02,
              given="{sft.tokens_after} <= 0.7 * {sft.tokens_before}"),
        Claim("self_compression", "the model writes fewer tokens per question with 4 questions per prompt than "
              "with one (measured either way)", "per-question reasoning shrinks as N grows",
              "{tokens_per_question.n4} < {tokens_per_question.n1}"),
        Claim("vs_baseline", "the fine-tuned model's single-question accuracy is at least that of multi-question "
              "prompting at test time", "compression SFT keeps accuracy where test-time packing loses it",
              "{sft.accuracy_after} >= {baseline.accuracy}", measurable="{sft.accuracy_before} < {baseline.accuracy}",
              why="the model before SFT already answers single questions as well as packed ones "
                  "(sft.accuracy_before >= baseline.accuracy), so the comparison holds without any fine-tuning"),
    )))
