"""Multimodal LM: splice against a brute-force loop, prefix conditioning equal to the LM on the concatenated
embeddings, a non-ViT encoder through the same path, the LLaVA configuration, sharded == single device, and
logical axis names on every param."""
from math import erf

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab import sharding
from jaxlab.models import multimodal as mm
from jaxlab.models import transformer as tfm
from jaxlab.models import vit, vlm
from jaxlab.nn import axes

TEXT = tfm.PRESETS["tiny"]
FRAMES = mm.LinearFeatures(d_in=8, width=32, n_tokens=4)  # e.g. 4 frames of 8 features each
SPLICE = mm.Config(encoder=mm.LINEAR, encoder_cfg=FRAMES, text=TEXT, placeholder_id=5, modality="clip")
PREFIX = SPLICE.replace(mode="prefix", n_latents=3)


def _tokens(rs, per_row, length, placeholder):
  """Rows of `length` tokens holding each row's inputs' placeholders, each block before a distinct text token."""
  out = []
  for n in per_row:
    text = list(rs.randint(10, TEXT.vocab_size, length - n * FRAMES.n_tokens))
    row, prev = [], 0
    for cut in sorted(rs.choice(len(text), n, replace=False)):
      row += text[prev:cut] + [placeholder] * FRAMES.n_tokens
      prev = cut
    out.append(row + text[prev:])
  return np.asarray(out, np.int32)


def test_splice_matches_brute_force_loop():
  rs = np.random.RandomState(0)
  emb = rs.randn(3, 11, 4).astype(np.float32)
  toks = rs.randint(0, 9, (3, 11)).astype(np.int32)
  toks[toks == 7] = 0
  toks[0, [1, 2, 7]] = 7
  toks[2, [0, 4, 5, 10]] = 7
  feats = rs.randn(7, 1, 4).astype(np.float32)
  want, k = emb.copy(), 0
  for b in range(3):
    for t in range(11):
      if toks[b, t] == 7:
        want[b, t] = feats[k, 0]
        k += 1
  got = mm.splice(jnp.asarray(emb), jnp.asarray(toks), jnp.asarray(feats), 7)
  np.testing.assert_array_equal(np.asarray(got), want)


@pytest.fixture(scope="module")
def splice_params():
  return mm.init(SPLICE, jax.random.key(0))


@pytest.fixture(scope="module")
def prefix_params():
  return mm.init(PREFIX, jax.random.key(1))


def test_linear_encoder_splices_like_llava(splice_params):
  rs = np.random.RandomState(1)
  toks = _tokens(rs, (1, 2), 20, SPLICE.placeholder_id)
  clips = rs.randn(3, FRAMES.n_tokens, FRAMES.d_in).astype(np.float32)
  out = jax.jit(mm.forward, static_argnames=("cfg", "capture"))(splice_params, toks, clips, cfg=SPLICE,
                                                                 capture=("hidden_states",))
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), splice_params)
  f = clips @ p["encoder"]["proj"]["kernel"] + p["encoder"]["proj"]["bias"]
  gelu = lambda x: 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))
  c = p["connector"]
  want = gelu(f @ c["fc1"]["kernel"] + c["fc1"]["bias"]) @ c["fc2"]["kernel"] + c["fc2"]["bias"]
  np.testing.assert_allclose(np.asarray(out.features), want, atol=1e-5, rtol=0)
  mask = toks == SPLICE.placeholder_id
  np.testing.assert_array_equal(np.asarray(out.feature_mask_BT), mask)
  h0 = np.asarray(out.lm.hidden_states[0])
  np.testing.assert_array_equal(h0[mask], np.asarray(out.features).reshape(-1, TEXT.d_model))
  ref = tfm.forward(splice_params["lm"], toks, TEXT, inputs_embeds_BTD=out.lm.hidden_states[0]).logits
  np.testing.assert_array_equal(np.asarray(out.logits), np.asarray(ref))
  with pytest.raises(ValueError, match=r"2 clips need 8 clip tokens \(4 each, id 5\); the tokens hold 12"):
    mm.forward(splice_params, toks, clips[:2], SPLICE)
  with pytest.raises(ValueError, match=r"inputs must be \[B, 4, 8\]"):
    mm.forward(splice_params, toks, clips[:, :, :3], SPLICE)


