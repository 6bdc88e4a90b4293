"""jaxlab.losses.mca_loss / mind_loss_fn (MIND, arXiv:2512.05530): zero when the margin is met, gradients only
through the hardest pair, equal to a NumPy transcription; the VLM loss equals CE + alpha * MCA recomputed from
captured hidden states, keeps the ViT frozen, and is the same sharded over 8 CPU devices as on one."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab import losses, sharding
from jaxlab.models import transformer as tfm, vit, vlm


def np_mca(anchor, emb, role, margin, top_k):
  out, valid = [], []
  for a, e, r in zip(anchor, emb, role):
    with np.errstate(invalid="ignore"):  # an unused zero row's cosine is NaN here; it is never selected
      cos = (e @ a) / (np.linalg.norm(e, axis=1) * np.linalg.norm(a))
    pos, neg = np.sort(cos[r > 0]), np.sort(cos[r < 0])[::-1]
    if not len(pos) or not len(neg):
      out.append(0.0), valid.append(False)
      continue
    out.append(max(0.0, neg[:top_k].mean() + margin - pos[:top_k].mean()))
    valid.append(True)
  return np.asarray(out), np.asarray(valid)


def test_zero_loss_and_zero_gradient_when_the_margin_is_met():
  anchor = jnp.asarray([[1.0, 0.0, 0.0]])
  emb = jnp.asarray([[[1.0, 0.1, 0.0], [0.9, 0.0, 0.2], [0.0, 1.0, 0.0], [0.3, 0.0, 1.0]]])
  role = jnp.asarray([[1, 1, -1, -1]])
  loss, valid = losses.mca_loss(anchor, emb, role, margin=0.2)
  assert bool(valid[0]) and float(loss[0]) == 0.0
  g = jax.grad(lambda e: losses.mca_loss(anchor, e, role)[0].sum())(emb)
  assert not np.any(np.asarray(g))
  # the same rationales with the margin raised above the gap: positive loss
  assert float(losses.mca_loss(anchor, emb, role, margin=1.5)[0][0]) > 0


@pytest.mark.parametrize("top_k", [1, 2])
def test_gradient_flows_only_through_the_hardest_rationales(top_k):
  rs = np.random.RandomState(0)
  anchor = jnp.asarray(rs.randn(1, 8), jnp.float32)
  emb = jnp.asarray(rs.randn(1, 7, 8), jnp.float32)
  role = jnp.asarray([[1, 1, 1, -1, -1, -1, 0]])
  cos = np.asarray(emb[0] @ anchor[0]) / (np.linalg.norm(emb[0], axis=1) * np.linalg.norm(anchor[0]))
  loss = losses.mca_loss(anchor, emb, role, margin=2.0, top_k=top_k)[0]
  assert float(loss[0]) > 0
  g = np.asarray(jax.grad(lambda e: losses.mca_loss(anchor, e, role, margin=2.0, top_k=top_k)[0].sum())(emb))[0]
  hardest = set(np.argsort(cos[:3])[:top_k]) | set(3 + np.argsort(-cos[3:6])[:top_k])
  moved = {i for i in range(7) if np.abs(g[i]).sum() > 0}
  assert moved == hardest


def test_unused_zero_rows_give_finite_gradients():
  # an unused row (role 0) pools to exact zeros: its norm's gradient is 0/0, which must not reach the step (a
  # train step skips updates whose gradients are not finite)
  rs = np.random.RandomState(2)
  anchor = jnp.asarray(rs.randn(2, 6), jnp.float32)
  emb = jnp.asarray(rs.randn(2, 4, 6), jnp.float32).at[:, 3].set(0.0).at[1, 2].set(0.0)
  role = jnp.asarray([[1, -1, 1, 0], [1, -1, 0, 0]])
  f = lambda a, e: losses.mca_loss(a, e, role, margin=2.0)[0].sum()
  loss = f(anchor, emb)
  ga, ge = jax.grad(f, argnums=(0, 1))(anchor, emb)
  assert float(loss) > 0 and np.all(np.isfinite(np.asarray(ga))) and np.all(np.isfinite(np.asarray(ge)))
  assert not np.any(np.asarray(ge)[:, 3]) and not np.any(np.asarray(ge)[1, 2])
  # a zero anchor too (an empty anchor mask): finite
  assert np.all(np.isfinite(np.asarray(jax.grad(f)(jnp.zeros_like(anchor), emb))))


@pytest.mark.parametrize("top_k", [1, 2, 5])
def test_equals_numpy_transcription(top_k):
  rs = np.random.RandomState(1)
  anchor, emb = rs.randn(4, 6).astype(np.float32), rs.randn(4, 5, 6).astype(np.float32)
  role = np.asarray([[1, -1, 1, -1, 0], [1, 1, 1, -1, -1], [1, 1, 0, 0, 0], [-1, 1, -1, -1, 1]])
  got, valid = losses.mca_loss(jnp.asarray(anchor), jnp.asarray(emb), jnp.asarray(role), 0.2, top_k)
  want, want_valid = np_mca(anchor, emb, role, 0.2, top_k)
  np.testing.assert_array_equal(np.asarray(valid), want_valid)
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-6)
  assert not want_valid[2] and float(got[2]) == 0.0


def test_bad_shapes_are_a_one_line_error():
  with pytest.raises(ValueError, match=r"expected anchor \[B, D\].*found") as e:
    losses.mca_loss(jnp.zeros((2, 3)), jnp.zeros((2, 4, 3)), jnp.zeros((2, 5)))
  assert "\n" not in str(e.value)


VCFG = vlm.Config(vision=vit.clip_config(image_size=16, patch_size=8, d_model=16, n_layers=1, n_heads=2, d_ff=32),
                  text=tfm.Config(vocab_size=32, d_model=16, n_layers=2, n_heads=2, d_ff=32), image_token_id=3,
                  feature_layers=(-1,))


def _batch(b=4, r=3, t=10, seed=0):
  rs = np.random.RandomState(seed)
  p = VCFG.tokens_per_image
  inputs = rs.randint(4, 32, (b, r, t)).astype(np.int32)
  inputs[:, :, 1:1 + p] = 3
  span = np.zeros((b, r, t), np.int32)
  span[:, :, 7:] = 1
  anchor = np.zeros((b, t), np.int32)
  anchor[:, 1:7] = 1
  role = np.tile(np.asarray([1, 1, -1], np.int32), (b, 1))
  role[0] = [1, -1, -1]
  role[1] = [1, 0, -1]  # an unused row, as a question with fewer positives has: no span, no loss
  span[1, 1] = 0
  mask = (span * (role[:, :, None] > 0)).astype(np.int32)
  return {"inputs": inputs, "targets": rs.randint(4, 32, (b, r, t)).astype(np.int32), "loss_mask": mask,
          "pixels": rs.rand(b, 16, 16, 3).astype(np.float32), "role": role, "span_mask": span,
          "anchor_mask": anchor}


def _per_row_pixels(batch):
  return {**batch, "pixels": np.repeat(batch["pixels"], batch["inputs"].shape[1], 0)}


_MIND_VALUE_AND_GRAD = jax.jit(jax.value_and_grad(lambda p, x: losses.mind_loss_fn(VCFG, alpha=1.0)(p, x, None)[0]))


@jax.jit
def _references(params, batch):
  """(logits and final hidden states of the flattened rows, mind_loss_fn at alpha 0 and its weight)."""
  b, r, t = batch["inputs"].shape
  out = vlm.forward(params, batch["inputs"].reshape(b * r, t), batch["pixels"], VCFG, capture=("hidden_states",))
  return out.logits, out.lm.hidden_states[-1].reshape(b, r, t, -1), losses.mind_loss_fn(VCFG, alpha=0.0)(
      params, batch, None)


def test_vlm_loss_is_ce_plus_alpha_mca_from_the_hidden_states():
  params = vlm.init(VCFG, jax.random.PRNGKey(0))
  batch = _per_row_pixels(_batch())
  b, r, t = batch["inputs"].shape
  logits, h, (s0, w0, _) = _references(params, batch)
  logp = jax.nn.log_softmax(np.asarray(logits, np.float64), -1)
  nll = -np.take_along_axis(np.asarray(logp), batch["targets"].reshape(b * r, t, 1), -1)[..., 0]
  m = batch["loss_mask"].reshape(b * r, t) > 0
  ce_sum, count = nll[m].sum(), m.sum()
  np.testing.assert_allclose([float(s0), float(w0)], [ce_sum, count], rtol=1e-5)
  h = np.asarray(h)
  anchor = np.stack([h[i, 0][batch["anchor_mask"][i] > 0].mean(0) for i in range(b)])
  emb = np.stack([[h[i, j][batch["span_mask"][i, j] > 0].mean(0) if batch["span_mask"][i, j].any()
                   else np.zeros(h.shape[-1]) for j in range(r)] for i in range(b)])
  mca, _ = np_mca(anchor, emb, batch["role"], 0.2, 1)
  assert mca.mean() > 0
  s1, grads = _MIND_VALUE_AND_GRAD(params, batch)
  np.testing.assert_allclose(float(s1) / count, ce_sum / count + mca.mean(), rtol=1e-5)
  assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(grads))
  assert not any(np.any(np.asarray(x)) for x in jax.tree.leaves(grads["vision"]))
  assert all(np.any(np.asarray(x)) for x in jax.tree.leaves(grads["connector"]))
  with pytest.raises(ValueError, match=r"one image per row \(4 x 3 = 12\), found 4") as e:
    losses.mind_loss_fn(VCFG)(params, _batch(), None)
  assert "\n" not in str(e.value)


def test_sharded_loss_and_grads_equal_single_device():
  params = vlm.init(VCFG, jax.random.PRNGKey(0))
  batch = _per_row_pixels(_batch())
  single_v, single_g = _MIND_VALUE_AND_GRAD(params, {k: jnp.asarray(v) for k, v in batch.items()})
  mesh = sharding.make_mesh("fsdp:4,tensor:2")
  sp = sharding.shard_params(params, mesh, "fsdp_tp", axes=vlm.AXES)
  multi_v, multi_g = _MIND_VALUE_AND_GRAD(sp, sharding.shard_batch(batch, mesh))
  np.testing.assert_allclose(float(multi_v), float(single_v), rtol=1e-5)
  for a, b in zip(jax.tree.leaves(multi_g), jax.tree.leaves(single_g)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5)
