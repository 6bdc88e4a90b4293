"""Decoding masked diffusion LMs: semi-autoregressive block sampling (LLaDA, arXiv 2502.09992) with Fast-dLLM's
threshold parallel decoding and prefix / dual KV caches (arXiv 2505.22618, NVlabs/Fast-dLLM llada/generate.py).

The generation area (gen_length [MASK]s after the prompt) is decoded in blocks of block_length, left to
right, with steps / num_blocks steps per block. One step = one forward evaluation (NFE) of the model:
  vanilla (threshold=None): commit the k_i most confident masked positions of the current block, where k_i is
    the even split of the block's masks over its steps (Fast-dLLM's get_num_transfer_tokens: the first
    `masks % steps` steps take one more);
  threshold: commit every masked position of the block whose confidence is >= threshold, and at least the
    most confident one.
Confidence ("low_confidence" remasking) is the softmax probability of the predicted token; "random" uses
uniform noise instead. With temperature > 0 the predicted token is the Gumbel-max sample
argmax(logits + temperature * g), which is the reference's argmax(exp(logits) / (-log u) ** temperature)
written in log space; the reference draws that noise in float64, here it is float32 (log space keeps it free
of the float64 exp overflow; the sample is the same up to float32 resolution of the noise).
Caches (Fast-dLLM's approximations; attention is bidirectional, so cached entries go stale as the block
changes):
  None: every step recomputes the whole sequence.
  "prefix": the first step of a block is a full forward that also stores the KV of every position; the
    block's later steps recompute the block and everything after it, attending to the stored prefix KV.
  "dual": as "prefix", but the suffix after the block is cached too and only the block is recomputed.
  refresh_every=r additionally redoes the full forward (and cache) every r-th step of a block; r=1 makes any
  cache mode compute exactly what cache=None computes.

Deviations from the reference, all invisible for a trained model: (1) a committed token is never [MASK]
(the argmax skips the mask id; the reference could commit [MASK] and then overrun its step schedule);
(2) when a block is complete after its first (cache-building) step, the reference's prefix/dual loops still
run one more forward that commits nothing; here the block ends (its NFE is one lower); (3) top-k ties go
to the lower position. Batches decode in lock step; each row's NFE counts the forwards during which its
current block still had masks, i.e. what the reference (batch size 1) would report for that row.

Dream-style models (`cfg.shift_logits`) read position p's prediction at p-1; a cached region then carries
one extra query token in front (position start-1) whose key is hidden, so the other queries see exactly the
same keys as without it.

Axes: B batch, L sequence (prompt + generation), N branches, T region tokens, V vocab.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxlab import choices
from jaxlab.models import mdm
from jaxlab.models import transformer as tfm
from kernels.spec_verify import make_mask, spec_verify_attention

Cache = Literal["prefix", "dual"]  # or None: no KV cache
CACHES = (None, *choices.values(Cache))
Remasking = Literal["low_confidence", "random"]
REMASKING = choices.values(Remasking)


class DiffusionOutput(NamedTuple):
  tokens: jax.Array  # [B, P + gen_length]
  nfe: np.ndarray  # [B] forward evaluations per row
  forwards: int  # batched forward calls
  step_commits: np.ndarray  # [B, num_blocks * (block_length + 1)] tokens committed per step, -1 = no step

  @property
  def tokens_per_step(self) -> np.ndarray:
    gen = (self.step_commits.clip(0)).sum(axis=1)
    return gen / np.maximum(self.nfe, 1)


def transfer_schedule(n_masked: int, steps: int) -> np.ndarray:
  """Fast-dLLM's get_num_transfer_tokens for one row: n_masked split evenly over steps, remainder first."""
  base, rem = divmod(n_masked, steps)
  k = np.full(steps, base, np.int32)
  k[:rem] += 1
  return k


def positions(valid_BL):
  return jnp.maximum(jnp.cumsum(valid_BL.astype(jnp.int32), axis=1) - 1, 0)


def refresh_cache(params, cfg: mdm.Config, x_BL, valid_BL, pos_BL, extra: int):
  """A full forward that also stores the KV of every position, with `extra` free slots after them.

  Returns:
    (logits [B, L, V] aligned so that position p predicts token p, cache with index = L).
  """
  b, l = x_BL.shape
  cache = tfm.init_cache(cfg, b, l + extra)
  out = tfm.forward(params, x_BL, cfg, positions_BT=pos_BL, attention_mask_BT=valid_BL, cache=cache)
  return (mdm.shift(out.logits) if cfg.shift_logits else out.logits), out.cache


