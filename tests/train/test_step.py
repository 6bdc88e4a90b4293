"""Train step: loss oracle, sharded == single device, accumulation == full batch, mixed precision, guard."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlab import sharding as shd
from jaxlab.models import transformer as tfm
from jaxlab.train import state as st
from jaxlab.train import step as sp

CFG = tfm.Config.tiny()
B, T = 8, 16


def _batch(seed=0, ragged=True):
  rng = np.random.default_rng(seed)
  toks = rng.integers(0, CFG.vocab_size, (B, T + 1)).astype(np.int32)
  mask = np.ones((B, T), np.int32)
  seg = np.ones((B, T), np.int32)
  pos = np.tile(np.arange(T, dtype=np.int32), (B, 1))
  if ragged:  # rows with different numbers of loss tokens and two packed documents in some rows
    for b in range(B):
      mask[b, T - b:] = 0
      if b % 2:
        seg[b, 7:] = 2
        pos[b, 7:] = np.arange(T - 7)
  return {"inputs": toks[:, :-1], "targets": toks[:, 1:], "loss_mask": mask, "segment_ids": seg, "positions": pos}


def _tx(opt="adamw"):
  if opt == "sgd":  # params - gradient: states after one step differ exactly as the gradients do
    return optax.sgd(1.0)
  return optax.adamw(1e-3, eps=1e-6, weight_decay=0.1)  # eps keeps near-zero gradients from amplifying rounding


def _host(tree):
  return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)


@functools.lru_cache(maxsize=None)
def _one_step(spec=None, rules="dp", microbatches=1, opt="adamw"):
  """(host state, host metrics, live state) after one step from the same init on the same batch."""
  cfg, batch = CFG, None
  mesh = shd.make_mesh(spec) if spec else None
  tx = _tx(opt)
  state = st.init_state(lambda k: tfm.init(cfg, k), tx, seed=0, mesh=mesh, rules=rules, axes=tfm.AXES)
  fn = sp.make_train_step(sp.lm_loss_fn(cfg), tx, microbatches=microbatches, mesh=mesh)
  step = sp.jit_train_step(fn, state, mesh, rules, axes=tfm.AXES)
  batch = _batch()
  placed = shd.shard_batch(batch, mesh) if mesh is not None else batch
  new, m = step(state, placed)
  return _host(new), _host(m), new


def test_next_token_nll_matches_numpy():
  rng = np.random.default_rng(1)
  logits = rng.standard_normal((2, 5, 7)).astype(np.float32) * 3
  tgt = rng.integers(0, 7, (2, 5))
  mask = rng.integers(0, 2, (2, 5))
  s, w = sp.next_token_nll(jnp.asarray(logits), jnp.asarray(tgt), jnp.asarray(mask))
  z = logits.astype(np.float64)
  logp = z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) - z.max(-1, keepdims=True)
  want = -(np.take_along_axis(logp, tgt[..., None], -1)[..., 0] * mask).sum()
  np.testing.assert_allclose(float(s), want, rtol=1e-6)
  assert float(w) == mask.sum()


def test_document_mask_isolates_packed_documents():
  """With segment ids, the second document's loss equals running it alone from position 0."""
  params = tfm.init(CFG, jax.random.PRNGKey(0))
  batch = _batch()
  row = {k: v[1:2] for k, v in batch.items()}
  seg = row["segment_ids"]
  kw = dict(attn_mask_BTS=jnp.asarray(seg[:, :, None] == seg[:, None, :]), positions_BT=jnp.asarray(row["positions"]))
  logits_packed = tfm.forward(params, jnp.asarray(row["inputs"]), CFG, **kw).logits[0, 7:]
  alone = tfm.forward(params, jnp.asarray(row["inputs"][:, 7:]), CFG).logits[0]
  np.testing.assert_allclose(np.asarray(logits_packed), np.asarray(alone), atol=1e-5)
  s, _, _ = jax.jit(sp.lm_loss_fn(CFG))(params, {k: jnp.asarray(v) for k, v in row.items()}, None)
  first = tfm.forward(params, jnp.asarray(row["inputs"][:, :7]), CFG).logits[0]
  want_s, _ = sp.next_token_nll(jnp.concatenate([first, alone])[None], jnp.asarray(row["targets"]),
                                jnp.asarray(row["loss_mask"]))
  np.testing.assert_allclose(float(s), float(want_s), rtol=1e-5)


