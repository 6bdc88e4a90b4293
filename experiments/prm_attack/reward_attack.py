"""The gradient attack on a process reward model of prm_attack ("reward under attack"; reference
SqueezeAILab/reward-under-attack, adversarial_probing): K adversarial tokens, each a vector of vocabulary logits,
enter the PRM as Gumbel-softmax relaxed one-hots times the embedding matrix and are optimized with Adam to raise
the reward of (wrong) solutions; an entropy penalty whose weight follows a schedule (cosine, 1e-4 -> 0.1) pushes
each distribution towards one token, and the argmax tokens are the discrete attack.

Where the tokens go (`position`): "end" appends them after the solution and closes with a step separator (the
value head then reads that separator, the step head also scores it); "middle" puts them between question and
solution, and for the step head adds a separator after them so they form a scored step of their own. A solution's
reward (`AGGREGATION`, the same before and after an attack): the minimum over its step rewards for the step head,
the sigmoid of the last step's value for the value head.
Rows are right-padded: `mask_BT` marks real tokens and `question_len_B` where each row's solution starts.

Axes: B rows, T tokens, S spliced tokens (T + K + separators), K adversarial tokens, V vocabulary, D width.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab import choices
from jaxlab.models import heads, transformer as tfm

Position = Literal["end", "middle"]
POSITIONS = choices.values(Position)
Schedule = Literal["cosine", "linear", "exponential", "constant"]
SCHEDULES = choices.values(Schedule)
_ORIG, _ADV, _SEP, _PAD = 0, 1, 2, 3
AGGREGATION = {"step": "min", "value": "last"}  # head kind -> `heads.aggregate` rule of a solution's reward


@dataclasses.dataclass(frozen=True)
class Config:
  n_tokens: int = 1
  position: Position = "end"
  steps: int = 1000
  lr: float = 0.1
  tau: float = 1.0
  entropy_start: float = 1e-4
  entropy_end: float = 0.1
  schedule: Schedule = "cosine"
  seed: int = 0

  def __post_init__(self):
    if self.position not in POSITIONS:
      raise ValueError(f"reward_attack.Config: position must be one of {POSITIONS}, found {self.position!r}")
    if self.schedule not in SCHEDULES:
      raise ValueError(f"reward_attack.Config: schedule must be one of {SCHEDULES}, found {self.schedule!r}")
    if self.n_tokens < 1 or self.steps < 1 or self.tau <= 0:
      raise ValueError(f"reward_attack.Config: n_tokens and steps must be >= 1 and tau > 0, found "
                       f"{self.n_tokens}, {self.steps}, {self.tau}")


def entropy_weight(cfg: Config, step):
  """The entropy penalty's weight at `step` (0-based) of `cfg.steps`."""
  p = step / max(cfg.steps - 1, 1)
  a, b = cfg.entropy_start, cfg.entropy_end
  if cfg.schedule == "cosine":
    return a + (b - a) * (1 - jnp.cos(p * math.pi)) / 2
  if cfg.schedule == "linear":
    return a + (b - a) * p
  if cfg.schedule == "exponential":
    return a * (b / max(a, 1e-9)) ** p
  return a + 0.0 * p


def relaxed_embeddings(logits_KV, embedding_VD, key, tau: float):
  """[K, D] softmax((logits + Gumbel noise) / tau) @ embedding: each adversarial token as a mixture of rows."""
  g = jax.random.gumbel(key, logits_KV.shape, jnp.float32)
  w = jax.nn.softmax((logits_KV.astype(jnp.float32) + g) / tau, axis=-1)
  return w.astype(embedding_VD.dtype) @ embedding_VD


class Layout(NamedTuple):
  """Where every spliced position comes from: kind_BS (original token, adversarial token, separator, padding),
  index_BS (the original position or the adversarial slot), mask_BS, steps_BS (1 at the separators the step
  head scores) and last_B (the final separator, which the value head reads)."""
  kind_BS: np.ndarray
  index_BS: np.ndarray
  mask_BS: np.ndarray
  steps_BS: np.ndarray
  last_B: np.ndarray


