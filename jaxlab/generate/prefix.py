"""Shared-prefix KV reuse: a prompt prefix (a system prompt, function docs, the earlier turns of a conversation) is
prefilled once and its KV cache reused by every generation whose prompt starts with it (`sample(..., prefix=)`)
and by a longer prefix that extends it (`prefill(..., prefix=)`), as llama.cpp's prompt cache and vLLM's prefix
caching reuse a prompt's keys and values.

The cache is `sampling.layer_list_cache`'s: per layer k/v [R, G, S, K], `pos` [R, S] (each slot's token position,
-1 for a free or padding slot) and the write `index`. A prefix row's tokens fill slots [0, index), rows of different
lengths left-padded (their padding slots hold -1); slots from `index` on are free. A continuation's positions
continue after its row's last prefix position and its queries see exactly the prefix's keys, so it computes what a
prefill of the whole prompt computes (the same greedy tokens; logits equal up to float summation order).

Axes: R prefix rows, B batch, T new tokens, S cache slots, G kv heads, K head dim.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.generate import quant
from jaxlab.generate.sampling import layer_list_cache, split_layers
from jaxlab.models import transformer as tfm

BUCKET = 32  # new tokens are left-padded to a power of two >= BUCKET, or above LONG to a multiple of LONG: a compiled
LONG = 256  # program serves every length of its bucket, for at most max(LONG, the tokens) padding slots


class PrefixCache(NamedTuple):
  """A prefilled prefix: `tokens` per row (one row: shared by every prompt of a batch) and its KV `cache`."""
  tokens: tuple
  cache: Any

  @property
  def length(self) -> int:
    """The first free slot (`cache["index"]`): where the tokens after the prefix are written."""
    return int(self.cache["index"])

  @property
  def capacity(self) -> int:
    return int(self.cache["pos"].shape[1])

  def split(self, prompt, prompt_mask, pad_id: int):
    """(whole prompt rows, tokens after the prefix [B, T] left-padded to their BUCKET size, their mask): what
    `sample(..., prefix=)` prefills."""
    rows = prompt_rows(prompt, prompt_mask)
    return (rows, *left_pad(after_prefix(self, rows), pad_id))

  def cache_for(self, batch: int, free: int):
    """The cache for `batch` rows (a one-row prefix broadcast) with `free` more slots after the prefix's."""
    return _join(self.cache, batch=batch, free=free)


def prompt_rows(prompt, prompt_mask=None) -> list[list[int]]:
  """The real tokens of each prompt row: a list of ints (one row), a list of token lists, or an int array [B, T]
  whose `prompt_mask` (default all ones) marks the real tokens."""
  if isinstance(prompt, (list, tuple)):
    if prompt_mask is not None:
      raise ValueError("prompt_mask is only accepted with an array prompt")
    return [[int(t) for t in prompt]] if not prompt or np.ndim(prompt[0]) == 0 else [[int(t) for t in r] for r in prompt]
  p = np.asarray(prompt)
  if p.ndim != 2:
    raise ValueError(f"prompt must be an int array [B, T] or a list of token lists, found shape {p.shape}")
  m = np.ones(p.shape, bool) if prompt_mask is None else np.asarray(prompt_mask).astype(bool)
  if m.shape != p.shape:
    raise ValueError(f"prompt_mask shape {m.shape} must equal prompt shape {p.shape}")
  return [[int(t) for t in r[k]] for r, k in zip(p, m)]


def after_prefix(prefix: PrefixCache, rows: Sequence[Sequence[int]]) -> list[list[int]]:
  """Each row's tokens after its prefix row (the only one, or row i of as many as `rows`); a row that does not
  start with its prefix, or adds no token to it, is an error."""
  if len(prefix.tokens) not in (1, len(rows)):
    raise ValueError(f"a prefix of {len(prefix.tokens)} rows serves 1 or {len(prefix.tokens)} prompts, "
                     f"found {len(rows)}")
  out = []
  for i, r in enumerate(rows):
    p = prefix.tokens[i if len(prefix.tokens) > 1 else 0]
    if len(r) <= len(p) or tuple(r[:len(p)]) != tuple(p):
      same = next((j for j, (a, b) in enumerate(zip(r, p)) if a != b), min(len(r), len(p)))
      raise ValueError(f"prompt row {i} ({len(r)} tokens) must extend its prefix ({len(p)} tokens) by at least one "
                       f"token; they agree on the first {same}")
    out.append(list(r[len(p):]))
  return out


