"""FSLoRA simulation: unbiased sketches, clients touching only their submatrices, rounds equal to a reference that
really trains the k_i-column/row submatrices client by client, exact FedLoRA at ratio 1, upload accounting,
Dirichlet splits, and a run on the tiny transformer."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlab.adapters import fslora, lora
from jaxlab.models import transformer as tfm

D_IN, D_OUT, N = 16, 12, 6


def _loss(params, batch):
  return jnp.mean((batch["x"] @ params["lin"]["kernel"] - batch["y"]) ** 2)


def _problem(seed=0):
  """Linear regression towards W0 + a rank-3 change; clients differ in their input distributions."""
  rng = np.random.default_rng(seed)
  w0 = rng.standard_normal((D_IN, D_OUT)).astype(np.float32) / 4
  target = w0 + (rng.standard_normal((D_IN, 3)) @ rng.standard_normal((3, D_OUT))).astype(np.float32) / 4
  labels = rng.integers(0, 3, 240)
  x = (rng.standard_normal((240, D_IN)) + 2.0 * np.eye(3, D_IN)[labels]).astype(np.float32)
  splits = fslora.dirichlet_split(labels, N, alpha=0.5, seed=seed, min_size=4)
  data, sizes = fslora.stack_clients({"x": x, "y": x @ target}, splits)
  return {"lin": {"kernel": jnp.asarray(w0)}}, data, sizes


def _cfg(**kw):
  base = dict(rank=6, alpha=4.0, targets=("lin/kernel",), n_clients=N, clients_per_round=4, local_steps=3,
              batch_size=5, local_lr=5e-2, local_weight_decay=0.05, ratios=(1 / 3, 2 / 3, 1.0))
  return fslora.Config(**{**base, **kw})


def _nonzero_b(state, seed=3):
  """Global LoRA with B != 0 so both factors get gradients from the first step."""
  ad = {p: {"lora_a": l["lora_a"], "lora_b": 0.3 * jax.random.normal(jax.random.key(seed), l["lora_b"].shape)}
        for p, l in state.adapter.items()}
  return state._replace(adapter=ad)


def _reference_round(cfg, adapter, base, data, plan):
  """Each client trains the actual submatrices A^T[:, I], B^T[I, :] of rank k (a Python loop), then FedAvg."""
  lcfg = cfg.lora()
  deltas, uploaded = [], 0
  for c, mask, factor, idx in zip(*(np.asarray(x) for x in plan[:4])):
    I = np.flatnonzero(mask)
    sub = {p: {"lora_a": l["lora_a"][..., I], "lora_b": l["lora_b"][..., I, :]} for p, l in adapter.items()}
    full = {p: {"lora_a": l["lora_a"], "lora_b": l["lora_b"]} for p, l in adapter.items()}

    def loss(s, batch, factor=factor):
      eff = {p: {"lora_a": factor * l["lora_a"], "lora_b": l["lora_b"]} for p, l in s.items()}
      return _loss(lora.add_deltas(base, lora.deltas(eff, lcfg)), batch)

    if cfg.local_opt == "adamw":
      tx = optax.adamw(cfg.local_lr, weight_decay=cfg.local_weight_decay)
    else:  # SGD with momentum 0.9 and decoupled decay, as the authors' client loop
      tx = optax.chain(optax.add_decayed_weights(cfg.local_weight_decay), optax.sgd(cfg.local_lr, momentum=0.9))
    opt = tx.init(sub)
    for h in range(cfg.local_steps):
      batch = {k: v[c][idx[h]] for k, v in data.items()}
      updates, opt = tx.update(jax.grad(loss)(sub, batch), opt, sub)
      sub = optax.apply_updates(sub, updates)
    uploaded += sum(np.asarray(x).nbytes for x in jax.tree.leaves(sub))
    delta = jax.tree.map(jnp.zeros_like, full)
    for p in sub:
      delta[p]["lora_a"] = delta[p]["lora_a"].at[..., I].set(sub[p]["lora_a"] - full[p]["lora_a"][..., I])
      delta[p]["lora_b"] = delta[p]["lora_b"].at[..., I, :].set(sub[p]["lora_b"] - full[p]["lora_b"][..., I, :])
    deltas.append(delta)
  # reweight: each component's sum over the clients that hold it, divided by their number
  holders = np.maximum(np.asarray(plan.mask).sum(0), 1) if cfg.reweight else np.full(cfg.rank, len(deltas))
  total = jax.tree.map(lambda *d: sum(d), *deltas)
  mean = {p: {"lora_a": l["lora_a"] / holders, "lora_b": l["lora_b"] / holders[:, None]} for p, l in total.items()}
  return jax.tree.map(jnp.add, adapter, mean), uploaded


def test_sketch_is_unbiased_by_enumeration_and_sampler_is_uniform():
  r = 6
  for k in range(1, r + 1):
    subsets = list(itertools.combinations(range(r), k))
    mean = sum(np.asarray(fslora.sketch(jnp.zeros(r).at[jnp.asarray(s)].set(1.0), k, r)) for s in subsets)
    np.testing.assert_allclose(mean / len(subsets), np.eye(r), atol=1e-6)
  masks = jax.vmap(lambda key: fslora.random_mask(key, r, 2))(jax.random.split(jax.random.key(0), 3000))
  assert np.all(np.asarray(masks).sum(1) == 2)
  freq = np.asarray(masks).mean(0)
  assert np.all(np.abs(freq - 2 / r) < 4 * np.sqrt((2 / r) * (1 - 2 / r) / 3000))


def test_client_update_changes_only_its_sketched_components():
  base, data, sizes = _problem()
  cfg = _cfg()
  state = _nonzero_b(fslora.init(cfg, base, jax.random.key(0)))
  mask = jnp.zeros(cfg.rank).at[jnp.asarray([1, 4])].set(1.0)
  idx = jnp.arange(cfg.local_steps * cfg.batch_size).reshape(cfg.local_steps, cfg.batch_size) % int(sizes[0])
  mine = jax.tree.map(lambda x: x[0], data)
  new, losses = fslora.client_update(cfg, _loss, state.adapter, base, mine, mask, cfg.rank / 2, idx)
  assert losses.shape == (cfg.local_steps,)
  da = np.asarray(new["lin/kernel"]["lora_a"] - state.adapter["lin/kernel"]["lora_a"])
  db = np.asarray(new["lin/kernel"]["lora_b"] - state.adapter["lin/kernel"]["lora_b"])
  off = np.asarray(mask) == 0
  assert np.all(da[:, off] == 0) and np.all(db[off, :] == 0)  # weight decay included: exactly untouched
  assert np.all(np.abs(da[:, ~off]).max(0) > 0) and np.all(np.abs(db[~off, :]).max(1) > 0)


@pytest.mark.parametrize("local_opt,reweight", [("adamw", False), ("sgd", False), ("adamw", True)])
@pytest.mark.parametrize("method", ["fslora", "fedlora", "hetlora"])
def test_round_equals_reference_that_trains_the_submatrices(method, local_opt, reweight):
  base, data, sizes = _problem()
  cfg = _cfg(method=method, local_opt=local_opt, reweight=reweight)
  state = _nonzero_b(fslora.init(cfg, base, jax.random.key(0)))
  round_fn = fslora.make_round(cfg, _loss)
  ref = state.adapter
  for i in range(2):
    plan = fslora.plan_round(cfg, jax.random.key(10 + i), sizes)
    k = np.asarray(plan.mask).sum(1)
    np.testing.assert_array_equal(k, cfg.client_k()[np.asarray(plan.clients)])
    if method == "hetlora":
      assert all(np.array_equal(np.flatnonzero(m), np.arange(kk)) for m, kk in zip(np.asarray(plan.mask), k))
    np.testing.assert_allclose(plan.factor, cfg.rank / k if method == "fslora" else np.ones_like(k))
    ref, uploaded = _reference_round(cfg, ref, base, data, plan)
    assert int(fslora.upload_bytes(state.adapter, plan).sum()) == uploaded
    state, metrics = round_fn(state, base, data, plan)
    assert metrics["loss"].shape == (cfg.clients_per_round, cfg.local_steps)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), state.adapter, ref)
  if method != "fedlora":
    full = (cfg.rank * (D_IN + D_OUT) * 4) * cfg.clients_per_round
    assert int(fslora.upload_bytes(state.adapter, plan).sum()) < full


def _rank_k_client(cfg, start, base, data, c, idx, k):
  """One client of rank k at scale alpha/sqrt(k) trained from `start` (its rank-k factors); its full update."""
  s_k = cfg.alpha / np.sqrt(k)
  loss = lambda sub, batch: _loss(lora.add_deltas(base, {p: s_k * l["lora_a"] @ l["lora_b"] for p, l in sub.items()}),
                                  batch)
  tx = optax.adamw(cfg.local_lr, weight_decay=cfg.local_weight_decay)
  sub, opt = start, tx.init(start)
  for h in range(cfg.local_steps):
    batch = {key: v[c][idx[h]] for key, v in data.items()}
    updates, opt = tx.update(jax.grad(loss)(sub, batch), opt, sub)
    sub = optax.apply_updates(sub, updates)
  return {p: s_k * np.asarray(l["lora_a"]) @ np.asarray(l["lora_b"]) for p, l in sub.items()}


@pytest.mark.parametrize("method", ["flexlora", "flora"])
def test_svd_and_stacking_rounds_equal_a_loop_over_rank_k_clients(method):
  """flexlora: clients start from the global update's best rank-k approximation (NumPy SVD) and the global LoRA
  becomes the rank-r truncation of their mean update; flora: clients start fresh and their mean update is merged."""
  base, data, sizes = _problem()
  cfg = _cfg(method=method)
  state = fslora.init(cfg, base, jax.random.key(0))
  round_fn = fslora.make_round(cfg, _loss)
  glob = {p: np.zeros((D_IN, D_OUT), np.float32) for p in state.adapter}  # the global update (flexlora)
  merged = {p: np.zeros((D_IN, D_OUT), np.float32) for p in state.adapter}  # flora
  for i in range(2):
    plan = fslora.plan_round(cfg, jax.random.key(10 + i), sizes)
    k_C = np.asarray(plan.mask).sum(1).round().astype(int)
    np.testing.assert_allclose(plan.factor, np.sqrt(cfg.rank / k_C), rtol=1e-6)
    fresh = lora.init(cfg.lora(), base, plan.init_key) if method == "flora" else state.adapter
    updates = []
    for c, idx, k in zip(np.asarray(plan.clients), np.asarray(plan.batch_idx), k_C):
      if method == "flexlora" and i > 0:
        start = {}
        for p, g in glob.items():
          u, sv, vt = np.linalg.svd(g)
          b = sv[:k, None] * vt[:k] / (cfg.alpha / np.sqrt(k))  # singular values on B, at the client's scale
          start[p] = {"lora_a": jnp.asarray(u[:, :k]), "lora_b": jnp.asarray(b)}
      else:
        start = {p: {"lora_a": l["lora_a"][..., :k], "lora_b": l["lora_b"][..., :k, :]} for p, l in fresh.items()}
      here = lora.add_deltas(base, merged)
      updates.append(_rank_k_client(cfg, start, here, data, c, idx, k))
    mean = {p: np.mean([u[p] for u in updates], 0) for p in glob}
    state, _ = round_fn(state, base, data, plan)
    got = {p: np.asarray(d) for p, d in lora.deltas(state.adapter, cfg.lora()).items()}
    if method == "flexlora":
      for p, d in mean.items():
        u, sv, vt = np.linalg.svd(d)
        glob[p] = (u[:, :cfg.rank] * sv[:cfg.rank]) @ vt[:cfg.rank]
        np.testing.assert_allclose(got[p], glob[p], rtol=1e-4, atol=1e-5)
    else:
      for p, d in mean.items():
        merged[p] = merged[p] + d
        np.testing.assert_allclose(state.merged[p], merged[p], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got[p], 0.0)
  assert np.abs(next(iter(mean.values()))).max() > 1e-3  # the clients moved


def test_round_lr_decay_follows_the_cosine_and_reaches_the_clients():
  base, data, sizes = _problem()
  cfg = _cfg(method="fslora", decay_rounds=4)
  lrs = [float(cfg.round_lr(t)) for t in range(6)]
  want = [cfg.local_lr * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * min(t, 4) / 4))) for t in range(6)]
  np.testing.assert_allclose(lrs, want, rtol=1e-6)
  state = _nonzero_b(fslora.init(cfg, base, jax.random.key(0)))
  round_fn = fslora.make_round(cfg, _loss)
  ref = state.adapter
  for i in range(3):
    plan = fslora.plan_round(cfg, jax.random.key(20 + i), sizes)
    ref, _ = _reference_round(cfg.replace(local_lr=lrs[i]), ref, base, data, plan)
    state, _ = round_fn(state, base, data, plan)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), state.adapter, ref)
  with pytest.raises(ValueError, match="decay_rounds"):
    _cfg(decay_rounds=-1)


def test_sketch_ratio_one_reproduces_fedlora_exactly():
  base, data, sizes = _problem()
  runs = {}
  for name, cfg in [("fedlora", _cfg(method="fedlora")), ("fslora-1", _cfg(method="fslora", ratios=(1.0,)))]:
    state, hist = fslora.simulate(cfg, _loss, base, data, sizes, rounds=3, key=jax.random.key(4))
    runs[name] = (state.adapter, hist)
  jax.tree.map(np.testing.assert_array_equal, runs["fedlora"][0], runs["fslora-1"][0])
  assert [h["upload_bytes"] for h in runs["fedlora"][1]] == [h["upload_bytes"] for h in runs["fslora-1"][1]]


def test_every_method_learns_and_fslora_uploads_less():
  base, data, sizes = _problem()
  x, y = (np.concatenate([np.asarray(v[c][: sizes[c]]) for c in range(N)]) for v in (data["x"], data["y"]))
  evaluate = lambda p: {"mse": _loss(p, {"x": x, "y": y})}
  start = float(evaluate(base)["mse"])
  final = {}
  for method in fslora.METHODS:
    cfg = _cfg(method=method, server_lr=1.0)
    _, hist = fslora.simulate(cfg, _loss, base, data, sizes, rounds=15, key=jax.random.key(1), eval_fn=evaluate,
                              eval_every=5)
    assert [h["round"] for h in hist] == list(range(1, 16)) and "mse" in hist[4] and "mse" not in hist[5]
    final[method] = hist[-1]
    assert hist[-1]["mse"] < 0.5 * start, (method, hist[-1]["mse"], start)
  assert final["fslora"]["upload_bytes"] < 0.85 * final["fedlora"]["upload_bytes"]


def test_dirichlet_split_partitions_and_concentrates_with_small_alpha():
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 10, 2000)
  purity = {}
  for alpha in (0.1, 100.0):
    parts = fslora.dirichlet_split(labels, 20, alpha, seed=1, min_size=5)
    allidx = np.concatenate(parts)
    assert len(parts) == 20 and min(len(p) for p in parts) >= 5
    np.testing.assert_array_equal(np.sort(allidx), np.arange(2000))
    purity[alpha] = np.mean([np.bincount(labels[p], minlength=10).max() / len(p) for p in parts])
  assert purity[0.1] > 0.5 > 0.25 > purity[100.0]
  with pytest.raises(ValueError, match="cannot give"):
    fslora.dirichlet_split(labels[:10], 20, 0.1)
  data, sizes = fslora.stack_clients({"v": np.arange(10) * 10}, [np.asarray([3, 5]), np.asarray([7])])
  np.testing.assert_array_equal(data["v"], [[30, 50], [70, 70]])
  np.testing.assert_array_equal(sizes, [2, 1])


def _reference_task_split(task_sizes, n_clients, alpha, seed):
  """The reference's `build_datasets` transcribed over example ids: tasks in order, each shuffled by the global
  NumPy stream; Dirichlet cuts for all but the largest; the largest fills the smallest clients up to the mean."""
  np.random.seed(seed)
  start = np.cumsum([0] + list(task_sizes))
  datasets = {}
  for t, n in enumerate(task_sizes):
    perm = np.random.permutation(n)
    datasets[t] = [int(start[t] + i) for i in perm]
  max_size = sum(len(d) for d in datasets.values()) // n_clients
  largest = max(datasets, key=lambda t: len(datasets[t]))
  big = datasets.pop(largest)
  clients = {i: [] for i in range(n_clients)}
  for d in datasets.values():
    props = np.random.dirichlet(np.repeat(alpha, n_clients))
    sizes = [int(p * len(d)) for p in props]
    sizes[-1] = len(d) - sum(sizes[:-1])
    at = 0
    for c, k in enumerate(sizes):
      if k > 0:
        clients[c].extend(d[at:at + k])
        at += k
  at = 0
  for c in sorted(range(n_clients), key=lambda c: len(clients[c])):
    need = max_size - len(clients[c])
    if need > 0 and at < len(big):
      need = min(need, len(big) - at)
      clients[c].extend(big[at:at + need])
      at += need
  return [sorted(clients[c]) for c in range(n_clients)]


@pytest.mark.parametrize("sizes,alpha", [((30, 200, 55, 120), 0.1), ((400, 10, 90), 1.0)])
def test_task_fill_split_is_the_reference_recipe(sizes, alpha):
  labels = np.concatenate([np.full(n, t) for t, n in enumerate(sizes)])
  parts = fslora.task_fill_split(labels, 7, alpha, seed=42)
  assert [p.tolist() for p in parts] == _reference_task_split(sizes, 7, alpha, 42)
  used = np.concatenate(parts)
  assert len(used) == len(set(used.tolist()))  # no example twice
  largest = int(np.argmax(sizes))
  assert set(np.flatnonzero(labels != largest)) <= set(used.tolist())  # every other task's example is on a client


def test_tiny_transformer_federation():
  """Clients hold next-token sequences with client-specific strides; FSLoRA on q, v (stacked) and the lm_head
  (unstacked) lowers the LM loss."""
  cfg_m = tfm.Config.tiny()
  base = tfm.init(cfg_m, jax.random.key(0))
  rng = np.random.default_rng(0)
  strides = rng.integers(1, 4, 96)
  starts = rng.integers(0, cfg_m.vocab_size, 96)
  tokens = (starts[:, None] + strides[:, None] * np.arange(16)[None]) % cfg_m.vocab_size
  splits = fslora.dirichlet_split(strides, 8, alpha=0.3, seed=0, min_size=4)
  data, sizes = fslora.stack_clients({"tokens": tokens.astype(np.int32)}, splits)

  def lm_loss(params, batch):
    t = batch["tokens"]
    logp = jax.nn.log_softmax(tfm.forward(params, t[:, :-1], cfg_m).logits)
    return -jnp.mean(jnp.take_along_axis(logp, t[:, 1:, None], -1))

  cfg = fslora.Config(rank=8, alpha=16, targets=("q", "v", "lm_head"), n_clients=8, clients_per_round=4,
                      local_steps=6, batch_size=8, local_lr=2e-2, ratios=(0.25, 0.5))
  evaluate = lambda p: {"loss": lm_loss(p, {"tokens": jnp.asarray(tokens)})}
  start = float(evaluate(base)["loss"])
  state, hist = fslora.simulate(cfg, lm_loss, base, data, sizes, rounds=4, key=jax.random.key(2), eval_fn=evaluate)
  assert hist[-1]["loss"] < start - 0.2, (start, hist)
  per_component = ((64 + 64 + 64 + 32) * cfg_m.n_layers + 64 + 256) * 4  # (in + out) of q, v per layer, lm_head
  first = hist[0]["upload_bytes"]
  assert first % per_component == 0 and 4 * 2 <= first // per_component <= 4 * 4  # k_i in {2, 4}, FedLoRA: 4 * 8
  merged = lora.merge(base, state.adapter, cfg.lora())
  np.testing.assert_allclose(evaluate(merged)["loss"], hist[-1]["loss"], rtol=1e-6)
