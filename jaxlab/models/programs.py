"""Layer programs (PoLar, "Skip a Layer or Loop It? Learning Program-of-Layers in LLMs", arXiv 2606.06574).

A program is a list of layer indices run in order: a missing layer is skipped, a repeated one is looped.
`transformer.forward(program=...)` takes a concrete program (one compile per program). Here a program is a
traced int array padded with NOOP (-1) positions that leave the residual stream unchanged, so every program of
one padded length shares one compile, and `forward_batch` runs N programs at once (vmap over the program axis).
Both run the layers through `transformer.stack`.

Segment encoding (PoLar's training target): the layers 0..L-1 are cut into contiguous segments of at most
`max_pack` (4) layers, each with an op: SKIP (not run), KEEP (run once), REPEAT (run twice in a row, i.e. the
segment's layers a..b then a..b again). A program has such an encoding only if it is a sequence of these
pieces. Among the encodings of a program the canonical one has the fewest segments, then the fewest skips,
then the most repeats, then the larger packs earlier (the sizes compared lexicographically, larger first).
Each layer's op is fixed by how often the program runs it, so the skip and repeat rules order nothing once
the segment count is minimal; the pack-size rule decides. `labels` gives the predictor's per-layer targets:
a boundary bit (1 where a segment starts, 0 at layer 0) and the op at each segment start (IGNORE elsewhere).

Axes: N programs, P padded program positions, B batch, T positions, D model, V vocab.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.models import transformer as tfm

NOOP = -1
SKIP, KEEP, REPEAT = 0, 1, 2
OP_NAMES = ("skip", "keep", "repeat")
IGNORE = -100  # op label at positions that do not start a segment (cross-entropy ignore index)
CAPTURES = ("hidden_states",)


class Output(NamedTuple):
  logits: Any  # [B, T, V]
  residual: Any  # [B, T, D] the residual stream after the last position, before the final norm
  hidden_states: Any = None  # [P+1, B, T, D]: 0 = embeddings, i = after position i (NOOP: unchanged), P normed


class Segment(NamedTuple):
  start: int
  size: int
  op: int  # SKIP, KEEP or REPEAT


# ------------------------------------------------------------------------------------------ evaluation

def pad(programs: Sequence[Sequence[int]], length: int, n_layers: int) -> np.ndarray:
  """int32 [N, length]: each program followed by NOOP positions.

  Raises:
    ValueError: a program is longer than `length` or names a layer outside [0, n_layers).
  """
  out = np.full((len(programs), length), NOOP, np.int32)
  for i, prog in enumerate(programs):
    prog = np.asarray(prog, np.int64).reshape(-1)
    if prog.size > length:
      raise ValueError(f"program {i} has {prog.size} positions, more than the padded length {length}")
    if prog.size and (prog.min() < 0 or prog.max() >= n_layers):
      raise ValueError(f"program {i} must hold layer indices in [0, {n_layers}), found {prog.tolist()}")
    out[i, :prog.size] = prog
  return out


def _check_concrete(program_P, cfg: tfm.Config):
  try:
    prog = np.asarray(program_P)
  except jax.errors.TracerArrayConversionError:  # a traced program is checked where it is built (`pad`)
    return
  if prog.ndim != 1 or prog.size == 0 or not np.issubdtype(prog.dtype, np.integer):
    raise ValueError(f"program must be a non-empty 1-D int array, found shape {prog.shape} dtype {prog.dtype}")
  if prog.min() < NOOP or prog.max() >= cfg.n_layers:
    raise ValueError(f"program entries must be NOOP (-1) or layers in [0, {cfg.n_layers}), found {prog.tolist()}")


def forward(params, tokens_BT, cfg: tfm.Config, program_P, *, attention_mask_BT=None, positions_BT=None,
            capture: Sequence[str] = ()) -> Output:
  """Runs the LM under a padded program (NOOP = -1 positions do nothing); `program_P` may be traced.

  Args:
    params, tokens_BT, cfg, attention_mask_BT, positions_BT: as `transformer.forward`.
    program_P: int [P] layer indices or NOOP.
    capture: () or ("hidden_states",).
  """
  unknown = set(capture) - set(CAPTURES)
  if unknown:
    raise ValueError(f"unknown capture {sorted(unknown)}; expected a subset of {CAPTURES}")
  _check_concrete(program_P, cfg)
  x = tfm.embed(params, tokens_BT, cfg)
  b, t = x.shape[:2]
  valid_BT = jnp.ones((b, t), bool) if attention_mask_BT is None else attention_mask_BT.astype(bool)
  frame = tfm.positions_and_mask(cfg, valid_BT, None, positions_BT)
  x_final, _, ys = tfm.stack(params["layers"], x, frame, cfg, program=jnp.asarray(program_P, jnp.int32),
                             capture=capture)
  h, logits = tfm.head(params, x_final, cfg)
  hs = None
  if "hidden_states" in capture:
    hs = jnp.concatenate([x[None], ys["hidden_states"][:-1], h[None]], axis=0)
  return Output(logits=logits, residual=x_final, hidden_states=hs)


def forward_batch(params, tokens_BT, cfg: tfm.Config, programs_NP, *, attention_mask_BT=None, positions_BT=None,
                  capture: Sequence[str] = ()) -> Output:
  """`forward` for N padded programs on the same tokens; every output gains a leading N axis."""
  one = functools.partial(forward, cfg=cfg, attention_mask_BT=attention_mask_BT, positions_BT=positions_BT,
                          capture=tuple(capture))
  return jax.vmap(lambda prog: one(params, tokens_BT, program_P=prog))(jnp.asarray(programs_NP, jnp.int32))


def truncated(layer: int, n_layers: int) -> np.ndarray:
  """The padded program [0, .., layer-1, NOOP, ..] of length n_layers: its `residual` is hidden state `layer`."""
  if not 0 <= layer <= n_layers:
    raise ValueError(f"layer must be in [0, {n_layers}], found {layer}")
  return pad([list(range(layer))], n_layers, n_layers)[0]


# -------------------------------------------------------------------------------------------- encoding

def _key(segs: Sequence[Segment]):
  """Smaller is better: fewer segments, fewer skips, more repeats, larger packs earlier."""
  return (len(segs), sum(s.op == SKIP for s in segs), -sum(s.op == REPEAT for s in segs),
          tuple(-s.size for s in segs))


def encode(program: Sequence[int], n_layers: int, max_pack: int = 4) -> tuple[Segment, ...]:
  """The canonical segment encoding of `program` (module docstring).

  Raises:
    ValueError: the program is not a sequence of skipped, kept and twice-run contiguous packs of layers.
  """
  if n_layers <= 0 or max_pack <= 0:
    raise ValueError(f"n_layers and max_pack must be positive, found {n_layers}, {max_pack}")
  path = [int(i) for i in program]

  @functools.lru_cache(maxsize=None)
  def best(cursor: int, pos: int):
    if cursor == n_layers:
      return () if pos == len(path) else None
    found = None
    for size in range(1, min(max_pack, n_layers - cursor) + 1):
      chunk = list(range(cursor, cursor + size))
      for op, reps in ((SKIP, 0), (KEEP, 1), (REPEAT, 2)):
        if path[pos:pos + reps * size] != chunk * reps:
          continue
        tail = best(cursor + size, pos + reps * size)
        if tail is not None:
          cand = (Segment(cursor, size, op),) + tail
          if found is None or _key(cand) < _key(found):
            found = cand
    return found

  segs = best(0, 0)
  if segs is None:
    raise ValueError(f"program {path} has no segment encoding over {n_layers} layers (packs of <= {max_pack} "
                     "contiguous layers, each skipped, kept or run twice in a row)")
  return segs


def decode(segments: Sequence[Segment], n_layers: int | None = None) -> list[int]:
  """The program of a segment list.

  Raises:
    ValueError: segments are not contiguous from layer 0 (to `n_layers` when given) or an op is unknown.
  """
  out, cursor = [], 0
  for s in segments:
    start, size, op = (int(v) for v in s)
    if start != cursor or size <= 0 or op not in (SKIP, KEEP, REPEAT):
      raise ValueError(f"segment {tuple(s)} must start at layer {cursor} with a positive size and an op in "
                       f"(SKIP, KEEP, REPEAT) = (0, 1, 2)")
    out += list(range(start, start + size)) * (0 if op == SKIP else 1 if op == KEEP else 2)
    cursor += size
  if n_layers is not None and cursor != n_layers:
    raise ValueError(f"segments cover layers [0, {cursor}), expected [0, {n_layers})")
  return out


def labels(segments: Sequence[Segment], n_layers: int) -> tuple[np.ndarray, np.ndarray]:
  """(boundary [L] int32: 1 where a segment starts except layer 0, op [L] int32: op at starts, IGNORE elsewhere)."""
  decode(segments, n_layers)
  boundary = np.zeros(n_layers, np.int32)
  ops = np.full(n_layers, IGNORE, np.int32)
  for s in segments:
    boundary[s.start] = int(s.start > 0)
    ops[s.start] = s.op
  return boundary, ops


def from_labels(boundary, ops) -> tuple[Segment, ...]:
  """Segments back from `labels` (layer 0 always starts a segment)."""
  boundary, ops = np.asarray(boundary), np.asarray(ops)
  if boundary.shape != ops.shape or boundary.ndim != 1:
    raise ValueError(f"boundary and ops must be 1-D of one length, found {boundary.shape} and {ops.shape}")
  starts = [0] + [i for i in range(1, len(boundary)) if boundary[i]]
  ends = starts[1:] + [len(boundary)]
  return tuple(Segment(s, e - s, int(ops[s])) for s, e in zip(starts, ends))
