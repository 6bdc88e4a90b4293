"""Point-cloud encoder and ray encoding: a NumPy brute-force set abstraction (FPS, kNN in a ball, shared MLP,
max-pool), invariance to point order and to padding, the ray encoding against a NumPy transcription of STLLM's
`RayDirectionEncoderForPointCloud` (frequencies checked against torch's int64 power, pooling against torch's
adaptive_avg_pool1d), the multimodal Encoder protocol, sharded == single device, axes and errors."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab import sharding
from jaxlab.models import multimodal as mm
from jaxlab.models import pointcloud as pc
from jaxlab.models import transformer as tfm
from jaxlab.nn import axes

CFG = pc.Config(n_points=48, stages=(pc.Stage(16, 6, 0.5, (8, 12)), pc.Stage(5, 4, 1.0, (12, 16))))


def _cloud(rs, n_real, n_total, c=3):
  xyz = np.zeros((n_total, 3), np.float32)
  rgb = np.zeros((n_total, c), np.float32)
  xyz[:n_real] = rs.rand(n_real, 3).astype(np.float32)
  rgb[:n_real] = rs.rand(n_real, c).astype(np.float32)
  xyz[n_real:] = 100 * rs.randn(n_total - n_real, 3)  # garbage in the padding
  rgb[n_real:] = 100 * rs.randn(n_total - n_real, c)
  return xyz, rgb, np.arange(n_total) < n_real


def _np_stage(p, s, xyz, feats, mask):
  """One set-abstraction stage for one cloud, by loops over the real points."""
  real = np.flatnonzero(mask)
  pts, f = xyz[real].astype(np.float64), feats[real].astype(np.float64)
  chosen = [int(np.argmax(((pts - pts.mean(0)) ** 2).sum(1)))]
  while len(chosen) < min(s.n_centers, len(real)):
    d = np.min([((pts - pts[i]) ** 2).sum(1) for i in chosen], axis=0)
    chosen.append(int(np.argmax(d)))
  out = np.zeros((s.n_centers, s.widths[-1]))
  for m, ci in enumerate(chosen):
    d = ((pts - pts[ci]) ** 2).sum(1)
    nbr = [j for j in np.argsort(d, kind="stable")[:s.k] if d[j] <= s.radius ** 2]
    h = np.concatenate([(pts[nbr] - pts[ci]) / s.radius, f[nbr]], 1)
    for lp in p["mlp"]:
      h = np.maximum(h @ np.asarray(lp["kernel"], np.float64) + np.asarray(lp["bias"], np.float64), 0)
    out[m] = h.max(0)
  c_xyz = np.zeros((s.n_centers, 3))
  c_xyz[:len(chosen)] = pts[chosen]
  return c_xyz, out, np.arange(s.n_centers) < len(chosen)


def _perturbed_params(cfg, key):
  params = pc.init(cfg, key)
  leaves, tree = jax.tree.flatten(params)  # non-zero biases and larger weights, so ReLUs are neither all on nor off
  ks = jax.random.split(jax.random.fold_in(key, 1), len(leaves))
  return jax.tree.unflatten(tree, [0.4 * jax.random.normal(k, x.shape) for k, x in zip(ks, leaves)])


def test_matches_numpy_brute_force():
  params = _perturbed_params(CFG, jax.random.key(0))
  rs = np.random.RandomState(0)
  clouds = [_cloud(rs, n, CFG.n_points) for n in (48, 30)]
  xyz, rgb, mask = (np.stack(a) for a in zip(*clouds))
  out = jax.jit(lambda p, x, f, m: pc.encode(p, x, f, CFG, mask_BN=m))(params, xyz, rgb, mask)
  for b in range(2):
    x, f, m = xyz[b], rgb[b], mask[b]
    for p, s in zip(params["stages"], CFG.stages):
      x, f, m = _np_stage(p, s, x, f, m)
    np.testing.assert_array_equal(np.asarray(out.mask_BM[b]), m)
    np.testing.assert_allclose(np.asarray(out.xyz_BM3[b])[m], x[m], atol=1e-6)
    np.testing.assert_allclose(np.asarray(out.features_BMC[b]), np.where(m[:, None], f, 0), atol=1e-4)
    assert np.abs(f[m]).max() > 0.1


def test_invariant_to_point_order_and_padding():
  params = _perturbed_params(CFG, jax.random.key(1))
  rs = np.random.RandomState(1)
  xyz, rgb, _ = _cloud(rs, 40, 40)
  tight = pc.encode(params, xyz[None], rgb[None], CFG.replace(n_points=40))
  # the same 40 points shuffled among 8 garbage padding rows
  pxyz, prgb, _ = _cloud(rs, 0, CFG.n_points)
  slots = rs.permutation(CFG.n_points)[:40]
  order = rs.permutation(40)
  pxyz[slots], prgb[slots] = xyz[order], rgb[order]
  pmask = np.zeros(CFG.n_points, bool)
  pmask[slots] = True
  loose = pc.encode(params, pxyz[None], prgb[None], CFG, mask_BN=pmask[None])
  for a, b in zip(tight, loose):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5)
  assert np.asarray(tight.mask_BM).all()


def _np_ray_encoding(xyz, c2w, n_freqs, n_out):
  """NumPy transcription of STLLM's point-cloud ray encoding (before its linear map)."""
  cam = (np.linalg.inv(c2w) @ np.concatenate([xyz, np.ones((len(xyz), 1))], 1).T).T[:, :3]
  d = cam / np.maximum(np.linalg.norm(cam, axis=1, keepdims=True), 1e-12)
  d = d / np.maximum(np.linalg.norm(d, axis=1, keepdims=True), 1e-12)
  freq = (2 ** np.arange(n_freqs, dtype=np.int64)).astype(np.float32)  # int64 power wraps like torch's
  df = (d.astype(np.float32)[:, :, None] * freq[None, None]).reshape(len(d), -1)
  emb = np.concatenate([d, np.sin(df), np.cos(df)], 1)
  n = len(emb)
  bins = [emb[(i * n) // n_out:-(-((i + 1) * n) // n_out)].mean(0) for i in range(n_out)]
  return np.stack(bins)


def _rigid(rs):
  q, _ = np.linalg.qr(rs.randn(3, 3))
  c2w = np.eye(4)
  c2w[:3, :3] = q * np.sign(np.linalg.det(q))
  c2w[:3, 3] = rs.randn(3)
  return c2w


@pytest.mark.parametrize("n_freqs,n_out", [(4, 10), (4, 7), (127, 10)])
def test_ray_encoding_matches_numpy_transcription(n_freqs, n_out):
  torch = pytest.importorskip("torch")
  np.testing.assert_array_equal(pc.ray_frequencies(n_freqs), (2 ** torch.arange(0, n_freqs)).double().numpy())
  rs = np.random.RandomState(n_freqs + n_out)
  xyz = rs.randn(10, 3)
  c2w = _rigid(rs)
  ref = _np_ray_encoding(xyz, c2w, n_freqs, n_out)
  dirs = pc.point_viewdirs(jnp.asarray(xyz[None], jnp.float32), jnp.asarray(c2w[None], jnp.float32))
  got = np.asarray(pc.ray_embedding(dirs, n_freqs, n_out))[0]
  assert got.shape == (n_out, pc.ray_width(n_freqs))
  # sin/cos of d * 2**k lose all precision for large k (float32 d, |d * 2**k| up to 2**62): compare the first 10
  # frequencies tightly, and the zero frequencies (k >= 64, sin 0, cos 1) exactly
  cols = np.concatenate([np.arange(3)] + [3 + o + 3 * n_freqs * s + np.arange(min(n_freqs, 10)) for s in (0, 1)
                                          for o in range(0, 3 * n_freqs, n_freqs)])
  np.testing.assert_allclose(got[:, cols], ref[:, cols], atol=2e-4)
  if n_freqs > 64:
    for s in (0, 1):
      zero = 3 + 3 * n_freqs * s + np.concatenate([o + np.arange(64, n_freqs) for o in range(0, 3 * n_freqs, n_freqs)])
      np.testing.assert_array_equal(got[:, zero], ref[:, zero])
      np.testing.assert_array_equal(got[:, zero], float(s))
  if n_out != 10:
    emb = torch.from_numpy(np.array(pc.ray_embedding(dirs, n_freqs))).permute(0, 2, 1)
    pooled = torch.nn.functional.adaptive_avg_pool1d(emb, n_out).permute(0, 2, 1)[0].numpy()
    np.testing.assert_allclose(got, pooled, atol=1e-6)


def test_ray_encoding_is_added_to_real_tokens():
  cfg = CFG.replace(ray_freqs=3)
  params = pc.init(cfg, jax.random.key(2))
  params["ray_proj"]["bias"] = jnp.ones_like(params["ray_proj"]["bias"])
  rs = np.random.RandomState(3)
  xyz, rgb, mask = _cloud(rs, 4, CFG.n_points)
  c2w = _rigid(rs)[None].astype(np.float32)
  out = pc.encode(params, xyz[None], rgb[None], cfg, mask_BN=mask[None], c2w_B44=c2w)
  plain = pc.encode(params, xyz[None], rgb[None], CFG, mask_BN=mask[None])
  m = np.asarray(out.mask_BM[0])
  assert m.sum() == 4
  emb = _np_ray_encoding(np.asarray(out.xyz_BM3[0], np.float64), c2w[0].astype(np.float64), 3, 5)
  pos = emb @ np.asarray(params["ray_proj"]["kernel"]) + 1.0
  np.testing.assert_allclose(np.asarray(out.features_BMC[0])[m], (np.asarray(plain.features_BMC[0]) + pos)[m],
                             atol=1e-4)
  np.testing.assert_array_equal(np.asarray(out.features_BMC[0])[~m], 0)
  dummy = pc.Config(n_points=48, stages=(pc.Stage(5, 4, 1.0, (8, 16)),), ray_freqs=2, ray_proj=False)
  assert "ray_proj" not in pc.init(dummy, jax.random.key(0))
  z = pc.ray_encoding({}, jnp.ones((1, 2, 3)) / np.sqrt(3), dummy)
  assert z.shape == (1, 2, 16) and np.all(np.asarray(z[..., -1]) == 0)


def test_encoder_protocol_and_sharded_equals_single_device():
  mcfg = mm.Config(encoder=pc.POINTCLOUD, encoder_cfg=CFG, text=tfm.PRESETS["tiny"], placeholder_id=5,
                   modality="point cloud")
  params = mm.init(mcfg, jax.random.key(4))
  assert mcfg.tokens_per_input == CFG.n_tokens
  rs = np.random.RandomState(4)
  xyz, rgb, mask = (np.stack(a) for a in zip(*[_cloud(rs, n, CFG.n_points) for n in (48, 40, 20, 33) * 2]))
  inputs = {"xyz": xyz, "rgb": rgb, "mask": mask}
  fn = jax.jit(lambda p, x: mm.encode(p, x, mcfg))
  single = fn(params, inputs)
  feats = pc.encode(params["encoder"], xyz, rgb, CFG, mask_BN=mask).features_BMC
  np.testing.assert_allclose(np.asarray(single),
                             np.asarray(mm.connector(params["connector"], feats, "gelu", jnp.float32)), atol=1e-6)
  mesh = sharding.make_mesh("fsdp:4,tensor:2")
  sp = sharding.shard_params(params, mesh, "fsdp_tp", axes=mm.axis_rules(mcfg))
  k = sp["encoder"]["stages"][1]["mlp"][0]["kernel"]
  assert k.addressable_shards[0].data.size < k.size
  multi = fn(sp, sharding.shard_batch(inputs, mesh))
  np.testing.assert_allclose(np.asarray(multi), np.asarray(single), atol=2e-5)


def test_axes_and_errors():
  names = pc.param_axes(pc.PRESETS["tiny-rays"])
  assert names["stages"][0]["mlp"][1]["kernel"] == ("embed", "mlp")
  assert names["ray_proj"]["kernel"] == ("patch", "embed")
  axes.logical_axes(jax.eval_shape(lambda: pc.init(pc.PRESETS["pointnet2-ssg"], jax.random.key(0))), pc.AXES)
  params = pc.init(CFG, jax.random.key(0))
  with pytest.raises(ValueError, match=r"xyz \[B, 48, 3\]"):
    pc.encode(params, np.zeros((1, 40, 3)), np.zeros((1, 40, 3)), CFG)
  with pytest.raises(ValueError, match="needs c2w"):
    pc.encode(pc.init(CFG.replace(ray_freqs=2), jax.random.key(0)), np.zeros((1, 48, 3)), np.zeros((1, 48, 3)),
              CFG.replace(ray_freqs=2))
  with pytest.raises(ValueError, match="stage 1 picks 20 centres"):
    pc.Config(n_points=48, stages=(pc.Stage(16, 4, 0.5, (8,)), pc.Stage(20, 4, 0.5, (8,))))
  with pytest.raises(ValueError, match=r"c2w \[B, F, 4, 4\] and intrinsics \[B, 3, 3\]"):
    pc.frame_viewdirs(jnp.zeros((1, 2, 4, 4)), jnp.zeros((2, 3, 3)), 4, 4)
  with pytest.raises(ValueError, match=r"\[B, F, 4\*4, 3\]"):
    pc.frame_ray_embedding(jnp.zeros((1, 2, 15, 3)), 4, 4, 2, 3)
  with pytest.raises(ValueError, match="need 'xyz' and 'rgb'"):
    pc.encoder_forward(params, {"xyz": np.zeros((1, 48, 3))}, CFG)


def _np_frame_rays(c2ws, k, h, w, grid, n_freqs):
  """NumPy transcription of STLLM's frame ray encoding (before its linear map) for one video, pixel by pixel."""
  first = np.linalg.inv(c2ws[0])
  out = []
  for c2w in c2ws:
    rel = first @ c2w
    d = np.zeros((h, w, 3))
    for y in range(h):
      for x in range(w):
        ray = rel[:3, :3] @ np.array([(x + 0.5 - k[0, 2]) / k[0, 0], (y + 0.5 - k[1, 2]) / k[1, 1], 1.0])
        d[y, x] = (ray / np.linalg.norm(ray)) @ c2ws[0][:3, :3]
    out.append(d)
  torch = pytest.importorskip("torch")
  pooled = torch.nn.functional.adaptive_avg_pool2d(torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2), grid)
  d = pooled.permute(0, 2, 3, 1).reshape(len(c2ws), grid * grid, 3).numpy()
  df = (d[..., None] * (2.0 ** np.arange(n_freqs))).reshape(*d.shape[:2], -1)
  return np.concatenate([d, np.sin(df), np.cos(df)], -1)


def test_frame_ray_encoding_matches_numpy_transcription():
  rs = np.random.RandomState(5)
  c2ws = np.stack([_rigid(rs) for _ in range(3)])
  k = np.array([[9.0, 0, 5.5], [0, 8.0, 3.5], [0, 0, 1]])
  h, w, grid, n_freqs = 7, 11, 3, 4
  ref = _np_frame_rays(c2ws, k, h, w, grid, n_freqs)
  dirs = pc.frame_viewdirs(jnp.asarray(c2ws[None], jnp.float32), jnp.asarray(k[None], jnp.float32), h, w)
  got = np.asarray(pc.frame_ray_embedding(dirs, h, w, grid, n_freqs))[0]
  assert got.shape == (3, grid * grid, pc.ray_width(n_freqs))
  np.testing.assert_allclose(got, ref, atol=2e-4)
