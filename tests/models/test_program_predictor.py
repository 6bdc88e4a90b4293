"""jaxlab/models/program_predictor.py: the forward equals a NumPy transcription of the reference's modules
(MultiheadAttention cross-attention, post-norm TransformerEncoderLayer with ReLU), the loss equals a NumPy
BCE + CE, beam decoding equals a brute-force ranking of every op assignment, training on a fixed batch lowers
the loss until the decoded programs are the targets, sharded == single device, axes on every param, errors."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab import sharding
from jaxlab.models import program_predictor as pp
from jaxlab.models import programs

CFG = pp.PRESETS["tiny"]


def _np(params):
  return jax.tree.map(lambda a: np.asarray(a, np.float64), params)


def _ln(p, x, eps):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _mha(p, q, kv, mask, h):
  lin = lambda w, x: x @ w["kernel"] + w["bias"]
  b, lq, d = q.shape
  split = lambda x: x.reshape(b, x.shape[1], h, d // h).transpose(0, 2, 1, 3)
  qh, kh, vh = split(lin(p["q"], q)), split(lin(p["k"], kv)), split(lin(p["v"], kv))
  s = qh @ kh.transpose(0, 1, 3, 2) / np.sqrt(d // h)
  if mask is not None:
    s = np.where(mask[:, None, None, :] > 0, s, -np.inf)
  w = np.exp(s - s.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  return lin(p["o"], (w @ vh).transpose(0, 2, 1, 3).reshape(b, lq, d))


def numpy_forward(params, x_BTE, mask_BT, cfg):
  p = _np(params)
  feats = x_BTE @ p["in_proj"]["kernel"] + p["in_proj"]["bias"]
  x = _mha(p["cross"]["attn"], np.broadcast_to(p["layer_queries"], (len(x_BTE), *p["layer_queries"].shape)),
           feats, mask_BT, cfg.n_heads)
  for i in range(cfg.n_blocks):
    blk = jax.tree.map(lambda a, i=i: a[i], p["layers"])
    x = _ln(blk["attn_norm"], x + _mha(blk["attn"], x, x, None, cfg.n_heads), cfg.norm_eps)
    m = blk["mlp"]
    hid = np.maximum(x @ m["up"]["kernel"] + m["up"]["bias"], 0)
    x = _ln(blk["mlp_norm"], x + hid @ m["down"]["kernel"] + m["down"]["bias"], cfg.norm_eps)
  seg = (x @ p["seg_head"]["kernel"] + p["seg_head"]["bias"])[..., 0]
  return seg, x @ p["op_head"]["kernel"] + p["op_head"]["bias"]


def _inputs(b=3, t=5, seed=0):
  rs = np.random.RandomState(seed)
  x = rs.randn(b, t, CFG.d_in).astype(np.float32)
  mask = np.ones((b, t), np.int32)
  mask[1, 3:] = 0
  mask[2, 1:] = 0
  return x, mask


def _params(seed=1, std=0.3):
  return pp.init(CFG.replace(init_std=std), jax.random.key(seed))


def test_forward_matches_numpy_and_padding_is_ignored():
  params = _params()
  x, mask = _inputs()
  out = pp.forward(params, jnp.asarray(x), CFG, jnp.asarray(mask))
  seg, op = numpy_forward(params, x.astype(np.float64), mask, CFG)
  np.testing.assert_allclose(np.asarray(out.seg_logits_BL), seg, atol=1e-4)
  np.testing.assert_allclose(np.asarray(out.op_logits_BLO), op, atol=1e-4)
  x2 = x.copy()
  x2[1, 3:] += 5.0  # padded tokens change nothing
  out2 = pp.forward(params, jnp.asarray(x2), CFG, jnp.asarray(mask))
  np.testing.assert_allclose(np.asarray(out2.op_logits_BLO), np.asarray(out.op_logits_BLO), atol=1e-6)


def _targets(segs_list):
  lab = [programs.labels(s, CFG.n_layers) for s in segs_list]
  return np.stack([b for b, _ in lab]), np.stack([o for _, o in lab])


SEGS = [(programs.Segment(0, 2, programs.KEEP), programs.Segment(2, 2, programs.SKIP)),
        (programs.Segment(0, 1, programs.KEEP), programs.Segment(1, 3, programs.REPEAT)),
        (programs.Segment(0, 4, programs.KEEP),)]


def test_loss_matches_numpy_bce_plus_ce_with_weights():
  params = _params()
  x, mask = _inputs()
  b, o = _targets(SEGS)
  w = np.array([1.0, 0.3, 2.0], np.float32)
  got = float(pp.loss(params, jnp.asarray(x), jnp.asarray(mask), b, o, jnp.asarray(w), CFG))
  seg, op = numpy_forward(params, x.astype(np.float64), mask, CFG)
  per = []
  for i in range(3):
    pr = 1 / (1 + np.exp(-seg[i, 1:]))
    bce = -np.mean(b[i, 1:] * np.log(pr) + (1 - b[i, 1:]) * np.log(1 - pr))
    starts = np.nonzero(o[i] != programs.IGNORE)[0]
    logp = op[i] - np.log(np.exp(op[i]).sum(-1, keepdims=True))
    per.append(bce - np.mean([logp[s, o[i, s]] for s in starts]))
  want = np.mean(w / w.mean() * np.array(per))
  np.testing.assert_allclose(got, want, rtol=1e-4)


def _brute_decode(seg_logits, op_logits, threshold, max_pack, k, top_ops):
  segs = pp.segments_from_boundaries(1 / (1 + np.exp(-seg_logits)), threshold, max_pack)
  logp = op_logits - np.log(np.exp(op_logits).sum(-1, keepdims=True))
  allowed = [np.argsort(-logp[s])[:top_ops] for s, _ in segs]
  scored = []
  for ops in itertools.product(*allowed):
    scored.append((tuple(programs.Segment(s, z, int(o)) for (s, z), o in zip(segs, ops)),
                   sum(logp[s, o] for (s, _), o in zip(segs, ops))))
  return sorted(scored, key=lambda t: -t[1])[:k]


@pytest.mark.parametrize("seed,top_ops,max_pack", [(0, 2, 4), (1, 2, 2), (2, 3, 3)])
def test_beam_decode_equals_brute_force_top_k(seed, top_ops, max_pack):
  rs = np.random.RandomState(seed)
  n = 9
  seg, op = rs.randn(n) * 2, rs.randn(n, 3) * 2
  got = pp.beam_decode(seg, op, max_pack=max_pack, beam=5, top_ops=top_ops)
  want = _brute_decode(seg, op, 0.5, max_pack, 5, top_ops)
  assert [g[0] for g in got] == [w[0] for w in want]
  np.testing.assert_allclose([g[1] for g in got], [w[1] for w in want], rtol=1e-9)
  for segs, _ in got:  # every decoded program covers every layer in packs of <= max_pack
    assert all(s.size <= max_pack for s in segs) and len(programs.decode(segs, n)) >= 0


def test_training_lowers_the_loss_and_decodes_the_targets():
  import optax
  params = pp.init(CFG, jax.random.key(3))
  x, mask = _inputs(seed=4)
  b, o = _targets(SEGS)
  w = jnp.ones(3)
  opt = optax.adam(3e-3)
  state = opt.init(params)

  @jax.jit
  def step(params, state):
    val, g = jax.value_and_grad(pp.loss)(params, x, mask, b, o, w, CFG)
    upd, state = opt.update(g, state, params)
    return optax.apply_updates(params, upd), state, val

  losses = []
  for _ in range(300):
    params, state, val = step(params, state)
    losses.append(float(val))
  assert losses[-1] < 0.1 * losses[0]
  out = pp.forward(params, jnp.asarray(x), CFG, jnp.asarray(mask))
  for i, segs in enumerate(SEGS):
    top = pp.beam_decode(np.asarray(out.seg_logits_BL[i]), np.asarray(out.op_logits_BLO[i]), max_pack=4)
    assert top[0][0] == segs
    bnd = (np.asarray(out.seg_logits_BL[i]) > 0).astype(int)
    bnd[0] = 0
    assert programs.from_labels(bnd, np.asarray(out.op_logits_BLO[i]).argmax(-1)) == segs


def test_sharded_loss_equals_single_device():
  cfg = CFG.replace(d_model=64, n_heads=8)
  params = pp.init(cfg.replace(init_std=0.2), jax.random.key(5))
  x, mask = _inputs(b=8, seed=6)
  b, o = _targets([SEGS[i % 3] for i in range(8)])
  w = np.linspace(0.5, 1.5, 8).astype(np.float32)
  fn = jax.jit(lambda p, x, m, b, o, w: jax.value_and_grad(pp.loss)(p, x, m, b, o, w, cfg))
  single, g_single = fn(params, x, mask, b, o, w)
  mesh = sharding.make_mesh("fsdp:4,tensor:2")
  sp = sharding.shard_params(params, mesh, "fsdp_tp", axes=pp.AXES)
  up = sp["layers"]["mlp"]["up"]["kernel"]
  assert up.addressable_shards[0].data.size < up.size
  batch = sharding.shard_batch({"x": x, "m": mask, "b": b, "o": o, "w": w}, mesh)
  got, g_got = fn(sp, batch["x"], batch["m"], batch["b"], batch["o"], batch["w"])
  np.testing.assert_allclose(float(got), float(single), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(g_got["in_proj"]["kernel"]), np.asarray(g_single["in_proj"]["kernel"]),
                             atol=1e-6)


def test_axes_and_errors():
  names = pp.param_axes(CFG)
  assert names["layer_queries"] == ("pos", "embed") and names["op_head"]["kernel"] == ("embed", "classes")
  assert names["layers"]["attn"]["q"]["kernel"] == ("layers", "embed", "q_heads")
  assert len(jax.tree.leaves(names, is_leaf=lambda t: isinstance(t, tuple))) == len(jax.tree.leaves(_params()))
  with pytest.raises(ValueError, match=r"tokens_BTE must be \[B, T, 16\]") as e:
    pp.forward(_params(), jnp.zeros((1, 3, 8)), CFG)
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match="n_heads .3. must divide d_model .32."):
    CFG.replace(n_heads=3)
  with pytest.raises(ValueError, match=r"op logits \[L, 3\]"):
    pp.beam_decode(np.zeros(4), np.zeros((4, 2)))