def test_prefix_equals_lm_on_concatenated_embeddings(prefix_params):
  rs = np.random.RandomState(2)
  toks = rs.randint(10, TEXT.vocab_size, (2, 9)).astype(np.int32)
  mask = np.ones((2, 9), np.int32)
  mask[1, :3] = 0  # left padding
  clips = rs.randn(2, FRAMES.n_tokens, FRAMES.d_in).astype(np.float32)
  out = mm.forward(prefix_params, toks, clips, PREFIX, attention_mask_BT=mask)
  k = PREFIX.n_latents + FRAMES.n_tokens
  assert out.n_prefix == k and out.logits.shape == (2, k + 9, TEXT.vocab_size)
  feats = mm.encode(prefix_params, clips, PREFIX)
  lat = jnp.concatenate([jnp.broadcast_to(prefix_params["latents"], (2, 3, TEXT.d_model)), feats], axis=1)
  emb = prefix_params["lm"]["embed"]["embedding"][toks]
  cat = jnp.concatenate([lat, emb], axis=1)
  cat_mask = np.concatenate([np.ones((2, k), np.int32), mask], axis=1)
  want = tfm.forward(prefix_params["lm"], np.zeros((2, k + 9), np.int32), TEXT, inputs_embeds_BTD=cat,
                     attention_mask_BT=cat_mask).logits
  np.testing.assert_array_equal(np.asarray(out.logits), np.asarray(want))
  np.testing.assert_array_equal(np.asarray(out.feature_mask_BT), np.arange(k + 9)[None].repeat(2, 0) < k)
  # explicit positions: latents 0..K-1, the text's shifted by K (the default for unpadded rows)
  pos = np.broadcast_to(np.arange(9), (2, 9))
  a = mm.forward(prefix_params, toks, clips, PREFIX, positions_BT=pos).logits
  b = mm.forward(prefix_params, toks, clips, PREFIX).logits
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  pre = mm.prefix(emb, lat, mask, pos)
  np.testing.assert_array_equal(np.asarray(pre.positions_BT[:, :k]), np.broadcast_to(np.arange(k), (2, k)))
  np.testing.assert_array_equal(np.asarray(pre.positions_BT[:, k:]), pos + k)
  # learned latents alone (no encoder input)
  only = mm.forward(prefix_params, toks, None, PREFIX)
  assert only.n_prefix == 3 and only.features is None


def test_vlm_is_the_vit_configuration():
  cfg = vlm.Config()
  m = cfg.multimodal
  assert m.encoder is mm.VIT and m.placeholder_id == cfg.image_token_id and m.tokens_per_input == 16
  params = vlm.init(cfg, jax.random.key(0))
  p = mm.init(m, jax.random.key(0))
  jax.tree.map(np.testing.assert_array_equal, params, {"vision": p["encoder"], "connector": p["connector"],
                                                       "lm": p["lm"]})
  px = np.random.RandomState(0).rand(1, 32, 32, 3).astype(np.float32)
  f = mm.vit_features(params["vision"], px, m.encoder_cfg)
  hs = vit.forward(params["vision"], px, cfg.vision, capture=("hidden_states",)).hidden_states
  np.testing.assert_array_equal(np.asarray(f), np.asarray(hs[-2][:, 1:]))
  with pytest.raises(ValueError, match="mode must be one of"):
    m.replace(mode="cross")
  with pytest.raises(ValueError, match="n_latents must be >= 0, and 0 unless mode='prefix'"):
    m.replace(n_latents=2)
  with pytest.raises(ValueError, match="unknown capture"):
    vit.forward(params["vision"], px, cfg.vision, capture=("hidden_state",))


def test_every_param_has_logical_axes(splice_params, prefix_params):
  for cfg, params in ((SPLICE, splice_params), (PREFIX, prefix_params)):
    names = axes.logical_axes(params, mm.axis_rules(cfg))
    for (path, x), n in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(
        names, is_leaf=lambda v: isinstance(v, tuple))):
      assert len(n) == x.ndim, (axes.path_str(path), n, x.shape)
    sharding.param_specs(params, "fsdp_tp", axes=mm.axis_rules(cfg))
  names = axes.logical_axes(prefix_params, mm.axis_rules(PREFIX))
  assert names["latents"] == ("pos", "embed")
  assert names["encoder"]["proj"]["kernel"] == ("patch", "embed")
  assert names["connector"]["fc2"]["kernel"] == ("mlp", "embed")


@pytest.mark.parametrize("spec,rules", [("fsdp:4,tensor:2", "fsdp_tp"), ("data:2,fsdp:2,tensor:2", "fsdp_tp")])
def test_sharded_equals_single_device(prefix_params, splice_params, spec, rules):
  rs = np.random.RandomState(3)
  toks = _tokens(rs, (1,) * 8, 12, SPLICE.placeholder_id)
  clips = rs.randn(8, FRAMES.n_tokens, FRAMES.d_in).astype(np.float32)
  mesh = sharding.make_mesh(spec)
  for cfg, params in ((SPLICE, splice_params), (PREFIX, prefix_params)):
    fn = jax.jit(lambda p, t, x, cfg=cfg: mm.forward(p, t, x, cfg).logits)
    single = fn(params, jnp.asarray(toks), jnp.asarray(clips))
    sp = sharding.shard_params(params, mesh, rules, axes=mm.axis_rules(cfg))
    fc1 = sp["connector"]["fc1"]["kernel"]
    assert fc1.addressable_shards[0].data.size < fc1.size
    batch = sharding.shard_batch({"t": toks, "x": clips}, mesh)
    multi = fn(sp, batch["t"], batch["x"])
    np.testing.assert_allclose(np.asarray(multi), np.asarray(single), atol=2e-5)
