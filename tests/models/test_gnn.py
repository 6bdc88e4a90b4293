"""GAT scene-graph encoder and GiG losses: a NumPy transcription of the forward pass, padding / batching /
node-order invariances, the losses against NumPy, and a sharded train step equal to the single-device one."""
import jax
import jax.numpy as jnp
import jraph
import numpy as np
import optax
import pytest

from jaxlab import sharding
from jaxlab.models import gnn


def random_graph(rng, cfg, n, e):
  return jraph.GraphsTuple(
      nodes=rng.normal(size=(n, cfg.node_features)).astype(np.float32),
      edges=rng.normal(size=(e, cfg.edge_features)).astype(np.float32),
      senders=rng.integers(0, n, size=e).astype(np.int32), receivers=rng.integers(0, n, size=e).astype(np.int32),
      n_node=np.array([n], np.int32), n_edge=np.array([e], np.int32), globals=None)


def random_params(cfg, seed):
  """init's params with every leaf random (zero biases and gates would hide mistakes)."""
  params = gnn.init(cfg, jax.random.PRNGKey(seed))
  leaves, tree = jax.tree.flatten(params)
  rng = np.random.default_rng(seed)
  return jax.tree.unflatten(tree, [jnp.asarray(rng.normal(size=x.shape) * 0.5, jnp.float32) for x in leaves])


def numpy_forward(params, graph, cfg):
  p = jax.tree.map(np.asarray, params)
  x = graph.nodes @ p["gat_in"]["kernel"] + p["gat_in"]["bias"]
  n, h, k = x.shape[0], cfg.n_heads, cfg.head_dim
  for l in range(cfg.n_layers):
    q = {name: v[l] for name, v in p["gat_layers"].items()}
    hn = np.einsum("nd,dhk->nhk", x, q["w"])
    edges = [(int(s), int(r), np.einsum("f,fhk->hk", f, q["w_edge"]))
             for s, r, f in zip(graph.senders, graph.receivers, graph.edges)]
    edges += [(i, i, q["self_edge"]) for i in range(n)]
    out = np.zeros((n, h, k))
    for r in range(n):
      inc = [(s, e) for s, rr, e in edges if rr == r]
      sc = np.array([np.sum(hn[s] * q["a_src"] + hn[r] * q["a_dst"] + e * q["a_edge"], -1) for s, e in inc])
      sc = np.where(sc > 0, sc, cfg.negative_slope * sc)
      a = np.exp(sc - sc.max(0)) / np.exp(sc - sc.max(0)).sum(0)
      out[r] = sum(a[j][:, None] * (hn[s] + e) for j, (s, e) in enumerate(inc)) + q["bias"]
    out = out.reshape(n, -1)
    elu = np.where(out > 0, out, np.expm1(np.minimum(out, 0)))
    x = x + elu if cfg.residual else elu
  zs, start = [], 0
  for m in graph.n_node:
    xs = x[start:start + m]
    start += m
    if cfg.readout == "mean":
      pooled = xs.mean(0)
    else:
      g = xs @ p["gat_readout"]["gate"]
      w = np.exp(g - g.max()) / np.exp(g - g.max()).sum()
      pooled = (w[:, None] * xs).sum(0)
    z = pooled @ p["gat_out"]["kernel"] + p["gat_out"]["bias"]
    zs.append(z / np.linalg.norm(z))
  return np.stack(zs)


@pytest.mark.parametrize("readout,residual", [("mean", True), ("attention", False)])
def test_forward_matches_numpy(readout, residual):
  cfg = gnn.Config.tiny(readout=readout, residual=residual)
  rng = np.random.default_rng(0)
  graph = gnn.batch([random_graph(rng, cfg, 5, 9), random_graph(rng, cfg, 3, 4)])
  params = random_params(cfg, 1)
  got = np.asarray(gnn.forward(params, graph, cfg))
  np.testing.assert_allclose(got, numpy_forward(params, graph, cfg), atol=1e-5)
  np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, atol=1e-6)


