"""Training losses as `LossFn`s, the one signature `jaxlab.train.step.make_train_step` trains any model with.

A `LossFn` is `loss_fn(params, batch, rng) -> (loss_sum, weight)`: the loss summed over the batch and the
number of items it sums over (tokens, or 1 for a loss that is already a mean); the train step divides the
accumulated sums, so microbatched and full-batch updates agree. Here:
  next_token_nll   summed masked token NLL from logits, log-softmax in fp32 (the primitive of the LM losses)
  lm_loss_fn       next-token loss of a decoder LM (`jaxlab.models.transformer`) on packed batches
  vlm_loss_fn      next-token loss of a VLM (`jaxlab.models.vlm`), image-token targets skipped
  mdm_loss_fn      the masked-diffusion (LLaDA, arXiv 2502.09992) objective of `jaxlab.models.mdm`
Next to come, each as a `LossFn` factory here: DPO (arXiv 2305.18290), GRPO (arXiv 2402.03300), Bradley-Terry
reward modelling, process reward models (PRM, per-step labels) and contrastive (InfoNCE) losses.

Axes: B batch, T positions, V vocab.
"""
from __future__ import annotations

from typing import Any, Protocol

import jax
import jax.numpy as jnp

from jaxlab.models import mdm
from jaxlab.models import transformer as tfm
from jaxlab.models import vlm


class LossFn(Protocol):
  """`(params, batch, rng) -> (loss_sum, weight)`: the summed loss and the count it sums over."""

  def __call__(self, params: Any, batch: dict, rng: jax.Array) -> tuple[jax.Array, jax.Array]:
    ...


def next_token_nll(logits_BTV, targets_BT, mask_BT=None):
  """(sum of masked token NLLs, number of masked-in tokens), with the log-softmax in fp32."""
  logits = logits_BTV.astype(jnp.float32)
  lse = jax.nn.logsumexp(logits, axis=-1)
  picked = jnp.take_along_axis(logits, targets_BT[..., None].astype(jnp.int32), axis=-1)[..., 0]
  nll = lse - picked
  mask = jnp.ones_like(nll) if mask_BT is None else mask_BT.astype(jnp.float32)
  return jnp.sum(nll * mask), jnp.sum(mask)


def lm_loss_fn(cfg: tfm.Config, document_mask: bool = True) -> LossFn:
  """Next-token loss of `tfm.forward` on packed batches (keys inputs, targets, loss_mask[, segment_ids, positions]).

  Args:
    cfg: the model config (its `dtype` is the compute dtype).
    document_mask: with `segment_ids` in the batch, tokens attend only within their own document piece
      (and `positions` restart per piece) instead of across the packed row.
  """
  def loss_fn(params, batch, rng):
    del rng
    kw = {}
    if document_mask and "segment_ids" in batch:
      seg = batch["segment_ids"]
      kw["attn_mask_BTS"] = seg[:, :, None] == seg[:, None, :]
      if "positions" in batch:
        kw["positions_BT"] = batch["positions"]
    logits = tfm.forward(params, batch["inputs"], cfg, **kw).logits
    return next_token_nll(logits, batch["targets"], batch.get("loss_mask"))
  return loss_fn


def vlm_loss_fn(cfg: vlm.Config, freeze: bool = False) -> LossFn:
  """Next-token loss of `vlm.forward`: batch keys inputs, pixels, targets[, loss_mask]; image-token targets skipped.

  Args:
    cfg: the VLM config.
    freeze: stop gradients at the encoder's and the LM's params, so the backward pass computes only the
      connector's gradient (the others come back as zeros); use with `vlm.connector_only`.
  """
  def loss_fn(params, batch, rng):
    del rng
    if freeze:
      params = {k: v if k == "connector" else jax.lax.stop_gradient(v) for k, v in params.items()}
    logits = vlm.forward(params, batch["inputs"], batch.get("pixels"), cfg).logits
    mask = batch["targets"] != cfg.image_token_id
    if "loss_mask" in batch:
      mask = mask & batch["loss_mask"].astype(bool)
    return next_token_nll(logits, batch["targets"], mask)
  return loss_fn


def mdm_loss_fn(cfg: mdm.Config, eps: float = 1e-3) -> LossFn:
  """`mdm.loss` (already a mean, so weight 1): batch keys tokens[, prompt_len] (SFT); `rng` draws t and the masks.

  Args:
    cfg: the masked-diffusion model config.
    eps: floor of the masking probability.
  """
  def loss_fn(params, batch, rng):
    value, _ = mdm.loss(params, batch["tokens"], cfg, rng, prompt_len_B=batch.get("prompt_len"), eps=eps)
    return value, jnp.ones((), jnp.float32)
  return loss_fn
