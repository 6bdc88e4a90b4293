"""Tele-Lens probes (jaxlab.interp.probes) against NumPy, a plain forward, scikit-learn and brute force.

Oracles: a NumPy transcription of the probe (every kind), `transformer.forward` hidden states (features
through a truncated program and from the cache), scikit-learn's roc_auc_score, NumPy sorts and loops
(targets, top-k, entropies), the single-device train step (sharded step), and a learnable synthetic target.
"""
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from jaxlab import sharding
from jaxlab.interp import probes
from jaxlab.models import transformer as tfm

TFM = tfm.Config.tiny(vocab_size=80, n_layers=3, d_ff=64, init_std=0.2)


def _random_params(cfg, seed):
  """init's tree with every leaf random (a zero length head would hide mistakes)."""
  leaves, tree = jax.tree.flatten(probes.init(cfg, jax.random.key(seed)))
  rng = np.random.default_rng(seed)
  return jax.tree.unflatten(tree, [jnp.asarray(rng.normal(size=x.shape) * 0.3, jnp.float32) for x in leaves])


def _numpy_probe(p, cfg, h, head):
  p = jax.tree.map(np.asarray, p)
  act = {"none": lambda x: x, "relu": lambda x: np.maximum(x, 0), "tanh": np.tanh,
         "silu": lambda x: x / (1 + np.exp(-x)),
         "gelu": lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2)))}[cfg.activation]
  if cfg.kind == "tokens":
    out = []
    for d in range(1, cfg.horizon + 1):
      z = act((h + p["lens_offset"]["embedding"][d]) @ p["lens_a"]["kernel"]) @ p["lens_b"]["kernel"]
      out.append(z * cfg.alpha / cfg.rank @ head)
    return np.stack(out, 1)
  z = act(h @ p["lens_a"]["kernel"]) @ p["lens_b"]["kernel"] * cfg.alpha / cfg.rank
  if cfg.kind == "length":
    return (z @ p["lens_length"]["kernel"])[:, 0] + p["lens_length"]["bias"][0]
  return z @ head


@pytest.mark.parametrize("kind,activation", [("tokens", "silu"), ("tokens", "gelu"), ("answer", "relu"),
                                             ("answer", "none"), ("length", "tanh")])
def test_probe_equals_numpy(kind, activation):
  cfg = probes.Config(d_model=12, rank=5, alpha=7.0, activation=activation, kind=kind, horizon=3)
  params = _random_params(cfg, 1)
  rng = np.random.default_rng(2)
  h = rng.normal(size=(6, 12)).astype(np.float32)
  head = rng.normal(size=(12, 9)).astype(np.float32)
  got = probes.forward(params, cfg, jnp.asarray(h), jnp.asarray(head))
  want = _numpy_probe(params, cfg, h.astype(np.float64), head.astype(np.float64))
  assert got.shape == want.shape
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


def test_init_shapes_axes_and_scales():
  cfg = probes.Config(d_model=32, rank=16, kind="tokens", horizon=8)
  p = probes.init(cfg, jax.random.key(0))
  assert p["lens_offset"]["embedding"].shape == (9, 32)
  assert np.abs(np.asarray(p["lens_a"]["kernel"])).max() <= 1 / np.sqrt(32)
  assert np.abs(np.asarray(p["lens_b"]["kernel"])).max() <= 1 / np.sqrt(16)
  assert probes.param_axes(cfg) == {"lens_a": {"kernel": ("embed", "rank")}, "lens_b": {"kernel": ("rank", "embed")},
                                    "lens_offset": {"embedding": ("pos", "embed")}}
  length = probes.param_axes(cfg.replace(kind="length"))
  assert length["lens_length"] == {"kernel": ("embed", "classes"), "bias": ("classes",)}


def _sequences(n=5, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, TFM.vocab_size, int(rng.integers(4, 20))).tolist() for _ in range(n)]


def _positions(seqs, seed=0):
  rng = np.random.default_rng(seed)
  return np.array([(r, int(rng.integers(len(s)))) for r, s in enumerate(seqs) for _ in range(3)])


def test_features_equal_plain_hidden_states_and_cache_round_trips(tmp_path, monkeypatch):
  params = tfm.init(TFM, jax.random.key(3))
  seqs = _sequences()
  pos = _positions(seqs)
  tok = np.zeros((len(seqs), max(map(len, seqs))), np.int32)
  for r, s in enumerate(seqs):  # right padding: a causal LM's real positions never see it
    tok[r, :len(s)] = s
  hs = np.asarray(tfm.forward(params, tok, TFM, capture=("hidden_states",)).hidden_states)
  for layer in range(TFM.n_layers + 1):
    got = probes.extract(params, TFM, seqs, layer, pos, batch_size=2, bucket=8)
    np.testing.assert_allclose(got, hs[layer, pos[:, 0], pos[:, 1]], atol=2e-5, rtol=1e-5)
  first = probes.extract_cached(str(tmp_path), "tiny/random", params, TFM, seqs, 2, pos)
  assert len(os.listdir(tmp_path)) == 1
  monkeypatch.setattr(probes, "extract", lambda *a, **k: pytest.fail("a cache hit recomputed the features"))
  np.testing.assert_array_equal(probes.extract_cached(str(tmp_path), "tiny/random", params, TFM, seqs, 2, pos), first)
  keys = {probes.cache_key("tiny/random", 2, seqs, pos), probes.cache_key("tiny/random", 1, seqs, pos),
          probes.cache_key("tiny/random", 2, seqs, pos[:-1]), probes.cache_key("other", 2, seqs, pos),
          probes.cache_key("tiny/random", 2, seqs[:-1] + [seqs[-1][:-1]], pos)}
  assert len(keys) == 5


