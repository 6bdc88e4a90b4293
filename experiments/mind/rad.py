"""RAD (Rationale Augmentation and Discrimination, MIND arXiv:2512.05530) data over generated scenes.

Questions about a `jaxlab.data.tasks.scenes` scene, each needing two or three steps:
  count      "how many red objects are there ?" (a colour or shape word): list the matching objects, count them
  relation   "how many objects are left of the blue square ?" (left / right of, above / below a unique object):
             locate it, list the objects on that side, count them
  compare    "are there more red objects than circle objects ?": count each attribute, compare the counts
Answers come from the scene's objects. A rationale is a tuple of steps (a listing step may hold one sentence per
object), each ending in " ."; the positives are up to `max_positives` distinct (object or step order) x (wording)
variants, and each negative is one positive with one named flaw (`FLAWS`): a wrong number (`wrong_count`), a wrong
colour or shape word in an object phrase (`wrong_attribute`), a wrong row / column word, or for comparisons the
wrong relation between the counts (`wrong_relation`), or one step left out (`skipped_step`). A misleading cue
prefixes the question with "hint the answer is X ." for a wrong X; in training a third of the questions carry a
wrong hint, a third a right one (so a hint carries no information) and a third none (as the plain test questions);
at evaluation with cues it is always wrong.
"""
from __future__ import annotations

import dataclasses
from typing import Literal, NamedTuple, Sequence

import numpy as np

from jaxlab import choices
from jaxlab.data.tasks import scenes as scenes_lib

Kind = Literal["count", "relation", "compare"]
KINDS = choices.values(Kind)
FLAWS = ("wrong_count", "wrong_attribute", "wrong_relation", "skipped_step")
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
RELATIONS = {"left": ("left", "of"), "right": ("right", "of"), "above": ("above",), "below": ("below",)}
COMPARISONS = ("more", "less", "equal")
WORDS = NUMBERS + ("how", "many", "objects", "are", "more", "than", "less", "equal", "to", "left", "right",
                   "above", "below", "of", "it", "so", "that", "makes", "no", "nothing", "first", "then",
                   "yes", "no", "answer", "hint", "given", "verdict", "correct", "wrong", "fix", "?")
_SCENE_CFG = scenes_lib.SceneConfig()  # the default scene settings (frozen, so one shared instance)


def vocabulary(cfg: scenes_lib.SceneConfig = _SCENE_CFG) -> list[str]:
  """The scene vocabulary with the RAD words appended (existing ids unchanged)."""
  base = scenes_lib.vocabulary(cfg)
  return base + [w for w in dict.fromkeys(WORDS) if w not in base]


class Negative(NamedTuple):
  steps: tuple[str, ...]
  flaw: str
  base: int  # index of the positive it was made from


class Question(NamedTuple):
  scene: int
  kind: str
  words: str  # the question text, without any hint
  args: tuple  # count: (attr,); relation: (relation, colour, shape); compare: (attr_a, attr_b)
  answer: str
  positives: tuple  # tuples of steps
  negatives: tuple  # Negative
  hint: str | None = None  # the hint's answer word, None for no hint

  @property
  def prompt(self) -> str:
    return (f"hint the answer is {self.hint} . " if self.hint else "") + self.words


@dataclasses.dataclass(frozen=True)
class RadConfig:
  kinds: tuple[Kind, ...] = KINDS
  max_positives: int = 3

  def __post_init__(self):
    if not self.kinds or set(self.kinds) - set(KINDS):
      raise ValueError(f"RadConfig: kinds must be a non-empty subset of {KINDS}, found {self.kinds}")
    if self.max_positives < 1:
      raise ValueError(f"RadConfig: max_positives must be >= 1, found {self.max_positives}")


def has(o: scenes_lib.Obj, attr: str) -> bool:
  return attr in (o.colour, o.shape)