@pytest.mark.parametrize("readout", gnn.READOUTS)
def test_padding_and_batching_do_not_change_embeddings(readout):
  cfg = gnn.Config.tiny(readout=readout)
  rng = np.random.default_rng(2)
  gs = [random_graph(rng, cfg, n, e) for n, e in [(4, 6), (6, 3), (2, 0), (5, 10)]]
  params = random_params(cfg, 3)
  alone = np.concatenate([np.asarray(gnn.forward(params, g, cfg)) for g in gs])
  batched = gnn.batch(gs)
  together = np.asarray(gnn.forward(params, batched, cfg))
  np.testing.assert_allclose(together, alone, atol=1e-5)
  padded = gnn.pad(batched, 40, 32, 8)
  fwd = jax.jit(lambda p, g: gnn.forward(p, g, cfg))
  out = np.asarray(fwd(params, padded))
  mask = np.asarray(jraph.get_graph_padding_mask(padded))
  assert mask.tolist() == [True] * 4 + [False] * 4
  np.testing.assert_allclose(out[:4], alone, atol=1e-5)
  node_mask = np.asarray(jraph.get_node_padding_mask(padded))
  real = np.asarray(gnn.node_states(params, batched, cfg))
  np.testing.assert_allclose(np.asarray(gnn.node_states(params, padded, cfg))[node_mask], real, atol=1e-5)


def test_embeddings_invariant_to_node_and_edge_order():
  cfg = gnn.Config.tiny(readout="attention")
  rng = np.random.default_rng(4)
  g = random_graph(rng, cfg, 7, 12)
  params = random_params(cfg, 5)
  perm = rng.permutation(7)  # new node i is old node perm[i]
  inv = np.argsort(perm)
  eperm = rng.permutation(12)
  h = g._replace(nodes=g.nodes[perm], senders=inv[g.senders][eperm].astype(np.int32),
                 receivers=inv[g.receivers][eperm].astype(np.int32), edges=g.edges[eperm])
  np.testing.assert_allclose(np.asarray(gnn.forward(params, h, cfg)), np.asarray(gnn.forward(params, g, cfg)),
                             atol=1e-5)
  np.testing.assert_allclose(np.asarray(gnn.node_states(params, h, cfg)),
                             np.asarray(gnn.node_states(params, g, cfg))[perm], atol=1e-5)
  # the edge features matter: the same graph with other edge features embeds elsewhere
  other = g._replace(edges=g.edges[::-1].copy())
  assert np.abs(np.asarray(gnn.forward(params, other, cfg)) - np.asarray(gnn.forward(params, g, cfg))).max() > 1e-3


def test_losses_match_numpy():
  rng = np.random.default_rng(6)
  z = rng.normal(size=(3, 5, 4))
  z /= np.linalg.norm(z, axis=-1, keepdims=True)
  a, p, n = z
  want_trip = np.mean(np.maximum(((a - p) ** 2).sum(-1) - ((a - n) ** 2).sum(-1) + 0.3, 0))
  got = float(gnn.triplet_loss(jnp.asarray(a), jnp.asarray(p), jnp.asarray(n), 0.3))
  np.testing.assert_allclose(got, want_trip, rtol=1e-5)
  pairs = [np.exp(-2 * ((a[i] - a[j]) ** 2).sum()) for i in range(5) for j in range(5) if i != j]
  np.testing.assert_allclose(float(gnn.uniformity_loss(jnp.asarray(a, jnp.float32))), np.log(np.mean(pairs)),
                             rtol=1e-5)
  # a collapsed set of embeddings is maximally non-uniform: log mean exp(0) = 0
  np.testing.assert_allclose(float(gnn.uniformity_loss(jnp.tile(jnp.asarray(a[:1]), (4, 1)))), 0.0, atol=1e-6)


def test_sample_triplets_follow_traces():
  lengths = [3, 1, 4]
  trace_of = np.repeat(np.arange(3), lengths)
  step_of = np.concatenate([np.arange(n) for n in lengths])
  t = gnn.sample_triplets(lengths, 200, np.random.default_rng(0))
  assert np.all(trace_of[t[:, 0]] == trace_of[t[:, 1]]) and np.all(step_of[t[:, 1]] == step_of[t[:, 0]] + 1)
  assert np.all(trace_of[t[:, 2]] != trace_of[t[:, 0]])
  with pytest.raises(ValueError, match="needs >= 2 traces"):
    gnn.sample_triplets([5], 3, np.random.default_rng(0))


