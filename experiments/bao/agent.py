"""BAO's gyms, scripted experts and text: the three UserRL-style gyms, the expert that writes retrospective
reasoning ("recall: ...") and prospective plans ("plan: ...") before each call, a random format policy (the
pretraining data), the agent's calculator, and the word-level codec of the small policy.

Experts (each solves every episode within the turn limit; tests check it):
  function   [search] test, probe 1 2 3 4, probe a second point when that value fits two rules, then answer by
             the calculator with the identified rule ("[answer] calc a * ( b + c ) / d").
  telepathy  asks the trait that splits the entities still possible most evenly until one is left, then names
             it (entities sharing every trait are named in turn).
  turtle     checks one hypothesis per criterion of the puzzle, then tells the story (the criteria's
             statements).
The calculator is part of the agent for every method: "[answer] calc EXPR" reaches the gym as the value of
EXPR (numbers, + - * / ^ and brackets; a, b, c, d stand for the test case of the agent's last "[search] test"),
so a small model answers by writing the rule it identified, not by multiplying.
"""
from __future__ import annotations

import ast
import functools
import itertools
import math
import operator
import re
from typing import Literal, Sequence

import numpy as np

from jaxlab import choices
from jaxlab.envs import base as envs
from experiments.bao import function as fn_gym
from experiments.bao import telepathy as tp_gym
from experiments.bao import turtle as tt_gym

Gym = Literal["function", "telepathy", "turtle"]
GYMS = choices.values(Gym)
FIRST_PROBE = (1, 2, 3, 4)
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow}


# ------------------------------------------------------------------------------------------------ calculator

def calc(expr: str) -> float:
  """The value of an arithmetic expression of numbers, + - * / ^ (power) and brackets; NaN when invalid."""
  def ev(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
      return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
      left, right = ev(node.left), ev(node.right)
      if isinstance(node.op, ast.Pow) and abs(right) > 16:
        raise ValueError("exponent too large")
      return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
      return -ev(node.operand)
    raise ValueError("not arithmetic")
  try:
    return float(ev(ast.parse(expr.strip().replace("^", "**"), mode="eval").body))
  except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, RecursionError):
    return math.nan


def bindings(history: Sequence[dict]) -> dict:
  """a, b, c, d: the numbers of the last "test case: ..." observation in `history` (none before a search)."""
  for m in reversed(history):
    found = re.fullmatch(r"test case: (\S+) (\S+) (\S+) (\S+)", m["content"]) if m["role"] == "user" else None
    if found:
      return dict(zip("abcd", found.groups()))
  return {}


def resolve(text: str, history: Sequence[dict] = ()) -> str:
  """The call the gym receives: "[answer] calc EXPR" becomes "[answer] VALUE", with a, b, c, d in EXPR bound
  by `bindings(history)`; anything else is unchanged."""
  choice, content = envs.parse_call(text)
  if choice != "answer" or not content.startswith("calc"):
    return text
  expr = content[4:]
  for var, num in bindings(history).items():
    expr = re.sub(rf"\b{var}\b", num, expr)
  v = calc(expr)
  return f"[answer] {v:.10g}" if math.isfinite(v) else "[answer] invalid"


# --------------------------------------------------------------------------------------------------- gyms

def make_env(gym: str, max_turns: int, entities="builtin", generate=None, rules=fn_gym.RULES,
             puzzles=tt_gym.PUZZLES):
  """A gym drawing its episodes from `rules` (function), `entities` (telepathy) or `puzzles` (turtle)."""
  if gym == "function":
    return fn_gym.FunctionGym(max_turns=max_turns, rules=rules)
  if gym == "telepathy":
    return tp_gym.TelepathyGym(entities, max_turns=max_turns, generate=generate)
  if gym == "turtle":
    return tt_gym.TurtleGym(puzzles, max_turns=max_turns, generate=generate)
  raise ValueError(f"gym must be one of {GYMS}, found {gym!r}")


def _key(v: float) -> str:
  return fn_gym._fmt(v)


def _second_probes() -> dict:
  """Rules sharing a value at FIRST_PROBE -> the first point (digits 1..5) that tells them apart."""
  groups: dict = {}
  for r in fn_gym.RULES:
    groups.setdefault(_key(fn_gym.evaluate(r, FIRST_PROBE)), []).append(r)
  return {rules: second_probe(rules) for rules in (tuple(g) for g in groups.values() if len(g) > 1)}


@functools.lru_cache(maxsize=None)
def second_probe(rules: tuple[str, ...]) -> tuple[int, ...]:
  """The first point (digits 1..5) where `rules` all have distinct finite values."""
  for p in itertools.product(range(1, 6), repeat=4):
    vals = [fn_gym.evaluate(r, p) for r in rules]
    if all(math.isfinite(v) for v in vals) and len({_key(v) for v in vals}) == len(rules):
      return p
  raise ValueError(f"no point of digits 1..5 separates {rules}")


