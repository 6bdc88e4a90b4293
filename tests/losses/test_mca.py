"""jaxlab.losses.mca_loss / mind_loss_fn (MIND, arXiv:2512.05530): the per-token MCA equals a NumPy transcription of
the reference's formula (`model.py: contrastive_loss_topk_extreme` over `cls_linear` embeddings of the argmax
prediction and of each rationale's token at the same position), is zero when the margin is met, has gradients only
through the hardest rows; the VLM loss is CE + alpha * MCA recomputed from the logits, keeps the ViT frozen, trains
the projection, and is the same sharded over 8 CPU devices as on one."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab import losses, sharding
from jaxlab.models import transformer as tfm, vit, vlm


def _unit(x):
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def np_mca(pred, label, role, mask, margin, top_k):
  """The reference's loss, one trained rationale at a time: for positive row i of question b, its positives are the
  question's other positive rows (itself when alone), its negatives the negative rows; per position the hinge of
  the mean of the top_k highest negative cosines + margin - the mean of the top_k lowest positive ones, then the
  mean over the masked positions of every trained row. Returns (sum, count)."""
  total, count = 0.0, 0.0
  for b in range(pred.shape[0]):
    pos_rows = [j for j in range(role.shape[1]) if role[b, j] > 0]
    neg_rows = [j for j in range(role.shape[1]) if role[b, j] < 0]
    if not pos_rows or not neg_rows:
      continue
    for i in pos_rows:
      positives = [j for j in pos_rows if j != i] or [i]
      for t in range(pred.shape[2]):
        if not mask[b, i, t]:
          continue
        p = _unit(pred[b, i, t])
        sp = np.sort([p @ _unit(label[b, j, t]) for j in positives])
        sn = np.sort([p @ _unit(label[b, j, t]) for j in neg_rows])[::-1]
        total += max(0.0, sn[:top_k].mean() + margin - sp[:top_k].mean())
        count += 1
  return total, count


def _random(seed, b=3, r=5, t=4, d=6):
  rs = np.random.RandomState(seed)
  pred, label = rs.randn(b, r, t, d).astype(np.float32), rs.randn(b, r, t, d).astype(np.float32)
  role = np.asarray([[1, 1, 1, -1, -1], [1, 0, -1, -1, -1], [1, 1, 0, 0, 0]], np.int32)[:b]
  mask = (rs.rand(b, r, t) < 0.8).astype(np.int32)
  return pred, label, role, mask


@pytest.mark.parametrize("top_k", [1, 2, 5])
def test_equals_numpy_transcription_of_the_reference(top_k):
  pred, label, role, mask = _random(1)
  got = losses.mca_loss(*map(jnp.asarray, (pred, label, role, mask)), 0.2, top_k)
  want = np_mca(pred, label, role, mask, 0.2, top_k)
  assert want[1] > 0 and want[0] > 0
  np.testing.assert_allclose([float(got[0]), float(got[1])], want, rtol=1e-5)


def test_zero_loss_and_zero_gradient_when_the_margin_is_met():
  e = np.eye(4, dtype=np.float32)
  # one position; row 0's prediction points along e0, the other positive's token too, the negatives away
  pred = np.stack([e[0], e[0], e[1], e[2]])[None, :, None]
  label = np.stack([e[0], 0.9 * e[0] + 0.1 * e[3], e[1], e[2]])[None, :, None]
  role, mask = np.asarray([[1, 1, -1, -1]]), np.asarray([[[1], [0], [0], [0]]])
  f = lambda lab, m=0.2: losses.mca_loss(jnp.asarray(pred), lab, jnp.asarray(role), jnp.asarray(mask), m)[0]
  assert float(f(jnp.asarray(label))) == 0.0
  assert not np.any(np.asarray(jax.grad(f)(jnp.asarray(label))))
  assert float(f(jnp.asarray(label), 1.5)) > 0


@pytest.mark.parametrize("top_k", [1, 2])
def test_gradient_flows_only_through_the_hardest_rows(top_k):
  rs = np.random.RandomState(0)
  pred, label = rs.randn(1, 7, 1, 8).astype(np.float32), rs.randn(1, 7, 1, 8).astype(np.float32)
  role = np.asarray([[1, 1, 1, -1, -1, -1, 0]])
  mask = np.zeros((1, 7, 1), np.int32)
  mask[0, 0] = 1  # only row 0 is trained: its positives are rows 1, 2
  cos = _unit(label[0, :, 0]) @ _unit(pred[0, 0, 0])
  g = np.asarray(jax.grad(lambda lab: losses.mca_loss(jnp.asarray(pred), lab, jnp.asarray(role), jnp.asarray(mask),
                                                      2.0, top_k)[0])(jnp.asarray(label)))[0, :, 0]
  hardest = set(1 + np.argsort(cos[1:3])[:top_k]) | set(3 + np.argsort(-cos[3:6])[:top_k])
  assert {i for i in range(7) if np.abs(g[i]).sum() > 0} == hardest


def test_zero_embeddings_give_finite_gradients():
  pred, label, role, mask = _random(2)
  label[:, 3] = 0.0
  pred[0, 1] = 0.0
  f = lambda p, lab: losses.mca_loss(p, lab, jnp.asarray(role), jnp.asarray(mask), 2.0)[0]
  gp, gl = jax.grad(f, argnums=(0, 1))(jnp.asarray(pred), jnp.asarray(label))
  assert np.all(np.isfinite(np.asarray(gp))) and np.all(np.isfinite(np.asarray(gl)))


def test_bad_shapes_are_a_one_line_error():
  with pytest.raises(ValueError, match=r"expected pred and label \[B, R, T, D\].*found") as e:
    losses.mca_loss(jnp.zeros((2, 3, 4, 5)), jnp.zeros((2, 3, 4, 5)), jnp.zeros((2, 4)), jnp.zeros((2, 3, 4)))
  assert "\n" not in str(e.value)


VCFG = vlm.Config(vision=vit.clip_config(image_size=16, patch_size=8, d_model=16, n_layers=1, n_heads=2, d_ff=32),
                  text=tfm.Config(vocab_size=32, d_model=16, n_layers=2, n_heads=2, d_ff=32), image_token_id=3,
                  feature_layers=(-1,))


def _batch(b=4, r=2, s=3, t=10, seed=0):
  """r trained rows per group (row 1 of group 1 without a target, as padding) and s sampled rationales."""
  rs = np.random.RandomState(seed)
  p = VCFG.tokens_per_image
  inputs = rs.randint(4, 32, (b, r, t)).astype(np.int32)
  inputs[:, :, 1:1 + p] = 3
  mask = np.zeros((b, r, t), np.int32)
  mask[:, :, 6:] = 1
  mask[1, 1] = 0
  role = np.tile(np.asarray([1, -1, -1], np.int32), (b, 1))
  role[0] = [-1, -1, -1]  # the trained rows' only positives are each other
  role[2] = [1, 0, -1]  # an unused row, as a question with fewer rationales has
  return {"inputs": inputs, "targets": rs.randint(4, 32, (b, r, t)).astype(np.int32), "loss_mask": mask,
          "pixels": rs.rand(b * r, 16, 16, 3).astype(np.float32),
          "mca_targets": rs.randint(4, 32, (b, s, t)).astype(np.int32), "mca_role": role}


def _params():
  params = vlm.init(VCFG, jax.random.PRNGKey(0))
  return {**params, "mca_head": losses.mca_head_init(jax.random.PRNGKey(1), VCFG.text.d_model)}


_MIND_VALUE_AND_GRAD = jax.jit(jax.value_and_grad(lambda p, x: losses.mind_loss_fn(VCFG, alpha=1.0)(p, x, None)[0]))


@jax.jit
def _references(params, batch):
  """(logits of the flattened rows, mind_loss_fn at alpha 0: CE sum and its weight)."""
  b, r, t = batch["inputs"].shape
  vlm_params = {k: v for k, v in params.items() if k != "mca_head"}
  out = vlm.forward(vlm_params, batch["inputs"].reshape(b * r, t), batch["pixels"], VCFG)
  return out.logits, losses.mind_loss_fn(VCFG, alpha=0.0)(vlm_params, batch, None)


def test_vlm_loss_is_ce_plus_alpha_mca_of_the_projected_predictions():
  params = _params()
  batch = _batch()
  b, r, t = batch["inputs"].shape
  logits, (s0, w0, _) = _references(params, batch)
  logits = np.asarray(logits, np.float64)
  logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - \
      logits.max(-1, keepdims=True)
  nll = -np.take_along_axis(logp, batch["targets"].reshape(b * r, t, 1), -1)[..., 0]
  m = batch["loss_mask"].reshape(b * r, t) > 0
  ce_sum, count = nll[m].sum(), m.sum()
  np.testing.assert_allclose([float(s0), float(w0)], [ce_sum, count], rtol=1e-5)
  table = np.asarray(params["lm"]["embed"]["embedding"], np.float64)
  w, bias = (np.asarray(params["mca_head"][k], np.float64) for k in ("kernel", "bias"))
  project = lambda ids: table[ids] @ w + bias
  pred = project(logits.argmax(-1).reshape(b, r, t))
  # the trained rows first, then the sampled ones (predictions unused: they have no target positions)
  sampled = batch["mca_targets"].shape[1]
  pred = np.concatenate([pred, np.zeros((b, sampled, t, pred.shape[-1]))], axis=1)
  labels = project(np.concatenate([batch["targets"], batch["mca_targets"]], axis=1))
  role = np.concatenate([(batch["loss_mask"].sum(-1) > 0).astype(np.int32), batch["mca_role"]], axis=1)
  mask_all = np.concatenate([batch["loss_mask"], np.zeros((b, sampled, t), np.int32)], axis=1)
  mca_sum, mca_count = np_mca(pred, labels, role, mask_all, 0.2, 1)
  assert mca_sum > 0 and mca_count == count
  s1, grads = _MIND_VALUE_AND_GRAD(params, batch)
  np.testing.assert_allclose(float(s1) / count, ce_sum / count + mca_sum / mca_count, rtol=1e-5)
  assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(grads))
  assert not any(np.any(np.asarray(x)) for x in jax.tree.leaves(grads["vision"]))
  assert all(np.any(np.asarray(x)) for x in jax.tree.leaves(grads["mca_head"]))
  with pytest.raises(ValueError, match=r"one image per row \(4 x 2 = 8\), found 4") as e:
    losses.mind_loss_fn(VCFG)(params, {**batch, "pixels": batch["pixels"][:4]}, None)
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match=r"needs params\['mca_head'\]") as e:
    losses.mind_loss_fn(VCFG)({k: v for k, v in params.items() if k != "mca_head"}, batch, None)
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match=r"mca_targets, mca_role; found .*batch \['inputs'"):
    losses.mind_loss_fn(VCFG)(params, {k: v for k, v in batch.items() if not k.startswith("mca")}, None)


def test_sharded_loss_and_grads_equal_single_device():
  params = _params()
  batch = _batch()
  single_v, single_g = _MIND_VALUE_AND_GRAD(params, {k: jnp.asarray(v) for k, v in batch.items()})
  mesh = sharding.make_mesh("fsdp:4,tensor:2")
  sp = sharding.shard_params(params, mesh, "fsdp_tp", axes=vlm.AXES + losses.MCA_AXES)
  multi_v, multi_g = _MIND_VALUE_AND_GRAD(sp, sharding.shard_batch(batch, mesh))
  np.testing.assert_allclose(float(multi_v), float(single_v), rtol=1e-5)
  for a, b in zip(jax.tree.leaves(multi_g), jax.tree.leaves(single_g)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5)