def bucket(n: int) -> int:
  """The slots `n` new tokens take (see BUCKET)."""
  return -(-n // LONG) * LONG if n > LONG else max(BUCKET, 1 << (n - 1).bit_length())


def left_pad(rows, pad_id: int):
  """(tokens [B, T], mask [B, T]) of token rows left-padded to T, the longest row's `bucket`."""
  t = bucket(max(len(r) for r in rows))
  toks = np.full((len(rows), t), pad_id, np.int32)
  mask = np.zeros((len(rows), t), np.int32)
  for i, r in enumerate(rows):
    if r:
      toks[i, t - len(r):], mask[i, t - len(r):] = r, 1
  return toks, mask


def join(prefix_cache, batch: int, free: int):
  """`prefix_cache` for `batch` rows (a one-row prefix broadcast) with `free` more slots after its own."""
  def grow(a, axis, fill):
    a = jnp.broadcast_to(a, (batch, *a.shape[1:]))
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, free)
    return jnp.pad(a, widths, constant_values=fill)
  return {"k": tuple(grow(a, 2, 0) for a in prefix_cache["k"]), "v": tuple(grow(a, 2, 0) for a in prefix_cache["v"]),
          "pos": grow(prefix_cache["pos"], 1, -1), "index": prefix_cache["index"]}


_join = jax.jit(join, static_argnames=("batch", "free"))


@functools.partial(jax.jit, static_argnames=("cfg", "free"))
def _extend(params, cache, tokens_BT, mask_BT, *, cfg, free):
  params = split_layers(params)
  cache = join(cache, tokens_BT.shape[0], free)
  x = tfm.embed(params, tokens_BT, cfg)
  frame = tfm.positions_and_mask(cfg, mask_BT.astype(bool), cache)
  _, (ks, vs), _ = tfm.stack(params["layers"], x, frame, cfg, cache=cache)
  return {"k": ks, "v": vs, "pos": frame.k_pos, "index": cache["index"] + tokens_BT.shape[1]}


def prefill(params, cfg: tfm.Config, tokens, *, prefix: PrefixCache | None = None, capacity: int | None = None,
            weights: str = "fp32") -> PrefixCache:
  """Prefills prompt prefixes once, for `sample(..., prefix=)` and for longer prefixes.

  Args:
    params: the transformer's params (stacked layers), as `sample` is given them.
    cfg: the model config.
    tokens: one prefix (a list of ints; shared by every row of a later batch), a list of token lists (one prefix
      per row, left-padded), or an int array [R, T] (every token real).
    prefix: a prefix these rows start with: only their tokens after it are computed, the rest is its cache.
    capacity: slots of the returned cache (default: just enough). Room left after the prefix lets a longer
      prefix extend it in the same compiled program, where a growing one compiles once per size.
    weights: "fp32", "bf16" or "int8", as `sample` decodes (the cache must come from the same weights).

  Returns:
    PrefixCache(tokens per row, cache); the tokens after the prefix are left-padded to their BUCKET size
    (padding slots are never attended).
  """
  rows = prompt_rows(tokens)
  if prefix is None:
    new = rows
    if min(len(r) for r in rows) == 0:
      raise ValueError("every prefix row needs at least one token")
    base = layer_list_cache(cfg, len(rows), 0)
  else:
    new, base = after_prefix(prefix, rows), prefix.cache
  toks, mask = left_pad(new, 0)
  start = int(base["index"])
  need = start + toks.shape[1]
  slots = max(int(capacity or 0), need, int(base["pos"].shape[1]))
  params = quant.quantize(params, weights)
  cache = _extend(params, base, jnp.asarray(toks), jnp.asarray(mask), cfg=cfg, free=slots - int(base["pos"].shape[1]))
  return PrefixCache(tuple(tuple(r) for r in rows), cache)
