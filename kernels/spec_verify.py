"""Branch-isolating attention for the verification forward of speculative diffusion decoding.

Trajectory-level speculative decoding for diffusion LMs (ICML 2026) drafts several candidate denoising
trajectories of the current block and verifies them all in one forward pass; the block is decoded against a
cached prefix as in Fast-dLLM (arXiv 2505.22618). This module computes that forward's attention:

  out[b, t, h] = softmax_j(scale * q[b, t, h] . k_j) v_j  over the visible keys j of query t,

where the keys are the S cached prefix entries followed by the T draft tokens of the row, and attention is
bidirectional with the mask
  (a) prefix key s is visible iff s < prefix_len[b] (entries past it are stale or empty cache slots) and
      prefix_valid[b, s] (optional: padding, or a dual cache whose excluded block sits inside the context);
  (b) block key u is visible iff branch_ids[b, t] == key_branch_ids[b, u] (each branch is one full copy of
      the block, one candidate trajectory; branches never see each other). key_branch_ids defaults to
      branch_ids; an id no query carries (e.g. -1) hides a key (padding, query-only tokens).
A row with no visible key gives zeros.

Layout: q [B, T, H, K], prefix k/v [B, S, G, K], block k/v [B, T, G, K], prefix_len [B], branch_ids [B, T];
grouped-query attention with H query heads sharing G kv heads (H % G == 0, query head h reads kv head
h // (H // G)). The Pallas kernel runs a grid over (batch, query head, query block) and, inside, an online
(flash) softmax in fp32 over the prefix key blocks and then the block key blocks. Internally the arrays are
made head-major ([B, H, T, K]) so that every tile has (sequence, head_dim) as its trailing dims, T and S are
zero-padded up to whole blocks (padded keys are masked, padded queries dropped) and K to a power of two.
Padded prefix blocks are still visited (the loop bound is static); entries past prefix_len cost compute only.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

NEG_INF = -1e30  # finite: a row that has seen no visible key yet keeps exp(m_prev - m_new) == 1, never NaN


def _is_pow2(n: int) -> bool:
  return n > 0 and n & (n - 1) == 0


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes (powers of two, >= 16 so GPU tensor-core dots are legal).

  Each is an upper bound: a dimension shorter than its block uses the next power of two >= max(16, length).

  Attributes:
    block_q: queries per program (grid axis 2).
    block_k_prefix: prefix keys per inner-loop step.
    block_k: block (draft) keys per inner-loop step.
  """
  block_q: int = 128
  block_k_prefix: int = 128
  block_k: int = 128

  def __post_init__(self):
    for name in ("block_q", "block_k_prefix", "block_k"):
      v = getattr(self, name)
      if not isinstance(v, int) or not _is_pow2(v) or v < 16:
        raise ValueError(f"BlockSizes.{name} must be a power of two >= 16, found {v!r}")

  @classmethod
  def default(cls) -> "BlockSizes":
    return cls()

  @classmethod
  def small(cls) -> "BlockSizes":
    """16-wide tiles: many blocks on tiny shapes (tests, interpret mode)."""
    return cls(16, 16, 16)


def _fit(block: int, n: int) -> int:
  return min(block, max(16, pl.next_power_of_2(max(n, 1))))


