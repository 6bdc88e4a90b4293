"""Layer programs (jaxlab.models.programs) against `transformer.forward(program=...)` and brute force.

Oracles: one `tfm.forward(program=...)` run per program (its own compile), a trace counter inside the jitted
batch function, exhaustive enumeration of every segment list over a few layers (canonical encoding), and
decoding (round trips).
"""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.models import programs as pg
from jaxlab.models import transformer as tfm

CFG = tfm.Config.tiny(vocab_size=96, n_layers=4, d_ff=64, init_std=0.2)
tfm_forward = jax.jit(tfm.forward, static_argnames=("cfg", "program", "capture"))


def _params(cfg=CFG, seed=0):
  return tfm.init(cfg, jax.random.key(seed))


def _tokens(b=2, t=7, seed=0):
  return np.random.RandomState(seed).randint(0, CFG.vocab_size, (b, t)).astype(np.int32)


PROGRAMS = [[0, 1, 2, 3], [3, 3, 1], [0, 1, 0, 1, 2], [1, 2, 3, 1, 2, 3, 0]]


def test_batch_equals_separate_forwards_and_compiles_once():
  params, toks = _params(), _tokens()
  mask = np.ones_like(toks)
  mask[1, :2] = 0
  traces = []

  @jax.jit
  def run(programs_NP):
    traces.append(1)
    return pg.forward_batch(params, toks, CFG, programs_NP, attention_mask_BT=mask, capture=("hidden_states",))

  length = 2 * CFG.n_layers
  got = run(pg.pad(PROGRAMS, length, CFG.n_layers))
  run(pg.pad([[1], [0] * 8, [3, 2, 1, 0], []], length, CFG.n_layers))
  assert len(traces) == 1, f"a new program set retraced ({len(traces)} traces)"
  for i, prog in enumerate(PROGRAMS):
    want = tfm_forward(params, toks, CFG, attention_mask_BT=mask, program=tuple(prog), capture=("hidden_states",))
    n = len(prog)
    np.testing.assert_allclose(got.logits[i], want.logits, atol=1e-4, rtol=1e-5)
    hs = np.asarray(got.hidden_states[i])
    np.testing.assert_allclose(hs[:n], want.hidden_states[:n], atol=1e-4, rtol=1e-5)
    np.testing.assert_allclose(hs[-1], want.hidden_states[n], atol=1e-4, rtol=1e-5)
    np.testing.assert_array_equal(hs[n:length], np.broadcast_to(hs[n], hs[n:length].shape))  # NOOP positions


def test_noops_anywhere_and_truncated_residual_is_a_hidden_state():
  params, toks = _params(), _tokens(seed=1)
  fwd = jax.jit(pg.forward, static_argnames=("cfg",))
  scattered = np.array([-1, 0, -1, 2, -1, -1], np.int32)
  np.testing.assert_allclose(fwd(params, toks, CFG, scattered).logits,
                             tfm_forward(params, toks, CFG, program=(0, 2)).logits, atol=1e-4, rtol=1e-5)
  plain = tfm_forward(params, toks, CFG, capture=("hidden_states",)).hidden_states
  for layer in range(CFG.n_layers):
    got = fwd(params, toks, CFG, pg.truncated(layer, CFG.n_layers)).residual
    np.testing.assert_allclose(got, plain[layer], atol=1e-4, rtol=1e-5)


def test_bad_programs_fail_clearly():
  with pytest.raises(ValueError, match="layer indices in \\[0, 4\\)"):
    pg.pad([[0, 4]], 4, 4)
  with pytest.raises(ValueError, match="more than the padded length 2"):
    pg.pad([[0, 1, 2]], 2, 4)
  with pytest.raises(ValueError, match="NOOP"):
    pg.forward(_params(), _tokens(), CFG, np.array([0, -2], np.int32))
  with pytest.raises(ValueError, match="unknown capture"):
    pg.forward(_params(), _tokens(), CFG, np.array([0], np.int32), capture=("attn_weights",))
  with pytest.raises(ValueError, match="no segment encoding"):
    pg.encode([1, 0], 4)
  with pytest.raises(ValueError, match="no segment encoding"):
    pg.encode([0, 0, 0], 4)  # three runs of a layer: REPEAT is twice only
  with pytest.raises(ValueError, match="must start at layer 2"):
    pg.decode([pg.Segment(0, 2, pg.KEEP), pg.Segment(3, 1, pg.KEEP)])
  with pytest.raises(ValueError, match="expected \\[0, 6\\)"):
    pg.decode([pg.Segment(0, 4, pg.KEEP)], 6)


