"""Q-Former aligner: parity with transformers' Blip2QFormerModel on a tiny random config (the torch weights
copied into jaxlab params; torch Linear weights are [out, in], ours [in, out], so kernels are transposed),
padded queries and points leave real outputs alone, the multimodal Encoder protocol, sharded == single device,
logical axes on every param, and errors for bad input."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab import sharding
from jaxlab.models import multimodal as mm
from jaxlab.models import qformer as qf
from jaxlab.models import transformer as tfm

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _lin(m):
  return {"kernel": m.weight.detach().numpy().T.copy(), "bias": m.bias.detach().numpy().copy()}


def _ln(m):
  return {"scale": m.weight.detach().numpy().copy(), "bias": m.bias.detach().numpy().copy()}


def _stack(trees):
  return jax.tree.map(lambda *a: jnp.asarray(np.stack(a)), *trees)


def _from_torch(model, cfg: qf.Config, latents, out_proj):
  """jaxlab params from a Blip2QFormerModel (+ the latents and output projection STLLM keeps beside it)."""
  lay, cross = [], []
  for i, layer in enumerate(model.encoder.layer):
    a = layer.attention
    lay.append({"attn": {"q": _lin(a.attention.query), "k": _lin(a.attention.key), "v": _lin(a.attention.value),
                         "o": _lin(a.output.dense)},
                "attn_norm": _ln(a.output.LayerNorm),
                "mlp": {"up": _lin(layer.intermediate_query.dense), "down": _lin(layer.output_query.dense)},
                "mlp_norm": _ln(layer.output_query.LayerNorm)})
    if i % cfg.cross_every == 0:
      c = layer.crossattention
      cross.append({"attn": {"q": _lin(c.attention.query), "k": _lin(c.attention.key), "v": _lin(c.attention.value),
                             "o": _lin(c.output.dense)}, "attn_norm": _ln(c.output.LayerNorm)})
  return {"latents": jnp.asarray(latents), "query_norm": jax.tree.map(jnp.asarray, _ln(model.layernorm)),
          "layers": _stack(lay), "cross": _stack(cross), "out_proj": jax.tree.map(jnp.asarray, _lin(out_proj))}


@pytest.mark.parametrize("every", [1, 2])
def test_matches_blip2_qformer(every):
  cfg = qf.Config(d_model=32, n_layers=4, n_heads=4, d_ff=48, encoder_width=20, cross_every=every, n_latents=5,
                  out_width=24)
  hf_cfg = transformers.Blip2QFormerConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                                           intermediate_size=48, encoder_hidden_size=20,
                                           cross_attention_frequency=every, hidden_act="gelu",
                                           layer_norm_eps=cfg.norm_eps)
  hf_cfg._attn_implementation = "eager"
  torch.manual_seed(every)
  model = transformers.Blip2QFormerModel(hf_cfg).eval()
  with torch.no_grad():  # non-trivial norms and biases, so a swapped or dropped one shows
    for name, p in model.named_parameters():
      if "LayerNorm" in name or "layernorm" in name or name.endswith("bias"):
        p.add_(0.2 * torch.randn_like(p))
  out_proj = torch.nn.Linear(32, 24)
  rs = np.random.RandomState(0)
  latents = rs.randn(5, 32).astype(np.float32)
  points = rs.randn(2, 7, 20).astype(np.float32)
  pmask = np.ones((2, 7), bool)
  pmask[1, 5:] = False
  params = _from_torch(model, cfg, latents, out_proj)
  with torch.no_grad():
    q = torch.from_numpy(np.broadcast_to(latents, (2, 5, 32)).copy())
    ref = model(query_embeds=q, encoder_hidden_states=torch.from_numpy(points),
                encoder_attention_mask=torch.from_numpy(pmask.astype(np.int64))).last_hidden_state
    ref_prefix = out_proj(ref).numpy()
  out = jax.jit(lambda p, x, m: qf.forward(p, x, cfg, points_mask_BS=m))(params, points, pmask)
  np.testing.assert_allclose(np.asarray(out.hidden_BQD), ref.numpy(), atol=1e-4)
  np.testing.assert_allclose(np.asarray(out.prefix_BKO), ref_prefix, atol=1e-4)


def test_extra_queries_match_blip2_with_query_mask():
  """Video and text queries: projected, concatenated after the latents and run on the query path with their mask."""
  cfg = qf.Config(d_model=32, n_layers=2, n_heads=4, d_ff=48, encoder_width=12, n_latents=3, out_width=8,
                  video_width=10, text_width=6)
  hf_cfg = transformers.Blip2QFormerConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=48, encoder_hidden_size=12, hidden_act="gelu",
                                           cross_attention_frequency=2)
  hf_cfg._attn_implementation = "eager"
  torch.manual_seed(5)
  model = transformers.Blip2QFormerModel(hf_cfg).eval()
  vproj, tproj, oproj = torch.nn.Linear(10, 32), torch.nn.Linear(6, 32), torch.nn.Linear(32, 8)
  rs = np.random.RandomState(1)
  latents = rs.randn(3, 32).astype(np.float32)
  video, text = rs.randn(2, 4, 10).astype(np.float32), rs.randn(2, 5, 6).astype(np.float32)
  vmask, tmask = np.ones((2, 4), bool), np.ones((2, 5), bool)
  vmask[0, 3:] = False
  tmask[1, 2:] = False
  points = rs.randn(2, 6, 12).astype(np.float32)
  params = _from_torch(model, cfg, latents, oproj)
  params["video_proj"] = jax.tree.map(jnp.asarray, _lin(vproj))
  params["text_proj"] = jax.tree.map(jnp.asarray, _lin(tproj))
  with torch.no_grad():
    q = torch.cat([torch.from_numpy(np.broadcast_to(latents, (2, 3, 32)).copy()), vproj(torch.from_numpy(video)),
                   tproj(torch.from_numpy(text))], 1)
    m = torch.from_numpy(np.concatenate([np.ones((2, 3), bool), vmask, tmask], 1).astype(np.int64))
    ref = model(query_embeds=q, attention_mask=m, encoder_hidden_states=torch.from_numpy(points)).last_hidden_state
  out = qf.forward(params, points, cfg, video_BVX=video, video_mask_BV=vmask, text_BTX=text, text_mask_BT=tmask)
  real = np.asarray(out.query_mask_BQ)
  assert real.sum() == 2 * 3 + 7 + 7
  np.testing.assert_allclose(np.asarray(out.hidden_BQD)[real], ref.numpy()[real], atol=1e-4)
  np.testing.assert_allclose(np.asarray(out.prefix_BKO), oproj(ref[:, :3]).detach().numpy(), atol=1e-4)


def test_padding_never_changes_real_outputs():
  cfg = qf.PRESETS["tiny-video-text"]
  params = qf.init(cfg, jax.random.key(0))
  rs = np.random.RandomState(2)
  pts, video = rs.randn(1, 5, 16).astype(np.float32), rs.randn(1, 3, 24).astype(np.float32)
  base = qf.forward(params, pts, cfg, video_BVX=video)
  pad_pts = np.concatenate([pts, 50 * rs.randn(1, 4, 16).astype(np.float32)], 1)
  pad_video = np.concatenate([video, 50 * rs.randn(1, 2, 24).astype(np.float32)], 1)
  padded = qf.forward(params, pad_pts, cfg, points_mask_BS=np.arange(9)[None] < 5, video_BVX=pad_video,
                      video_mask_BV=np.arange(5)[None] < 3)
  np.testing.assert_allclose(np.asarray(padded.prefix_BKO), np.asarray(base.prefix_BKO), atol=1e-5)
  np.testing.assert_allclose(np.asarray(padded.hidden_BQD)[:, :cfg.n_latents + 3], np.asarray(base.hidden_BQD),
                             atol=1e-5)


def test_prefix_of_multimodal_lm_equals_manual_prefix():
  text = tfm.PRESETS["tiny"]
  cfg = qf.Config.tiny(out_width=24, n_latents=4)
  mcfg = mm.Config(encoder=qf.QFORMER, encoder_cfg=cfg, text=text, mode="prefix", modality="point cloud")
  params = mm.init(mcfg, jax.random.key(1))
  rs = np.random.RandomState(3)
  toks = rs.randint(5, text.vocab_size, (2, 6)).astype(np.int32)
  inputs = {"points": rs.randn(2, 7, cfg.encoder_width).astype(np.float32), "points_mask": np.ones((2, 7), bool)}
  out = mm.forward(params, toks, inputs, mcfg)
  assert out.n_prefix == cfg.n_latents and out.logits.shape == (2, 4 + 6, text.vocab_size)
  pre = qf.forward(params["encoder"], inputs["points"], cfg).prefix_BKO
  lat = mm.connector(params["connector"], pre, mcfg.connector_activation, jnp.float32)
  x = jnp.concatenate([lat, params["lm"]["embed"]["embedding"][toks]], axis=1)
  manual = tfm.forward(params["lm"], jnp.zeros((2, 10), jnp.int32), text, inputs_embeds_BTD=x).logits
  np.testing.assert_allclose(np.asarray(out.logits), np.asarray(manual), atol=1e-5)


def test_sharded_equals_single_device():
  cfg = qf.Config.tiny(d_model=64, n_heads=8, d_ff=128, video_width=16)
  params = qf.init(cfg, jax.random.key(2))
  rs = np.random.RandomState(4)
  pts, video = rs.randn(8, 6, 16).astype(np.float32), rs.randn(8, 3, 16).astype(np.float32)
  fn = jax.jit(lambda p, x, v: qf.forward(p, x, cfg, video_BVX=v).prefix_BKO)
  single = fn(params, pts, video)
  mesh = sharding.make_mesh("fsdp:4,tensor:2")
  sp = sharding.shard_params(params, mesh, "fsdp_tp", axes=qf.AXES)
  up = sp["layers"]["mlp"]["up"]["kernel"]
  assert up.addressable_shards[0].data.size < up.size
  batch = sharding.shard_batch({"x": pts, "v": video}, mesh)
  np.testing.assert_allclose(np.asarray(fn(sp, batch["x"], batch["v"])), np.asarray(single), atol=2e-5)


def test_axes_and_errors():
  cfg = qf.PRESETS["tiny-video-text"]
  names = qf.param_axes(cfg)
  assert names["cross"]["attn"]["k"]["kernel"] == ("layers", "embed", "kv_heads")
  assert names["latents"] == ("pos", "embed") and names["out_proj"]["kernel"] == ("mlp", "embed")
  sharding.param_specs(jax.eval_shape(lambda: qf.init(cfg, jax.random.key(0))), "fsdp_tp", axes=qf.AXES)
  params = qf.init(cfg, jax.random.key(0))
  with pytest.raises(ValueError, match=r"\[B, S, 16\]"):
    qf.forward(params, np.zeros((1, 3, 8), np.float32), cfg)
  with pytest.raises(ValueError, match="text_width=0"):
    qf.forward(qf.init(qf.Config.tiny(), jax.random.key(0)), np.zeros((1, 3, 16)), qf.Config.tiny(),
               text_BTX=np.zeros((1, 2, 4)))
  with pytest.raises(ValueError, match="cross_every"):
    qf.Config(n_layers=3, cross_every=2)
  with pytest.raises(ValueError, match="need 'points'"):
    qf.encoder_forward(params, {"pts": np.zeros((1, 3, 16))}, cfg)


def test_aligner_end_to_end_through_the_prefix_protocol():
  from jaxlab.models import pointcloud as pc
  from jaxlab.models import video
  points = pc.Config(n_points=24, stages=(pc.Stage(6, 4, 0.8, (8, 16)),), ray_freqs=2)
  frames_cfg = video.Config(n_frames=1)
  acfg = qf.AlignerConfig(points=points, video=frames_cfg, qformer=qf.Config.tiny(n_latents=3, video_width=64))
  mcfg = mm.Config(encoder=qf.ALIGNER, encoder_cfg=acfg, text=tfm.PRESETS["tiny"], mode="prefix")
  params = {"encoder": qf.ALIGNER.init(acfg, jax.random.key(6))}
  rs = np.random.RandomState(6)
  xyz, rgb = rs.rand(1, 24, 3).astype(np.float32), rs.rand(1, 24, 3).astype(np.float32)
  mask = np.arange(24)[None] < 15
  xyz[:, 15:] = 30.0  # padding far away: it would dominate FPS and the max-pool if it leaked
  c2w = np.eye(4, dtype=np.float32)[None]
  c2w[0, :3, 3] = [0.1, -2.0, 0.3]
  frames = rs.randn(1, 1, 32, 32, 3).astype(np.float32)
  inputs = {"xyz": xyz, "rgb": rgb, "mask": mask, "c2w": c2w, "frames": frames}
  pre = qf.aligner_forward(params["encoder"], inputs, acfg)
  tight = qf.aligner_forward(params["encoder"], {**inputs, "xyz": xyz[:, :15], "rgb": rgb[:, :15], "mask": None},
                             qf.AlignerConfig(points=points.replace(n_points=15), video=frames_cfg, qformer=acfg.qformer))
  np.testing.assert_allclose(np.asarray(pre), np.asarray(tight), atol=1e-5)
  enc = params["encoder"]
  pts = pc.encode(enc["points"], xyz, rgb, points, mask_BN=mask, c2w_B44=c2w)
  manual = qf.forward(enc["qformer"], pts.features_BMC, acfg.qformer, points_mask_BS=pts.mask_BM,
                      video_BVX=video.forward(enc["video"], frames, frames_cfg)).prefix_BKO
  np.testing.assert_allclose(np.asarray(pre), np.asarray(manual), atol=1e-6)
  assert mcfg.tokens_per_input == 3 and pre.shape == (1, 3, mcfg.encoder.width(acfg))
  with pytest.raises(ValueError, match="must match qformer.video_width"):
    qf.AlignerConfig(points=points, video=None, qformer=acfg.qformer)
  with pytest.raises(ValueError, match="need 'xyz', 'rgb', frames"):
    qf.aligner_forward(params["encoder"], {"xyz": xyz, "rgb": rgb}, acfg)