def on_side(o: scenes_lib.Obj, ref: scenes_lib.Obj, relation: str) -> bool:
  return {"left": o.col < ref.col, "right": o.col > ref.col, "above": o.row < ref.row,
          "below": o.row > ref.row}[relation]


def _phrase(o) -> str:
  return f"{o.colour} {o.shape} at the {scenes_lib.ROWS[o.row]} {scenes_lib.COLS[o.col]}"


def _listing(objs, wording: int, lead: str) -> str:
  if wording == 0:
    return lead + " " + " and ".join(f"the {_phrase(o)}" for o in objs) + " ."
  return " . ".join(f"there is a {_phrase(o)}" for o in objs) + " ."


def count_steps(objs: Sequence, attr: str, wording: int) -> tuple[str, ...]:
  n = NUMBERS[len(objs)]
  if wording == 0:
    return (_listing(objs, 0, f"the {attr} objects are"), f"so there are {n} .")
  return (_listing(objs, 1, ""), f"that makes {n} {attr} objects .")


def relation_steps(ref, objs: Sequence, relation: str, wording: int) -> tuple[str, ...]:
  n, rel = NUMBERS[len(objs)], " ".join(RELATIONS[relation])
  locate = f"the {_phrase(ref)} ." if wording == 0 else f"first there is the {_phrase(ref)} ."
  if not objs:
    side = f"nothing is {rel} it ."
  elif wording == 0:
    side = f"{rel} it are " + " and ".join(f"the {_phrase(o)}" for o in objs) + " ."
  else:
    side = "then " + " . ".join(f"the {_phrase(o)} is {rel} it" for o in objs) + " ."
  return (locate, side, f"so there are {n} ." if wording == 0 else f"that makes {n} .")


def comparison(n_a: int, n_b: int) -> str:
  return "more" if n_a > n_b else "less" if n_a < n_b else "equal"


def compare_steps(a: str, n_a: int, b: str, n_b: int, order: int, wording: int) -> tuple[str, ...]:
  tmpl = "there are {n} {x} objects ." if wording == 0 else "{n} objects are {x} ."
  counts = [tmpl.format(n=NUMBERS[n_a], x=a), tmpl.format(n=NUMBERS[n_b], x=b)]
  return tuple(counts[::-1] if order else counts) + (_conclusion(n_a, n_b),)


def _conclusion(n_a: int, n_b: int, c: str | None = None) -> str:
  c = c or comparison(n_a, n_b)
  return f"{NUMBERS[n_a]} is {c} {'to' if c == 'equal' else 'than'} {NUMBERS[n_b]} ."


def _off_by_one(n: int, rng) -> int:
  return n + 1 if n == 0 or rng.random() < 0.5 else n - 1


def _distinct(rows, k: int, rng) -> tuple:
  rows = list(dict.fromkeys(rows))
  idx = sorted(rng.permutation(len(rows))[:k]) if len(rows) > k else range(len(rows))
  return tuple(rows[i] for i in idx)


def _orders(objs, rng, n: int = 2):
  out = [list(objs)]
  for _ in range(n):
    out.append([objs[i] for i in rng.permutation(len(objs))])
  return out


def _flip_word(step: str, choices: Sequence[str], positions, rng, ok) -> str | None:
  """`step` with the word at one of `positions` replaced by another of `choices` for which `ok(words)` holds."""
  words = step.split()
  for p in rng.permutation(positions):
    alts = [c for c in choices if c != words[p]]
    for c in rng.permutation(alts):
      new = words[:p] + [str(c)] + words[p + 1:]
      if ok(new):
        return " ".join(new)
  return None


def _true_phrase(objs, words, i) -> bool:
  """Whether the object phrase "colour shape at the row col" starting at words[i] names an object of the scene."""
  c, s, r, col = words[i], words[i + 1], words[i + 4], words[i + 5]
  return any((o.colour, o.shape, scenes_lib.ROWS[o.row], scenes_lib.COLS[o.col]) == (c, s, r, col) for o in objs)


