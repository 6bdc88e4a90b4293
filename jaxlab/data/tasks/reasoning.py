"""Explicit compositional reasoning tasks with exact answers and a templated chain of thought (CoT): Parity,
Cycle (cycle detection in an undirected graph) and Subsum (subset sum), as probed by Tele-Lens (arXiv
2602.02103, "How Far Ahead Do LLMs Plan?").

Each task draws a problem from a `numpy.random.Generator`, states it as a question, solves it step by step
(one CoT step per line) and ends in a one-word answer:

  Parity  "Is the number of 1s in 1 0 1 even or odd?"   "Bit 1 is 1: count 1, odd." ...         -> "even"
  Cycle   "... nodes 0 to 3 and edges 0-1, 1-2, 0-2."     "Edge 0-1: join {0} and {1} into {0, 1}." ... -> "yes"
  Subsum  "Can a subset of 3, 5, 2 sum to 7?"             "Add 3: sums {0, 3}." ... "7 is reachable." -> "yes"

Cycle runs union-find over the edges in the order given and stops at the first edge whose ends are already
connected; Subsum tracks the reachable sums up to the target and stops once the target is reached.
`generate(task, n, seed)` is deterministic in the seed and, with `balanced`, cycles through the task's answers.
`from_gym(name, n, seed)` draws reasoning-gym problems whose answer is one word of a fixed set (GYM_TASKS), with
the gym's answer and no templated CoT (`steps` is empty: a model writes its own).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np


class Example(NamedTuple):
  """task: the task's name; prompt: the question; steps: the CoT lines; answer: the exact final answer;
  problem: the raw problem (bits, (n_nodes, edges), or (numbers, target))."""
  task: str
  prompt: str
  steps: tuple[str, ...]
  answer: str
  problem: tuple

  @property
  def cot(self) -> str:
    return "\n".join(self.steps)

  @property
  def completion(self) -> str:
    """The CoT followed by the answer line: what a model is trained or expected to write."""
    return f"{self.cot}\nAnswer: {self.answer}"


def _fail(name, msg):
  raise ValueError(f"{name}: {msg}")


def _fmt_set(s) -> str:
  return "{" + ", ".join(str(v) for v in sorted(s)) + "}"


@dataclasses.dataclass(frozen=True)
class Parity:
  """Parity of the number of 1s in a bit string of min_bits..max_bits bits."""
  min_bits: int = 4
  max_bits: int = 10
  name = "parity"
  answers = ("even", "odd")

  def __post_init__(self):
    if not 1 <= self.min_bits <= self.max_bits:
      _fail("Parity", f"expected 1 <= min_bits <= max_bits, found {self.min_bits}, {self.max_bits}")

  def sample(self, rng: np.random.Generator) -> tuple:
    n = int(rng.integers(self.min_bits, self.max_bits + 1))
    return tuple(int(b) for b in rng.integers(0, 2, n))

  def solve(self, bits: tuple) -> Example:
    steps, count = [], 0
    for i, b in enumerate(bits):
      count += b
      steps.append(f"Bit {i + 1} is {b}: count {count}, {self.answers[count % 2]}.")
    prompt = f"Is the number of 1s in {' '.join(map(str, bits))} even or odd?"
    return Example(self.name, prompt, tuple(steps), self.answers[count % 2], bits)


@dataclasses.dataclass(frozen=True)
class Cycle:
  """Does an undirected simple graph of min_nodes..max_nodes nodes and about `edge_ratio` * nodes edges have a
  cycle? Edges are listed in a random order with random end order."""
  min_nodes: int = 4
  max_nodes: int = 7
  edge_ratio: float = 1.0
  name = "cycle"
  answers = ("yes", "no")

  def __post_init__(self):
    if not 3 <= self.min_nodes <= self.max_nodes or self.edge_ratio <= 0:
      _fail("Cycle", f"expected 3 <= min_nodes <= max_nodes and edge_ratio > 0, found {self.min_nodes}, "
            f"{self.max_nodes}, {self.edge_ratio}")

  def sample(self, rng: np.random.Generator) -> tuple:
    n = int(rng.integers(self.min_nodes, self.max_nodes + 1))
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    m = int(np.clip(round(self.edge_ratio * n + rng.integers(-1, 2)), 1, len(pairs)))
    chosen = rng.permutation(len(pairs))[:m]
    edges = tuple((pairs[i] if rng.integers(2) else pairs[i][::-1]) for i in chosen)
    return n, tuple((int(a), int(b)) for a, b in edges)

  def solve(self, problem: tuple) -> Example:
    n, edges = problem
    group = {v: frozenset([v]) for v in range(n)}
    steps, answer = [], "no"
    for a, b in edges:
      if b in group[a]:
        steps.append(f"Edge {a}-{b}: {a} and {b} are already connected, so this edge closes a cycle.")
        answer = "yes"
        break
      merged = group[a] | group[b]
      steps.append(f"Edge {a}-{b}: join {_fmt_set(group[a])} and {_fmt_set(group[b])} into {_fmt_set(merged)}.")
      for v in merged:
        group[v] = merged
    else:
      steps.append("No edge joined two connected nodes, so there is no cycle.")
    listed = ", ".join(f"{a}-{b}" for a, b in edges)
    prompt = f"An undirected graph has nodes 0 to {n - 1} and edges {listed}. Does it contain a cycle?"
    return Example(self.name, prompt, tuple(steps), answer, problem)


@dataclasses.dataclass(frozen=True)
class Subsum:
  """Can a subset of min_numbers..max_numbers numbers in [1, max_value] sum to a target in
  [1, target_fraction * their total]?"""
  min_numbers: int = 3
  max_numbers: int = 5
  max_value: int = 9
  target_fraction: float = 0.7
  name = "subsum"
  answers = ("yes", "no")

  def __post_init__(self):
    if not 1 <= self.min_numbers <= self.max_numbers or self.max_value < 1 or not 0 < self.target_fraction <= 1:
      _fail("Subsum", f"expected 1 <= min_numbers <= max_numbers, max_value >= 1, 0 < target_fraction <= 1; "
            f"found {self.min_numbers}, {self.max_numbers}, {self.max_value}, {self.target_fraction}")

  def sample(self, rng: np.random.Generator) -> tuple:
    k = int(rng.integers(self.min_numbers, self.max_numbers + 1))
    nums = tuple(int(v) for v in rng.integers(1, self.max_value + 1, k))
    target = int(rng.integers(1, max(1, int(self.target_fraction * sum(nums))) + 1))
    return nums, target

  def solve(self, problem: tuple) -> Example:
    nums, target = problem
    sums, steps, answer = {0}, ["Start with sums {0}."], "no"
    for v in nums:
      sums = sums | {s + v for s in sums if s + v <= target}
      steps.append(f"Add {v}: sums {_fmt_set(sums)}.")
      if target in sums:
        answer = "yes"
        break
    steps.append(f"{target} is reachable." if answer == "yes" else f"{target} is not reachable.")
    prompt = f"Can a subset of {', '.join(map(str, nums))} sum to {target}?"
    return Example(self.name, prompt, tuple(steps), answer, problem)


TASKS = {"parity": Parity(), "cycle": Cycle(), "subsum": Subsum()}


def generate(task: str | Parity | Cycle | Subsum, n: int, seed: int = 0, *, balanced: bool = True,
             max_tries: int = 1000) -> list[Example]:
  """n examples of `task` (a name in TASKS or a task instance), deterministic in `seed`.

  Args:
    balanced: example i has answer `task.answers[i % len(answers)]` (problems are redrawn until it does).
    max_tries: draws allowed per example before a ValueError (an answer the task's ranges cannot produce).
  """
  if isinstance(task, str):
    if task not in TASKS:
      raise ValueError(f"unknown reasoning task {task!r}; expected one of {sorted(TASKS)}")
    task = TASKS[task]
  if n < 0:
    raise ValueError(f"n must be >= 0, found {n}")
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    want = task.answers[i % len(task.answers)] if balanced else None
    for _ in range(max_tries):
      ex = task.solve(task.sample(rng))
      if want is None or ex.answer == want:
        break
    else:
      raise ValueError(f"{task.name}: no problem with answer {want!r} in {max_tries} draws; widen the task's ranges")
    out.append(ex)
  return out


# reasoning-gym datasets whose every answer is one of a few words
GYM_TASKS = {"syllogism": ("Yes", "No"), "ransom_note": ("True", "False")}


def from_gym(name: str, n: int, seed: int = 0, *, balanced: bool = True) -> list[Example]:
  """n problems of the reasoning-gym dataset `name` (a key of GYM_TASKS), deterministic in `seed`; with `balanced`
  example i has answer `GYM_TASKS[name][i % 2]` (the gym's stream is read on until each answer has its share).
  `problem` holds the gym's entry, so `dataset.score_answer(answer, entry)` checks an answer."""
  import reasoning_gym  # a core dependency, imported where it is used
  if name not in GYM_TASKS:
    raise ValueError(f"unknown reasoning-gym task {name!r}; expected one of {sorted(GYM_TASKS)}")
  answers = GYM_TASKS[name]
  size = 4 * n + 16 if balanced else n
  data = reasoning_gym.create_dataset(name, size=size, seed=seed)
  pools = {a: [] for a in answers}
  ordered = []
  for i in range(size):
    entry = data[i]
    if entry["answer"] not in pools:
      raise ValueError(f"{name}: answer {entry['answer']!r} is not one of {answers}")
    pools[entry["answer"]].append(entry)
    ordered.append(entry)
  if balanced:
    want = [answers[i % len(answers)] for i in range(n)]
    short = [a for a in answers if want.count(a) > len(pools[a])]
    if short:
      raise ValueError(f"{name}: fewer than {n // len(answers)} problems with answer {short[0]!r} in {size} draws")
    picked = [pools[a].pop(0) for a in want]
  else:
    picked = ordered[:n]
  return [Example(name, e["question"].strip(), (), e["answer"], (e,)) for e in picked]
