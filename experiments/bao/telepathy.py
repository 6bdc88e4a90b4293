"""Telepathy gym: twenty questions over entities with attributes (UserRL's TelepathyGym; arXiv 2509.19736).

The user thinks of an entity; the agent asks "[action] is it X?" and the user answers "Yes", "No" or "Maybe";
"[answer] NAME" guesses. As in UserRL a turn's reward is the improvement of the answer score (1 for the right
entity, else 0) over the best so far, times `reward_scale`, minus `step_penalty` times the turn number,
clipped to [0, 1]; a right answer or "[finish]" ends the episode, at most `max_turns` (15) turns.

Entities carry traits (category, size, living, ...). `BUILTIN` is a list written here; `wordnet_entities`
reads Debian's wordnet-base (`/usr/share/wordnet`, or $WNSEARCHDIR when set): frequent nouns of chosen
lexicographer files, their traits every lemma of the noun and of its hypernyms (a dog is a canine, a mammal, an
animal, a living thing ...).
The scripted user answers exactly from the traits: "Yes" when X is one of the entity's traits or names, "No"
when X is a trait or name of another entity of the pool, "Maybe" otherwise. An LM user (`generate`) answers
the questions instead, from a prompt naming the entity and its traits; answers are always scored by name.
"""
from __future__ import annotations

import functools
import os
import re
from typing import NamedTuple, Sequence

import numpy as np

from jaxlab import errors
from jaxlab.envs.base import Generate, Turn, verdict

SIZES = ("tiny", "small", "medium", "large", "huge")
# name: category, size, traits; "alive" and "man-made" follow from the category
_TABLE = """
dog: animal, medium, mammal pet furry legged noisy
cat: animal, small, mammal pet furry legged
elephant: animal, huge, mammal wild legged
horse: animal, large, mammal furry legged
mouse: animal, tiny, mammal wild furry legged
whale: animal, huge, mammal wild aquatic
eagle: animal, medium, bird wild winged dangerous
parrot: animal, small, bird pet winged noisy green
shark: animal, large, fish wild aquatic dangerous
goldfish: animal, tiny, fish pet aquatic
bee: animal, tiny, wild winged dangerous
frog: animal, tiny, wild aquatic green legged
snake: animal, small, wild dangerous
oak: plant, huge, tree wooden
pine: plant, huge, tree wooden green
rose: plant, small, flower
sunflower: plant, medium, flower
cactus: plant, small, green dangerous
fern: plant, small, green
apple: food, small, fruit sweet
banana: food, small, fruit sweet yellow
carrot: food, small, vegetable
lettuce: food, small, vegetable green
bread: food, small, baked
cake: food, medium, baked sweet
cheese: food, small, dairy
pizza: food, medium, baked dairy
hammer: tool, small, metal wooden
saw: tool, medium, metal dangerous
screwdriver: tool, small, metal
drill: tool, small, metal electric noisy
shovel: tool, medium, metal wooden
car: vehicle, large, metal wheeled noisy
bicycle: vehicle, medium, metal wheeled
airplane: vehicle, huge, metal winged noisy
boat: vehicle, large, aquatic
train: vehicle, huge, metal wheeled noisy
skateboard: vehicle, small, wooden wheeled
guitar: instrument, medium, wooden noisy
piano: instrument, large, wooden noisy legged
drum: instrument, medium, noisy
violin: instrument, small, wooden
trumpet: instrument, small, metal noisy
chair: furniture, medium, wooden legged
table: furniture, large, wooden legged
bed: furniture, large, legged soft
sofa: furniture, large, soft
lamp: furniture, small, electric
refrigerator: appliance, large, metal electric
toaster: appliance, small, metal electric
television: appliance, medium, electric noisy
microwave: appliance, medium, metal electric noisy
"""
LIVING = ("animal", "plant")
MAN_MADE = ("tool", "vehicle", "instrument", "furniture", "appliance")


class Entity(NamedTuple):
  """names: what counts as the right answer (the first is shown); traits: what "is it X?" is true of."""
  names: tuple[str, ...]
  traits: frozenset[str]

  @property
  def name(self) -> str:
    return self.names[0]