def test_targets_and_subsets():
  seqs = [[5, 6, 7, 8], [9, 10]]
  got = probes.token_targets(seqs, [(0, 0), (0, 2), (1, 1)], horizon=3)
  assert got.tolist() == [[6, 7, 8], [8, -1, -1], [-1, -1, -1]]
  assert probes.token_targets(seqs, [(0, 0)], horizon=3, ends=[3, 2]).tolist() == [[6, 7, -1]]
  assert probes.to_subset([[8, 5, -1], [3, 7, 8]], [7, 3, 8]).tolist() == [[2, -1, -1], [1, 0, 2]]
  with pytest.raises(ValueError, match="row 1, position 2"):
    probes.token_targets(seqs, [(1, 2)], horizon=2)


def test_predict_top_k_ids_equal_a_sort_of_the_full_logits():
  cfg = probes.Config(d_model=16, rank=8, kind="tokens", horizon=3)
  p = probes.init(cfg, jax.random.key(1))
  rng = np.random.default_rng(2)
  h, head = rng.normal(size=(70, 16)).astype(np.float32), rng.normal(size=(16, 300)).astype(np.float32)
  logits = probes.predict(p, cfg, h, head, batch_size=32)
  top = probes.predict(p, cfg, h, head, batch_size=32, top_k=5)
  assert top.shape == (70, 3, 5)
  np.testing.assert_array_equal(top, np.argsort(-logits, -1, kind="stable")[..., :5])
  targets = np.where(rng.random((70, 3)) < 0.3, top[..., 2], rng.integers(-1, 300, (70, 3)))
  np.testing.assert_array_equal(probes.topk_accuracy(None, targets, 5, top_ids=top),
                                probes.topk_accuracy(logits, targets, 5))


def test_linear_schedule_decays_adams_steps_to_zero_over_the_training_steps():
  # under a constant gradient Adam's bias-corrected step is lr(t) * g / (|g| + eps), i.e. lr(t) per coordinate
  cfg = probes.Config(d_model=4, rank=2, schedule="linear", decay_steps=4, learning_rate=0.1)
  tx = probes.optimizer(cfg)
  params = {"w": jnp.zeros(3)}
  state = tx.init(params)
  steps = []
  for _ in range(5):
    upd, state = tx.update({"w": jnp.ones(3)}, state, params)
    steps.append(float(-upd["w"][0]))
  np.testing.assert_allclose(steps, [0.1, 0.075, 0.05, 0.025, 0.0], atol=1e-6)
  const = probes.optimizer(cfg.replace(schedule="constant"))
  upd, _ = const.update({"w": jnp.ones(3)}, const.init(params), params)
  np.testing.assert_allclose(-np.asarray(upd["w"]), 0.1, atol=1e-6)
  with pytest.raises(ValueError, match="schedule"):
    probes.Config(schedule="cosine")


def test_topk_entropies_and_readouts_against_numpy():
  rng = np.random.default_rng(4)
  logits = rng.normal(size=(40, 3, 11)).astype(np.float32)
  targets = rng.integers(-1, 11, (40, 3))
  want = [np.mean([targets[i, m] in np.argsort(-logits[i, m])[:5] for i in range(40) if targets[i, m] >= 0])
          for m in range(3)]
  np.testing.assert_allclose(probes.topk_accuracy(logits, targets, 5), want)
  p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  ent = -(p * np.log(p)).sum(-1)
  np.testing.assert_allclose(probes.entropy(logits), ent, rtol=1e-5)
  mask = rng.random((40, 3)) < 0.8
  mask[:, 0] = True
  got = probes.pivot_uncertainty(ent, mask, k=2)
  np.testing.assert_allclose(got, [np.sort(e[m])[:2].mean() for e, m in zip(ent, mask)], rtol=1e-5)
  got = probes.pivot_uncertainty(ent, mask, k=2, highest=True)
  np.testing.assert_allclose(got, [np.sort(e[m])[-2:].mean() for e, m in zip(ent, mask)], rtol=1e-5)
  kl = (np.log(1 / 11) - np.log(p)).mean(-1)  # KL(U || p) = mean_v (log U - log p_v)
  np.testing.assert_allclose(probes.self_certainty(logits, mask), [k[m].mean() for k, m in zip(kl, mask)], rtol=1e-4)
  lp = np.log(p[..., 0])
  np.testing.assert_allclose(probes.perplexity(lp, mask), [np.exp(-l[m].mean()) for l, m in zip(lp, mask)],
                             rtol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auroc_equals_sklearn(seed):
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 2, 300)
  scores = rng.normal(size=300) + 0.7 * labels
  assert probes.auroc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
  tied = np.round(scores)  # many ties
  assert probes.auroc(tied, labels) == pytest.approx(roc_auc_score(labels, tied), abs=1e-12)
  with pytest.raises(ValueError, match="both classes"):
    probes.auroc(scores, np.ones(300))


