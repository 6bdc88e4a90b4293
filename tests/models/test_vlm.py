"""LLaVA-style VLM: splicing image features into the token sequence, the encoder -> connector path, config checks,
and connector-only training (the LatentLens recipe: encoder and LM frozen)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlab import losses as losses_lib, sharding
from jaxlab.models import transformer as tfm
from jaxlab.models import vit, vlm
from jaxlab.nn import axes
from jaxlab.train import state as state_lib
from jaxlab.train import step as step_lib

CFG = vlm.Config()
P = CFG.tokens_per_image
forward = jax.jit(vlm.forward, static_argnames=("cfg", "capture"))


@pytest.fixture(scope="module")
def params():
  return jax.jit(vlm.init, static_argnums=0)(CFG, jax.random.key(0))


def make_batch(seed=0, images_per_row=(1, 2), length=45):
  rs = np.random.RandomState(seed)
  rows = []
  for n in images_per_row:  # each image before a distinct text token, so the last token is always text
    text = list(rs.randint(10, CFG.text.vocab_size, length - n * P))
    row, prev = [], 0
    for cut in sorted(rs.choice(len(text), n, replace=False)):
      row += text[prev:cut] + [CFG.image_token_id] * P
      prev = cut
    rows.append(row + text[prev:])
  px = rs.rand(sum(images_per_row), CFG.vision.image_size, CFG.vision.image_size, 3).astype(np.float32)
  return np.asarray(rows, np.int32), px


def test_splice_matches_row_major_loop():
  rs = np.random.RandomState(0)
  emb = rs.randn(3, 11, 4).astype(np.float32)
  mask = np.zeros((3, 11), bool)
  mask[0, [1, 2, 7]] = True
  mask[2, [0, 4, 5, 10]] = True
  feats = rs.randn(7, 4).astype(np.float32).reshape(7, 1, 4)
  want, k = emb.copy(), 0
  for b in range(3):
    for t in range(11):
      if mask[b, t]:
        want[b, t] = feats[k, 0]
        k += 1
  np.testing.assert_array_equal(np.asarray(vlm.splice(jnp.asarray(emb), jnp.asarray(mask), jnp.asarray(feats))), want)


def _gelu(x):
  from math import erf
  return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))


def test_image_features_are_connector_of_penultimate_patch_states(params):
  _, px = make_batch()
  run = jax.jit(lambda p, x: vit.forward(p, x, CFG.vision, capture=("hidden_states",)).hidden_states)
  hs = run(params["vision"], px)
  f = np.asarray(hs[-2][:, 1:], np.float64)  # feature layer -2, class token dropped
  c = jax.tree.map(lambda a: np.asarray(a, np.float64), params["connector"])
  want = _gelu(f @ c["fc1"]["kernel"] + c["fc1"]["bias"]) @ c["fc2"]["kernel"] + c["fc2"]["bias"]
  got = jax.jit(vlm.encode_images, static_argnums=2)(params, px, CFG)
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=0)


def test_spliced_sequence_enters_the_lm(params):
  toks, px = make_batch(1)
  out = forward(params, toks, px, cfg=CFG, capture=("hidden_states",))
  mask = toks == CFG.image_token_id
  np.testing.assert_array_equal(np.asarray(out.image_mask_BT), mask)
  h0 = np.asarray(out.lm.hidden_states[0])
  np.testing.assert_allclose(h0[mask], np.asarray(out.image_features).reshape(-1, CFG.text.d_model), atol=1e-6)
  emb = np.asarray(params["lm"]["embed"]["embedding"])[toks]
  np.testing.assert_array_equal(h0[~mask], emb[~mask])
  for b, pos in enumerate(vlm.image_positions(toks, CFG)):
    np.testing.assert_array_equal(pos, np.flatnonzero(mask[b]))
  # the same embeddings given to the decoder directly give the same logits
  ref = tfm.forward(params["lm"], toks, CFG.text, inputs_embeds_BTD=out.lm.hidden_states[0]).logits
  np.testing.assert_allclose(np.asarray(out.logits), np.asarray(ref), atol=1e-5, rtol=0)


def test_text_only_equals_decoder(params):
  toks = np.random.RandomState(2).randint(10, 200, (2, 9)).astype(np.int32)
  got = forward(params, toks, None, cfg=CFG).logits
  want = tfm.forward(params["lm"], toks, CFG.text).logits
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6, rtol=0)


def test_image_token_count_is_checked(params):
  toks, px = make_batch()
  with pytest.raises(ValueError, match=r"4 images need 64 image tokens \(16 each, id 3\); the tokens hold 48"):
    vlm.forward(params, toks, np.concatenate([px, px[:1]]), CFG)


def test_config_validation():
  with pytest.raises(ValueError, match="has none; use 'full'"):
    vlm.Config(vision=vit.Config.tiny("siglip"))
  with pytest.raises(ValueError, match=r"feature_layers .* in \[-3, 2\], found \(3,\)"):
    vlm.Config(feature_layers=(3,))
  with pytest.raises(ValueError, match="image_token_id"):
    vlm.Config(image_token_id=256)
  reg = vlm.Config(vision=vit.Config.tiny("dinov2", n_registers=2), feature_layers=-1)
  assert reg.feature_layers == (-1,) and reg.tokens_per_image == 2 + 16 and reg.vision_layers_used == 2
  assert vlm.Config(vision=vit.Config.tiny("siglip"), feature_select="full").tokens_per_image == 16


def test_params_have_logical_axes_and_shard(params):
  names = axes.logical_axes(params, vlm.AXES)
  assert names["connector"]["fc1"]["kernel"] == ("embed", "mlp")
  assert names["vision"]["layers"]["attn"]["q"]["kernel"] == ("layers", "embed", "q_heads")
  assert names["vision"]["patch_embed"]["kernel"] == ("embed", "patch", "patch", "patch")
  assert names["vision"]["pos_embed"] == ("pos", "embed")
  dino = jax.eval_shape(lambda: vit.init(vit.Config.tiny("dinov2", n_registers=2), jax.random.key(0)))
  assert axes.logical_axes(dino, vit.AXES)["cls_token"] == ("layers", "layers", "embed")
  for tree, rules in ((params, vlm.AXES), (dino, vit.AXES)):
    sharding.param_specs(tree, "fsdp_tp", axes=rules)  # every name has a rule and no two dims share a mesh axis


def test_connector_only_training_changes_only_the_connector(params):
  tx = vlm.connector_only(optax.adam(1e-2))
  st = state_lib.create(params, tx)
  mask = vlm.connector_mask(params)
  assert all(jax.tree.leaves(mask["connector"])) and not any(jax.tree.leaves(mask["vision"]))
  assert not any(jax.tree.leaves(mask["lm"]))
  n_conn = len(jax.tree.leaves(params["connector"]))
  assert sum(x.size > 1 for x in jax.tree.leaves(st.opt_state)) == 2 * n_conn  # Adam moments: connector only
  toks, px = make_batch(3)
  batch = {"inputs": toks[:, :-1], "targets": toks[:, 1:], "pixels": px}
  step = jax.jit(step_lib.make_train_step(losses_lib.vlm_loss_fn(CFG, freeze=True), tx))
  losses = []
  new = st
  for _ in range(4):
    new, m = step(new, batch)
    losses.append(float(m["loss"]))
  for path, (a, b) in zip(step_lib.leaf_paths(params), zip(jax.tree.leaves(params), jax.tree.leaves(new.params))):
    if path.startswith("connector/"):
      assert not np.array_equal(np.asarray(a), np.asarray(b)), path
    else:
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=path)
  assert losses[-1] < losses[0]


def test_frozen_loss_gives_the_connector_gradient_only(params):
  toks, px = make_batch(4, images_per_row=(1, 1), length=24)
  batch = {"inputs": toks[:, :-1], "targets": toks[:, 1:], "pixels": px}
  mean = lambda f: lambda p: (lambda s, w, _: s / w)(*f(p, batch, None))
  full = jax.jit(jax.grad(mean(losses_lib.vlm_loss_fn(CFG))))(params)
  frozen = jax.jit(jax.grad(mean(losses_lib.vlm_loss_fn(CFG, freeze=True))))(params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5),
               frozen["connector"], full["connector"])
  for k in ("vision", "lm"):
    assert all(not np.any(np.asarray(g)) for g in jax.tree.leaves(frozen[k]))
    assert any(np.any(np.asarray(g)) for g in jax.tree.leaves(full[k]))
