"""BERT-family encoder: padding invariance, pooling closed forms, jit == eager, remat, sharded == single device,
logical axes on every param, text batching, and clear errors on bad configs and inputs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab import sharding
from jaxlab.models import encoder
from jaxlab.nn import axes

CFG = encoder.Config.tiny(max_position_embeddings=32, type_vocab_size=3)
forward = jax.jit(encoder.forward, static_argnames=("cfg", "capture"))
sentence_embedding = jax.jit(encoder.sentence_embedding, static_argnames=("cfg", "pooling", "normalize"))


def _randomized(params, seed=1):
  """Norm scales around 1 and non-zero biases, so no path hides behind the init's 1s and 0s."""
  leaves, tree = jax.tree.flatten_with_path(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  out = []
  for (path, x), k in zip(leaves, keys):
    noise = 0.2 * jax.random.normal(k, x.shape, x.dtype)
    out.append(x + noise if axes.path_str(path).endswith(("scale", "bias")) else x)
  return jax.tree.unflatten(tree, out)


@pytest.fixture(scope="module")
def params():
  return _randomized(encoder.init(CFG, jax.random.key(0)))


def _batch(seed=0, b=4, t=11):
  rs = np.random.RandomState(seed)
  ids = rs.randint(1, CFG.vocab_size, (b, t)).astype(np.int32)
  lengths = rs.randint(2, t + 1, b)
  lengths[0] = t
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
  types = rs.randint(0, CFG.type_vocab_size, (b, t)).astype(np.int32)
  return ids, mask, types, lengths


def test_padding_does_not_change_real_tokens(params):
  ids, mask, types, lengths = _batch()
  out = forward(params, jnp.asarray(ids), CFG, mask_BT=jnp.asarray(mask), token_types_BT=jnp.asarray(types),
                capture=("hidden_states",))
  assert out.hidden_states.shape == (CFG.n_layers + 1, *ids.shape, CFG.d_model)
  np.testing.assert_array_equal(out.hidden_states[-1], out.last_hidden_state)
  for b, n in enumerate(lengths):
    alone = forward(params, jnp.asarray(ids[b:b + 1, :n]), CFG, token_types_BT=jnp.asarray(types[b:b + 1, :n]),
                    capture=("hidden_states",))
    np.testing.assert_allclose(out.hidden_states[:, b, :n], alone.hidden_states[:, 0], atol=1e-5)


def test_bidirectional_and_token_types_matter(params):
  ids, _, types, _ = _batch(b=1)
  base = np.asarray(forward(params, jnp.asarray(ids), CFG).last_hidden_state)
  later = ids.copy()
  later[0, -1] = (later[0, -1] % (CFG.vocab_size - 1)) + 1
  moved = np.asarray(forward(params, jnp.asarray(later), CFG).last_hidden_state)
  assert np.abs(moved[0, 0] - base[0, 0]).max() > 1e-3  # the first token sees the last one
  typed = np.asarray(forward(params, jnp.asarray(ids), CFG, token_types_BT=jnp.asarray(types)).last_hidden_state)
  assert np.abs(typed - base).max() > 1e-3


def test_pooling_closed_forms(params):
  ids, mask, types, _ = _batch(1)
  h = np.asarray(forward(params, jnp.asarray(ids), CFG, mask_BT=jnp.asarray(mask),
                         token_types_BT=jnp.asarray(types)).last_hidden_state)
  want_mean = (h * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
  for pooling, want in (("mean", want_mean), ("cls", h[:, 0])):
    raw = sentence_embedding(params, CFG, jnp.asarray(ids), jnp.asarray(mask), pooling, normalize=False,
                             token_types_BT=jnp.asarray(types))
    np.testing.assert_allclose(raw, want, rtol=1e-5, atol=1e-6)
    unit = sentence_embedding(params, CFG, jnp.asarray(ids), jnp.asarray(mask), pooling,
                              token_types_BT=jnp.asarray(types))
    np.testing.assert_allclose(unit, want / np.linalg.norm(want, axis=1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_jit_equals_eager_and_remat(params):
  ids, mask, types, _ = _batch(2)
  args = (jnp.asarray(ids),)
  kw = dict(mask_BT=jnp.asarray(mask), token_types_BT=jnp.asarray(types), capture=("hidden_states", "attn_weights"))
  with jax.disable_jit():
    eager = encoder.forward(params, *args, CFG, **kw)
  jitted = forward(params, *args, CFG, **kw)
  remat = forward(params, *args, CFG.replace(remat=True), **kw)
  for a, b, c in zip(eager, jitted, remat):
    np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(b, c, atol=1e-6)
  w = np.asarray(jitted.attn_weights)  # padded keys get no weight; rows sum to 1
  assert np.all(w * (1 - mask)[None, :, None, None, :] == 0)
  np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)


def test_every_param_has_logical_axes():
  shapes = jax.eval_shape(lambda: encoder.init(CFG, jax.random.key(0)))
  names = encoder.param_axes(CFG)
  for (path, x), n in zip(jax.tree_util.tree_leaves_with_path(shapes), jax.tree.leaves(
      names, is_leaf=lambda v: isinstance(v, tuple))):
    assert len(n) == x.ndim, (axes.path_str(path), n, x.shape)
    if axes.path_str(path).startswith("layers/"):
      assert n[0] == "layers"
  flat = {axes.path_str(p): n for p, n in jax.tree_util.tree_leaves_with_path(
      names, is_leaf=lambda v: isinstance(v, tuple))}
  assert flat["layers/attn/q/kernel"] == ("layers", "embed", "q_heads")
  assert flat["layers/mlp/up/kernel"] == ("layers", "embed", "mlp")
  assert flat["pos_embed"] == ("pos", "embed")


@pytest.mark.parametrize("spec,rules", [("fsdp:4,tensor:2", "fsdp_tp"), ("data:2,fsdp:2,tensor:2", "fsdp_tp"),
                                        ("tensor:8", "tp")])
def test_sharded_equals_single_device(params, spec, rules):
  ids, mask, types, _ = _batch(3, b=8, t=12)
  fn = jax.jit(lambda p, i, m, t: (encoder.forward(p, i, CFG, mask_BT=m, token_types_BT=t).last_hidden_state,
                                   encoder.sentence_embedding(p, CFG, i, m, token_types_BT=t)))
  single = fn(params, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
  mesh = sharding.make_mesh(spec)
  sp = sharding.shard_params(params, mesh, rules, axes=encoder.AXES)
  q = sp["layers"]["attn"]["q"]["kernel"]
  assert q.sharding.spec[-1] == "tensor" and q.addressable_shards[0].data.size < q.size
  batch = sharding.shard_batch({"i": ids, "m": mask, "t": types}, mesh)
  multi = fn(sp, batch["i"], batch["m"], batch["t"])
  for a, b in zip(single, multi):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-5)


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory):
  tokenizers = pytest.importorskip("tokenizers")
  words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(40)]
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  tok.enable_padding(length=20, pad_id=0, pad_token="[PAD]")  # a stored fixed padding must not leak through
  d = tmp_path_factory.mktemp("wordtok")
  tok.save(str(d / "tokenizer.json"))
  return encoder.load_tokenizer(str(d))


def test_embed_texts_equals_unpadded_rows(params, word_tokenizer):
  tok = word_tokenizer
  assert (tok.bos_id, tok.eos_id, tok.pad_id) == (2, 3, 0)
  texts = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9 w10 w11", "w12 w13", "w1 w1 w1 w1 w2"]
  got = encoder.embed_texts(params, CFG, tok, texts, batch_size=2, pad_multiple=8)
  assert got.shape == (len(texts), CFG.d_model)
  for text, g in zip(texts, got):
    ids = [2] + [int(w[1:]) + 5 for w in text.split()] + [3]
    want = sentence_embedding(params, CFG, jnp.asarray([ids]))
    np.testing.assert_allclose(g, want[0], atol=1e-5)
  cut = encoder.embed_texts(params, CFG, tok, texts[2:3], max_length=4, pooling="cls")
  want = sentence_embedding(params, CFG, jnp.asarray([[2, 10, 11, 3]]), pooling="cls")
  np.testing.assert_allclose(cut, want, atol=1e-5)


@pytest.mark.parametrize("kw,match", [
    (dict(n_heads=3), "n_heads \\(3\\) must divide d_model \\(64\\)"),
    (dict(activation="swish"), "activation must be one of"),
    (dict(d_model=0), "d_model must be a positive int, found 0"),
    (dict(pad_token_id=999), "pad_token_id must be in \\[0, 128\\)"),
    (dict(dtype="int8"), "dtype must be float32, bfloat16 or float16, found 'int8'"),
])
def test_bad_config(kw, match):
  with pytest.raises(ValueError, match=match):
    CFG.replace(**kw)


def test_checkpoint_prefix_is_not_a_config_field():
  with pytest.raises(TypeError, match="hf_prefix"):  # jaxlab.hf.encoder.key_prefix reads it from config.json
    CFG.replace(hf_prefix="roberta.")


def test_bad_inputs(params, word_tokenizer):
  ids, mask, _, _ = _batch()
  with pytest.raises(ValueError, match="tokens_BT must be a 2-D integer array"):
    encoder.forward(params, jnp.asarray(ids[0]), CFG)
  with pytest.raises(ValueError, match="tokens_BT must be a 2-D integer array"):
    encoder.forward(params, jnp.asarray(ids, jnp.float32), CFG)
  with pytest.raises(ValueError, match=r"mask_BT must have the tokens' shape \(4, 11\), found \(4, 10\)"):
    encoder.forward(params, jnp.asarray(ids), CFG, mask_BT=jnp.asarray(mask[:, :10]))
  with pytest.raises(ValueError, match="sequence length 40 exceeds max_position_embeddings \\(32\\)"):
    encoder.forward(params, jnp.zeros((1, 40), jnp.int32), CFG)
  with pytest.raises(ValueError, match="unknown capture"):
    encoder.forward(params, jnp.asarray(ids), CFG, capture=("logits",))
  with pytest.raises(ValueError, match="pooling must be one of"):
    encoder.sentence_embedding(params, CFG, jnp.asarray(ids), pooling="max")
  with pytest.raises(TypeError, match="single str"):
    encoder.embed_texts(params, CFG, word_tokenizer, "w1 w2")
  with pytest.raises(ValueError, match="max_length must be in \\[2, 32\\], found 64"):
    encoder.embed_texts(params, CFG, word_tokenizer, ["w1"], max_length=64)
  with pytest.raises(FileNotFoundError, match="expected a tokenizer.json"):
    encoder.load_tokenizer("/nonexistent/dir")
