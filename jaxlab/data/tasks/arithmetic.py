"""Tasks with checkable answers: synthetic arithmetic word problems and GSM8K / MetaMathQA / commonsense JSONL.

The synthetic task mimics math fine-tuning (MetaMathQA -> GSM8K, as in arXiv:2602.01267) at a size a CPU can
train. A problem is a start value and `steps` operations, told in words; its solution is the chain of equations
and ends in the number:

  "Q: Ann has 7 pens. Gets 5 more. Gives away 3. How many now?\nA: " -> "7+5=12, 12-3=9"

Pretraining text holds the bare equation chains of training problems ("7+5=12\n12-3=9\n..."), so a base model
learns the arithmetic facts there and fine-tuning teaches reading problems into chains. Problems are assigned to
"train" or "test" by a stable hash of their operations and operands (`corpus.split_by_hash`): a test problem
appears in no pretraining or fine-tuning text (its single facts may). Each example carries an integer label for
non-IID federated splits: the first operation, the operation pattern, or the answer's digit count.

Answers are stored `normalize`d; reading an answer out of a completion and scoring it is
`jaxlab.evals.answers`.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import re
from typing import Literal, NamedTuple, Sequence

import numpy as np

from jaxlab import choices
from jaxlab.data import corpus as corpus_lib

Op = Literal["add", "sub", "mul"]
OPS = {"add": "+", "sub": "-", "mul": "*"}
choices.same(OPS, Op)
PHRASES = {"add": "Gets {b} more.", "sub": "Gives away {b}.", "mul": "Multiplies them by {b}."}
NAMES = ("Ann", "Ben", "Cat", "Dan", "Eve", "Max", "Sam", "Zoe")
ITEMS = ("apples", "pens", "cards", "coins", "books", "shells")
Label = Literal["op", "pattern", "digits"]
LABELS = choices.values(Label)
Format = Literal["gsm8k", "metamathqa", "commonsense"]  # a JSONL file's layout (`load_jsonl`)
FORMATS = choices.values(Format)


class Example(NamedTuple):
  """prompt: model input; answer: the checked final answer; label: class for splits; target: the trained
  continuation (the solution; its final answer is `answer`)."""
  prompt: str
  answer: str
  label: int
  target: str


class Problem(NamedTuple):
  start: int
  ops: tuple[str, ...]
  operands: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Arithmetic:
  """The synthetic arithmetic task.

  Attributes:
    ops: operations among "add", "sub", "mul" (sub never goes below zero).
    steps: operations per problem.
    digits: the start value and add/sub operands are drawn from [0, 10**digits).
    mul_max: "mul" operands are drawn from [2, mul_max].
    test_fraction: fraction of problems held out for testing.
    label_by: "op" (first operation), "pattern" (the operation sequence) or "digits" (answer digits - 1).
    salt: changes the train/test assignment.
  """
  ops: tuple[Op, ...] = ("add", "sub")
  steps: int = 2
  digits: int = 1
  mul_max: int = 3
  test_fraction: float = 0.1
  label_by: Label = "op"
  salt: str = "arith"

  def __post_init__(self):
    if not isinstance(self.ops, tuple):
      object.__setattr__(self, "ops", (self.ops,) if isinstance(self.ops, str) else tuple(self.ops))
    bad = [o for o in self.ops if o not in OPS]
    if not self.ops or bad or len(set(self.ops)) != len(self.ops):
      raise ValueError(f"Arithmetic.ops must be distinct names from {list(OPS)}, found {self.ops}")
    if not 1 <= self.steps <= 4 or not 1 <= self.digits <= 4 or self.mul_max < 2:
      raise ValueError(f"Arithmetic: expected 1 <= steps <= 4, 1 <= digits <= 4, mul_max >= 2; found "
                       f"steps={self.steps}, digits={self.digits}, mul_max={self.mul_max}")
    if not 0.0 < self.test_fraction < 1.0:
      raise ValueError(f"Arithmetic.test_fraction must be in (0, 1), found {self.test_fraction}")
    choices.check(self, prefix="Arithmetic.")

  @property
  def patterns(self) -> list[tuple[str, ...]]:
    return list(itertools.product(self.ops, repeat=self.steps))


def compute(op: str, a: int, b: int) -> int:
  return {"add": a + b, "sub": a - b, "mul": a * b}[op]


def chain(p: Problem) -> list[tuple[int, str, int, int]]:
  """[(a, op, b, result)] of every step."""
  out, cur = [], p.start
  for op, b in zip(p.ops, p.operands):
    nxt = compute(op, cur, b)
    out.append((cur, op, b, nxt))
    cur = nxt
  return out


def value(p: Problem) -> int:
  return chain(p)[-1][3]


def solution(p: Problem, sep: str = ", ") -> str:
  return sep.join(f"{a}{OPS[op]}{b}={c}" for a, op, b, c in chain(p))


def split_of(spec: Arithmetic, p: Problem) -> str:
  """"test" for held-out problems, else "train" (stable across runs and processes)."""
  key = "|".join([*p.ops, str(p.start), *map(str, p.operands)])
  return "test" if corpus_lib.split_by_hash(key, spec.test_fraction, spec.salt) == "val" else "train"


def _random_problem(spec: Arithmetic, rng: np.random.Generator) -> Problem:
  hi = 10 ** spec.digits
  cur = start = int(rng.integers(hi))
  ops, operands = [], []
  for _ in range(spec.steps):
    op = spec.ops[rng.integers(len(spec.ops))]
    b = {"add": lambda: rng.integers(hi), "sub": lambda cur=cur: rng.integers(min(cur, hi - 1) + 1),
         "mul": lambda: rng.integers(2, spec.mul_max + 1)}[op]()
    cur = compute(op, cur, int(b))
    ops.append(op)
    operands.append(int(b))
  return Problem(start, tuple(ops), tuple(operands))


def problems(spec: Arithmetic, n: int, split: str = "train", seed: int = 0) -> list[Problem]:
  """n problems of `split`, distinct while enough exist (then repeats are allowed)."""
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', found {split!r}")
  rng = np.random.default_rng(seed)
  out, seen, repeats = [], set(), 0
  while len(out) < n:
    p = _random_problem(spec, rng)
    if split_of(spec, p) != split:
      continue
    if p in seen and repeats < 20 * n:
      repeats += 1
      continue
    seen.add(p)
    out.append(p)
  return out


def pretrain_texts(spec: Arithmetic, n_docs: int, problems_per_doc: int = 4, statements_per_doc: int = 0,
                   seed: int = 0) -> list[str]:
  """Documents of bare equation chains (one equation per line) of training problems, followed by
  `statements_per_doc` problem statements of other training problems without their solution (the language of
  the problems without the task of solving them), one per line.
  """
  ps = problems(spec, n_docs * (problems_per_doc + statements_per_doc), "train", seed)
  rng = np.random.default_rng(seed + 104729)
  docs = []
  for i in range(n_docs):
    mine = ps[i * (problems_per_doc + statements_per_doc):(i + 1) * (problems_per_doc + statements_per_doc)]
    lines = [solution(p, "\n") for p in mine[:problems_per_doc]]
    lines += [text_of(p, NAMES[rng.integers(len(NAMES))], ITEMS[rng.integers(len(ITEMS))])
              for p in mine[problems_per_doc:]]
    docs.append("\n".join(lines))
  return docs


def label_of(spec: Arithmetic, p: Problem) -> int:
  if spec.label_by == "op":
    return spec.ops.index(p.ops[0])
  if spec.label_by == "pattern":
    return spec.patterns.index(p.ops)
  return len(str(value(p))) - 1


def text_of(p: Problem, name: str, item: str) -> str:
  parts = [f"{name} has {p.start} {item}."] + [PHRASES[op].format(b=b) for op, b in zip(p.ops, p.operands)]
  return " ".join(parts) + " How many now?"


def word_problems(spec: Arithmetic, n: int, split: str = "train", seed: int = 0) -> list[Example]:
  """n word problems of `split`; target = the equation chain, answer = its final value.

  Args:
    spec: the task.
    n: number of examples.
    split: "train" or "test" (held-out problems).
    seed: NumPy seed for problems, names and items.
  """
  rng = np.random.default_rng(seed + 7919)
  out = []
  for p in problems(spec, n, split, seed):
    text = text_of(p, NAMES[rng.integers(len(NAMES))], ITEMS[rng.integers(len(ITEMS))])
    out.append(Example(f"Q: {text}\nA: ", str(value(p)), label_of(spec, p), solution(p)))
  return out


def equation_problems(spec: Arithmetic, n: int, split: str = "test", seed: int = 0) -> list[Example]:
  """The bare form of `word_problems`: the chain (as in pretraining text) up to its last "=", answer = value.
  Measures what a base model learned in pretraining, without the word format."""
  out = []
  for p in problems(spec, n, split, seed):
    sol = solution(p, "\n")
    cut = sol.rindex("=") + 1
    out.append(Example(sol[:cut], str(value(p)), label_of(spec, p), sol[cut:]))
  return out


class StepLabelled(NamedTuple):
  """A solution in steps with process labels: `labels[i]` is 1 while every step up to i is right, 0 from the
  first wrong step on (later steps build on the wrong value); `answer` is the value the steps end in."""
  prompt: str
  steps: tuple[str, ...]
  labels: tuple[int, ...]
  answer: str


def step_labelled(spec: Arithmetic, n: int, split: str = "train", seed: int = 0,
                  error_rate: float = 0.5) -> list[StepLabelled]:
  """n word problems with step solutions, an error injected into a `error_rate` share of them: one step's
  result is off by 1 to 3 either way and the steps after it compute correctly from the wrong value (the PRM
  training data of arXiv 2501.07301's step labels, made from `word_problems`' problems)."""
  if not 0.0 <= error_rate <= 1.0:
    raise ValueError(f"error_rate must be in [0, 1], found {error_rate}")
  rng = np.random.default_rng(seed + 15485863)
  out = []
  for p in problems(spec, n, split, seed):
    text = text_of(p, NAMES[rng.integers(len(NAMES))], ITEMS[rng.integers(len(ITEMS))])
    wrong_at = int(rng.integers(spec.steps)) if rng.random() < error_rate else spec.steps
    delta = int(rng.choice([-3, -2, -1, 1, 2, 3]))
    steps, labels, cur = [], [], p.start
    for i, (op, b) in enumerate(zip(p.ops, p.operands)):
      c = compute(op, cur, b) + (delta if i == wrong_at else 0)
      steps.append(f"{cur}{OPS[op]}{b}={c}")
      labels.append(int(i < wrong_at))
      cur = c
    out.append(StepLabelled(f"Q: {text}\nA: ", tuple(steps), tuple(labels), str(cur)))
  return out


# ------------------------------------------------------------------------------------------ checking

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def normalize(ans: str) -> str:
  """Strips spaces, a trailing period, '$' and thousands separators; 12.0 -> 12; lower-cases words."""
  s = ans.strip().rstrip(".").strip().replace("$", "")
  if NUMBER.fullmatch(s):
    s = s.replace(",", "")
    if "." in s:
      s = s.rstrip("0").rstrip(".")
    return str(int(s)) if re.fullmatch(r"-?\d+", s) else s
  return s.lower()


# ---------------------------------------------------------------------------------------- encoding

def sft_arrays(examples: Sequence[Example], tokenizer, seq_len: int) -> dict:
  """{inputs, targets, loss_mask} [n, seq_len] int32: bos + prompt + target + eos, next-token targets, the loss
  on target and eos tokens only. Raises if an example does not fit."""
  n = len(examples)
  pad = tokenizer.batch_pad_id
  inputs = np.full((n, seq_len), pad, np.int32)
  targets = np.full((n, seq_len), pad, np.int32)
  mask = np.zeros((n, seq_len), np.int32)
  for i, e in enumerate(examples):
    p = tokenizer.encode(e.prompt, add_bos=True)
    t = tokenizer.encode(e.target, add_eos=True)
    ids = p + t
    if len(ids) - 1 > seq_len:
      raise ValueError(f"example {i} needs {len(ids) - 1} positions, seq_len is {seq_len}: {e.prompt!r}")
    inputs[i, :len(ids) - 1] = ids[:-1]
    targets[i, :len(ids) - 1] = ids[1:]
    mask[i, len(p) - 1:len(ids) - 1] = 1
  return {"inputs": inputs, "targets": targets, "loss_mask": mask}


def prompt_tokens(examples: Sequence[Example], tokenizer) -> list[list[int]]:
  return [tokenizer.encode(e.prompt, add_bos=True) for e in examples]


# ---------------------------------------------------------------------------------------- JSONL data

ALPACA = ("Below is an instruction that describes a task. Write a response that appropriately completes the "
           "request.\n\n### Instruction:\n{q}\n\n### Response:\n")
_MARKERS = {"gsm8k": "####", "metamathqa": "The answer is:"}
_FIELDS = {"gsm8k": ("question", "answer"), "metamathqa": ("query", "response"),
           "commonsense": ("instruction", "output")}


def load_jsonl(path: str, fmt: str, limit: int | None = None, template: str = ALPACA,
               offset: int = 0) -> list[Example]:
  """Examples from a JSONL file (read through `jaxlab.data.corpus.jsonl_corpus`).

  Args:
    path: a .jsonl file, directory or glob.
    fmt: "gsm8k" (question, answer ending in "#### N"), "metamathqa" (query, response ending in
      "The answer is: N") or "commonsense" (LLM-Adapters commonsense_170k: instruction, output, answer).
    limit: keep the first `limit` records (from `offset` on).
    template: prompt template with a {q} slot (Alpaca, as both papers' fine-tuning code uses).
    offset: skip the first `offset` records (a later window of the file, e.g. held-out records after training ones).
  """
  if fmt not in FORMATS:
    raise ValueError(f"load_jsonl: fmt must be one of {FORMATS}, found {fmt!r}")
  if not (os.path.exists(path) or any(c in path for c in "*?[")):
    raise FileNotFoundError(f"load_jsonl: expected a {fmt} JSONL file, found no file at {path!r}")
  q_field, a_field = _FIELDS[fmt]
  qs = corpus_lib.jsonl_corpus(path, field=q_field)
  ans = corpus_lib.jsonl_corpus(path, field=a_field)
  if offset < 0:
    raise ValueError(f"load_jsonl: offset must be >= 0, found {offset}")
  stop = len(qs) if limit is None else min(offset + limit, len(qs))
  answers = corpus_lib.jsonl_corpus(path, field="answer") if fmt == "commonsense" else None
  out = []
  for i in range(offset, stop):
    q, target = qs[i], ans[i]
    answer = str(answers[i]).strip() if answers is not None else _gold(target, _MARKERS[fmt], path, i)
    out.append(Example(template.format(q=q), answer, 0, target))
  return out


def _gold(target: str, marker: str, path: str, i: int) -> str:
  """The normalized number after the last `marker` of a reference solution (else the text after it)."""
  if marker not in target:
    raise ValueError(f"load_jsonl: record {i} of {path}: expected a solution ending in {marker!r} N, found "
                     f"{target[-60:]!r}")
  tail = target.rsplit(marker, 1)[1].strip().split("\n")[0]
  m = NUMBER.search(tail)
  return normalize(m.group(0) if m else tail)