def _train_batch(cfg, seed):
  rng = np.random.default_rng(seed)
  lengths = [4, 3, 5]
  gs = [random_graph(rng, cfg, int(rng.integers(2, 5)), int(rng.integers(1, 6))) for _ in range(sum(lengths))]
  trip = gnn.sample_triplets(lengths, 8, rng)
  graphs = gnn.pad(gnn.batch(gs), 64, 64, 16)
  return {"graphs": graphs, "anchor": trip[:, 0].astype(np.int32), "positive": trip[:, 1].astype(np.int32),
          "negative": trip[:, 2].astype(np.int32)}


@pytest.mark.parametrize("spec,rules", [("data:2,tensor:4", "tp"), ("fsdp:8", "fsdp")])
def test_train_step_sharded_equals_single_device(spec, rules):
  cfg = gnn.Config.tiny(d_model=16, n_heads=4, d_embed=8, readout="attention")
  tx = optax.adam(1e-2)
  batch = _train_batch(cfg, 7)
  params = random_params(cfg, 8)
  step = gnn.make_train_step(cfg, tx, margin=0.5, uniformity_weight=0.1)
  copy = lambda t: jax.tree.map(lambda x: jnp.array(x, copy=True), t)
  p1, s1 = copy(params), tx.init(params)
  for _ in range(3):
    p1, s1, m1 = step(p1, s1, jax.tree.map(jnp.asarray, batch))
  mesh = sharding.make_mesh(spec)
  p2 = sharding.shard_params(copy(params), mesh, rules, axes=gnn.AXES)
  s2 = tx.init(p2)
  sb = sharding.shard_batch(batch, mesh)
  assert not sb["graphs"].nodes.sharding.is_fully_replicated
  for _ in range(3):
    p2, s2, m2 = step(p2, s2, sb)
  np.testing.assert_allclose(float(m2["loss"]), float(m1["loss"]), rtol=1e-5)
  for a, b in zip(jax.tree.leaves(p2), jax.tree.leaves(p1)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
  want = jax.sharding.NamedSharding(mesh, sharding.param_specs(params, rules, mesh, axes=gnn.AXES)["gat_layers"]["w"])
  assert p2["gat_layers"]["w"].sharding.is_equivalent_to(want, 4)


def test_training_separates_traces():
  """A few steps of the GiG loss on fixed triplets lower it (gradients flow through attention and readout)."""
  cfg = gnn.Config.tiny(d_model=16, n_heads=2, d_embed=8)
  tx = optax.adam(3e-2)
  batch = jax.tree.map(jnp.asarray, _train_batch(cfg, 9))
  params = gnn.init(cfg, jax.random.PRNGKey(0))
  state = tx.init(params)
  step = gnn.make_train_step(cfg, tx, margin=0.5, uniformity_weight=0.1)
  losses = []
  for _ in range(30):
    params, state, m = step(params, state, batch)
    losses.append(float(m["triplet"]))
  assert losses[-1] < 0.5 * losses[0], losses


def test_bad_inputs_fail_clearly():
  with pytest.raises(ValueError, match="divisible by n_heads"):
    gnn.Config(d_model=10, n_heads=4)
  with pytest.raises(ValueError, match="readout must be one of"):
    gnn.Config(readout="max")
  cfg = gnn.Config.tiny()
  g = random_graph(np.random.default_rng(0), gnn.Config.tiny(node_features=5), 3, 2)
  with pytest.raises(ValueError, match=r"graph.nodes must be \[N, 6\], found \(3, 5\)"):
    gnn.forward(gnn.init(cfg, jax.random.PRNGKey(0)), g, cfg)
  with pytest.raises(ValueError, match="padded sizes must exceed"):
    gnn.pad(random_graph(np.random.default_rng(0), cfg, 3, 2), 3, 2, 2)