def _builtin() -> tuple[Entity, ...]:
  out = []
  for line in _TABLE.strip().splitlines():
    name, rest = line.split(":")
    category, size, traits = (x.strip() for x in rest.split(","))
    extra = ("alive",) if category in LIVING else ("man-made",) if category in MAN_MADE else ()
    out.append(Entity((name,), frozenset((category, size, *traits.split(), *extra))))
  return tuple(out)


BUILTIN = _builtin()
_LEXFILES = {"noun.animal": 5, "noun.artifact": 6, "noun.food": 13, "noun.plant": 20}


def _norm(text: str) -> str:
  """Lower case, "_" and punctuation to spaces, leading "is it" / articles dropped: "Is it a pet?" -> "pet"."""
  s = re.sub(r"[^a-z0-9\- ]+", " ", text.lower().replace("_", " "))
  s = re.sub(r"^\s*(is|was)\s+(it|this|that|the thing|your entity)\s+", "", s)
  s = re.sub(r"^\s*((a|an|the|some|kind of|type of|sort of)\s+)+", "", s)
  return " ".join(s.split())


@functools.lru_cache(maxsize=4)
def _wordnet_nouns(path: str):
  """offset -> (lexfile number, lemmas, hypernym offsets) for every noun synset; lemma -> first-sense offset."""
  synsets = {}
  with open(os.path.join(path, "data.noun"), encoding="utf-8") as f:
    for line in f:
      if line.startswith(" "):
        continue
      head = line.split(" | ")[0].split()
      n_words = int(head[3], 16)
      lemmas = tuple(head[4 + 2 * k].lower().replace("_", " ") for k in range(n_words))
      i = 4 + 2 * n_words
      n_ptr, ptrs = int(head[i]), head[i + 1:]
      hyper = tuple(ptrs[4 * k + 1] for k in range(n_ptr) if ptrs[4 * k] in ("@", "@i"))
      synsets[head[0]] = (int(head[1]), lemmas, hyper)
  first = {}
  with open(os.path.join(path, "index.noun"), encoding="utf-8") as f:
    for line in f:
      if not line.startswith(" "):
        parts = line.split()
        first[parts[0].replace("_", " ")] = parts[-int(parts[2])]
  return synsets, first


def wordnet_entities(path: str | None = None, lexnames: Sequence[str] = ("noun.animal", "noun.plant", "noun.food"),
                     min_count: int = 3, max_entities: int | None = None) -> tuple[Entity, ...]:
  """Frequent single-word nouns whose first sense lies in `lexnames`, most frequent first (SemCor counts of
  cntlist.rev at least `min_count`); names: the synset's lemmas; traits: the lemmas of it and its hypernyms.
  `path`: WordNet's dictionary directory (default `errors.wordnet_dir()`)."""
  path = path or errors.wordnet_dir()
  if not os.path.exists(os.path.join(path, "data.noun")):
    raise errors.missing("wordnet", f"WordNet entities (no data.noun in {path})")
  unknown = [x for x in lexnames if x not in _LEXFILES]
  if unknown:
    raise ValueError(f"lexnames must be among {sorted(_LEXFILES)}, found {unknown}")
  synsets, first = _wordnet_nouns(path)
  wanted = {_LEXFILES[x] for x in lexnames}
  counts = []
  with open(os.path.join(path, "cntlist.rev"), encoding="utf-8") as f:
    for line in f:
      key, sense, count = line.split()
      lemma, rest = key.split("%")
      ss_type, lexfile = rest.split(":")[:2]
      if ss_type == "1" and sense == "1" and int(lexfile) in wanted and int(count) >= min_count and lemma.isalpha():
        counts.append((-int(count), lemma))
  out, seen = [], set()
  for _, lemma in sorted(counts):
    offset = first.get(lemma)
    if offset is None or offset in seen or synsets[offset][0] not in wanted:
      continue
    seen.add(offset)
    traits, todo = set(), [offset]
    while todo:
      o = todo.pop()
      traits.update(synsets[o][1])
      todo.extend(synsets[o][2])
    names = (lemma,) + tuple(x for x in synsets[offset][1] if x != lemma)
    out.append(Entity(names, frozenset(traits)))
    if max_entities is not None and len(out) == max_entities:
      break
  return tuple(out)