def exclude(cache, start, length: int):
  """The cache as attention context without the entries [start, start + length) (they will be recomputed)."""
  b = cache["pos"].shape[0]
  pos = lax.dynamic_update_slice_in_dim(cache["pos"], jnp.full((b, length), -1, jnp.int32), start, axis=1)
  return {**cache, "pos": pos}


def region_logits(params, cfg: mdm.Config, ctx, tokens_BNT, pos_BT, valid_BT, lead: int = 0, *,
                  kernel: bool = False):
  """Logits of N copies (branches) of a region; each copy sees the context cache and only its own tokens.

  Args:
    ctx: None (no context) or a cache from `refresh_cache` / `exclude` whose free slots hold exactly N*T.
    tokens_BNT: int [B, N, T]: per branch, `lead` query-only tokens (keys hidden) then the region.
    pos_BT, valid_BT: rotary positions and validity of the T tokens (shared by the branches).
    lead: 1 for a shift_logits model whose region starts after position 0 (see module docstring), else 0.
    kernel: attention through the Pallas kernel `kernels.spec_verify` (context as its prefix, branch ids as
      its block mask) instead of a dense [N*T, S + N*T] mask; the same numbers up to summation order.

  Returns:
    [B, N, T - lead, V]: index r predicts region token r.
  """
  b, n, t = tokens_BNT.shape
  branch = jnp.broadcast_to(jnp.repeat(jnp.arange(n, dtype=jnp.int32), t), (b, n * t))
  key_ok = jnp.tile(jnp.arange(t) >= lead, n)
  valid = jnp.tile(valid_BT, (1, n))
  kw = dict(positions_BT=jnp.tile(pos_BT, (1, n)), attention_mask_BT=valid, cache=ctx)
  s = 0 if ctx is None else ctx["pos"].shape[1] - n * t
  prefix_len = jnp.full((b,), s, jnp.int32)
  if kernel:
    if cfg.sliding_window is not None:
      raise ValueError("kernel=True needs full attention; this config has a sliding window")
    key_ids = jnp.where(key_ok & valid.astype(bool), branch, -1)
    prefix_valid = None if ctx is None else ctx["pos"][:, :s] >= 0

    def attention_fn(q_BTHK, k_BSGK, v_BSGK, _):
      return spec_verify_attention(q_BTHK, k_BSGK[:, :s], v_BSGK[:, :s], k_BSGK[:, s:], v_BSGK[:, s:], prefix_len,
                                   branch, prefix_valid_BS=prefix_valid, key_branch_ids_BT=key_ids)
    kw["intervention"] = tfm.Intervention(attention=attention_fn)
  elif n > 1 or lead or ctx is not None:  # excluded cache entries and padding (pos -1): the model hides them
    kw["attn_mask_BTS"] = make_mask(prefix_len, branch, s) & jnp.concatenate([jnp.ones((s,), bool), key_ok])
  out = tfm.forward(params, tokens_BNT.reshape(b, n * t), cfg, **kw)
  raw = out.logits.reshape(b, n, t, -1)
  if cfg.shift_logits:
    raw = raw[:, :, :t - lead] if lead else jnp.concatenate([raw[:, :, :1], raw[:, :, :-1]], axis=2)
  return raw


def predict(logits, mask_token_id: int, *, temperature: float = 0.0, remasking: str = "low_confidence",
            key=None):
  """(x0, confidence) per position: the (Gumbel-max sampled) token, never [MASK], and its confidence."""
  l = logits.astype(jnp.float32)
  kg, kr = jax.random.split(key) if key is not None else (None, None)
  noisy = l + temperature * jax.random.gumbel(kg, l.shape) if temperature > 0 else l
  x0 = jnp.argmax(noisy.at[..., mask_token_id].set(-jnp.inf), axis=-1)
  if remasking == "low_confidence":
    conf = jnp.take_along_axis(jax.nn.softmax(l, axis=-1), x0[..., None], axis=-1)[..., 0]
  else:
    conf = jax.random.uniform(kr, x0.shape)
  return x0.astype(jnp.int32), conf