@pytest.fixture(scope="module")
def single():
  return _one_step()


@pytest.mark.parametrize("spec,rules", [("data:8", "dp"), ("fsdp:4,tensor:2", "fsdp_tp"),
                                        ("data:2,fsdp:2,tensor:2", "fsdp_tp")])
def test_sharded_step_matches_single_device(single, spec, rules):
  params1, m1, _ = single
  params8, m8, live = _one_step(spec, rules)
  assert abs(float(m8["loss"]) - float(m1["loss"])) < 1e-5
  np.testing.assert_allclose(m8["grad_norm"], m1["grad_norm"], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), params8.params, params1.params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), params8.opt_state, params1.opt_state)
  if "tensor" in spec:  # really sharded: the q projection is split over "tensor"
    q = live.params["layers"]["attn"]["q"]["kernel"]
    assert q.sharding.spec[-1] == "tensor", q.sharding.spec
    assert q.addressable_shards[0].data.size < q.size


# Accumulation is a property of the gradient, so these compare SGD(lr 1) steps: Adam's first step divides each
# gradient by its own magnitude, which turns 1e-9 rounding in a near-zero entry into a 1e-6 parameter difference.
@pytest.mark.parametrize("spec,rules", [(None, "dp"), ("data:2,fsdp:2,tensor:2", "fsdp_tp")])
def test_grad_accumulation_equals_full_batch(spec, rules):
  p_full, m_full, _ = _one_step(spec, rules, opt="sgd")
  p_acc, m_acc, _ = _one_step(spec, rules, microbatches=2, opt="sgd")
  assert float(m_acc["weight"]) == float(m_full["weight"]) == _batch()["loss_mask"].sum()
  np.testing.assert_allclose(m_acc["loss"], m_full["loss"], rtol=1e-6)
  np.testing.assert_allclose(m_acc["grad_norm"], m_full["grad_norm"], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), p_acc.params, p_full.params)


def test_mixed_precision_keeps_fp32_master_params(single):
  params1, m1, _ = single
  cfg = CFG.replace(dtype="bfloat16")
  tx = _tx()
  state = st.init_state(lambda k: tfm.init(cfg, k), tx, seed=0)
  seen = []

  def loss_fn(p, b, r):
    seen.append({jnp.dtype(x.dtype).name for x in jax.tree.leaves(p)})
    return sp.lm_loss_fn(cfg)(p, b, r)
  step = sp.jit_train_step(sp.make_train_step(loss_fn, tx, compute_dtype=cfg.dtype))
  new, m = step(state, _batch())
  assert seen[0] == {"bfloat16"}
  assert {x.dtype for x in jax.tree.leaves(new.params)} == {jnp.dtype("float32")}
  assert abs(float(m["loss"]) - float(m1["loss"])) < 0.05  # same init, bf16 rounding only
  moved = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - b))), new.params, params1.params)
  assert max(jax.tree.leaves(moved)) < 2e-3  # one Adam step of size ~lr in the same direction


def test_nonfinite_step_keeps_state_and_flags_leaf():
  params = {"a": jnp.ones(3), "b": jnp.zeros(2)}

  def loss_fn(p, batch, rng):
    return jnp.sum(p["a"] * batch["x"]) + jnp.sum(jnp.sqrt(p["b"])), jnp.float32(1), {}
  tx = optax.sgd(0.1)
  state = st.create(params, tx)
  step = jax.jit(sp.make_train_step(loss_fn, tx))
  new, m = step(state, {"x": jnp.ones(3)})
  assert not bool(m["finite"]) and np.isfinite(m["loss"])
  assert list(m["finite_leaves"]) == [True, False]
  assert sp.leaf_paths(params) == ["a", "b"]
  assert int(new.step) == 0
  np.testing.assert_array_equal(new.params["a"], params["a"])