@pytest.mark.parametrize("kind", ["tokens", "length"])
def test_train_step_sharded_equals_single_device(kind):
  cfg = probes.Config(d_model=16, rank=8, alpha=8.0, kind=kind, horizon=4, learning_rate=1e-2)
  rng = np.random.default_rng(5)
  h = rng.normal(size=(16, 16)).astype(np.float32)
  y = rng.integers(-1, 10, (16, 4)).astype(np.int32) if kind == "tokens" else rng.normal(size=16).astype(np.float32)
  head = jnp.asarray(rng.normal(size=(16, 10)), jnp.float32)
  batch = next(probes.batches(h, y, 16))
  tx = probes.optimizer(cfg)
  step = probes.make_train_step(cfg, tx)
  copy = lambda t: jax.tree.map(lambda x: jnp.array(x, copy=True), t)
  params = _random_params(cfg, 6)
  p1, s1 = copy(params), tx.init(params)
  for _ in range(3):
    p1, s1, l1 = step(p1, s1, jax.tree.map(jnp.asarray, batch), head)
  mesh = sharding.make_mesh("data:8")
  p2 = sharding.shard_params(copy(params), mesh, "dp", axes=probes.AXES)
  s2 = tx.init(p2)
  sb = sharding.shard_batch(batch, mesh)
  assert not sb["h"].sharding.is_fully_replicated
  for _ in range(3):
    p2, s2, l2 = step(p2, s2, sb, head)
  np.testing.assert_allclose(float(l2), float(l1), rtol=1e-5)
  for a, b in zip(jax.tree.leaves(p2), jax.tree.leaves(p1)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_padded_rows_do_not_count():
  cfg = probes.Config(d_model=8, rank=4, kind="answer")
  rng = np.random.default_rng(7)
  h, y = rng.normal(size=(5, 8)).astype(np.float32), rng.integers(0, 6, 5).astype(np.int32)
  head = jnp.asarray(rng.normal(size=(8, 6)), jnp.float32)
  params = probes.init(cfg, jax.random.key(0))
  (padded,) = list(probes.batches(h, y, 8))
  assert padded["w"].tolist() == [1] * 5 + [0] * 3
  full = {"h": h, "y": y, "w": np.ones(5, np.float32)}
  np.testing.assert_allclose(probes.loss_fn(params, cfg, padded, head), probes.loss_fn(params, cfg, full, head),
                             rtol=1e-6)


def test_training_learns_a_planted_future_token():
  """h carries the token 2 ahead in a random direction: the probe's delta-2 top-1 accuracy becomes high while
  delta 1 (not encoded) stays near chance."""
  rng = np.random.default_rng(8)
  d, v, n = 16, 6, 384
  directions = rng.normal(size=(v, d)).astype(np.float32) * 3
  y = rng.integers(0, v, (n, 2)).astype(np.int32)
  h = directions[y[:, 1]] + 0.3 * rng.normal(size=(n, d)).astype(np.float32)
  head = jnp.asarray(rng.normal(size=(d, v)), jnp.float32)
  cfg = probes.Config(d_model=d, rank=16, alpha=16.0, kind="tokens", horizon=2, learning_rate=1e-2)
  params, losses = probes.train(cfg, h[:256], y[:256], head_DV=head, epochs=30, batch_size=64, seed=0,
                                mesh=sharding.make_mesh("data:8"))
  assert losses[-1] < losses[0]
  acc = probes.topk_accuracy(probes.predict(params, cfg, h[256:], head), y[256:], k=1)
  assert acc[1] > 0.9 and acc[0] < 0.45


def test_bad_inputs_fail_clearly():
  with pytest.raises(ValueError, match="kind must be one of"):
    probes.Config(kind="plan")
  with pytest.raises(ValueError, match="activation must be one of"):
    probes.Config(activation="swish")
  cfg = probes.Config(d_model=8, rank=4, kind="answer")
  params = probes.init(cfg, jax.random.key(0))
  with pytest.raises(ValueError, match="d_model=8, found shape \\(2, 9\\)"):
    probes.forward(params, cfg, jnp.zeros((2, 9)), jnp.zeros((8, 3)))
  with pytest.raises(ValueError, match="pass head_DV"):
    probes.forward(params, cfg, jnp.zeros((2, 8)))
  with pytest.raises(ValueError, match="layer must be in \\[0, 3\\]"):
    probes.extract(tfm.init(TFM, jax.random.key(0)), TFM, [[1, 2]], 4, [(0, 0)])
