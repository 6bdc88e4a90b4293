"""The multi-turn environment protocol, in the style of the UserRL gyms (SalesforceAIResearch/UserRL).

An agent acts through one tool, `interact(choice, content)`, with `choice` one of `CHOICES`: "action" talks to
the user (or probes the world: the user-involving turns that BAO counts), "search" looks something up, "answer"
submits an answer, "finish" ends the episode. Each call returns a `Turn`: the observation text, the turn's
reward, whether the episode is over, and facts for metrics. Episodes are reset by seed, so a batch of envs
reset with seeds 0..n-1 is the same batch every time; an episode ends after `max_turns` turns at the latest.

Policies write text; `parse_call` reads "[choice] content" from it (the gyms' format). `EnvBatch` steps a batch
of envs reset by seed, each to its done or its `max_turns`; `run` plays a batch of episodes with a policy
`histories -> texts`, batching the policy over the episodes still running.

A user simulator is scripted (a gym answers from its hidden structured state) or an LM: a chat model passed
in as `generate(messages) -> str` (messages [{"role", "content"}]), whose reply `verdict` reads as
"Yes" / "No" / "Maybe".
"""
from __future__ import annotations

import re
from typing import Callable, NamedTuple, Protocol, Sequence

CHOICES = ("action", "search", "answer", "finish")
_CALL = re.compile(r"\[(action|search|answer|finish)\]\s*(.*)", re.IGNORECASE | re.DOTALL)
_VERDICT = re.compile(r"\b(yes|no|maybe)\b", re.IGNORECASE)

Generate = Callable[[list], str]


class Turn(NamedTuple):
  """observation: what the agent sees next; reward: this turn's reward; done: the episode is over;
  info: per-turn facts (e.g. "user": the turn involved the user, "correct": an answer was right)."""
  observation: str
  reward: float
  done: bool
  info: dict


class Env(Protocol):
  name: str
  max_turns: int

  def reset(self, seed: int) -> str:
    """Starts an episode; returns the task statement."""

  def interact(self, choice: str, content: str) -> Turn:
    """One agent turn."""


class UserSimulator(Protocol):
  """Replies as the user to the agent's message, given the conversation so far (a scripted rule or an LM)."""

  def __call__(self, history: Sequence[dict], message: str) -> str: ...


def lm_user(generate: Generate, system: str) -> UserSimulator:
  """An LM as the user: `generate([system, *history, {"role": "user", "content": message}])`."""
  def reply(history: Sequence[dict], message: str) -> str:
    return generate([{"role": "system", "content": system}, *history, {"role": "user", "content": message}])
  return reply


def verdict(text: str) -> str:
  """"Yes" | "No" | "Maybe": the first of those words in an LM's reply (a JSON "response" field first);
  "Maybe" when there is none."""
  m = re.search(r'"response"\s*:\s*"([^"]*)"', text)
  word = _VERDICT.search(m.group(1) if m else text)
  return word.group(1).capitalize() if word else "Maybe"


def parse_call(text: str) -> tuple[str, str]:
  """("action" | "search" | "answer" | "finish", content) from the first "[choice] content" in `text`;
  ("invalid", text) when there is none."""
  m = _CALL.search(text)
  if m is None:
    return "invalid", text.strip()
  return m.group(1).lower(), m.group(2).strip().split("\n")[0].strip()


class Episode(NamedTuple):
  """history: [{"role": "user" | "assistant", "content": str}] starting with the task; turns: one per agent
  turn; score: the sum of the turn rewards."""
  history: list
  turns: list
  score: float


class EnvBatch:
  """n envs stepped together: `reset(seeds)` starts one episode per seed; `step(texts)` takes one text per live
  env (in the order of `live`) and returns their turns; an env stops when it says done or after `max_turns`
  turns (its last turn then gets done and info["truncated"])."""

  def __init__(self, make_env: Callable[[], Env], n: int):
    self.envs = [make_env() for _ in range(n)]
    self.turns: list[list[Turn]] = [[] for _ in range(n)]
    self.live: list[int] = []

  def reset(self, seeds: Sequence[int]) -> list[str]:
    if len(seeds) != len(self.envs):
      raise ValueError(f"reset needs one seed per env ({len(self.envs)}), found {len(seeds)}")
    self.turns = [[] for _ in self.envs]
    self.live = list(range(len(self.envs)))
    return [env.reset(s) for env, s in zip(self.envs, seeds)]

  def step(self, texts: Sequence[str]) -> list[Turn]:
    if len(texts) != len(self.live):
      raise ValueError(f"policy returned {len(texts)} texts for {len(self.live)} histories")
    out, still = [], []
    for i, text in zip(self.live, texts):
      env = self.envs[i]
      turn = env.interact(*parse_call(text))
      if len(self.turns[i]) + 1 >= env.max_turns and not turn.done:
        turn = turn._replace(done=True, info={**turn.info, "truncated": True})
      self.turns[i].append(turn)
      out.append(turn)
      if not turn.done:
        still.append(i)
    self.live = still
    return out

  def rewards(self) -> list[list[float]]:
    """Each episode's per-turn rewards so far (what `experiments.bao.turns.pad_rewards` takes)."""
    return [[t.reward for t in turns] for turns in self.turns]


def run(make_env: Callable[[], Env], policy: Callable[[list[list[dict]]], list[str]],
        seeds: Sequence[int]) -> list[Episode]:
  """Plays one episode per seed: each round, `policy` gets the histories of the episodes still running and
  returns one text per history; an episode ends when its env says done or after its `max_turns` turns."""
  batch = EnvBatch(make_env, len(seeds))
  histories = [[{"role": "user", "content": task}] for task in batch.reset(seeds)]
  while batch.live:
    live = batch.live
    texts = policy([histories[i] for i in live])
    for i, text, turn in zip(live, texts, batch.step(texts)):
      histories[i] += [{"role": "assistant", "content": text}, {"role": "user", "content": turn.observation}]
  return [Episode(h, t, float(sum(x.reward for x in t))) for h, t in zip(histories, batch.turns)]