def _all_segmentations(n_layers, max_pack=4):
  for k in range(1, n_layers + 1):
    for sizes in itertools.product(range(1, max_pack + 1), repeat=k):
      if sum(sizes) != n_layers:
        continue
      starts = np.cumsum((0,) + sizes[:-1])
      for ops in itertools.product((pg.SKIP, pg.KEEP, pg.REPEAT), repeat=k):
        yield tuple(pg.Segment(int(s), z, o) for s, z, o in zip(starts, sizes, ops))


def _key(segs):  # the documented order, written out again
  return (len(segs), sum(s.op == pg.SKIP for s in segs), -sum(s.op == pg.REPEAT for s in segs),
          [-s.size for s in segs])


@pytest.mark.parametrize("n_layers", [1, 3, 6])
def test_encoding_is_the_best_of_all_segmentations(n_layers):
  best = {}
  for segs in _all_segmentations(n_layers):
    prog = tuple(pg.decode(segs, n_layers))
    if prog not in best or _key(segs) < _key(best[prog]):
      best[prog] = segs
  for prog, segs in best.items():
    assert pg.encode(prog, n_layers) == segs, prog
  # with the segment count minimal, the op counts are fixed by the program
  for segs in _all_segmentations(n_layers):
    b = best[tuple(pg.decode(segs, n_layers))]
    if len(segs) == len(b):
      assert _key(segs)[:3] == _key(b)[:3]


def test_round_trip_on_random_programs():
  rng = np.random.default_rng(0)
  for _ in range(300):
    n_layers = int(rng.integers(1, 31))
    segs, cursor = [], 0
    while cursor < n_layers:
      size = int(rng.integers(1, min(4, n_layers - cursor) + 1))
      segs.append(pg.Segment(cursor, size, int(rng.integers(0, 3))))
      cursor += size
    prog = pg.decode(segs, n_layers)
    canon = pg.encode(prog, n_layers)
    assert pg.decode(canon, n_layers) == prog
    assert len(canon) <= len(segs)
    boundary, ops = pg.labels(canon, n_layers)
    assert pg.from_labels(boundary, ops) == canon
    assert boundary[0] == 0 and set(ops[boundary == 1]) <= {0, 1, 2}


def test_tie_breaks_on_hand_made_programs():
  S, K, R = pg.SKIP, pg.KEEP, pg.REPEAT
  seg = lambda *t: tuple(pg.Segment(*x) for x in t)
  # fewer segments: the full model is two packs of four, not eight singletons or 4+2+2
  assert pg.encode(range(8), 8) == seg((0, 4, K), (4, 4, K))
  # larger packs earlier: 6 kept layers are 4+2, not 2+4 or 3+3
  assert pg.encode(range(6), 6) == seg((0, 4, K), (4, 2, K))
  # skipped layers grouped: one SKIP of 4 between two KEEPs
  assert pg.encode([0, 1, 6, 7], 8) == seg((0, 2, K), (2, 4, S), (6, 2, K))
  # a loop of a whole pack is one REPEAT, a loop of single layers is one REPEAT each
  assert pg.encode([0, 1, 2, 3, 0, 1, 2, 3], 4) == seg((0, 4, R))
  assert pg.encode([0, 0, 1, 1], 2) == seg((0, 1, R), (1, 1, R))
  # the empty program over 5 layers: 4 + 1 skipped
  assert pg.encode([], 5) == seg((0, 4, S), (4, 1, S))
  boundary, ops = pg.labels(pg.encode([0, 1, 6, 7], 8), 8)
  assert boundary.tolist() == [0, 0, 1, 0, 0, 0, 1, 0]
  assert ops.tolist() == [K, pg.IGNORE, S, pg.IGNORE, pg.IGNORE, pg.IGNORE, K, pg.IGNORE]


def test_batched_gradient_flows_only_through_run_layers():
  params, toks = _params(), _tokens(b=1, t=5, seed=3)
  progs = pg.pad([[0, 2], [1]], 3, CFG.n_layers)
  grads = jax.jit(jax.grad(lambda p: jnp.sum(pg.forward_batch(p, toks, CFG, progs).logits ** 2)))(params)
  per_layer = np.asarray(jnp.abs(grads["layers"]["mlp"]["up"]["kernel"]).sum(axis=(1, 2)))
  assert (per_layer[[0, 1, 2]] > 0).all() and per_layer[3] == 0