def select(conf, masked, k=None, threshold: float | None = None):
  """Positions to commit: the k most confident masked ones, or (threshold) all >= threshold plus the top-1."""
  c = jnp.where(masked, conf, -jnp.inf)
  order = jnp.argsort(-c, axis=-1, stable=True)
  rank = jnp.argsort(order, axis=-1, stable=True)
  if threshold is None:
    return masked & (rank < jnp.asarray(k)[..., None])
  return masked & ((rank == 0) | (c >= threshold))


@dataclasses.dataclass(frozen=True)
class Plan:
  """Static description of one block's decoding (the jit key together with the model config)."""
  cache: Cache | None
  length: int  # L
  block_length: int
  steps: int  # per block
  threshold: float | None
  remasking: Remasking
  temperature: float
  region_len: int  # tokens recomputed by a cached step (None cache: L)
  lead: int
  refresh_every: int | None = None


def make_plan(cfg: mdm.Config, length: int, block_start: int, block_length: int, steps: int, threshold, cache,
              remasking, temperature, refresh_every=None) -> Plan:
  region = {None: length, "prefix": length - block_start, "dual": block_length}[cache]
  lead = int(cfg.shift_logits and cache is not None)
  return Plan(cache, length, block_length, steps, threshold, remasking, float(temperature), region, lead,
              refresh_every)


@functools.partial(jax.jit, static_argnames=("cfg", "plan"))
def decode_block(params, x_BL, valid_BL, pos_BL, block_start, key, *, cfg: mdm.Config, plan: Plan):
  """Decodes one block to completion. Returns (x, nfe [B], forwards, commits [B, block_length + 1])."""
  b, _ = x_BL.shape
  lb, r, lead = plan.block_length, plan.region_len, plan.lead
  rs = 0 if plan.cache is None else block_start
  sched = jnp.asarray(transfer_schedule(lb, plan.steps))
  blk = lambda a: lax.dynamic_slice_in_dim(a, block_start, lb, axis=1)
  reg = lambda a: lax.dynamic_slice_in_dim(a, rs - lead, r + lead, axis=1)

  def full(x):
    if plan.cache is None:
      logits = region_logits(params, cfg, None, x[:, None], pos_BL, valid_BL)[:, 0]
      return blk(logits), None
    logits, cache = refresh_cache(params, cfg, x, valid_BL, pos_BL, r + lead)
    return blk(logits), exclude(cache, rs, r)

  def cached(x, ctx):
    logits = region_logits(params, cfg, ctx, reg(x)[:, None], reg(pos_BL), reg(valid_BL), lead)[:, 0]
    return lax.dynamic_slice_in_dim(logits, block_start - rs, lb, axis=1)

  def commit(x, logits, t, nfe, commits):
    cur = blk(x)
    masked = cur == cfg.mask_token_id
    x0, conf = predict(logits, cfg.mask_token_id, temperature=plan.temperature, remasking=plan.remasking,
                       key=jax.random.fold_in(key, t))
    k = jnp.broadcast_to(sched[jnp.minimum(t, plan.steps - 1)], (b,))
    sel = select(conf, masked, k, plan.threshold)
    active = jnp.any(masked, axis=1)
    x = lax.dynamic_update_slice_in_dim(x, jnp.where(sel, x0, cur), block_start, axis=1)
    commits = commits.at[:, t].set(jnp.where(active, jnp.sum(sel, axis=1), -1))
    return x, nfe + active, commits

  nfe0 = jnp.zeros((b,), jnp.int32)
  commits0 = jnp.full((b, lb + 1), -1, jnp.int32)
  logits, ctx = full(x_BL)
  x, nfe, commits = commit(x_BL, logits, 0, nfe0, commits0)

  def cond(state):
    x, t = state[0], state[1]
    return (t <= lb) & jnp.any(blk(x) == cfg.mask_token_id)

  def body(state):
    x, t, ctx, nfe, commits = state
    if plan.cache is None:
      logits, _ = full(x)
    elif plan.refresh_every:
      logits, ctx = lax.cond(t % plan.refresh_every == 0, full, lambda x: (cached(x, ctx), ctx), x)
    else:
      logits = cached(x, ctx)
    x, nfe, commits = commit(x, logits, t, nfe, commits)
    return x, t + 1, ctx, nfe, commits

  x, t, _, nfe, commits = lax.while_loop(cond, body, (x, jnp.int32(1), ctx, nfe, commits))
  return x, nfe, t, commits