SECOND_PROBES = _second_probes()


def rule_text(rule: str, nums="abcd") -> str:
  """The rule spaced for the codec, with `nums` in place of a, b, c, d: "a * ( b + c ) / d", "3 * ( 5 + 2 ) / 7"."""
  s = rule.replace("**", "^")
  for var, n in zip("abcd", nums):
    s = re.sub(rf"\b{var}\b", str(n), s)
  return " ".join(re.findall(r"\d+|[a-d]|[-+*/^()]", s))


def _say(enhanced: bool, recall: str, plan: str, call: str) -> str:
  return f"recall : {recall} plan : {plan} {call}" if enhanced else call


def _digits(nums) -> str:
  return " ".join(str(x) for x in nums)


# ------------------------------------------------------------------------------------------------ experts

def expert_function(env, enhanced: bool) -> list[str]:
  """The expert's texts for the episode `env` was reset to (it reads the hidden rule only through probes among the
  gym's rules)."""
  texts = [_say(enhanced, "nothing yet", "get the test case", "[search] test")]
  cands = list(env.rules)
  facts = ["test case found"]
  probe = FIRST_PROBE
  while True:
    texts.append(_say(enhanced, " , ".join(facts), f"probe {_digits(probe)}", f"[action] {_digits(probe)}"))
    value = _key(fn_gym.evaluate(env.rule, probe))
    cands = [r for r in cands if _key(fn_gym.evaluate(r, probe)) == value]
    names = " ".join(f"r{fn_gym.RULES.index(r)}" for r in cands)
    facts.append(f"value {value} fits {names}")
    if len(cands) == 1:
      break
    probe = second_probe(tuple(cands))
  idx = fn_gym.RULES.index(cands[0])
  texts.append(_say(enhanced, " , ".join(facts), f"answer with r{idx}", f"[answer] calc {rule_text(cands[0])}"))
  return texts


def _split(cands, traits) -> str | None:
  best, n = None, len(cands)
  for t in traits:
    yes = sum(t in e.traits for e in cands)
    if 0 < yes < n and (best is None or abs(2 * yes - n) < abs(2 * best[1] - n)):
      best = (t, yes)
  return best and best[0]


def expert_telepathy(env, enhanced: bool) -> list[str]:
  """Halving questions over `env.entities`, answered by the scripted rule (the same as the gym's)."""
  cands, facts, texts = list(env.entities), [], []
  traits = sorted(set().union(*(e.traits for e in env.entities)))
  while True:
    t = _split(cands, traits)
    recall = " , ".join(facts) or "nothing yet"
    if t is None:
      texts.append(_say(enhanced, recall, f"answer {cands[0].name}", f"[answer] {cands[0].name}"))
      if cands[0] is env.entity or cands[0].name == env.entity.name:
        return texts
      facts.append(f"not {cands[0].name}")
      cands = cands[1:]
      continue
    texts.append(_say(enhanced, recall, f"ask {t}", f"[action] is it {t} ?"))
    yes = t in env.entity.traits
    facts.append(f"{t} {'yes' if yes else 'no'}")
    cands = [e for e in cands if (t in e.traits) == yes]


def expert_turtle(env, enhanced: bool) -> list[str]:
  facts, texts = [], []
  for c in env.puzzle.criteria:
    words = " ".join(g.split("|")[0] for g in c.groups)
    texts.append(_say(enhanced, " , ".join(facts) or "nothing yet", f"check {words}", f"[action] {words} ?"))
    facts.append(f"{words} {tt_gym.scripted_reply(env.puzzle, words).lower()}")
  story = " ".join(c.statement for c in env.puzzle.criteria)
  texts.append(_say(enhanced, " , ".join(facts), "explain", f"[answer] {story}"))
  return texts


EXPERTS = {"function": expert_function, "telepathy": expert_telepathy, "turtle": expert_turtle}


def random_call(gym: str, env, rng: np.random.Generator) -> str:
  """A valid call drawn at random: the format policy whose episodes pretrain the small model."""
  u = rng.random()
  if gym == "function":
    nums = _digits(rng.integers(1, 10, size=4))
    if u < 0.25:
      return "[search] test"
    if u < 0.75:
      return f"[action] {nums}"
    return f"[answer] calc {rule_text(env.rules[rng.integers(len(env.rules))])}"
  if gym == "telepathy":
    traits = sorted(set().union(*(e.traits for e in env.entities)))
    if u < 0.6:
      return f"[action] is it {traits[rng.integers(len(traits))]} ?"
    return f"[answer] {env.entities[rng.integers(len(env.entities))].name}"
  facts = [f for p in env.puzzles for f in p.facts]
  if u < 0.6:
    return f"[action] {' '.join(g.split('|')[0] for g in facts[rng.integers(len(facts))].groups)} ?"
  p = env.puzzles[rng.integers(len(env.puzzles))]
  return f"[answer] {p.criteria[rng.integers(len(p.criteria))].statement}"


