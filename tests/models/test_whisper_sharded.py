"""Whisper sharded over the 8 virtual CPU devices equals Whisper on one device: teacher-forced logits, the
cached decoder step, and the gradient of a next-token loss, under the rule tables of `jaxlab.sharding`.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab import sharding
from jaxlab.models import whisper
from jaxlab.nn import axes

CFG = whisper.PRESETS["tiny_random"]


@pytest.fixture(scope="module")
def params():
  """Random params with norm scales around 1 and non-zero biases, so no path hides behind 1s and 0s."""
  p = whisper.init(CFG, jax.random.key(0))
  leaves, tree = jax.tree.flatten_with_path(p)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  out = [x + 0.2 * jax.random.normal(k, x.shape, x.dtype) if axes.path_str(path).endswith(("scale", "bias")) else x
         for (path, x), k in zip(leaves, keys)]
  return jax.tree.unflatten(tree, out)


def _batch(b=8, t=10, seed=0):
  rs = np.random.RandomState(seed)
  mel = rs.randn(b, CFG.n_mels, CFG.n_frames).astype(np.float32)
  tokens = rs.randint(0, CFG.vocab_size, (b, t)).astype(np.int32)
  return mel, tokens


def _loss(p, mel, tokens):
  logits = whisper.forward(p, mel, tokens[:, :-1], CFG)
  logp = jax.nn.log_softmax(logits, -1)
  return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], -1))


def _sharded(params, mel, tokens, spec="data:2,fsdp:2,tensor:2", rules="fsdp_tp"):
  mesh = sharding.make_mesh(spec)
  sp = sharding.shard_params(params, mesh, rules, axes=whisper.AXES)
  q = sp["decoder"]["layers"]["cross_attn"]["q"]["kernel"]
  assert q.sharding.spec[1:] == ("fsdp", "tensor") and q.addressable_shards[0].data.size * 4 == q.size
  batch = sharding.shard_batch({"mel": mel, "tokens": tokens}, mesh)
  return sp, batch["mel"], batch["tokens"]


def test_logits_sharded_equal_single_device(params):
  mel, tokens = _batch()
  fwd = jax.jit(lambda p, m, t: whisper.forward(p, m, t, CFG))
  single = fwd(params, jnp.asarray(mel), jnp.asarray(tokens))
  multi = fwd(*_sharded(params, mel, tokens))
  assert len(multi.sharding.device_set) == 8
  np.testing.assert_allclose(np.asarray(multi), np.asarray(single), atol=2e-5)


@pytest.mark.slow
def test_loss_and_grads_sharded_equal_single_device(params):
  mel, tokens = _batch()
  grad = jax.jit(jax.value_and_grad(_loss))
  single_loss, single_grads = grad(params, jnp.asarray(mel), jnp.asarray(tokens))
  multi_loss, multi_grads = grad(*_sharded(params, mel, tokens))
  np.testing.assert_allclose(float(multi_loss), float(single_loss), rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-6),
               single_grads, multi_grads)
  assert float(jnp.abs(single_grads["encoder"]["conv1"]["kernel"]).max()) > 0  # the encoder is in the graph


def test_cached_decoding_sharded_equals_single_device(params):
  mel, tokens = _batch(t=3, seed=1)

  @jax.jit
  def steps(p, m, t):
    cache = whisper.init_cache(p, whisper.encode(p, m, CFG), CFG)
    outs = []
    for i in range(t.shape[1]):
      logits, cache = whisper.decode(p, t[:, i:i + 1], cache, CFG)
      outs.append(logits[:, 0])
    return jnp.stack(outs, 1)

  single = steps(params, jnp.asarray(mel), jnp.asarray(tokens))
  np.testing.assert_allclose(np.asarray(single), np.asarray(whisper.forward(params, mel, tokens, CFG)), atol=2e-5)
  mesh = sharding.make_mesh("tensor:8")
  sp = sharding.shard_params(params, mesh, "tp", axes=whisper.AXES)
  batch = sharding.shard_batch({"mel": mel, "tokens": tokens}, mesh)
  multi = steps(sp, batch["mel"], batch["tokens"])
  np.testing.assert_allclose(np.asarray(multi), np.asarray(single), atol=2e-5)