def load_entities(source: str = "auto") -> tuple[Entity, ...]:
  """"builtin": `BUILTIN`; "wordnet": `wordnet_entities()`; "auto": WordNet when installed (`errors.wordnet_dir()`
  holds it), else builtin, silently: the pool, and so any result over it, then depends on the machine."""
  if source == "auto":
    source = "wordnet" if errors.installed("wordnet") else "builtin"
  if source == "builtin":
    return BUILTIN
  if source == "wordnet":
    return wordnet_entities()
  raise ValueError(f"entity source must be 'auto', 'builtin' or 'wordnet', found {source!r}")


def scripted_reply(entity: Entity, question: str, vocabulary: frozenset[str]) -> str:
  """The exact user: "Yes" if the asked X is a trait or name of `entity`, "No" if X is in `vocabulary` (traits
  and names of the pool) but not the entity's, "Maybe" for anything else."""
  x = _norm(question)
  if x in entity.traits or x in entity.names:
    return "Yes"
  return "No" if x in vocabulary else "Maybe"


def lm_messages(entity: Entity, question: str) -> list[dict]:
  """The LM user's prompt: it plays the one thinking of `entity` and answers one yes/no question."""
  system = (f"We are playing twenty questions. You are thinking of: {entity.name}. Facts about it: "
            f"{', '.join(sorted(entity.traits))}. Answer the player's question truthfully about {entity.name} "
            "with a single word: Yes, No, or Maybe (only when the facts cannot decide it). Never say its name.")
  return [{"role": "system", "content": system}, {"role": "user", "content": question}]


class TelepathyGym:
  """One episode at a time; `reset(seed)` draws the entity uniformly from the pool."""
  name = "telepathy"

  def __init__(self, entities: str | Sequence[Entity] = "auto", max_turns: int = 15,
               generate: Generate | None = None, reward_scale: float = 1.0, step_penalty: float = 0.0):
    self.entities = load_entities(entities) if isinstance(entities, str) else tuple(entities)
    if not self.entities:
      raise ValueError("entities must hold at least one Entity, found none")
    if max_turns < 1:
      raise ValueError(f"max_turns must be >= 1, found {max_turns}")
    self.max_turns, self.generate = max_turns, generate
    self.reward_scale, self.step_penalty = reward_scale, step_penalty
    self.vocabulary = frozenset().union(*(e.traits | set(e.names) for e in self.entities))
    self.entity, self.step_count, self.best = self.entities[0], 0, 0.0

  def task(self) -> str:
    shown = sorted(set().union(*(e.traits for e in self.entities)))
    hint = ", ".join(shown) if len(shown) <= 80 else "a category, a kind or a property of it"
    return ("I am thinking of something. Ask yes/no questions with '[action] is it X?' (X for example: "
            f"{hint}) and guess with '[answer] NAME'.")

  def reset(self, seed: int) -> str:
    self.entity = self.entities[int(np.random.default_rng(seed).integers(len(self.entities)))]
    self.step_count, self.best = 0, 0.0
    return self.task()

  def _reward(self, score: float) -> float:
    gain = max(0.0, score - self.best) * self.reward_scale - self.step_penalty * self.step_count
    self.best = max(self.best, score)
    return min(1.0, max(0.0, gain))

  def interact(self, choice: str, content: str) -> Turn:
    self.step_count += 1
    if choice == "action":
      if self.generate is None:
        reply = scripted_reply(self.entity, content, self.vocabulary)
      else:
        reply = verdict(self.generate(lm_messages(self.entity, content)))
      return Turn(reply, self._reward(0.0), False, {"user": True})
    if choice == "answer":
      ok = _norm(content) in self.entity.names
      return Turn("Yes, that is it!" if ok else "No, that is not it.", self._reward(float(ok)), ok,
                  {"user": False, "correct": ok})
    if choice == "finish":
      return Turn("Game finished.", self._reward(0.0), True, {"user": False})
    return Turn("use '[action] is it X?' or '[answer] NAME'", self._reward(0.0), False,
                {"user": False, "valid": False})
