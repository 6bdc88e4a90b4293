"""GiG's embedding loss: the triplet loss (adjacent steps of a trace are positives, states of other traces
negatives) plus a uniformity term on the anchors' embeddings, the mean squared cosine similarity of distinct pairs
(the paper's form) or the log-mean-exp of Wang & Isola (`jaxlab.models.gnn.uniformity_loss`, an ablation)."""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
import optax

from jaxlab.models import gnn

Uniformity = Literal["cosine2", "log_mean_exp"]


def cosine_uniformity(z_BZ):
  """mean over pairs i != j of cos(z_i, z_j)^2."""
  b = z_BZ.shape[0]
  if b < 2:
    raise ValueError(f"cosine_uniformity: needs at least 2 embeddings, found {b}")
  u = z_BZ / jnp.maximum(jnp.linalg.norm(z_BZ, axis=-1, keepdims=True), 1e-12)
  c2 = (u @ u.T) ** 2
  return (jnp.sum(c2) - jnp.sum(jnp.diagonal(c2))) / (b * (b - 1))


def gig_loss(params, batch, cfg: gnn.Config, *, margin: float = 1.0, uniformity_weight: float = 0.1,
             uniformity: Uniformity = "cosine2"):
  """Triplet loss (squared Euclidean, `margin`) plus `uniformity_weight` x the anchors' uniformity term.

  Args:
    batch: {"graphs": a padded GraphsTuple, "anchor"/"positive"/"negative": [B] graph indices into it}.
  Returns:
    (loss, {"triplet": ..., "uniformity": ...}).
  """
  z_GZ = gnn.forward(params, batch["graphs"], cfg)
  a, p, n = (z_GZ[batch[k]] for k in ("anchor", "positive", "negative"))
  trip = gnn.triplet_loss(a, p, n, margin)
  unif = cosine_uniformity(a) if uniformity == "cosine2" else gnn.uniformity_loss(a)
  return trip + uniformity_weight * unif, {"triplet": trip, "uniformity": unif}


def make_train_step(cfg: gnn.Config, tx: optax.GradientTransformation, **loss_kw):
  """A jitted `step(params, opt_state, batch) -> (params, opt_state, metrics)` on `gig_loss` (params and optimizer
  state donated)."""
  def step(params, opt_state, batch):
    (loss, aux), grads = jax.value_and_grad(gig_loss, has_aux=True)(params, batch, cfg, **loss_kw)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, {"loss": loss, **aux}
  return jax.jit(step, donate_argnums=(0, 1))
