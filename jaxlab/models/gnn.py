"""A graph attention network (GAT, arXiv 1710.10903) over scene graphs, as the state encoder of GiG planning.

GiG (Graph-in-Graph planning; experiments/gig/README.md) embeds the scene graph of every step of a trace into one
unit vector z_t, trained so adjacent steps of a trace lie close and states of other traces far (a triplet loss)
while the embeddings spread over the sphere (the uniformity term of Wang & Isola, arXiv 2005.10242).

Graphs are `jraph.GraphsTuple`s: float node features [N, Fn], float edge features [E, Fe], senders/receivers
[E], n_node/n_edge [G]; several graphs batched into one tuple (`batch`) and padded to static sizes with jraph's
`pad_with_graphs` (`pad`) so one compiled program serves every batch. Each layer is multi-head attention over
the incoming edges of every node, plus a self-loop with a learned edge vector (so a node with no incoming edge
still keeps its own state):
  score_EH = LeakyReLU(a_src . h[sender] + a_dst . h[receiver] + a_edge . e),  e = edge features @ W_edge,
  alpha = softmax of the scores over each receiver's incoming edges (per head),
  out[r] = sum_edges alpha * (h[sender] + e) + bias,  x <- x + ELU(out) (residual) or ELU(out).
Edge features enter both the score and the message, so the edge type (on / in / holding ...) changes what flows.
A readout (mean over a graph's nodes, or attention pooling with a learned gate) and a linear map give one
L2-normalized embedding per graph. Layers are stacked on a leading `layers` axis under lax.scan.

Axes: N nodes, E edges, G graphs, B triplets, Fn/Fe node/edge features, D width, H heads, K head dim, Z embedding.
"""
from __future__ import annotations

import dataclasses
from typing import Literal, Sequence

import jax
import jax.numpy as jnp
import jraph
import numpy as np
import optax

from jaxlab import choices
from jaxlab.nn import axes, layers

Readout = Literal["mean", "attention"]
READOUTS = choices.values(Readout)


def _fail(msg):
  raise ValueError(f"gnn.Config: {msg}")