def check_args(cfg, prompt, steps, gen_length, block_length, threshold, cache, remasking, temperature, key):
  if not isinstance(cfg, mdm.Config):
    raise TypeError(f"expected an mdm.Config, found {type(cfg).__name__}")
  if prompt.ndim != 2 or prompt.shape[1] < 1:
    raise ValueError(f"prompt must be int [B, P] with P >= 1, found shape {prompt.shape}")
  if gen_length <= 0 or block_length <= 0 or gen_length % block_length:
    raise ValueError(f"gen_length ({gen_length}) must be a positive multiple of block_length ({block_length})")
  blocks = gen_length // block_length
  if steps <= 0 or steps % blocks:
    raise ValueError(f"steps ({steps}) must be a positive multiple of the number of blocks ({blocks})")
  if cache not in CACHES:
    raise ValueError(f"cache must be one of {CACHES}, found {cache!r}")
  if remasking not in REMASKING:
    raise ValueError(f"remasking must be one of {REMASKING}, found {remasking!r}")
  if threshold is not None and not threshold > 0:
    raise ValueError(f"threshold must be positive or None, found {threshold}")
  if (temperature > 0 or remasking == "random") and key is None:
    raise ValueError("temperature > 0 and random remasking need a PRNG key")
  if prompt.shape[1] + gen_length > cfg.max_position_embeddings:
    raise ValueError(f"prompt ({prompt.shape[1]}) + gen_length ({gen_length}) exceed max_position_embeddings "
                     f"({cfg.max_position_embeddings})")
  return blocks


def generate(params, cfg: mdm.Config, prompt, *, steps: int, gen_length: int, block_length: int,
             threshold: float | None = None, cache: str | None = None, remasking: str = "low_confidence",
             temperature: float = 0.0, key=None, prompt_mask=None, refresh_every: int | None = None
             ) -> DiffusionOutput:
  """Generates gen_length tokens after each prompt row with Fast-dLLM's sampler (see module docstring).

  Args:
    params, cfg: an mdm model.
    prompt: int [B, P]; rows of different lengths are left-padded and marked in `prompt_mask`.
    steps: total denoising steps (a multiple of gen_length // block_length); ignored by threshold decoding
      except through the reference's assertion.
    gen_length: tokens to generate (a multiple of block_length).
    block_length: semi-autoregressive block size.
    threshold: None for the vanilla sampler, else Fast-dLLM's confidence threshold (e.g. 0.9).
    cache: None, "prefix" or "dual".
    remasking: "low_confidence" or "random".
    temperature: Gumbel-max sampling temperature (0 = greedy).
    key: PRNG key (needed for temperature > 0 or random remasking).
    prompt_mask: optional [B, P] 1 = real token, 0 = left padding.
    refresh_every: also rebuild the cache every this many steps of a block (None: at block starts only).

  Returns:
    DiffusionOutput(tokens, nfe, forwards, step_commits).
  """
  prompt = jnp.asarray(prompt, jnp.int32)
  blocks = check_args(cfg, prompt, steps, gen_length, block_length, threshold, cache, remasking, temperature,
                      key)
  b, p = prompt.shape
  x = jnp.concatenate([prompt, jnp.full((b, gen_length), cfg.mask_token_id, jnp.int32)], axis=1)
  pm = jnp.ones((b, p), bool) if prompt_mask is None else jnp.asarray(prompt_mask, bool)
  valid = jnp.concatenate([pm, jnp.ones((b, gen_length), bool)], axis=1)
  pos = positions(valid)
  key = jax.random.key(0) if key is None else key
  nfe, forwards, commits = np.zeros(b, np.int64), 0, []
  for i in range(blocks):
    start = p + i * block_length
    plan = make_plan(cfg, p + gen_length, start, block_length, steps // blocks, threshold, cache, remasking,
                     temperature, refresh_every)
    x, n, f, c = decode_block(params, x, valid, pos, jnp.int32(start), jax.random.fold_in(key, i), cfg=cfg,
                              plan=plan)
    nfe += np.asarray(n)
    forwards += int(f)
    commits.append(np.asarray(c))
  return DiffusionOutput(tokens=x, nfe=nfe, forwards=forwards, step_commits=np.concatenate(commits, axis=1))
