"""Trajectory-level speculative decoding for masked diffusion LMs (spec_dllm, ICML 2026; no public code), on
top of Fast-dLLM's block sampler (`jaxlab.generate.diffusion`, arXiv 2505.22618).

The target is the non-speculative sampler with the same settings (vanilla or threshold, cache None /
"prefix" / "dual"): a denoising trajectory s_0 -> s_1 -> ... where each step commits f(logits(s_j)) inside
the current block. One iteration here, from a state s whose logits are known:
  1. target step: s_1 = s + f(logits(s)) (exact, no forward needed);
  2. draft tree: the masked positions of the draft window (the current block and, with lookahead, the next
     blocks) are ranked block by block, then by their stale confidence under logits(s), and drafted with
     their stale argmax. Draft node c commits the n_c top-ranked ones (n_1 < n_2 < ...): per block, one node
     per confidence stratum (n = #{stale confidence >= stratum}, at least one more per level) for a
     threshold target, or the cumulative commit counts of the schedule's next steps for a vanilla target,
     plus a node that exactly completes the block. A draft trajectory is any increasing path
     root -> c_1 -> c_2 -> ... (each edge commits the ranks between two nodes), so the tree of trajectories
     shares its states and N = 1 + (blocks in window) * len(strata) copies represent all of them;
  3. verification: one forward over the N copies of the region (no cache: the whole sequence; prefix: the
     block and everything after it; dual: the block), each attending to the shared cached context exactly
     as the target's step does and to its own copy only: branch ids drive the Pallas kernel
     `kernels.spec_verify.spec_verify_attention` (the context cache as its prefix), or on CPU the same mask
     made dense (`make_mask` -> the model's attn_mask_BTS);
  4. acceptance: edge a -> c is consistent when
       "exact":     the target's own step at node a (from its verified logits; in the block node a is
                    working on) commits exactly the ranks between n_a and n_c, with the drafted tokens;
       "confident": every drafted token on the edge is one the target's step at node a would commit (or has
                    confidence >= accept_threshold there) and is node a's argmax; an edge that starts a
                    later block before node a's block is complete also needs that block's first position
                    committed or confident (>= inter_block_gate);
     the deepest node reachable from the root through consistent edges becomes the new state; its verified
     logits feed the next iteration. One forward advances 1 + (path length) target steps.
Inter-block speculation: with lookahead, nodes and edges continue into the next blocks (the target moves on
to the next block exactly when the current one is complete), so one verification can finish a block and
start the next ones. Without a cache, the last verification's logits are those of the state the next block
starts from, so that block skips its first forward (hand-over); with a prefix cache the next block still
rebuilds its cache first.

Exactness: the output equals `diffusion.generate` with the same (steps, gen_length, block_length,
threshold, cache) token for token, and NFE is never higher, when acceptance == "exact" (temperature 0 and
low-confidence remasking, the only modes supported here) and either cache is None (any lookahead) or
lookahead == 0 (with a prefix cache the target rebuilds the cache before the next block, which drafts from
the old cache do not see; a dual cache never looks ahead). Every accepted state was then produced by the
target rule from logits of the same state computed the way the target computes them. "Identical" is up to
floating point: a verification forward holds several branch copies, so its attention reductions run over
more (masked, exactly zero-weighted) keys, which may reorder float sums; a confidence tie closer than ~1e-6
could resolve differently. "confident" acceptance leaves that regime (each step may commit a subset of what
the target would commit, and later blocks may start early: the trajectory drifts) and is the fast mode.

NFE counts forward evaluations per row (block starts that were not handed over, plus verifications); one
verification is one batched forward of N branch copies, so its cost grows with N (and the window).

Axes: B batch, L sequence, G generation area, W draft window, N branch copies, R region, V vocab.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxlab import choices
from jaxlab.generate import diffusion as dif
from jaxlab.models import mdm

ACCEPTANCE = ("exact", "confident")
Attention = Literal["auto", "kernel", "dense"]  # verification attention: Pallas kernel, dense mask, kernel off CPU
ATTENTION = choices.values(Attention)


@dataclasses.dataclass(frozen=True)
class SpecPlan:
  base: dif.Plan
  prompt_len: int
  strata: tuple[float, ...]
  acceptance: str
  accept_threshold: float
  window: int  # blocks in the draft window: this one and window - 1 after it (inter-block speculation)
  handover: bool  # no cache and a next block: its first predictions come from the last verification
  inter_block_gate: float
  kernel: bool  # verification attention through kernels.spec_verify


def _sched_at(sched, i, steps: int, lb: int):
  """k for step i of the block schedule; past the schedule everything left is committed."""
  return jnp.where(i < steps, sched[jnp.minimum(i, steps - 1)], lb)


def _node_sizes(sp: SpecPlan, sched, stale, masked1, blk_id, i1, rem_BK):
  """Sizes [B, K*m] of the draft nodes: nested prefixes of the stale ranking, block by block."""
  plan, m, k = sp.base, len(sp.strata), sp.window
  lb, steps = plan.block_length, plan.steps
  before = jnp.cumsum(rem_BK, axis=1) - rem_BK
  out = []
  for q in range(k):
    if plan.threshold is None:  # the schedule's next steps: a chain
      first = i1[:, None] if q == 0 else 0
      sizes = jnp.cumsum(_sched_at(sched, first + jnp.arange(m)[None, :], steps, lb), axis=1)
    else:  # confidence strata, at least one more token per level
      ok = masked1 & (blk_id == q)
      count = jnp.sum(ok[:, None, :] & (stale[:, None, :] >= jnp.asarray(sp.strata)[None, :, None]), axis=2)
      sizes = lax.cummax(jnp.maximum(count, jnp.arange(1, m + 1)[None, :]), axis=1)
    sizes = jnp.minimum(sizes, rem_BK[:, q:q + 1])
    if q < k - 1:
      sizes = sizes.at[:, -1].set(rem_BK[:, q])  # a node that exactly completes the block
    out.append(before[:, q:q + 1] + sizes)
  return jnp.concatenate(out, axis=1)


@functools.partial(jax.jit, static_argnames=("cfg", "sp"))
def decode_block(params, x_BL, valid_BL, pos_BL, block_start, block_index, hand, *, cfg: mdm.Config,
                 sp: SpecPlan):
  """Speculatively decodes one block (and drafts into the next window - 1 blocks).

  Args:
    hand: (have [B], at [B], step [B], tok [B, G], conf [B, G]) from the previous blocks: whether tok/conf
      are the predictions of the row's current state, and the step index `step` of block `at`.

  Returns:
    (x, nfe [B], forwards, commits [B, Lb + 1], hand for the next block).
  """
  plan = sp.base
  b, _ = x_BL.shape
  lb, r, lead, p, k = plan.block_length, plan.region_len, plan.lead, sp.prompt_len, sp.window
  w, n = k * lb, 1 + k * len(sp.strata)
  rs = 0 if plan.cache is None else block_start
  gs = block_start - p
  sched = jnp.asarray(dif.transfer_schedule(lb, plan.steps))
  mask_id = cfg.mask_token_id
  win = lambda a, o, axis=1: lax.dynamic_slice_in_dim(a, o, w, axis=axis)
  reg = lambda a: lax.dynamic_slice_in_dim(a, rs - lead, r + lead, axis=1)
  target = lambda conf, masked, i: dif.select(conf, masked, _sched_at(sched, i, plan.steps, lb), plan.threshold)
  blk_id = jnp.broadcast_to(jnp.arange(w) // lb, (b, w))
  have, at, step, gtok, gconf = hand

  def gen_preds(logits, base_tok, base_conf):  # region logits [B, N, X, V] -> predictions over the gen area
    tok, conf = dif.predict(logits[:, :, (p if plan.cache is None else 0):], mask_id)
    shape = tok.shape[:2] + base_tok.shape[1:]
    put = lambda g, v: lax.dynamic_update_slice_in_dim(jnp.broadcast_to(g[:, None], shape), v,
                                                       0 if plan.cache is None else gs, axis=2)
    return put(base_tok, tok), put(base_conf, conf)

  active0 = jnp.any(lax.dynamic_slice_in_dim(x_BL, block_start, lb, axis=1) == mask_id, axis=1)
  ctx = None
  if plan.cache is None:  # the last accepted state's logits are this state's: reuse them where handed over
    need = active0 & ~have
    def fresh(_):
      tok, conf = gen_preds(dif.region_logits(params, cfg, None, x_BL[:, None], pos_BL, valid_BL), gtok, gconf)
      return tok[:, 0], conf[:, 0]
    gtok, gconf = lax.cond(jnp.any(need), fresh, lambda _: (gtok, gconf), None)
  else:  # rebuild the cache (skipped when earlier lookahead already completed this block in every row)
    need = active0
    def build(_):
      logits, cache = dif.refresh_cache(params, cfg, x_BL, valid_BL, pos_BL, n * (r + lead))
      return dif.exclude(cache, rs, r), dif.predict(logits[:, p:], mask_id)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(build, None))
    ctx, (gtok, gconf) = lax.cond(jnp.any(need), build, lambda _: zeros, None)
  i0 = jnp.where(at == block_index, step, 0).astype(jnp.int32)
  state = dict(x=x_BL, tok=gtok, conf=gconf, i=i0, t=jnp.int32(0), nfe=need.astype(jnp.int32),
               commits=jnp.full((b, lb + 1), -1, jnp.int32), fw=jnp.any(need).astype(jnp.int32),
               have=jnp.where(active0, False, have), at=at, step=step)

  def body(st):
    x, tok, conf, i = st["x"], st["tok"], st["conf"], st["i"]
    wx, wt, wc = win(x, block_start), win(tok, gs), win(conf, gs)
    masked = (wx == mask_id) & (blk_id == 0)
    sel = target(wc, masked, i)  # the exact target step
    x1w = jnp.where(sel, wt, wx)
    masked1 = x1w == mask_id
    active = jnp.any(masked, axis=1)
    rem = jnp.stack([jnp.sum(masked1 & (blk_id == q), axis=1) for q in range(k)], axis=1)  # [B, K]
    verifying = active & ((rem[:, 0] > 0) | sp.handover)
    i1 = i + 1
    key = jnp.where(masked1, wc + 2.0 * (k - blk_id), -jnp.inf)  # earlier blocks first, then stale confidence
    rank = jnp.argsort(jnp.argsort(-key, axis=1, stable=True), axis=1, stable=True)
    sizes = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), _node_sizes(sp, sched, wc, masked1, blk_id, i1, rem)], 1)
    node_ok = jnp.concatenate([verifying[:, None], sizes[:, 1:] > sizes[:, :-1]], axis=1)  # [B, N]
    nodes = jnp.where(masked1[:, None] & (rank[:, None] < sizes[..., None]), wt[:, None], x1w[:, None])

    def verify(_):
      x1 = lax.dynamic_update_slice_in_dim(x, x1w, block_start, axis=1)
      toks = jnp.broadcast_to(reg(x1)[:, None], (b, n, r + lead))
      toks = lax.dynamic_update_slice_in_dim(toks, nodes, block_start - rs + lead, axis=2)
      logits = dif.region_logits(params, cfg, ctx, toks, reg(pos_BL), reg(valid_BL), lead, kernel=sp.kernel)
      return gen_preds(logits, tok, conf)

    def skip(_):
      shape = (b, n) + tok.shape[1:]
      return jnp.broadcast_to(tok[:, None], shape), jnp.zeros(shape, conf.dtype)

    ntok, nconf = lax.cond(jnp.any(verifying), verify, skip, None)  # [B, N, G]
    wnt, wnc = win(ntok, gs, 2), win(nconf, gs, 2)
    # Node a's active block (blocks it has completed) and its step index there along the chain.
    ends = jnp.cumsum(rem, axis=1)  # [B, K]
    phase = jnp.minimum(jnp.sum(sizes[:, :, None] >= ends[:, None, :], axis=2), k - 1)  # [B, N]
    first = jnp.stack([jnp.argmax(phase >= q, axis=1) for q in range(k)], axis=1)  # [B, K]
    a_idx = jnp.arange(n)[None, :]
    idx = jnp.where(phase == 0, i1[:, None] + a_idx, a_idx - jnp.take_along_axis(first, phase, axis=1))
    node_masked = masked1[:, None] & (rank[:, None] >= sizes[..., None]) & (blk_id[:, None] == phase[..., None])
    tsel = target(wnc, node_masked, idx)  # [B, A, W]: the target's own step at node a
    lo, hi, rk = sizes[:, :, None, None], sizes[:, None, :, None], rank[:, None, None, :]
    edge = masked1[:, None, None, :] & (rk >= lo) & (rk < hi)  # [B, A, C, W]: ranks [size_a, size_c)
    agree = wnt[:, :, None, :] == wt[:, None, None, :]
    if sp.acceptance == "exact":
      ok = jnp.all((tsel[:, :, None, :] == edge) & (agree | ~edge), axis=3)
    else:
      take_ok = (tsel | (wnc >= sp.accept_threshold))[:, :, None, :]
      ok = jnp.all(~edge | (agree & take_ok), axis=3)
      if k > 1:  # starting a later block before the active one is complete needs its first position confident
        early = jnp.any(edge & (blk_id[:, None, None, :] > phase[:, :, None, None]), axis=3)
        nxt = jnp.minimum(phase + 1, k - 1) * lb  # [B, A]: first position of the block after node a's
        first_conf = jnp.take_along_axis(wnc, nxt[..., None], axis=2)[..., 0]
        first_set = jnp.take_along_axis(nodes, nxt[..., None], axis=2)[..., 0] != mask_id
        ok &= ~early | ((first_conf >= sp.inter_block_gate) | first_set)[:, :, None]
    ok &= jnp.any(edge, axis=3) & node_ok[:, :, None] & node_ok[:, None, :]
    reach, depth = [node_ok[:, 0]], [jnp.zeros((b,), jnp.int32)]
    for c in range(1, n):
      via = jnp.stack(reach, 1) & ok[:, :c, c]
      reach.append(jnp.any(via, axis=1))
      depth.append(jnp.max(jnp.where(via, jnp.stack(depth, 1) + 1, 0), axis=1))
    reach, depth = jnp.stack(reach, 1), jnp.stack(depth, 1)
    best = jnp.argmax(jnp.where(reach, jnp.arange(n)[None, :], -1), axis=1)
    pick = lambda a: jnp.take_along_axis(a, best.reshape((b,) + (1,) * (a.ndim - 1)), axis=1)[:, 0]
    new_w = jnp.where(verifying[:, None], pick(nodes), x1w)
    new_w = jnp.where(active[:, None], new_w, wx)
    x = lax.dynamic_update_slice_in_dim(x, new_w, block_start, axis=1)
    tok = jnp.where(verifying[:, None], pick(ntok), tok)
    conf = jnp.where(verifying[:, None], pick(nconf), conf)
    completed = active & ~jnp.any((new_w == mask_id) & (blk_id == 0), axis=1)
    ph = jnp.where(verifying, pick(phase), 1)
    upd = lambda new, old: jnp.where(completed, new, old)
    i = jnp.where(active, i1 + jnp.where(verifying, pick(depth), 0), i)
    return dict(x=x, tok=tok, conf=conf, i=i, t=st["t"] + 1, nfe=st["nfe"] + verifying,
                commits=st["commits"].at[:, st["t"]].set(jnp.where(active, jnp.sum(new_w != wx, axis=1), -1)),
                fw=st["fw"] + jnp.any(verifying).astype(jnp.int32), have=upd(verifying, st["have"]),
                at=upd(block_index + ph, st["at"]), step=upd(jnp.where(verifying, pick(idx), 0), st["step"]))

  def cond(st):
    cur = lax.dynamic_slice_in_dim(st["x"], block_start, lb, axis=1)
    return (st["t"] <= lb) & jnp.any(cur == mask_id)

  st = lax.while_loop(cond, body, state)
  return st["x"], st["nfe"], st["fw"], st["commits"], (st["have"], st["at"], st["step"], st["tok"], st["conf"])


def block_plans(cfg: mdm.Config, prompt_len: int, *, steps: int, gen_length: int, block_length: int,
                threshold: float | None, cache: str | None, strata: tuple[float, ...], acceptance: str,
                accept_threshold: float | None, lookahead: int, inter_block_gate: float | None,
                kernel: bool) -> list[SpecPlan]:
  """The static plan of each block's `decode_block` call (its jit key with `cfg`), in order, as `generate` makes
  them for a prompt of `prompt_len` tokens."""
  blocks = gen_length // block_length
  default = 0.9 if threshold is None else threshold
  out = []
  for i in range(blocks):
    base = dif.make_plan(cfg, prompt_len + gen_length, prompt_len + i * block_length, block_length, steps // blocks,
                         threshold, cache, "low_confidence", 0.0)
    window = 1 if cache == "dual" else min(1 + lookahead, blocks - i)
    out.append(SpecPlan(base, prompt_len, strata, acceptance,
                        float(default if accept_threshold is None else accept_threshold), window,
                        cache is None and i < blocks - 1,
                        float(default if inter_block_gate is None else inter_block_gate), kernel))
  return out


def generate(params, cfg: mdm.Config, prompt, *, steps: int, gen_length: int, block_length: int,
             threshold: float | None = None, cache: str | None = None, strata=(0.8, 0.6, 0.4, 0.2),
             acceptance: str = "exact", accept_threshold: float | None = None, lookahead: int = 1,
             inter_block_gate: float | None = None, prompt_mask=None,
             attention: str = "auto") -> dif.DiffusionOutput:
  """Speculative decoding of the `diffusion.generate` sampler with the same settings (greedy only).

  Args:
    params, cfg, prompt, steps, gen_length, block_length, threshold, cache, prompt_mask: as
      `diffusion.generate` (temperature 0, low-confidence remasking).
    strata: stale-confidence levels of the draft nodes (their count m sets the tree size: m + 1 copies of
      the block per verification); for a vanilla target only len(strata) is used.
    acceptance: "exact" (reproduces the target) or "confident".
    accept_threshold: confidence an accepted token needs in "confident" mode (default: threshold or 0.9).
    lookahead: inter-block speculation: the draft window also covers this many later blocks (0 = off; only
      where the region covers them: cache None or "prefix").
    inter_block_gate: first-position confidence needed for that (default: threshold or 0.9).
    attention: verification attention: "kernel" (the Pallas kernel `kernels.spec_verify`), "dense" (a
      dense branch mask through `tfm.forward`) or "auto" (kernel on GPU/TPU, dense on CPU, where Pallas
      only interprets).

  Returns:
    DiffusionOutput; nfe counts the block-start forwards plus the verification forwards.
  """
  prompt = jnp.asarray(prompt, jnp.int32)
  dif.check_args(cfg, prompt, steps, gen_length, block_length, threshold, cache, "low_confidence", 0.0, None)
  if lookahead < 0:
    raise ValueError(f"lookahead must be >= 0, found {lookahead}")
  if acceptance not in ACCEPTANCE:
    raise ValueError(f"acceptance must be one of {ACCEPTANCE}, found {acceptance!r}")
  if attention not in ATTENTION:
    raise ValueError(f"attention must be one of {ATTENTION}, found {attention!r}")
  kernel = attention == "kernel" or (attention == "auto" and jax.default_backend() != "cpu")
  strata = tuple(float(s) for s in strata)
  if not strata or any(a < b for a, b in zip(strata, strata[1:])):
    raise ValueError(f"strata must be a non-empty non-increasing tuple, found {strata}")
  b, p = prompt.shape
  plans = block_plans(cfg, p, steps=steps, gen_length=gen_length, block_length=block_length, threshold=threshold,
                      cache=cache, strata=strata, acceptance=acceptance, accept_threshold=accept_threshold,
                      lookahead=lookahead, inter_block_gate=inter_block_gate, kernel=kernel)
  x = jnp.concatenate([prompt, jnp.full((b, gen_length), cfg.mask_token_id, jnp.int32)], axis=1)
  pm = jnp.ones((b, p), bool) if prompt_mask is None else jnp.asarray(prompt_mask, bool)
  valid = jnp.concatenate([pm, jnp.ones((b, gen_length), bool)], axis=1)
  pos = dif.positions(valid)
  nfe, forwards, commits = np.zeros(b, np.int64), 0, []
  hand = (jnp.zeros((b,), bool), jnp.zeros((b,), jnp.int32), jnp.zeros((b,), jnp.int32),
          jnp.zeros((b, gen_length), jnp.int32), jnp.zeros((b, gen_length), jnp.float32))
  for i, sp in enumerate(plans):
    start = p + i * block_length
    x, n, f, c, hand = decode_block(params, x, valid, pos, jnp.int32(start), jnp.int32(i), hand, cfg=cfg,
                                    sp=sp)
    nfe += np.asarray(n)
    forwards += int(f)
    commits.append(np.asarray(c))
  return dif.DiffusionOutput(tokens=x, nfe=nfe, forwards=forwards, step_commits=np.concatenate(commits, 1))
