"""Video encoder: one frame equals the ViT's patch tokens plus the temporal position, frames are encoded
independently in frame-major order, the sinusoidal table and the spatial pooling against NumPy, the
multimodal Encoder protocol, sharded == single device, axes and errors."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab import sharding
from jaxlab.models import multimodal as mm
from jaxlab.models import transformer as tfm
from jaxlab.models import video, vit

VISION = vit.PRESETS["clip-tiny"]


def _patches(params, pixels, layer=-2):
  """The ViT's hidden state of `layer` without the class token, straight from vit.forward."""
  hs = vit.forward(params, pixels, VISION, capture=("hidden_states",)).hidden_states
  return np.asarray(hs[layer])[:, 1:]


@pytest.mark.parametrize("temporal", ["learned", "sinusoidal"])
def test_one_frame_is_vit_patches_plus_temporal_position(temporal):
  cfg = video.Config(n_frames=1, temporal=temporal)
  params = video.init(cfg, jax.random.key(0))
  frames = np.random.RandomState(0).randn(2, 1, 32, 32, 3).astype(np.float32)
  got = np.asarray(video.forward(params, frames, cfg))
  want = _patches(params["vision"], frames[:, 0])
  pos = np.asarray(params["temporal"])[0] if temporal == "learned" else np.tile([0.0, 1.0], cfg.width // 2)
  assert got.shape == (2, VISION.n_patches, VISION.d_model) and np.abs(pos).max() > 0
  np.testing.assert_allclose(got, want + pos, atol=1e-5)


def test_frames_are_independent_and_frame_major():
  cfg = video.Config(n_frames=3, features=mm.VitFeatures(feature_layers=(-1, 1)))
  params = video.init(cfg, jax.random.key(1))
  frames = np.random.RandomState(1).randn(2, 3, 32, 32, 3).astype(np.float32)
  got = np.asarray(jax.jit(lambda p, x: video.forward(p, x, cfg))(params, frames))
  p = VISION.n_patches
  assert got.shape == (2, 3 * p, 2 * VISION.d_model) and cfg.n_tokens == 3 * p
  for f in range(3):
    want = np.concatenate([_patches(params["vision"], frames[:, f], layer) for layer in (-1, 1)], -1)
    np.testing.assert_allclose(got[:, f * p:(f + 1) * p], want + np.asarray(params["temporal"])[f], atol=1e-5)


def test_sinusoidal_table_and_spatial_pool():
  tab = video.sinusoidal(5, 6)
  for f in range(5):
    for i in range(3):
      np.testing.assert_allclose(tab[f, 2 * i], np.sin(f / 10000 ** (2 * i / 6)), atol=1e-6)
      np.testing.assert_allclose(tab[f, 2 * i + 1], np.cos(f / 10000 ** (2 * i / 6)), atol=1e-6)
  cfg = video.Config(n_frames=2, temporal="none", spatial_pool=2)
  params = video.init(cfg, jax.random.key(2))
  assert "temporal" not in params and cfg.tokens_per_frame == VISION.n_patches // 4
  frames = np.random.RandomState(2).randn(1, 2, 32, 32, 3).astype(np.float32)
  got = np.asarray(video.forward(params, frames, cfg))
  g = VISION.grid
  for f in range(2):
    grid = _patches(params["vision"], frames[:, f]).reshape(g, g, -1)
    want = np.stack([grid[2 * i:2 * i + 2, 2 * j:2 * j + 2].mean((0, 1)) for i in range(g // 2) for j in range(g // 2)])
    np.testing.assert_allclose(got[0, f * 4:(f + 1) * 4], want, atol=1e-5)


def test_encoder_protocol_and_sharded_equals_single_device():
  cfg = video.Config(n_frames=2)
  mcfg = mm.Config(encoder=video.VIDEO, encoder_cfg=cfg, text=tfm.PRESETS["tiny"], placeholder_id=5,
                   modality="video")
  params = mm.init(mcfg, jax.random.key(3))
  assert mcfg.tokens_per_input == 2 * VISION.n_patches
  frames = np.random.RandomState(3).randn(8, 2, 32, 32, 3).astype(np.float32)
  fn = jax.jit(lambda p, x: mm.encode(p, x, mcfg))
  single = fn(params, frames)
  want = mm.connector(params["connector"], video.forward(params["encoder"], frames, cfg), "gelu", jnp.float32)
  np.testing.assert_allclose(np.asarray(single), np.asarray(want), atol=1e-6)
  mesh = sharding.make_mesh("fsdp:4,tensor:2")
  sp = sharding.shard_params(params, mesh, "fsdp_tp", axes=mm.axis_rules(mcfg))
  t = sp["encoder"]["temporal"]
  assert t.addressable_shards[0].data.size < t.size
  np.testing.assert_allclose(np.asarray(fn(sp, sharding.shard_batch(frames, mesh))), np.asarray(single), atol=2e-5)


def test_axes_and_errors():
  names = video.param_axes(video.PRESETS["tiny"])
  assert names["temporal"] == ("pos", "embed")
  assert names["vision"]["layers"]["attn"]["q"]["kernel"] == ("layers", "embed", "q_heads")
  sharding.param_specs(jax.eval_shape(lambda: video.init(video.PRESETS["stllm-siglip"], jax.random.key(0))), "fsdp_tp",
                       axes=video.AXES)
  cfg = video.PRESETS["tiny"]
  params = video.init(cfg, jax.random.key(0))
  with pytest.raises(ValueError, match=r"frames must be \[B, 4, 32, 32, 3\]"):
    video.forward(params, np.zeros((1, 2, 32, 32, 3), np.float32), cfg)
  with pytest.raises(ValueError, match="divisor of the patch grid"):
    video.Config(spatial_pool=3)
  with pytest.raises(ValueError, match="patches only"):
    video.Config(spatial_pool=2, features=mm.VitFeatures(feature_select="full"))
  with pytest.raises(ValueError, match="temporal must be one of"):
    video.Config(temporal="rope")