def _phrase_starts(words) -> list[int]:
  return [i for i in range(len(words) - 5) if words[i] in scenes_lib.COLOURS and words[i + 2:i + 4] == ["at", "the"]]


def _phrase_flaw(pos, objs, rng, slot: str):
  """A copy of `pos` with one object phrase's colour/shape (slot "attribute") or row/col ("relation") word wrong."""
  cands = [(j, i) for j, st in enumerate(pos) for i in _phrase_starts(st.split())]
  for j, i in (cands[k] for k in rng.permutation(len(cands))):
    offs = (0, 1) if slot == "attribute" else (4, 5)
    for off in rng.permutation(offs):
      choices = ({0: tuple(scenes_lib.COLOURS), 1: scenes_lib.SHAPES, 4: scenes_lib.ROWS, 5: scenes_lib.COLS}
                 [int(off)])
      new = _flip_word(pos[j], choices, [i + int(off)], rng, lambda w, i=i: not _true_phrase(objs, w, i))
      if new is not None:
        return pos[:j] + (new,) + pos[j + 1:]
  return None


def _negatives(q_kind, positives, objs, rng, counts=None) -> tuple | None:
  out = []
  for flaw in FLAWS:
    b = int(rng.integers(len(positives)))
    pos = positives[b]
    if flaw == "wrong_count":
      if q_kind == "compare":
        j = int(rng.integers(2))
        words = pos[j].split()
        p = next(i for i, w in enumerate(words) if w in NUMBERS)
        n = dict(counts)
        n[words[3]] = _off_by_one(NUMBERS.index(words[p]), rng)  # both count wordings put the attribute at 3
        a, a2 = tuple(counts)
        new_step = " ".join(words[:p] + [NUMBERS[n[words[3]]]] + words[p + 1:])
        neg = tuple(new_step if k == j else s for k, s in enumerate(pos[:2])) + (_conclusion(n[a], n[a2]),)
      else:
        words = pos[-1].split()
        p = next(i for i, w in enumerate(words) if w in NUMBERS)
        neg = pos[:-1] + (" ".join(words[:p] + [NUMBERS[_off_by_one(NUMBERS.index(words[p]), rng)]] + words[p + 1:]),)
    elif flaw == "wrong_relation" and q_kind == "compare":
      words = pos[-1].split()
      c = [x for x in COMPARISONS if x != words[2]][int(rng.integers(2))]
      neg = pos[:-1] + (_conclusion(NUMBERS.index(words[0]), NUMBERS.index(words[-2]), c),)
    elif flaw == "wrong_attribute" and q_kind == "compare":
      j = int(rng.integers(2))
      words = pos[j].split()
      p = next(i for i, w in enumerate(words) if w in scenes_lib.COLOURS or w in scenes_lib.SHAPES)
      n_stated = NUMBERS.index(next(w for w in words if w in NUMBERS))
      pool = tuple(scenes_lib.COLOURS) if words[p] in scenes_lib.COLOURS else scenes_lib.SHAPES
      new = _flip_word(pos[j], pool, [p], rng,
                       lambda w, p=p, n=n_stated: sum(has(o, w[p]) for o in objs) != n and w[p] not in counts)
      neg = None if new is None else pos[:j] + (new,) + pos[j + 1:]
    elif flaw in ("wrong_attribute", "wrong_relation"):
      neg = _phrase_flaw(pos, objs, rng, flaw.split("_")[1])
    else:
      j = int(rng.integers(len(pos) - 1))
      neg = pos[:j] + pos[j + 1:]
    if neg is None:
      return None
    out.append(Negative(neg, flaw, b))
  return tuple(out)


def _count_question(objs, rng, cfg):
  attrs = sorted({o.colour for o in objs} | {o.shape for o in objs})
  attr = attrs[int(rng.integers(len(attrs)))]
  match = [o for o in objs if has(o, attr)]
  pos = [count_steps(order, attr, w) for order in _orders(match, rng) for w in (0, 1)]
  return f"how many {attr} objects are there ?", (attr,), NUMBERS[len(match)], pos, None


