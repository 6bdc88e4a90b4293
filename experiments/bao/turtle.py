"""Turtle gym: lateral-thinking ("turtle soup") puzzles, UserRL's TurtleGym (arXiv 2509.19736).

The agent sees a puzzling story (the surface) and must explain what really happened (the bottom). It asks
"[action] QUESTION" and the user answers "Yes", "No" or "Maybe"; "[answer] STORY" is scored against the
puzzle's weighted criteria, each judged 0, 0.5 or 1, score = sum of weight * judgment. As in UserRL a turn's
reward is the gain of the score over the best so far (times `reward_scale`, minus `step_penalty` times the
turn number, clipped to [0, 1]); an answer scoring at least `success_threshold` (0.9) or "[finish]" ends the
episode, at most `max_turns` turns.

The puzzles here are structured: facts (keyword groups and their truth) answer the questions and keyword
groups judge the criteria, so the scripted user is exact and needs no model: a question matching a fact's
every group gets its truth (the most specific match wins), anything else "Maybe"; a criterion is 1 when its
answer matches all its groups, 0.5 when at least half, else 0. A group is a set of alternative words or
phrases ("died|dead|killed"). An LM user (`generate(messages) -> str`) answers the questions and judges the
answers instead, from prompts holding the surface, the bottom and the criteria.
"""
from __future__ import annotations

import re
from typing import NamedTuple, Sequence

import numpy as np

from jaxlab.envs.base import Generate, Turn, verdict


class Fact(NamedTuple):
  groups: tuple[str, ...]
  truth: bool


class Criterion(NamedTuple):
  statement: str
  weight: float
  groups: tuple[str, ...]


class Puzzle(NamedTuple):
  """surface: the story shown; bottom: what happened (and a full answer); facts answer questions; criteria
  score answers, their weights summing to 1."""
  title: str
  surface: str
  bottom: str
  facts: tuple[Fact, ...]
  criteria: tuple[Criterion, ...]


PUZZLES = (
    Puzzle(
        "The lift",
        "A man lives on the tenth floor. Each morning he rides the lift down to the lobby. Coming home, he rides "
        "it to the seventh floor and climbs the stairs the rest of the way, except on rainy days, when he rides "
        "all the way up. Why?",
        "The man is too short to reach the button for the tenth floor; he can reach the seventh. On rainy days "
        "he carries an umbrella and presses the tenth-floor button with it.",
        (Fact(("short|small|height|dwarf",), True), Fact(("tall",), False), Fact(("umbrella",), True),
         Fact(("reach|press|presses|push",), True),
         Fact(("button|buttons",), True), Fact(("exercise|fitness|healthy|health",), False),
         Fact(("afraid|fear|scared|phobia",), False), Fact(("broken|faulty|repair",), False),
         Fact(("rain|rainy|wet",), True), Fact(("neighbour|neighbor|visit|friend",), False)),
        (Criterion("The man is too short to reach the higher buttons.", 0.6,
                   ("short|small|height|dwarf", "reach|press|presses|push", "button|buttons")),
         Criterion("On rainy days he presses the button with his umbrella.", 0.4,
                   ("umbrella", "press|presses|pressed|push|pushes|reach")))),
    Puzzle(
        "The punch",
        "Two friends drink the same punch at a party. One gulps five glasses and leaves early; the other sips a "
        "single glass all evening and dies. Why did only one of them die?",
        "The poison was in the ice cubes. The fast drinker finished before the ice melted; in the slow drinker's "
        "glass the ice melted and poisoned the drink.",
        (Fact(("poison|poisoned|toxic|toxin",), True), Fact(("ice|cubes",), True), Fact(("melt|melted|melting",), True),
         Fact(("allergy|allergic",), False), Fact(("alcohol|drunk",), False), Fact(("antidote|immune",), False),
         Fact(("poison|poisoned", "punch|bowl"), False), Fact(("murder|murdered|killer|intended",), True)),
        (Criterion("The poison was in the ice.", 0.5, ("poison|poisoned|toxic|toxin", "ice|cubes")),
         Criterion("The ice melted only in the slow drinker's glass.", 0.5,
                   ("melt|melted|melting|thawed", "slow|slowly|sipped|longer|time")))),
    Puzzle(
        "The match",
        "A man lies dead in the middle of a desert, face down, holding half a match. There are no footprints "
        "anywhere near him. What happened?",
        "He was flying in a hot-air balloon with others that was losing height. They drew matches to choose who "
        "had to jump to lighten it; he drew the short, broken match and jumped.",
        (Fact(("balloon",), True), Fact(("plane|airplane|aircraft|helicopter",), False),
         Fact(("jump|jumped|fell|fall",), True), Fact(("fire|burn|burned|smoke",), False),
         Fact(("murder|murdered|killed|shot",), False), Fact(("others|people|passengers|together",), True),
         Fact(("draw|drew|lots|chose|choose|picked",), True), Fact(("thirst|water|heat|sun",), False)),
        (Criterion("He was in a balloon.", 0.4, ("balloon",)),
         Criterion("They drew matches to choose who would leave.", 0.3,
                   ("match|matches|lots|straws", "draw|drew|chose|choose|picked|short")),
         Criterion("He had to jump to lighten the load.", 0.3, ("jump|jumped|thrown|pushed|fell",)))),
    Puzzle(
        "The hotel",
        "A man pushes his car up to a hotel and tells the owner that he is bankrupt. Why?",
        "He is playing Monopoly: his token is the car, and it lands on a property with a hotel whose rent he "
        "cannot pay.",
        (Fact(("game|monopoly|board",), True), Fact(("token|piece",), True), Fact(("rent|pay",), True),
         Fact(("broke down|engine|fuel|petrol|gas",), False), Fact(("real|actual",), False),
         Fact(("dice|roll|rolled|landed|lands",), True), Fact(("owner",), True)),
        (Criterion("It is a board game (Monopoly).", 0.5, ("monopoly|board game|game",)),
         Criterion("His car token landed on a hotel whose rent he cannot pay.", 0.5,
                   ("token|piece|landed|lands", "rent|pay|afford")))),
)