def layout(tokens_BT, mask_BT, question_len_B, n_tokens: int, position: str, kind: str,
           separator_id: int) -> Layout:
  """The splice of `n_tokens` adversarial tokens into each right-padded row (computed on the host)."""
  tokens_BT, mask_BT = np.asarray(tokens_BT), np.asarray(mask_BT).astype(bool)
  q = np.asarray(question_len_B)
  b, t = tokens_BT.shape
  lengths = mask_BT.sum(1)
  if not (mask_BT == (np.arange(t)[None] < lengths[:, None])).all():
    raise ValueError("reward_attack.layout: expected right-padded rows (mask_BT 1s then 0s)")
  if ((q < 0) | (q > lengths)).any():
    raise ValueError(f"reward_attack.layout: question lengths must lie in [0, row length], found {q.tolist()} "
                     f"for lengths {lengths.tolist()}")
  extra = 1 + int(position == "middle" and kind == "step")
  s = t + n_tokens + extra
  out_kind = np.full((b, s), _PAD, np.int32)
  out_index = np.zeros((b, s), np.int32)
  steps = np.zeros((b, s), np.int32)
  last = np.zeros((b,), np.int32)
  for r in range(b):
    orig = [(_ORIG, i) for i in range(lengths[r])]
    adv = [(_ADV, k) for k in range(n_tokens)]
    if position == "end":
      seq = orig + adv + [(_SEP, 0)]
    else:
      seq = orig[:q[r]] + adv + [(_SEP, 0)] * (extra - 1) + orig[q[r]:] + [(_SEP, 0)]
    for j, (k, i) in enumerate(seq):
      out_kind[r, j], out_index[r, j] = k, i
      if k == _SEP or (k == _ORIG and i >= q[r] and tokens_BT[r, i] == separator_id):
        steps[r, j] = 1
    last[r] = len(seq) - 1
  return Layout(out_kind, out_index, (out_kind != _PAD).astype(np.int32), steps, last)


def splice_embeddings(embeds_BTD, adv_KD, sep_D, lay: Layout):
  """[B, S, D] the spliced input embeddings (zeros at padding)."""
  kind, index = jnp.asarray(lay.kind_BS), jnp.asarray(lay.index_BS)
  orig = jnp.take_along_axis(embeds_BTD, jnp.minimum(index, embeds_BTD.shape[1] - 1)[..., None], axis=1)
  adv = adv_KD[jnp.minimum(index, adv_KD.shape[0] - 1)]
  x = jnp.where((kind == _ORIG)[..., None], orig, jnp.where((kind == _ADV)[..., None], adv, 0.0))
  return jnp.where((kind == _SEP)[..., None], sep_D, x).astype(embeds_BTD.dtype)


def splice_tokens(tokens_BT, adv_K, separator_id: int, lay: Layout):
  """[B, S] the spliced token ids of a discrete attack (0 at padding)."""
  tokens_BT, adv_K = np.asarray(tokens_BT), np.asarray(adv_K)
  orig = np.take_along_axis(tokens_BT, np.minimum(lay.index_BS, tokens_BT.shape[1] - 1), axis=1)
  adv = adv_K[np.minimum(lay.index_BS, len(adv_K) - 1)] if len(adv_K) else np.zeros_like(lay.index_BS)
  out = np.where(lay.kind_BS == _ORIG, orig, np.where(lay.kind_BS == _ADV, adv, 0))
  return np.where(lay.kind_BS == _SEP, separator_id, out).astype(np.int32)


def rewards(lm_params, lm_cfg: tfm.Config, head_params, head_cfg: heads.Config, embeds_BSD, lay: Layout):
  """[B] the PRM's reward of each spliced row: min over scored steps (step head) or the last value (value), as
  `AGGREGATION`."""
  out = tfm.forward(lm_params, jnp.zeros(embeds_BSD.shape[:2], jnp.int32), lm_cfg,
                    attention_mask_BT=jnp.asarray(lay.mask_BS), inputs_embeds_BTD=embeds_BSD,
                    capture=("hidden_states",))
  return _read(head_params, head_cfg, out.hidden_states[-1], lay)


def _read(head_params, head_cfg: heads.Config, hidden_BSD, lay: Layout):
  # the value head's last scored step is the closing separator, lay.last_B
  return heads.aggregate(heads.position_rewards(head_params, head_cfg, hidden_BSD), jnp.asarray(lay.steps_BS),
                         AGGREGATION[head_cfg.kind])


class Result(NamedTuple):
  """logits_KV: the final logits; tokens_K: the best discrete tokens (by mean discrete reward); relaxed_BN /
  discrete_BN: per-row rewards over the steps (N = cfg.steps); entropy_N: mean token entropy per step."""
  logits_KV: jax.Array
  tokens_K: np.ndarray
  relaxed_BN: np.ndarray
  discrete_BN: np.ndarray
  entropy_N: np.ndarray


