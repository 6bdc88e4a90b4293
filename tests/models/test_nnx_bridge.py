"""jaxlab.models.nnx_bridge: a Flax `nnx.Optimizer` step equals jaxlab's own train step; params round-trip exactly.

The oracle for training is `jaxlab.train` (`init_state`, `make_train_step` with `lm_loss_fn`) on the same batch
and optimizer; forwards are compared with the jaxlab model's own `forward` on the same arrays.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen, nnx
from jax.sharding import PartitionSpec

from jaxlab import hf, losses
from jaxlab import sharding as shd
from jaxlab import train
from jaxlab.models import encoder, nnx_bridge, vit
from jaxlab.models import transformer as tfm
from jaxlab.nn import axes

CFG = tfm.Config.tiny()


def _batch(key, b=4, t=16, vocab=CFG.vocab_size):
  seq = jax.random.randint(key, (b, t + 1), 0, vocab)
  # Half the targets masked out: the loss is a mean over kept tokens. Their count is a power of two, so dividing
  # by it before autodiff (here) or after (jaxlab's step) rounds the same; Adam would amplify any difference in
  # near-zero gradients.
  mask = jnp.ones((b, t), jnp.float32).at[:, : t // 2].set(0.0)
  return {"inputs": seq[:, :-1], "targets": seq[:, 1:], "loss_mask": mask}


def _nnx_loss(model, batch):
  logits = model(batch["inputs"]).logits
  s, w = losses.next_token_nll(logits, batch["targets"], batch["loss_mask"])
  return s / w


@nnx.jit
def _nnx_step(model, optimizer, batch):
  loss, grads = nnx.value_and_grad(_nnx_loss)(model, batch)
  optimizer.update(model, grads)
  return loss


def _assert_same_tree(a, b, exact=True):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.shape == y.shape and x.dtype == y.dtype
    if exact:
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    else:
      np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=2e-6)


def test_optimizer_steps_match_jaxlab_train_step():
  tx = optax.adamw(1e-2, weight_decay=0.1)
  state = train.init_state(lambda k: tfm.init(CFG, k), tx, seed=0)
  model = nnx_bridge.decoder(CFG, params=state.params)
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  step = jax.jit(train.make_train_step(train.lm_loss_fn(CFG), tx))  # no donation: the model shares the arrays
  start = state.params
  for i in range(2):
    batch = _batch(jax.random.key(10 + i))
    state, metrics = step(state, batch)
    loss = _nnx_step(model, optimizer, batch)
    np.testing.assert_allclose(float(loss), float(metrics["loss"]), rtol=1e-6)
    _assert_same_tree(nnx_bridge.to_params(model), state.params, exact=False)
  moved = jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), start, state.params))
  assert min(moved) > 1e-3  # every leaf was updated, so the comparison above is not vacuous
  assert int(optimizer.step[...]) == int(state.step) == 2


def test_round_trip_is_identity():
  params = tfm.init(CFG, jax.random.key(1))
  model = nnx_bridge.from_params(params, tfm.forward, CFG, tfm.AXES)
  back = nnx_bridge.to_params(model)
  _assert_same_tree(back, params)
  assert all(a is b for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)))  # wrapped, not copied
  graphdef, state = nnx.split(model)
  _assert_same_tree(nnx_bridge.to_params(state), params)
  _assert_same_tree(nnx_bridge.to_params(nnx.merge(graphdef, state)), params)


def test_hf_loaded_params(tmp_path):
  params = tfm.init(CFG, jax.random.key(2))
  hf.save(str(tmp_path), CFG, params)
  cfg, loaded = hf.load(str(tmp_path))
  model = nnx_bridge.decoder(cfg, params=loaded)
  _assert_same_tree(nnx_bridge.to_params(model), loaded)
  tokens = _batch(jax.random.key(3))["inputs"]
  np.testing.assert_array_equal(model(tokens).logits, tfm.forward(loaded, tokens, cfg).logits)


def test_forward_equals_model_forward():
  params = tfm.init(CFG, jax.random.key(4))
  model = nnx_bridge.decoder(CFG, params=params)
  tokens = _batch(jax.random.key(5))["inputs"]
  np.testing.assert_array_equal(model(tokens).logits, tfm.forward(params, tokens, CFG).logits)
  pad = jnp.ones(tokens.shape, jnp.int32).at[0, :3].set(0)
  got = model(tokens, attention_mask_BT=pad, capture=("hidden_states",))
  want = tfm.forward(params, tokens, CFG, attention_mask_BT=pad, capture=("hidden_states",))
  np.testing.assert_array_equal(got.logits, want.logits)
  np.testing.assert_array_equal(got.hidden_states, want.hidden_states)


@pytest.mark.parametrize("family", ["encoder", "vit"])
def test_generic_over_model_families(family):
  mod, cfg = (encoder, encoder.Config.tiny()) if family == "encoder" else (vit, vit.Config.tiny())
  model = nnx_bridge.create(mod.init, mod.forward, cfg, jax.random.key(6), mod.AXES)
  params = nnx_bridge.to_params(model)
  _assert_same_tree(params, mod.init(cfg, jax.random.key(6)))
  if family == "encoder":
    x = jax.random.randint(jax.random.key(7), (2, 12), 0, cfg.vocab_size)
  else:
    x = jax.random.normal(jax.random.key(7), (2, cfg.image_size, cfg.image_size, 3))
  for got, want in zip(jax.tree.leaves(model(x)), jax.tree.leaves(mod.forward(params, x, cfg))):
    np.testing.assert_array_equal(got, want)


def test_split_and_jit():
  params = tfm.init(CFG, jax.random.key(8))
  model = nnx_bridge.decoder(CFG, params=params)
  graphdef, state = nnx.split(model)
  leaves = jax.tree.leaves(state)  # Param values are the leaves: the param arrays themselves
  assert len(leaves) == len(jax.tree.leaves(params))
  assert all(a is b for a, b in zip(leaves, jax.tree.leaves(params)))
  assert all(isinstance(v, nnx.Param) for v in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable)))

  tokens = _batch(jax.random.key(9))["inputs"]
  want = jax.jit(lambda p, t: tfm.forward(p, t, CFG).logits)(params, tokens)
  np.testing.assert_array_equal(nnx.jit(lambda m, t: m(t).logits)(model, tokens), want)
  _assert_same_tree(nnx_bridge.to_params(model), params)  # a forward leaves the params as they were
  apply = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t).logits)  # the functional (jax.jit) way
  np.testing.assert_array_equal(apply(state, tokens), want)


def test_logical_axes_and_sharding():
  params = tfm.init(CFG, jax.random.key(11))
  model = nnx_bridge.decoder(CFG, params=params)
  specs = nnx.get_partition_spec(nnx.state(model))
  names = jax.tree.map(tuple, nnx_bridge.to_params(specs), is_leaf=lambda x: isinstance(x, PartitionSpec))
  assert names == axes.logical_axes(params, tfm.AXES)
  with linen.logical_axis_rules(shd.RULES["tp"]):  # Flax's own mapping of the names
    q_spec = nnx.get_partition_spec(nnx.state(model))["params"]["layers"]["attn"]["q"]["kernel"].get_value()
  assert tuple(q_spec) == (None, None, "tensor")

  mesh = shd.make_mesh("fsdp:4,tensor:2")
  nnx_bridge.shard(model, mesh, "fsdp_tp")
  want = shd.param_shardings(params, mesh, "fsdp_tp", axes=tfm.AXES)
  got = jax.tree.map(lambda x: x.sharding, nnx_bridge.to_params(model))
  assert jax.tree.leaves(got) == jax.tree.leaves(want)
  _assert_same_tree(nnx_bridge.to_params(model), params)

  tx = optax.adamw(1e-2)
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  batch = shd.shard_batch(_batch(jax.random.key(12), b=8), mesh)
  state = train.place(train.create(params, tx), mesh, "fsdp_tp", axes=tfm.AXES)  # the oracle: jaxlab's step
  ref = train.jit_train_step(train.make_train_step(train.lm_loss_fn(CFG), tx), state, mesh, "fsdp_tp",
                             axes=tfm.AXES)
  state, metrics = ref(state, batch)
  np.testing.assert_allclose(float(_nnx_step(model, optimizer, batch)), float(metrics["loss"]), rtol=1e-5)
  got = nnx_bridge.to_params(model)
  assert jax.tree.leaves(jax.tree.map(lambda x: x.sharding, got)) == jax.tree.leaves(want)
  _assert_same_tree(got, state.params, exact=False)


def test_errors():
  with pytest.raises(ValueError, match="needs a key"):
    nnx_bridge.decoder(CFG)
  with pytest.raises(TypeError, match="param dict"):
    nnx_bridge.Model([jnp.zeros(3)], tfm.forward, CFG)
  with pytest.raises(TypeError, match="Model or its nnx.State"):
    nnx_bridge.to_params({"embed": {}})
