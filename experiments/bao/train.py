"""BAO's training and evaluation machinery: batched multi-turn play with a token policy, next-token training on
episode rows (pretraining and SFT), and one GRPO iteration with turn-level advantages.

Multi-turn GRPO here takes one loss row per agent turn: its prompt is the conversation so far and its completion
the turn's reply, with the log-probs the sampler gave. Every token of turn t of trajectory b carries the
per-token advantage of `experiments.bao.turns` (through `experiments.bao.objective.advantages`, whose token layout is each
trajectory's replies in order), and the loss is `jaxlab.train.rl_loop.make_grpo_step` with "token_mean"
aggregation: the same clipped objective, averaged over the same tokens, as a forward over whole trajectories
with a per-token advantage (the history tokens of a turn's prompt are the trajectory's own prefix). One rollout
is split into PPO-style minibatches of turns (`minibatches`), one update each, all against the sampler's
log-probs.

Axes: B rows, T prompt tokens (left-padded to a bucket), N reply tokens, L tokens of a whole episode.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import numpy as np

from experiments.bao import agent
from jaxlab import sharding as shd
from jaxlab.envs import base as envs
from jaxlab.generate import sample
from experiments.bao import objective as bao_lib
from experiments.bao import turns as turns_lib


class TurnRecord(NamedTuple):
  prompt: list
  reply: list
  logp: list
  reward: float
  user: bool
  correct: bool


class Played(NamedTuple):
  """One episode: its gym, seed, turn records and history (texts as the policy wrote them)."""
  gym: str
  seed: int
  turns: list
  history: list

  @property
  def score(self) -> float:
    return float(sum(t.reward for t in self.turns))

  @property
  def solved(self) -> bool:
    return any(t.correct for t in self.turns)

  @property
  def user_turns(self) -> int:
    return sum(t.user for t in self.turns)


def _bucket(n: int, step: int) -> int:
  return max(step, -(-n // step) * step)


def left_pad(rows: Sequence[Sequence[int]], width: int, pad: int = 0) -> tuple[np.ndarray, np.ndarray]:
  toks = np.full((len(rows), width), pad, np.int32)
  mask = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    r = list(r)[-width:]
    if r:
      toks[i, width - len(r):], mask[i, width - len(r):] = r, 1
  return toks, mask


class Policy:
  """A token policy over a codec: `act` samples (or greedily decodes) one reply per history, batched to a fixed
  width and prompts bucketed, so the compiled sampler is reused across rounds and iterations; with `mesh`, the
  prompts' rows are placed over its batch axes (`shard_rows`)."""

  def __init__(self, model_cfg, codec, max_new_tokens: int, max_prompt: int, batch: int, bucket: int = 64,
               mesh=None):
    self.cfg, self.codec, self.max_new, self.max_prompt = model_cfg, codec, max_new_tokens, max_prompt
    self.batch, self.bucket, self.mesh = batch, bucket, mesh

  def act(self, params, histories, key=None, temperature: float = 0.0):
    """(texts, reply token lists, reply log-prob lists, prompt token lists), one per history."""
    prompts = [self.codec.prompt(h)[-self.max_prompt:] for h in histories]
    texts, replies, logps = [], [], []
    for i in range(0, len(prompts), self.batch):
      chunk = prompts[i:i + self.batch]
      width = min(_bucket(max(len(p) for p in chunk), self.bucket), self.max_prompt)
      toks, mask = shd.shard_rows(left_pad(chunk + [[agent.PAD]] * (self.batch - len(chunk)), width), self.mesh)
      k = None if key is None else jax.random.fold_in(key, i)
      out = sample(params, self.cfg, toks, self.max_new, temperature=temperature, key=k, prompt_mask=mask,
                   stop_tokens=(self.codec.eos,), pad_id=0, return_logprobs=True)
      new, n, lp = (np.asarray(x) for x in (out.tokens, out.lengths, out.logprobs))
      for j in range(len(chunk)):
        replies.append(new[j, :n[j]].tolist())
        logps.append(lp[j, :n[j]].tolist())
        texts.append(self.codec.decode(replies[-1]))
    return texts, replies, logps, prompts


def play(policy: Policy, params, make_env, gym: str, seeds: Sequence[int], key=None,
         temperature: float = 0.0) -> list[Played]:
  """One episode per seed of `gym`, all stepped together (`jaxlab.envs.EnvBatch`); the calculator resolves each
  reply before the gym reads it."""
  batch = envs.EnvBatch(make_env, len(seeds))
  histories = [[{"role": "user", "content": task}] for task in batch.reset(list(seeds))]
  records: list[list] = [[] for _ in seeds]
  r = 0
  while batch.live:
    live = batch.live
    k = None if key is None else jax.random.fold_in(key, r)
    texts, replies, logps, prompts = policy.act(params, [histories[i] for i in live], k, temperature)
    for i, text, reply, lp, prompt, turn in zip(live, texts, replies, logps, prompts,
                                                batch.step([agent.resolve(t, histories[i]) for i, t in zip(live, texts)])):
      histories[i] += [{"role": "assistant", "content": text}, {"role": "user", "content": turn.observation}]
      records[i].append(TurnRecord(prompt, reply, lp, float(turn.reward), bool(turn.info.get("user")),
                                   bool(turn.info.get("correct"))))
    r += 1
  return [Played(gym, s, rec, h) for s, rec, h in zip(seeds, records, histories)]