def play_scripted(make, seed: int, texts_of) -> envs.Episode:
  """One episode of a scripted policy: `texts_of(env)` -> the next text (called before each turn)."""
  env = make()
  history, turns = [{"role": "user", "content": env.reset(seed)}], []
  while not (turns and turns[-1].done):
    text = texts_of(env, len(turns))
    turn = env.interact(*envs.parse_call(resolve(text, history)))
    if len(turns) + 1 >= env.max_turns and not turn.done:
      turn = turn._replace(done=True, info={**turn.info, "truncated": True})
    turns.append(turn)
    history += [{"role": "assistant", "content": text}, {"role": "user", "content": turn.observation}]
  return envs.Episode(history, turns, float(sum(t.reward for t in turns)))


def expert_episode(make, gym: str, seed: int, enhanced: bool) -> envs.Episode:
  plan: list[str] = []

  def texts_of(env, t):
    if t == 0:
      plan.extend(EXPERTS[gym](env, enhanced))
    return plan[t]
  return play_scripted(make, seed, texts_of)


def random_episode(make, gym: str, seed: int) -> envs.Episode:
  rng = np.random.default_rng([seed, 7])
  return play_scripted(make, seed, lambda env, t: random_call(gym, env, rng))


# ------------------------------------------------------------------------------------------------- codec

_TOKEN = re.compile(r"\[(?:action|search|answer|finish)\]|[a-z][a-z0-9'\-]*|-?\d+(?:\.\d+)?|\S")
SPECIALS = ("<pad>", "<bos>", "<eos>", "<obs>", "<act>", "<unk>")
PAD, BOS, EOS, OBS, ACT, UNK = range(len(SPECIALS))


def words(text: str) -> list[str]:
  return _TOKEN.findall(text.lower())


class WordCodec:
  """Word-level tokens of the small policy (lower case; numbers whole; "[action]" one token). A conversation is
  <bos> <obs> task (<act> reply <eos> <obs> observation)*; the policy writes after <act> and stops at <eos>."""

  def __init__(self, texts: Sequence[str]):
    vocab = sorted({w for t in texts for w in words(t)})
    self.itos = list(SPECIALS) + vocab
    self.stoi = {w: i for i, w in enumerate(self.itos)}
    self.vocab_size = len(self.itos)
    self.eos = EOS

  def encode(self, text: str) -> list[int]:
    return [self.stoi.get(w, UNK) for w in words(text)]

  def decode(self, ids) -> str:
    return " ".join(self.itos[i] for i in ids if i >= len(SPECIALS) or i == UNK)

  def prompt(self, history: Sequence[dict]) -> list[int]:
    """The tokens before the policy's next reply."""
    ids = [BOS]
    for m in history:
      ids += ([OBS] if m["role"] == "user" else [ACT]) + self.encode(m["content"]) + ([EOS] * (m["role"] != "user"))
    return ids + [ACT]

  def reply(self, text: str) -> list[int]:
    return self.encode(text) + [EOS]


class ChatCodec:
  """A chat model's tokenizer (full preset): the tool format goes in a system message; replies end at eos."""

  def __init__(self, tok, system: str):
    self.tok, self.system = tok, system
    self.vocab_size, self.eos = tok.vocab_size, tok.eos_id

  def prompt(self, history: Sequence[dict]) -> list[int]:
    return list(self.tok.apply_chat_template([{"role": "system", "content": self.system}, *history],
                                             add_generation_prompt=True, tokenize=True))

  def reply(self, text: str) -> list[int]:
    return self.tok.encode(text) + [self.eos]

  def decode(self, ids) -> str:
    return self.tok.decode([i for i in ids if i != self.eos]).strip()


def sft_rows(codec, history: Sequence[dict]) -> list[tuple[list[int], list[int]]]:
  """(tokens, loss mask) rows of an episode, the mask 1 exactly on the policy's reply tokens (eos included):
  one row for the whole episode when each turn's prompt extends the previous row (the word codec), else a new
  row where it does not (chat templates that rewrite earlier turns)."""
  rows, ids, mask = [], [], []
  for k, m in enumerate(history):
    if m["role"] != "assistant":
      continue
    prompt = codec.prompt(history[:k])
    if prompt[:len(ids)] != ids:
      rows.append((ids, mask))
      ids, mask = [], []
    new = prompt[len(ids):]
    r = codec.reply(m["content"])
    ids, mask = ids + new + r, mask + [0] * len(new) + [1] * len(r)
  return rows + [(ids, mask)]