def make_step(cfg: Config, lm_cfg: tfm.Config, head_cfg: heads.Config, lay: Layout):
  """The attack's jitted step for rows laid out as `lay`: `step(lm_params, head_params, embeds_BTD, sep_D,
  logits_KV, opt_state, key, i)` returns (new logits, new Adam state, relaxed rewards [B], discrete rewards [B] of the
  argmax tokens before the update, mean entropy, those argmax tokens [K]). Weights are arguments, never constants
  folded into the program."""
  opt = optax.adam(cfg.lr)

  def reward_of(lm_params, head_params, embeds, sep, adv_KD):
    return rewards(lm_params, lm_cfg, head_params, head_cfg, splice_embeddings(embeds, adv_KD, sep, lay), lay)

  def loss_fn(logits_KV, lm_params, head_params, embeds, sep, k, w):
    table = lm_params["embed"]["embedding"]
    r_B = reward_of(lm_params, head_params, embeds, sep, relaxed_embeddings(logits_KV, table, k, cfg.tau))
    logp = jax.nn.log_softmax(logits_KV, axis=-1)
    ent = -jnp.sum(jnp.exp(logp) * logp, axis=-1).mean()
    return -r_B.mean() + w * ent, (r_B, ent)

  @jax.jit
  def step(lm_params, head_params, embeds_BTD, sep_D, logits_KV, opt_state, k, i):
    (_, (r_B, ent)), g = jax.value_and_grad(loss_fn, has_aux=True)(logits_KV, lm_params, head_params, embeds_BTD,
                                                                   sep_D, k, entropy_weight(cfg, i))
    upd, opt_state = opt.update(g, opt_state, logits_KV)
    tokens_K = jnp.argmax(logits_KV, axis=-1)  # the tokens these logits stand for now
    discrete_B = reward_of(lm_params, head_params, embeds_BTD, sep_D, lm_params["embed"]["embedding"][tokens_K])
    return optax.apply_updates(logits_KV, upd), opt_state, r_B, discrete_B, ent, tokens_K

  return step, opt


def attack(cfg: Config, lm_params, lm_cfg: tfm.Config, head_params, head_cfg: heads.Config, tokens_BT, mask_BT,
           question_len_B, separator_id: int) -> Result:
  """Optimizes one set of K adversarial tokens for all rows (a universal attack when B > 1)."""
  lay = layout(tokens_BT, mask_BT, question_len_B, cfg.n_tokens, cfg.position, head_cfg.kind, separator_id)
  table = lm_params["embed"]["embedding"]
  embeds = jnp.take(table, jnp.asarray(tokens_BT), axis=0)
  sep = table[separator_id]
  key, init_key = jax.random.split(jax.random.key(cfg.seed))
  logits = jax.random.normal(init_key, (cfg.n_tokens, table.shape[0]), jnp.float32)
  step, opt = make_step(cfg, lm_cfg, head_cfg, lay)
  opt_state = opt.init(logits)
  relaxed, discrete, ents = [], [], []
  best, best_tokens = -np.inf, None
  for i in range(cfg.steps):
    key, k = jax.random.split(key)
    logits, opt_state, r_B, d_B, ent, toks = step(lm_params, head_params, embeds, sep, logits, opt_state, k, i)
    relaxed.append(np.asarray(r_B))
    discrete.append(np.asarray(d_B))
    ents.append(float(ent))
    if discrete[-1].mean() > best:
      best, best_tokens = float(discrete[-1].mean()), np.asarray(toks)
  return Result(logits, best_tokens, np.stack(relaxed, 1), np.stack(discrete, 1), np.asarray(ents))


def discrete_rewards(lm_params, lm_cfg, head_params, head_cfg, tokens_BT, mask_BT, question_len_B, adv_K,
                     separator_id: int, position: str = "end"):
  """[B] the PRM's reward of rows with the discrete tokens `adv_K` spliced in (e.g. held-out rows: transfer);
  a token forward, independent of the relaxed path."""
  lay = layout(tokens_BT, mask_BT, question_len_B, len(adv_K), position, head_cfg.kind, separator_id)
  toks = splice_tokens(tokens_BT, adv_K, separator_id, lay)
  return _read(head_params, head_cfg, hidden_fn(lm_cfg)(lm_params, jnp.asarray(toks), jnp.asarray(lay.mask_BS)), lay)


@functools.lru_cache(maxsize=8)
def hidden_fn(lm_cfg: tfm.Config):
  """The PRM's jitted LM forward `(lm_params, tokens_BT, mask_BT) -> final hidden states [B, T, D]` (what every
  reward reads), one per config; weights are an argument."""
  return jax.jit(lambda p, t, m: heads.hidden_states(p, lm_cfg, t, m))