def _text(s: str) -> str:
  return " " + " ".join(re.findall(r"[a-z0-9]+", s.lower())) + " "


def matches(group: str, text: str) -> bool:
  """Whether any alternative of `group` ("a|b c") occurs in `text` as whole words."""
  t = _text(text)
  return any(_text(alt) in t for alt in group.split("|"))


def judge(criterion: Criterion, answer: str) -> float:
  hit = sum(matches(g, answer) for g in criterion.groups)
  return 1.0 if hit == len(criterion.groups) else 0.5 if 2 * hit >= len(criterion.groups) else 0.0


def scripted_reply(puzzle: Puzzle, question: str) -> str:
  """The truth of the most specific fact whose groups all occur in `question`; "Maybe" when none does."""
  hits = [f for f in puzzle.facts if all(matches(g, question) for g in f.groups)]
  if not hits:
    return "Maybe"
  return "Yes" if max(hits, key=lambda f: len(f.groups)).truth else "No"


def question_messages(puzzle: Puzzle, question: str) -> list[dict]:
  system = ("You host a lateral-thinking puzzle. The player only knows the story; you also know what really "
            f"happened.\nStory: {puzzle.surface}\nWhat really happened: {puzzle.bottom}\nReply to the player's "
            "question with one word: Yes (true of what happened), No (false or contradicting it) or Maybe "
            "(irrelevant or undecidable). Prefer Yes or No.")
  return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def judge_messages(puzzle: Puzzle, answer: str) -> list[dict]:
  points = "\n".join(f"{i + 1}. {c.statement}" for i, c in enumerate(puzzle.criteria))
  system = ("You grade a player's explanation of a lateral-thinking puzzle against what really happened, point "
            f"by point.\nStory: {puzzle.surface}\nWhat really happened: {puzzle.bottom}\nPoints:\n{points}\n"
            "For each point give 0 (missed), 0.5 (partly) or 1 (covered). Reply as JSON: "
            '{"scores": [one number per point, in order]}.')
  return [{"role": "system", "content": system}, {"role": "user", "content": answer}]