def metrics(episodes: Sequence[Played]) -> dict:
  """score: mean episode score (sum of turn rewards); pass_u1: share solved with at most one user-involving
  turn; user_rate: user-involving turns / all turns; plus turns and user turns per episode."""
  n_turns = sum(len(e.turns) for e in episodes)
  return {"score": float(np.mean([e.score for e in episodes])),
          "pass_u1": float(np.mean([e.solved and e.user_turns <= 1 for e in episodes])),
          "user_rate": sum(e.user_turns for e in episodes) / max(n_turns, 1),
          "solved": float(np.mean([e.solved for e in episodes])),
          "turns": n_turns / len(episodes), "user_turns": float(np.mean([e.user_turns for e in episodes]))}


# ----------------------------------------------------------------------------------------------- training

def lm_batches(rows: Sequence[tuple[list, list]], batch: int, max_len: int, seed: int, bucket: int = 64):
  """Endless {inputs, targets, loss_mask} batches of (tokens, mask) rows, right-padded to a bucket."""
  rng = np.random.default_rng(seed)
  rows = [(t[:max_len + 1], m[:max_len + 1]) for t, m in rows]
  while True:
    perm = rng.permutation(len(rows)) if len(rows) >= batch else rng.integers(len(rows), size=batch)
    for i in range(0, len(perm) - batch + 1, batch):
      chunk = [rows[j] for j in perm[i:i + batch]]
      width = min(_bucket(max(len(t) for t, _ in chunk) - 1, bucket), max_len)
      out = {k: np.zeros((batch, width), np.int32) for k in ("inputs", "targets", "loss_mask")}
      for b, (t, m) in enumerate(chunk):
        t, m = np.asarray(t[:width + 1]), np.asarray(m[:width + 1])
        out["inputs"][b, :len(t) - 1], out["targets"][b, :len(t) - 1] = t[:-1], t[1:]
        out["loss_mask"][b, :len(t) - 1] = m[1:]
      yield out


def token_layout(episodes: Sequence[Played]) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
  """(turn_index [B, L], mask [B, L], first token of each turn per episode) of the episodes' replies laid end
  to end: the token layout `experiments.bao.turns.turn_advantages` reads."""
  width = max(1, max(sum(len(t.reply) for t in e.turns) for e in episodes))
  idx = np.full((len(episodes), width), -1, np.int32)
  mask = np.zeros((len(episodes), width), np.int32)
  starts = []
  for b, e in enumerate(episodes):
    pos, s = 0, []
    for t, turn in enumerate(e.turns):
      s.append(pos)
      idx[b, pos:pos + len(turn.reply)], mask[b, pos:pos + len(turn.reply)] = t, 1
      pos += len(turn.reply)
    starts.append(s)
  return idx, mask, starts


def episode_advantages(episodes: Sequence[Played], group_ids: Sequence[int], reg: bao_lib.Regularizers,
                       credit: turns_lib.TurnCredit) -> list[list[float]]:
  """Each turn's advantage (the per-token advantage of its tokens); environment feedback = a positive reward."""
  idx, mask, starts = token_layout(episodes)
  adv = np.asarray(bao_lib.advantages(
      [[t.reward for t in e.turns] for e in episodes], [[t.user for t in e.turns] for e in episodes],
      [[t.reward > 0 for t in e.turns] for e in episodes], [sum(len(t.reply) for t in e.turns) for e in episodes],
      idx, mask, np.asarray(group_ids), reg, credit))
  return [[float(adv[b, s]) for s in starts[b]] for b in range(len(episodes))]


def turn_rows(episodes: Sequence[Played], advs: Sequence[Sequence[float]]) -> list[tuple[TurnRecord, float]]:
  return [(t, a) for e, ad in zip(episodes, advs) for t, a in zip(e.turns, ad)]


def rows_batch(rows: Sequence[tuple[TurnRecord, float]], max_new: int, n_rows: int, len_bucket: int,
               max_prompt: int) -> dict:
  """The loss batch (`jaxlab.rl.rollout.as_batch` keys) of (turn, advantage) rows, padded to `n_rows` rows
  with empty completions and the prompts to a multiple of `len_bucket` (at most `max_prompt`)."""
  width = min(_bucket(max(len(t.prompt) for t, _ in rows), len_bucket), max_prompt)
  prompt, pmask = left_pad([t.prompt for t, _ in rows] + [[agent.PAD]] * (n_rows - len(rows)), width)
  out = {"prompt": prompt, "prompt_mask": pmask, "tokens": np.zeros((n_rows, max_new), np.int32),
         "completion_mask": np.zeros((n_rows, max_new), np.int32),
         "old_logp": np.zeros((n_rows, max_new), np.float32), "advantages": np.zeros((n_rows,), np.float32)}
  for i, (t, a) in enumerate(rows):
    k = len(t.reply)
    out["tokens"][i, :k], out["completion_mask"][i, :k], out["old_logp"][i, :k] = t.reply, 1, t.logp
    out["advantages"][i] = a
  return out


def grpo_batch(episodes: Sequence[Played], advs: Sequence[Sequence[float]], max_new: int, rows_bucket: int,
               len_bucket: int, max_prompt: int) -> dict:
  """All turns of `episodes` as one loss batch, rows padded to a multiple of `rows_bucket`."""
  rows = turn_rows(episodes, advs)
  return rows_batch(rows, max_new, _bucket(len(rows), rows_bucket), len_bucket, max_prompt)


def minibatches(episodes: Sequence[Played], advs: Sequence[Sequence[float]], size: int, max_new: int,
                len_bucket: int, max_prompt: int, rng: np.random.Generator) -> list[dict]:
  """The turns as loss batches of exactly `size` rows (PPO-style minibatches of one rollout, in random order):
  rows sorted by prompt length first, so a minibatch pads little and shapes repeat (few compilations)."""
  rows = sorted(turn_rows(episodes, advs), key=lambda r: len(r[0].prompt))
  out = [rows_batch(rows[i:i + size], max_new, size, len_bucket, max_prompt) for i in range(0, len(rows), size)]
  return [out[i] for i in rng.permutation(len(out))]