@dataclasses.dataclass(frozen=True)
class Config:
  node_features: int = 16
  edge_features: int = 8
  d_model: int = 32
  n_heads: int = 4
  n_layers: int = 2
  d_embed: int = 32
  readout: Readout = "mean"
  negative_slope: float = 0.2
  residual: bool = True
  init_std: float = 0.1
  param_dtype: layers.DType = "float32"

  def __post_init__(self):
    for name in ("node_features", "edge_features", "d_model", "n_heads", "n_layers", "d_embed"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
        _fail(f"{name} must be a positive int, found {getattr(self, name)!r}")
    if self.d_model % self.n_heads:
      _fail(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
    layers.check_dtype_names(self, _fail, ("param_dtype",))
    choices.check(self, _fail, nested=False)

  @property
  def head_dim(self) -> int:
    return self.d_model // self.n_heads

  @classmethod
  def tiny(cls, **kw) -> "Config":
    return cls(**{**dict(node_features=6, edge_features=3, d_model=8, n_heads=2, n_layers=2, d_embed=4), **kw})


PRESETS = {
    "gig-tiny": Config(d_model=16, n_heads=2, n_layers=2, d_embed=16),
    "gig": Config(d_model=64, n_heads=4, n_layers=3, d_embed=64, readout="attention"),
    "gig-large": Config(d_model=256, n_heads=8, n_layers=4, d_embed=128, readout="attention"),
}


def init(cfg: Config, key) -> dict:
  """{"gat_in": Fn -> D, "gat_layers": stacked per-layer attention params, "gat_readout" (attention readout
  only): the gate, "gat_out": D -> Z}."""
  dt = jnp.dtype(cfg.param_dtype)
  h, k, L, s = cfg.n_heads, cfg.head_dim, cfg.n_layers, cfg.init_std
  ks = jax.random.split(key, 8)
  p = {
      "gat_in": layers.linear_init(ks[0], cfg.node_features, cfg.d_model, bias=True, std=s, dtype=dt),
      "gat_layers": {
          "w": layers.normal(ks[1], (L, cfg.d_model, h, k), s, dt),
          "w_edge": layers.normal(ks[2], (L, cfg.edge_features, h, k), s, dt),
          "self_edge": layers.normal(ks[3], (L, h, k), s, dt),
          "a_src": layers.normal(ks[4], (L, h, k), s, dt),
          "a_dst": layers.normal(ks[5], (L, h, k), s, dt),
          "a_edge": layers.normal(ks[6], (L, h, k), s, dt),
          "bias": jnp.zeros((L, h, k), dt),
      },
      "gat_out": layers.linear_init(ks[7], cfg.d_model, cfg.d_embed, bias=True, std=s, dtype=dt),
  }
  if cfg.readout == "attention":
    p["gat_readout"] = {"gate": jnp.zeros((cfg.d_model,), dt)}
  return p


# Node and edge features are one-hot kinds plus a few flags: their axis is "classes" (replicated by every rule).
AXES = axes.rules(
    (r"gat_in/kernel", ("classes", "embed"), "classes"),
    (r"gat_in/bias", ("embed",), None),
    (r"gat_layers/w", ("embed", "heads", "head_dim"), "embed"),
    (r"gat_layers/w_edge", ("classes", "heads", "head_dim"), "classes"),
    (r"gat_layers/(self_edge|a_src|a_dst|a_edge|bias)", ("heads", "head_dim"), None),
    (r"gat_readout/gate", ("embed",), None),
    (r"gat_out/kernel", ("embed", "classes"), "embed"),
    (r"gat_out/bias", ("classes",), None),
)


def _check_graph(graph: jraph.GraphsTuple, cfg: Config):
  if graph.nodes is None or graph.nodes.ndim != 2 or graph.nodes.shape[1] != cfg.node_features:
    shape = None if graph.nodes is None else graph.nodes.shape
    raise ValueError(f"gnn: graph.nodes must be [N, {cfg.node_features}], found {shape}")
  if graph.edges is None or graph.edges.ndim != 2 or graph.edges.shape[1] != cfg.edge_features:
    shape = None if graph.edges is None else graph.edges.shape
    raise ValueError(f"gnn: graph.edges must be [E, {cfg.edge_features}], found {shape}")
  if graph.senders.shape != (graph.edges.shape[0],) or graph.receivers.shape != (graph.edges.shape[0],):
    raise ValueError(f"gnn: senders/receivers must be [{graph.edges.shape[0]}], found {graph.senders.shape} "
                     f"and {graph.receivers.shape}")


def _gat_layer(cfg: Config, x_ND, p, edges_EF, senders_E, receivers_E):
  n = x_ND.shape[0]
  h_NHK = jnp.einsum("nd,dhk->nhk", x_ND, p["w"])
  e_EHK = jnp.einsum("ef,fhk->ehk", edges_EF, p["w_edge"])
  e_EHK = jnp.concatenate([e_EHK, jnp.broadcast_to(p["self_edge"], (n, *p["self_edge"].shape))], axis=0)
  loops = jnp.arange(n, dtype=senders_E.dtype)
  snd, rcv = jnp.concatenate([senders_E, loops]), jnp.concatenate([receivers_E, loops])
  src_EHK, dst_EHK = h_NHK[snd], h_NHK[rcv]
  score_EH = jnp.sum(src_EHK * p["a_src"] + dst_EHK * p["a_dst"] + e_EHK * p["a_edge"], axis=-1)
  score_EH = jax.nn.leaky_relu(score_EH, cfg.negative_slope)
  alpha_EH = jraph.segment_softmax(score_EH, rcv, num_segments=n)
  out_NHK = jax.ops.segment_sum(alpha_EH[..., None] * (src_EHK + e_EHK), rcv, num_segments=n) + p["bias"]
  out_ND = jax.nn.elu(out_NHK.reshape(n, cfg.d_model))
  return x_ND + out_ND if cfg.residual else out_ND


def node_states(params, graph: jraph.GraphsTuple, cfg: Config):
  """[N, D] node states after the GAT layers (fp32)."""
  _check_graph(graph, cfg)
  f32 = lambda t: jax.tree.map(lambda a: a.astype(jnp.float32), t)
  x_ND = layers.linear(f32(params["gat_in"]), jnp.asarray(graph.nodes, jnp.float32))
  edges_EF = jnp.asarray(graph.edges, jnp.float32)
  senders, receivers = jnp.asarray(graph.senders, jnp.int32), jnp.asarray(graph.receivers, jnp.int32)

  def body(x, p):
    return _gat_layer(cfg, x, p, edges_EF, senders, receivers), None
  x_ND, _ = jax.lax.scan(body, x_ND, f32(params["gat_layers"]))
  return x_ND


def node_graph_ids(graph: jraph.GraphsTuple):
  """[N] the graph index of every node (static N, so usable under jit)."""
  n = graph.nodes.shape[0]
  g = graph.n_node.shape[0]
  return jnp.repeat(jnp.arange(g), jnp.asarray(graph.n_node), total_repeat_length=n)


def forward(params, graph: jraph.GraphsTuple, cfg: Config):
  """[G, Z] one L2-normalized embedding per graph of `graph` (padding graphs included: an empty graph's
  embedding is the normalized output bias; mask them with `jraph.get_graph_padding_mask`)."""
  x_ND = node_states(params, graph, cfg)
  g = graph.n_node.shape[0]
  gid_N = node_graph_ids(graph)
  if cfg.readout == "mean":
    count_G = jnp.maximum(jnp.asarray(graph.n_node, jnp.float32), 1.0)
    pooled_GD = jax.ops.segment_sum(x_ND, gid_N, num_segments=g) / count_G[:, None]
  else:
    gate_N = x_ND @ params["gat_readout"]["gate"].astype(jnp.float32)
    w_N = jraph.segment_softmax(gate_N, gid_N, num_segments=g)
    pooled_GD = jax.ops.segment_sum(w_N[:, None] * x_ND, gid_N, num_segments=g)
  z_GZ = layers.linear(jax.tree.map(lambda a: a.astype(jnp.float32), params["gat_out"]), pooled_GD)
  return z_GZ / jnp.sqrt(jnp.maximum(jnp.sum(z_GZ * z_GZ, axis=-1, keepdims=True), 1e-24))


# ------------------------------------------------------------------------------------------- batching

def batch(graphs: Sequence[jraph.GraphsTuple]) -> jraph.GraphsTuple:
  """The graphs as one GraphsTuple (NumPy arrays; node indices of senders/receivers offset per graph)."""
  if not graphs:
    raise ValueError("gnn.batch: expected at least one graph, found none")
  return jraph.batch_np(list(graphs))


def pad(graph: jraph.GraphsTuple, n_node: int, n_edge: int, n_graph: int) -> jraph.GraphsTuple:
  """`graph` padded to exactly n_node nodes, n_edge edges and n_graph graphs (jraph.pad_with_graphs: one dummy
  graph holds the padding nodes and edges, then empty graphs); sizes must leave at least one padding node and
  one padding graph."""
  nn_, ne, ng = int(np.sum(graph.n_node)), int(np.sum(graph.n_edge)), int(np.shape(graph.n_node)[0])
  if n_node <= nn_ or n_edge < ne or n_graph <= ng:
    raise ValueError(f"gnn.pad: padded sizes must exceed the real ones (nodes > {nn_}, edges >= {ne}, graphs > "
                     f"{ng}), found n_node={n_node}, n_edge={n_edge}, n_graph={n_graph}")
  return jraph.pad_with_graphs(graph, n_node, n_edge, n_graph)


def round_up(x: int, multiple: int) -> int:
  return -(-x // multiple) * multiple


# --------------------------------------------------------------------------------------------- losses

def triplet_loss(anchor_BZ, positive_BZ, negative_BZ, margin: float):
  """mean over triplets of max(0, |a - p|^2 - |a - n|^2 + margin) (squared Euclidean distances)."""
  d_ap = jnp.sum((anchor_BZ - positive_BZ) ** 2, axis=-1)
  d_an = jnp.sum((anchor_BZ - negative_BZ) ** 2, axis=-1)
  return jnp.mean(jax.nn.relu(d_ap - d_an + margin))


def uniformity_loss(z_BZ, t: float = 2.0):
  """log of the mean over pairs i != j of exp(-t |z_i - z_j|^2) (Wang & Isola; t = 2 in their paper)."""
  b = z_BZ.shape[0]
  if b < 2:
    raise ValueError(f"uniformity_loss: needs at least 2 embeddings, found {b}")
  sq = jnp.sum(z_BZ * z_BZ, axis=-1)
  d_BB = jnp.maximum(sq[:, None] + sq[None, :] - 2.0 * z_BZ @ z_BZ.T, 0.0)
  off = ~jnp.eye(b, dtype=bool)
  return jax.nn.logsumexp(jnp.where(off, -t * d_BB, -jnp.inf)) - jnp.log(float(b * (b - 1)))


def gig_loss(params, batch, cfg: Config, *, margin: float = 0.5, uniformity_weight: float = 0.1,
             uniformity_t: float = 2.0):
  """Triplet loss plus `uniformity_weight` x the uniformity of the anchors' embeddings.

  Args:
    batch: {"graphs": a padded GraphsTuple, "anchor"/"positive"/"negative": [B] graph indices into it}.
  Returns:
    (loss, {"triplet": ..., "uniformity": ...}).
  """
  z_GZ = forward(params, batch["graphs"], cfg)
  a, p, n = (z_GZ[batch[k]] for k in ("anchor", "positive", "negative"))
  trip = triplet_loss(a, p, n, margin)
  unif = uniformity_loss(a, uniformity_t)
  return trip + uniformity_weight * unif, {"triplet": trip, "uniformity": unif}


def make_train_step(cfg: Config, tx: optax.GradientTransformation, **loss_kw):
  """A jitted `step(params, opt_state, batch) -> (params, opt_state, metrics)` on `gig_loss` (params and
  optimizer state donated; their shardings carry through)."""
  def step(params, opt_state, batch):
    (loss, aux), grads = jax.value_and_grad(gig_loss, has_aux=True)(params, batch, cfg, **loss_kw)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, {"loss": loss, **aux}
  return jax.jit(step, donate_argnums=(0, 1))


def sample_triplets(trace_lengths: Sequence[int], n: int, rng: np.random.Generator):
  """[n, 3] (anchor, positive, negative) flat state indices over traces laid end to end: the anchor is step t of
  a trace, the positive step t + 1 of the same trace, the negative any step of another trace."""
  lengths = np.asarray(trace_lengths, np.int64)
  if lengths.size < 2 or not np.any(lengths >= 2):
    raise ValueError(f"sample_triplets: needs >= 2 traces and one of length >= 2, found lengths {list(lengths)}")
  start = np.concatenate([[0], np.cumsum(lengths)[:-1]])
  out = np.zeros((n, 3), np.int64)
  usable = np.flatnonzero(lengths >= 2)
  for i in range(n):
    tr = int(rng.choice(usable))
    t = int(rng.integers(lengths[tr] - 1))
    other = int(rng.choice([j for j in range(lengths.size) if j != tr and lengths[j] > 0]))
    out[i] = (start[tr] + t, start[tr] + t + 1, start[other] + int(rng.integers(lengths[other])))
  return out