def _relation_question(objs, rng, cfg):
  unique = [o for o in objs if sum((p.colour, p.shape) == (o.colour, o.shape) for p in objs) == 1]
  if not unique:
    return None
  ref = unique[int(rng.integers(len(unique)))]
  relation = tuple(RELATIONS)[int(rng.integers(len(RELATIONS)))]
  side = [o for o in objs if o is not ref and on_side(o, ref, relation)]
  pos = [relation_steps(ref, order, relation, w) for order in _orders(side, rng) for w in (0, 1)]
  words = f"how many objects are {' '.join(RELATIONS[relation])} the {ref.colour} {ref.shape} ?"
  return words, (relation, ref.colour, ref.shape), NUMBERS[len(side)], pos, None


def _compare_question(objs, rng, cfg):
  colours = list(scenes_lib.COLOURS)
  present = sorted({o.colour for o in objs} | {o.shape for o in objs})
  a = present[int(rng.integers(len(present)))]
  pool = colours if a in scenes_lib.COLOURS else list(cfg.shapes)
  b = [x for x in pool if x != a][int(rng.integers(len(pool) - 1))]
  if rng.random() < 0.5:
    a, b = b, a
  n_a, n_b = sum(has(o, a) for o in objs), sum(has(o, b) for o in objs)
  pos = [compare_steps(a, n_a, b, n_b, order, w) for order in (0, 1) for w in (0, 1)]
  return (f"are there more {a} objects than {b} objects ?", (a, b), "yes" if n_a > n_b else "no", pos,
          {a: n_a, b: n_b})


_MAKERS = {"count": _count_question, "relation": _relation_question, "compare": _compare_question}


def wrong_answer(q_kind: str, answer: str, rng) -> str:
  if q_kind == "compare":
    return "no" if answer == "yes" else "yes"
  return NUMBERS[_off_by_one(NUMBERS.index(answer), rng)]


def generate(scenes: scenes_lib.Scenes, cfg: RadConfig = RadConfig(), seed: int = 0, hints: str = "none",
             scene_cfg: scenes_lib.SceneConfig = _SCENE_CFG) -> list[Question]:
  """One question per scene, kinds in turn.

  Args:
    scenes: the scenes (`scenes_lib.generate`).
    cfg: which kinds and how many positives.
    seed: the question sampler's seed.
    hints: "none"; "train" (a wrong hint, a right hint or none, each with probability 1/3: the
      test questions without a hint stay in the training distribution); "misleading" (a
      wrong hint on every question).
    scene_cfg: the scenes' config (its shape words).
  """
  if hints not in ("none", "train", "misleading"):
    raise ValueError(f"hints must be 'none', 'train' or 'misleading', found {hints!r}")
  if scene_cfg.objects != "shapes":
    raise ValueError(f"RAD questions need drawn shapes (objects='shapes'), found {scene_cfg.objects!r}")
  rng = np.random.default_rng(seed)
  out = []
  for i, objs in enumerate(scenes.objects):
    for t in range(len(cfg.kinds)):
      kind = cfg.kinds[(i + t) % len(cfg.kinds)]
      made = _MAKERS[kind](objs, rng, scene_cfg)
      if made is None:
        continue
      words, args, answer, pos, counts = made
      positives = _distinct(pos, cfg.max_positives, rng)
      negs = _negatives(kind, positives, objs, rng, counts)
      if negs is not None:
        break
    else:
      continue
    hint = None
    u = rng.random() if hints == "train" else 1.0
    if hints == "misleading" or u < 1 / 3:
      hint = wrong_answer(kind, answer, rng)
    elif hints == "train" and u < 2 / 3:
      hint = answer
    out.append(Question(i, kind, words, args, answer, positives, negs, hint))
  return out