def _round_up(n: int, m: int) -> int:
  return -(-n // m) * m


def _validate(q, kp, vp, kb, vb, prefix_len, branch_ids, prefix_valid=None, key_ids=None):
  named = {"q_BTHK": q, "k_prefix_BSGK": kp, "v_prefix_BSGK": vp, "k_block_BTGK": kb, "v_block_BTGK": vb}
  for name, x in named.items():
    if x.ndim != 4:
      raise ValueError(f"{name} must have rank 4, found shape {x.shape}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
      raise ValueError(f"{name} must be floating point, found dtype {x.dtype}")
    if x.dtype != q.dtype:
      raise ValueError(f"{name} must have the dtype of q_BTHK ({q.dtype}), found {x.dtype}")
  b, t, h, k = q.shape
  s, g = kp.shape[1], kp.shape[2]
  expected = {"k_prefix_BSGK": (b, s, g, k), "v_prefix_BSGK": (b, s, g, k),
              "k_block_BTGK": (b, t, g, k), "v_block_BTGK": (b, t, g, k)}
  for name, shape in expected.items():
    if tuple(named[name].shape) != shape:
      raise ValueError(f"{name} must have shape [B, *, G, K] = {shape} (B={b}, T={t}, S={s}, G={g}, K={k} "
                       f"from q_BTHK {q.shape} and k_prefix_BSGK {kp.shape}), found {named[name].shape}")
  if h % g:
    raise ValueError(f"query heads H={h} must be a multiple of kv heads G={g}")
  if tuple(prefix_len.shape) != (b,):
    raise ValueError(f"prefix_len_B must have shape ({b},), found {prefix_len.shape}")
  if tuple(branch_ids.shape) != (b, t):
    raise ValueError(f"branch_ids_BT must have shape ({b}, {t}), found {branch_ids.shape}")
  if prefix_valid is not None and tuple(prefix_valid.shape) != (b, s):
    raise ValueError(f"prefix_valid_BS must have shape ({b}, {s}), found {prefix_valid.shape}")
  if key_ids is not None and tuple(key_ids.shape) != (b, t):
    raise ValueError(f"key_branch_ids_BT must have shape ({b}, {t}), found {key_ids.shape}")
  for name, x in (("prefix_len_B", prefix_len), ("branch_ids_BT", branch_ids), ("key_branch_ids_BT", key_ids)):
    if x is not None and not jnp.issubdtype(x.dtype, jnp.integer):
      raise ValueError(f"{name} must have an integer dtype, found {x.dtype}")


def make_mask(prefix_len_B, branch_ids_BT, S: int, prefix_valid_BS=None, key_branch_ids_BT=None):
  """Boolean [B, T, S + T] verification mask, True = may attend; keys are the S prefix entries then the block.

  Args:
    prefix_len_B: int [B], number of valid prefix entries per row (clipped to [0, S]).
    branch_ids_BT: int [B, T], branch of each draft token (as a query).
    S: prefix (cache) length.
    prefix_valid_BS: optional bool [B, S]; False hides a prefix entry.
    key_branch_ids_BT: optional int [B, T], branch of each draft token as a key (default `branch_ids_BT`);
      query t sees block key u iff their ids are equal.
  """
  b, t = branch_ids_BT.shape
  key_ids = branch_ids_BT if key_branch_ids_BT is None else key_branch_ids_BT
  prefix_ok = jnp.arange(S)[None, None, :] < jnp.asarray(prefix_len_B)[:, None, None]
  if prefix_valid_BS is not None:
    prefix_ok &= jnp.asarray(prefix_valid_BS, bool)[:, None, :]
  prefix_ok = jnp.broadcast_to(prefix_ok, (b, t, S))
  block_ok = branch_ids_BT[:, :, None] == key_ids[:, None, :]
  return jnp.concatenate([prefix_ok, block_ok], axis=-1)


def spec_verify_reference(q_BTHK, k_prefix_BSGK, v_prefix_BSGK, k_block_BTGK, v_block_BTGK, prefix_len_B,
                          branch_ids_BT, *, scale: float | None = None, prefix_valid_BS=None,
                          key_branch_ids_BT=None):
  """Pure-jnp oracle of `spec_verify_attention`: explicit mask, fp32 softmax, zeros for rows with no key.

  Args: as `spec_verify_attention`, without tiling options.
  """
  _validate(q_BTHK, k_prefix_BSGK, v_prefix_BSGK, k_block_BTGK, v_block_BTGK, prefix_len_B, branch_ids_BT,
            prefix_valid_BS, key_branch_ids_BT)
  b, t, h, kd = q_BTHK.shape
  s, g = k_prefix_BSGK.shape[1:3]
  scale = kd ** -0.5 if scale is None else scale
  f32 = lambda x: x.astype(jnp.float32)
  k = jnp.concatenate([f32(k_prefix_BSGK), f32(k_block_BTGK)], axis=1)
  v = jnp.concatenate([f32(v_prefix_BSGK), f32(v_block_BTGK)], axis=1)
  q = f32(q_BTHK).reshape(b, t, g, h // g, kd)
  logits = jnp.einsum("btgrk,bsgk->bgrts", q, k, precision=lax.Precision.HIGHEST) * scale
  mask = make_mask(prefix_len_B, branch_ids_BT, s, prefix_valid_BS, key_branch_ids_BT)[:, None, None]
  w = jax.nn.softmax(jnp.where(mask, logits, -jnp.inf), axis=-1)
  w = jnp.where(mask, w, 0.0)  # fully masked rows: softmax of all -inf is NaN; these become zeros
  out = jnp.einsum("bgrts,bsgk->btgrk", w, v, precision=lax.Precision.HIGHEST)
  return out.reshape(b, t, h, kd).astype(q_BTHK.dtype)


def _kernel(plen_ref, pvalid_ref, qid_ref, kid_ref, q_ref, kp_ref, vp_ref, kb_ref, vb_ref, o_ref, *, scale,
            block_kp, block_kb, n_prefix_blocks, n_block_blocks, t_real):
  q = q_ref[...]
  bq = q.shape[0]
  q_ids = qid_ref[...]  # [bq, 1]
  plen = plen_ref[...]  # [1, 1]

  def step(carry, k, v, mask):
    acc, m_prev, l_prev = carry
    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
    s = jnp.where(mask, s, NEG_INF)
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
    p = jnp.where(mask, jnp.exp(s - m_new), 0.0)
    alpha = jnp.exp(m_prev - m_new)
    l_new = alpha * l_prev + jnp.sum(p, axis=-1, keepdims=True)
    pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    return acc * alpha + pv, m_new, l_new

  def prefix_body(j, carry):
    sl = pl.ds(pl.multiple_of(j * block_kp, block_kp), block_kp)
    pos = j * block_kp + lax.broadcasted_iota(jnp.int32, (1, block_kp), 1)
    mask = jnp.broadcast_to(jnp.logical_and(pos < plen, pvalid_ref[:, sl] != 0), (bq, block_kp))
    return step(carry, kp_ref[sl, :], vp_ref[sl, :], mask)

  def block_body(j, carry):
    sl = pl.ds(pl.multiple_of(j * block_kb, block_kb), block_kb)
    mask = q_ids == kid_ref[:, sl]
    if n_block_blocks * block_kb != t_real:
      pos = j * block_kb + lax.broadcasted_iota(jnp.int32, (1, block_kb), 1)
      mask = jnp.logical_and(mask, pos < t_real)
    return step(carry, kb_ref[sl, :], vb_ref[sl, :], mask)

  carry = (jnp.zeros(q.shape, jnp.float32), jnp.full((bq, 1), NEG_INF, jnp.float32),
           jnp.zeros((bq, 1), jnp.float32))
  carry = lax.fori_loop(0, n_prefix_blocks, prefix_body, carry)
  acc, _, l = lax.fori_loop(0, n_block_blocks, block_body, carry)
  out = jnp.where(l > 0.0, acc / jnp.where(l > 0.0, l, 1.0), 0.0)
  o_ref[...] = out.astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("scale", "block_sizes", "interpret"))
def spec_verify_attention(q_BTHK, k_prefix_BSGK, v_prefix_BSGK, k_block_BTGK, v_block_BTGK, prefix_len_B,
                          branch_ids_BT, *, scale: float | None = None, prefix_valid_BS=None,
                          key_branch_ids_BT=None, block_sizes: BlockSizes | None = None,
                          interpret: bool | None = None):
  """Verification attention over a cached prefix plus branch-isolated draft tokens (Pallas, flash-style).

  Args:
    q_BTHK: queries of the T draft tokens, [B, T, H, K].
    k_prefix_BSGK, v_prefix_BSGK: cached prefix keys/values, [B, S, G, K]; only the first prefix_len[b] count.
    k_block_BTGK, v_block_BTGK: keys/values of the draft tokens, [B, T, G, K] (same dtype as q).
    prefix_len_B: int [B], valid prefix entries per row (values outside [0, S] are clipped).
    branch_ids_BT: int [B, T], branch of each draft token; tokens see only block keys of their own branch.
    prefix_valid_BS: optional bool/int [B, S]; a zero hides that prefix entry (padding, excluded cache slots).
    key_branch_ids_BT: optional int [B, T], the draft tokens' branch ids as keys (default `branch_ids_BT`);
      an id no query has (-1) hides the key.
    scale: logit scale; default K ** -0.5.
    block_sizes: `BlockSizes` tiling; default `BlockSizes()`.
    interpret: run the kernel in Pallas interpret mode; None = interpret on CPU, compiled on GPU/TPU.

  Returns:
    [B, T, H, K] in the dtype of q_BTHK.
  """
  _validate(q_BTHK, k_prefix_BSGK, v_prefix_BSGK, k_block_BTGK, v_block_BTGK, prefix_len_B, branch_ids_BT,
            prefix_valid_BS, key_branch_ids_BT)
  block_sizes = BlockSizes() if block_sizes is None else block_sizes
  if not isinstance(block_sizes, BlockSizes):
    raise ValueError(f"block_sizes must be a BlockSizes, found {type(block_sizes).__name__}")
  if interpret is None:
    interpret = jax.default_backend() == "cpu"
  b, t, h, kd = q_BTHK.shape
  s, g = k_prefix_BSGK.shape[1:3]
  scale = kd ** -0.5 if scale is None else float(scale)
  bq, bkb, bkp = (_fit(block_sizes.block_q, t), _fit(block_sizes.block_k, t),
                  _fit(block_sizes.block_k_prefix, s))
  tp, sp, kp = _round_up(t, max(bq, bkb)), _round_up(max(s, 1), bkp), pl.next_power_of_2(kd)

  def head_major(x, n):  # [B, N, heads, K] -> [B, heads, n, kp], zero padded
    x = jnp.swapaxes(x, 1, 2)
    return jnp.pad(x, ((0, 0), (0, 0), (0, n - x.shape[2]), (0, kp - kd)))

  q = head_major(q_BTHK, tp)
  k_pre, v_pre = head_major(k_prefix_BSGK, sp), head_major(v_prefix_BSGK, sp)
  k_blk, v_blk = head_major(k_block_BTGK, tp), head_major(v_block_BTGK, tp)
  ids = jnp.pad(branch_ids_BT.astype(jnp.int32), ((0, 0), (0, tp - t)))
  kids = ids if key_branch_ids_BT is None else jnp.pad(key_branch_ids_BT.astype(jnp.int32), ((0, 0), (0, tp - t)))
  pvalid = jnp.ones((b, s), jnp.int32) if prefix_valid_BS is None else prefix_valid_BS.astype(jnp.int32)
  pvalid = jnp.pad(pvalid, ((0, 0), (0, sp - s)))[:, None, :]
  plen = jnp.clip(prefix_len_B.astype(jnp.int32), 0, s).reshape(b, 1, 1)
  rep = h // g

  kernel = functools.partial(_kernel, scale=scale, block_kp=bkp, block_kb=bkb, n_prefix_blocks=sp // bkp,
                             n_block_blocks=tp // bkb, t_real=t)
  out = pl.pallas_call(
      kernel,
      grid=(b, h, tp // bq),
      in_specs=[
          pl.BlockSpec((None, 1, 1), lambda i, j, n: (i, 0, 0)),
          pl.BlockSpec((None, 1, sp), lambda i, j, n: (i, 0, 0)),
          pl.BlockSpec((None, bq, 1), lambda i, j, n: (i, n, 0)),
          pl.BlockSpec((None, 1, tp), lambda i, j, n: (i, 0, 0)),
          pl.BlockSpec((None, None, bq, kp), lambda i, j, n: (i, j, n, 0)),
          pl.BlockSpec((None, None, sp, kp), lambda i, j, n: (i, j // rep, 0, 0)),
          pl.BlockSpec((None, None, sp, kp), lambda i, j, n: (i, j // rep, 0, 0)),
          pl.BlockSpec((None, None, tp, kp), lambda i, j, n: (i, j // rep, 0, 0)),
          pl.BlockSpec((None, None, tp, kp), lambda i, j, n: (i, j // rep, 0, 0)),
      ],
      out_specs=pl.BlockSpec((None, None, bq, kp), lambda i, j, n: (i, j, n, 0)),
      out_shape=jax.ShapeDtypeStruct((b, h, tp, kp), q_BTHK.dtype),
      interpret=interpret,
      name="spec_verify_attention",
  )(plen, pvalid, ids[:, :, None], kids[:, None, :], q, k_pre, v_pre, k_blk, v_blk)
  return jnp.swapaxes(out[:, :, :t, :kd], 1, 2)