def read_scores(text: str, n: int) -> list[float] | None:
  """The n judgments of an LM judge's reply ({"scores": [...]}, numbers or {"score": x} items), each snapped to
  0, 0.5 or 1; None when the reply does not hold exactly n."""
  m = re.search(r'"scores"\s*:\s*\[(.*?)\]', text, re.DOTALL)
  if m is None:
    return None
  body = m.group(1)
  nums = re.findall(r'"score"\s*:\s*(-?\d+(?:\.\d+)?)', body) if '"score"' in body else \
      re.findall(r"-?\d+(?:\.\d+)?", body)
  if len(nums) != n:
    return None
  return [min((0.0, 0.5, 1.0), key=lambda v: abs(v - float(x))) for x in nums]


class TurtleGym:
  """One episode at a time; `reset(seed)` draws a puzzle uniformly."""
  name = "turtle"

  def __init__(self, puzzles: Sequence[Puzzle] = PUZZLES, max_turns: int = 15, generate: Generate | None = None,
               success_threshold: float = 0.9, reward_scale: float = 1.0, step_penalty: float = 0.0):
    if not puzzles:
      raise ValueError("puzzles must hold at least one Puzzle, found none")
    for p in puzzles:
      total = sum(c.weight for c in p.criteria)
      if abs(total - 1.0) > 1e-6:
        raise ValueError(f"puzzle {p.title!r}: criteria weights must sum to 1, found {total}")
    if max_turns < 1:
      raise ValueError(f"max_turns must be >= 1, found {max_turns}")
    self.puzzles, self.max_turns, self.generate = tuple(puzzles), max_turns, generate
    self.success_threshold, self.reward_scale, self.step_penalty = success_threshold, reward_scale, step_penalty
    self.puzzle, self.step_count, self.best = self.puzzles[0], 0, 0.0

  def reset(self, seed: int) -> str:
    self.puzzle = self.puzzles[int(np.random.default_rng(seed).integers(len(self.puzzles)))]
    self.step_count, self.best = 0, 0.0
    return (f"{self.puzzle.title}: {self.puzzle.surface}\nFind out what really happened. Ask yes/no questions "
            "with '[action] QUESTION' and explain it with '[answer] STORY'.")

  def _reward(self, score: float) -> float:
    gain = max(0.0, score - self.best) * self.reward_scale - self.step_penalty * self.step_count
    self.best = max(self.best, score)
    return min(1.0, max(0.0, gain))

  def score(self, answer: str) -> tuple[list[float] | None, float]:
    """(judgments per criterion, None when the LM judge's reply is unreadable; the weighted score)."""
    if self.generate is None:
      marks = [judge(c, answer) for c in self.puzzle.criteria]
    else:
      marks = read_scores(self.generate(judge_messages(self.puzzle, answer)), len(self.puzzle.criteria))
    if marks is None:
      return None, 0.0
    return marks, float(sum(c.weight * m for c, m in zip(self.puzzle.criteria, marks)))

  def interact(self, choice: str, content: str) -> Turn:
    self.step_count += 1
    if choice == "action":
      if self.generate is None:
        reply = scripted_reply(self.puzzle, content)
      else:
        reply = verdict(self.generate(question_messages(self.puzzle, content)))
      return Turn(reply, self._reward(0.0), False, {"user": True})
    if choice == "answer":
      marks, score = self.score(content)
      if marks is None:
        return Turn("Your answer could not be judged; try again.", self._reward(0.0), False,
                    {"user": False, "score": 0.0, "judged": False})
      covered = [c.statement for c, m in zip(self.puzzle.criteria, marks) if m == 1.0]
      text = ("Your story covers: " + " ".join(covered)) if covered else "Your story covers none of the key points."
      done = score >= self.success_threshold
      return Turn(text, self._reward(score), done, {"user": False, "score": score, "correct": done})
    if choice == "finish":
      return Turn("Game finished.", self._reward(0.0), True, {"user": False})
    return Turn("use '[action] QUESTION' or '[answer] STORY'", self._reward(0.0), False,
                {"user": False, "valid": False})
