"""SCALE (arXiv 2506.16659) against a direct NumPy implementation of its update rule on a LLaMA-shaped tree."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlab import optim
from jaxlab.models import transformer as tfm

SCHED = optax.linear_schedule(3e-2, 1e-2, 3)  # lr changes every step
PEAK, ADAM_LR, WD = 3e-2, 5e-3, 0.1


def numpy_rule(params, grads_seq, lrs, *, momentum_paths, normalize=True, beta=0.9, adam_ratio=ADAM_LR / PEAK,
               wd=WD, b1=0.9, b2=0.999, eps=1e-8):
  """The rule written out per path: embedding normalized over vocab (axis 0), kernels [.., in, out] over `in`."""
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  mom = {k: np.zeros_like(p[k]) for k in momentum_paths}
  m1 = {k: np.zeros_like(v) for k, v in p.items()}
  m2 = {k: np.zeros_like(v) for k, v in p.items()}
  history = []
  for t, (grads, lr) in enumerate(zip(grads_seq, lrs), start=1):
    new = {}
    for k, w in p.items():
      g = np.asarray(grads[k], np.float64)
      if k.endswith("/scale") or k.endswith("/bias"):
        a_lr = lr * adam_ratio
        m1[k] = b1 * m1[k] + (1 - b1) * g
        m2[k] = b2 * m2[k] + (1 - b2) * g * g
        d = np.sqrt(1 - b2 ** t) / (1 - b1 ** t) * m1[k] / (np.sqrt(m2[k]) + eps)
        new[k] = w * (1 - a_lr * wd) - a_lr * d
        continue
      if k in mom:
        mom[k] = beta * mom[k] + (1 - beta) * g
        g = mom[k]
      if normalize:
        axis = 0 if k == "embed/embedding" else w.ndim - 2
        g = g / np.maximum(np.sqrt(np.mean(g * g, axis=axis, keepdims=True)), 1e-8)
      new[k] = w * (1 - lr * wd) - lr * g
    p = new
    history.append(p)
  return history


def init(seed=0, **kw):
  return jax.jit(tfm.init, static_argnums=0)(tfm.Config.tiny(**kw), jax.random.key(seed))


def flat(tree):
  return {jax.tree_util.keystr(k, simple=True, separator="/"): v for k, v in jax.tree_util.tree_leaves_with_path(tree)}


def run_jax(tx, params, grads_seq):
  state = tx.init(params)
  update = jax.jit(tx.update)
  out = []
  for g in grads_seq:
    u, state = update(g, state, params)
    params = optax.apply_updates(params, u)
    out.append(flat(params))
  return out, state


def random_grads(params, seed, n=3):
  keys = jax.random.split(jax.random.key(seed), n)
  make = jax.jit(lambda k: jax.tree.map(lambda x: jax.random.normal(jax.random.fold_in(k, x.size), x.shape), params))
  return [make(k) for k in keys]


@pytest.mark.parametrize("tied", [False, True])
def test_scale_equals_numpy_rule(tied):
  params = init(0, tie_embeddings=tied)
  grads_seq = random_grads(params, 1)
  tx = optim.scale(SCHED, axes=tfm.AXES, adam_lr=ADAM_LR, peak_lr=PEAK, weight_decay=WD)
  got, state = run_jax(tx, params, grads_seq)
  last = "embed/embedding" if tied else "lm_head/kernel"
  want = numpy_rule(flat(params), [flat(g) for g in grads_seq], [SCHED(t) for t in range(3)], momentum_paths={last})
  assert set(got[0]) == set(want[0])
  assert any(k.endswith("norm/scale") for k in want[0]) and "layers/mlp/down/kernel" in want[0]
  for g_step, w_step in zip(got, want):
    for k in w_step:
      np.testing.assert_allclose(np.asarray(g_step[k]), w_step[k], rtol=2e-5, atol=2e-6, err_msg=k)

  # Exactly one momentum buffer, shaped like the last layer; AdamW moments only for the vectors.
  mom = [x for x in jax.tree.leaves(state.inner_states["momentum"]) if x.ndim > 0]
  assert [m.shape for m in mom] == [flat(params)[last].shape]
  vectors = [v for k, v in flat(params).items() if k.endswith("/scale")]
  adam = [x for x in jax.tree.leaves(state.inner_states["vector"]) if x.ndim > 0]
  assert sorted(x.shape for x in adam) == sorted([v.shape for v in vectors] * 2)
  assert not [x for x in jax.tree.leaves(state.inner_states["matrix"]) if x.ndim > 0]


@pytest.mark.parametrize("name,momentum,normalize", [("sgd", (), False), ("sgd_colnorm", (), True),
                                                     ("colnorm_momentum", "all", True)])
def test_variants_equal_numpy_rule(name, momentum, normalize):
  params = init(2)
  grads_seq = random_grads(params, 3)
  tx = optim.get(name, SCHED, axes=tfm.AXES, adam_lr=ADAM_LR, peak_lr=PEAK, weight_decay=WD)
  got, _ = run_jax(tx, params, grads_seq)
  fp = flat(params)
  mats = {k for k in fp if not (k.endswith("/scale") or k.endswith("/bias"))}
  want = numpy_rule(fp, [flat(g) for g in grads_seq], [SCHED(t) for t in range(3)],
                    momentum_paths=mats if momentum == "all" else set(), normalize=normalize)
  for k in want[-1]:
    np.testing.assert_allclose(np.asarray(got[-1][k]), want[-1][k], rtol=2e-5, atol=2e-6, err_msg=k)


def test_inject_hyperparams_matches_and_controls_lr():
  params = init(4)
  grads_seq = random_grads(params, 5)
  direct, _ = run_jax(optim.scale(SCHED, axes=tfm.AXES, adam_lr=ADAM_LR, peak_lr=PEAK), params, grads_seq)
  injected = optax.inject_hyperparams(optim.scale)(learning_rate=SCHED, axes=tfm.AXES, adam_lr=ADAM_LR,
                                                    peak_lr=PEAK)
  got, state = run_jax(injected, params, grads_seq)
  for k in direct[-1]:
    np.testing.assert_allclose(np.asarray(got[-1][k]), np.asarray(direct[-1][k]), rtol=1e-6, atol=1e-7)
  fixed = optax.inject_hyperparams(optim.scale)(learning_rate=1e-2, axes=tfm.AXES, adam_lr=ADAM_LR, peak_lr=1e-2)
  state, update = fixed.init(params), jax.jit(fixed.update)
  u, _ = update(grads_seq[0], state, params)
  assert all(float(jnp.max(jnp.abs(x))) > 0.0 for x in jax.tree.leaves(u))
  state.hyperparams["learning_rate"] = jnp.zeros([])  # a zero learning rate stops every group
  u, _ = update(grads_seq[0], state, params)
  assert all(float(jnp.max(jnp.abs(x))) == 0.0 for x in jax.tree.leaves(u))


def test_schedule_without_peak_is_rejected():
  with pytest.raises(ValueError, match="peak_lr"):
    optim.scale(SCHED, axes=tfm.AXES, adam_lr=1e-3)


@pytest.mark.parametrize("tied", [False, True])
def test_fsdp_sharded_equals_single_device(tied, sharded_check):
  params = init(6, tie_embeddings=tied)
  grads = random_grads(params, 7, 1)[0]
  sharded_check(optim.scale(1e-2, axes=tfm.AXES, adam_lr=1e-3, weight_decay=WD), params, grads, steps=2)
