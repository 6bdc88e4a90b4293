"""The multi-turn environment protocol, in the style of the UserRL gyms (SalesforceAIResearch/UserRL).

An agent acts through one tool, `interact(choice, content)`, with `choice` one of `CHOICES`: "action" talks to
the user (or probes the world: the user-involving turns that BAO counts), "search" looks something up, "answer"
submits an answer, "finish" ends the episode. Each call returns a `Turn`: the observation text, the turn's
reward, whether the episode is over, and facts for metrics. Episodes are reset by seed, so a batch of envs
reset with seeds 0..n-1 is the same batch every time; an episode ends after `max_turns` turns at the latest.

Policies write text; `parse_call` reads "[choice] content" from it (the gyms' format). `run` plays a batch of
episodes with a policy `histories -> texts`, batching the policy over the episodes still running.
"""
from __future__ import annotations

import re
from typing import Callable, NamedTuple, Protocol, Sequence

CHOICES = ("action", "search", "answer", "finish")
_CALL = re.compile(r"\[(action|search|answer|finish)\]\s*(.*)", re.IGNORECASE | re.DOTALL)


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


def run(make_env: Callable[[], Env], policy: Callable[[list[list[dict]]], list[str]],
        seeds: Sequence[int]) -> list[Episode]:
  """Plays one episode per seed: each round, `policy` gets the histories of the episodes still running and
  returns one text per history; an episode ends when its env says done or after its `max_turns` turns."""
  envs = [make_env() for _ in seeds]
  histories = [[{"role": "user", "content": env.reset(s)}] for env, s in zip(envs, seeds)]
  turns: list[list[Turn]] = [[] for _ in seeds]
  live = list(range(len(seeds)))
  while live:
    texts = policy([histories[i] for i in live])
    if len(texts) != len(live):
      raise ValueError(f"policy returned {len(texts)} texts for {len(live)} histories")
    still = []
    for i, text in zip(live, texts):
      turn = envs[i].interact(*parse_call(text))
      if len(turns[i]) + 1 >= envs[i].max_turns and not turn.done:
        turn = turn._replace(done=True, info={**turn.info, "truncated": True})
      turns[i].append(turn)
      histories[i] += [{"role": "assistant", "content": text}, {"role": "user", "content": turn.observation}]
      if not turn.done:
        still.append(i)
    live = still
  return [Episode(h, t, float(sum(x.reward for x in t))) for h, t in zip(histories, turns)]
