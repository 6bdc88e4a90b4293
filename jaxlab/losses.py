"""Training losses as `LossFn`s, the one signature `jaxlab.train.step.make_train_step` trains any model with.

A `LossFn` is `loss_fn(params, batch, rng) -> (loss_sum, weight, aux)`: the loss summed over the batch, the
number of items it sums over (tokens, or 1 for a loss that is already a mean), and a pytree of auxiliary outputs
(statistics; `{}` when none) that the train step reports in its metrics; the train step divides the accumulated
sums, so microbatched and full-batch updates agree. Here:
  next_token_nll   summed masked token NLL from logits, log-softmax in fp32 (the primitive of the LM losses)
  lm_loss_fn       next-token loss of a decoder LM (`jaxlab.models.transformer`) on packed batches
  vlm_loss_fn      next-token loss of a VLM (`jaxlab.models.vlm`), image-token targets skipped
  multimodal_loss_fn  the same for any `jaxlab.models.multimodal` splice model, from raw inputs or from a frozen
                   encoder's features computed beforehand (connector alignment and distillation)
  mdm_loss_fn      the masked-diffusion (LLaDA, arXiv 2502.09992) objective of `jaxlab.models.mdm`
  grpo_objective   GRPO (arXiv 2402.03300) on per-token log-probs: PPO-clip ratio with separate low/high clip
                   (DAPO, arXiv 2503.14476), k3 KL to a reference, three token-aggregation rules (below)
  grpo_loss_fn     GRPO of a decoder LM on a rollout batch, its statistics (KL, clip fractions, entropy) as aux
  dpo_loss         DPO (arXiv 2305.18290) sigmoid loss on sequence log-probs; `ipo_loss` IPO (arXiv 2310.12036)
  dpo_loss_fn      DPO or IPO of a decoder LM on chosen/rejected pairs, + alpha * NLL of the chosen completions
  sft_loss_fn      completion-only next-token loss (`completion_loss_mask` leaves prompt tokens out)
  prm_step_loss    process-reward step labels at step separators (value head: sigmoid BCE; step head: 2-class CE)
  prm_loss_fn      a PRM (`jaxlab.models.heads` on a decoder LM, the LM frozen or trained) on step-labelled batches
  mca_loss         MIND's (arXiv:2512.05530) multi-rationale contrastive alignment, per target token: the hardest
                   negative rationale's token pushed a cosine margin below the hardest positive's
  mind_loss_fn     MIND phase 1 on a VLM: CE on the trained rationales + alpha * MCA on projected token embeddings
Next to come: Bradley-Terry reward modelling and contrastive (InfoNCE) losses.

GRPO aggregation rules, for a per-token loss l over completion tokens (mask m), as `(loss_sum, weight)`:
  "seq_mean"    mean over tokens of each sequence, then over sequences (GRPO): sum_b mean_t l, weight B
  "token_mean"  mean over all tokens of the batch (DAPO): sum_bt l m, weight sum_bt m
  "constant"    sum over tokens over a constant B * max_len (Dr. GRPO, arXiv 2503.20783): sum_bt l m / max_len,
                weight B
so a microbatched step (which divides accumulated sums by accumulated weights) keeps each rule's meaning.

Axes: B batch (sequences or pairs), T positions, N completion tokens, V vocab.
"""
from __future__ import annotations

from typing import Any, Literal, Protocol

import jax
import jax.numpy as jnp

from jaxlab import choices
from jaxlab.models import heads, mdm, multimodal
from jaxlab.models import transformer as tfm
from jaxlab.models import vlm
from jaxlab.nn import axes, layers


class LossFn(Protocol):
  """`(params, batch, rng) -> (loss_sum, weight, aux)`: the summed loss, the count it sums over, and auxiliary
  outputs (a pytree of scalars or arrays, `{}` when none)."""

  def __call__(self, params: Any, batch: dict, rng: jax.Array) -> tuple[jax.Array, jax.Array, Any]:
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
    return (*next_token_nll(logits, batch["targets"], batch.get("loss_mask")), {})
  return loss_fn


def _placeholder_nll(logits_fn, placeholder_id: int, freeze: bool) -> LossFn:
  """Next-token loss of `logits_fn(params, batch)` with placeholder targets (and those off `loss_mask`) skipped;
  `freeze` stops gradients at every param but the connector's."""
  def loss_fn(params, batch, rng):
    del rng
    if freeze:
      params = {k: v if k == "connector" else jax.lax.stop_gradient(v) for k, v in params.items()}
    mask = batch["targets"] != placeholder_id
    if "loss_mask" in batch:
      mask = mask & batch["loss_mask"].astype(bool)
    return (*next_token_nll(logits_fn(params, batch), batch["targets"], mask), {})
  return loss_fn


def vlm_loss_fn(cfg: vlm.Config, freeze: bool = False) -> LossFn:
  """Next-token loss of `vlm.forward`: batch keys inputs, pixels, targets[, loss_mask]; image-token targets skipped.

  Args:
    cfg: the VLM config.
    freeze: stop gradients at the encoder's and the LM's params, so the backward pass computes only the
      connector's gradient (the others come back as zeros); use with `vlm.connector_only`.
  """
  return _placeholder_nll(lambda params, batch: vlm.forward(params, batch["inputs"], batch.get("pixels"), cfg).logits,
                          cfg.image_token_id, freeze)


def multimodal_loss_fn(cfg: multimodal.Config, freeze: bool = False) -> LossFn:
  """Next-token loss of `multimodal.forward` (splice mode): batch keys inputs, targets[, loss_mask] and either
  encoder_inputs (the encoder's batch) or features (its features [B, N, E] computed beforehand); placeholder
  targets are skipped.

  Args:
    cfg: the multimodal config.
    freeze: stop gradients at every param but the connector's (use with `jaxlab.models.vlm.connector_only`).
  """
  if cfg.mode != "splice":
    raise ValueError(f"multimodal_loss_fn trains splice models; this config's mode is {cfg.mode!r}")
  return _placeholder_nll(lambda params, batch: multimodal.forward(
      params, batch["inputs"], batch.get("encoder_inputs"), cfg, features_BNE=batch.get("features")).logits,
      cfg.placeholder_id, freeze)


def mdm_loss_fn(cfg: mdm.Config, eps: float = 1e-3) -> LossFn:
  """`mdm.loss` (already a mean, so weight 1; its masked_tokens and mask_rate as aux): batch keys tokens[,
  prompt_len] (SFT); `rng` draws t and the masks.

  Args:
    cfg: the masked-diffusion model config.
    eps: floor of the masking probability.
  """
  def loss_fn(params, batch, rng):
    value, stats = mdm.loss(params, batch["tokens"], cfg, rng, prompt_len_B=batch.get("prompt_len"), eps=eps)
    return value, jnp.ones((), jnp.float32), stats
  return loss_fn


# ------------------------------------------------------------------------------------------- log-probs

def token_logprobs(logits_BTV, targets_BT, temperature=1.0):
  """log p(target) under `log_softmax(logits / temperature)`, in fp32, shape [B, T]."""
  x = logits_BTV.astype(jnp.float32) / temperature
  picked = jnp.take_along_axis(x, targets_BT[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return picked - jax.nn.logsumexp(x, axis=-1)


def token_entropy(logits_BTV, temperature=1.0):
  """Entropy of `softmax(logits / temperature)` at each position, in fp32, shape [B, T]."""
  logp = jax.nn.log_softmax(logits_BTV.astype(jnp.float32) / temperature, axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def completion_logprobs(params, cfg: tfm.Config, prompt_BT, prompt_mask_BT, tokens_BN, temperature=1.0,
                        entropy: bool = False, forward_fn=None):
  """Teacher-forced log-probs of completions `tokens_BN` after (left-padded) prompts, as `sample` scores them.

  Returns:
    (logp_BN, entropy_BN or None), fp32, under `log_softmax(logits / temperature)`.
  """
  b, t = prompt_BT.shape
  seq = jnp.concatenate([prompt_BT, tokens_BN], axis=1).astype(jnp.int32)
  mask = jnp.concatenate([prompt_mask_BT.astype(jnp.int32), jnp.ones(tokens_BN.shape, jnp.int32)], axis=1)
  logits = (forward_fn or tfm.forward)(params, seq, cfg, attention_mask_BT=mask).logits[:, t - 1:-1]
  logp = token_logprobs(logits, tokens_BN, temperature)
  return logp, (token_entropy(logits, temperature) if entropy else None)


# ------------------------------------------------------------------------------------------------ GRPO

Aggregation = Literal["seq_mean", "token_mean", "constant"]
AGGREGATIONS = choices.values(Aggregation)


def aggregate(x_BN, mask_BN, rule: str, max_len: int | None = None):
  """`(loss_sum, weight)` of a per-token quantity under an aggregation rule (see the module docstring)."""
  m = mask_BN.astype(jnp.float32)
  x = x_BN * m
  b = jnp.asarray(x_BN.shape[0], jnp.float32)
  if rule == "seq_mean":
    return jnp.sum(jnp.sum(x, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0)), b
  if rule == "token_mean":
    return jnp.sum(x), jnp.sum(m)
  if rule == "constant":
    if not max_len:
      raise ValueError("aggregation 'constant' needs max_len (the completion-length normalizer)")
    return jnp.sum(x) / max_len, b
  raise ValueError(f"aggregation must be one of {AGGREGATIONS}, found {rule!r}")


def _masked_mean(x_BN, m_BN):
  return jnp.sum(x_BN * m_BN) / jnp.maximum(jnp.sum(m_BN), 1.0)


def grpo_objective(logp_BN, old_logp_BN, adv_B, mask_BN, *, ref_logp_BN=None, beta: float = 0.0,
                   clip_low: float = 0.2, clip_high: float = 0.2, aggregation: str = "seq_mean",
                   max_len: int | None = None):
  """The clipped GRPO surrogate with a k3 KL penalty, aggregated to `(loss_sum, weight, stats)`.

  Per completion token, with ratio r = exp(logp - old_logp) and advantage A of its sequence:
    l = -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) + beta * (exp(ref - logp) - (ref - logp) - 1).

  Args:
    logp_BN: log-probs of the sampled tokens under the policy being trained (differentiated).
    old_logp_BN: log-probs under the policy that sampled them (held fixed over the updates of one batch).
    adv_B: one advantage per sequence.
    mask_BN: completion mask (1 on generated tokens, the stop token included).
    ref_logp_BN: reference-policy log-probs; needed only when beta > 0.
    beta: KL coefficient (0: no reference term).
    clip_low, clip_high: the ratio is clipped to [1 - clip_low, 1 + clip_high].
    aggregation: one of `AGGREGATIONS`.
    max_len: the constant normalizer of "constant" (the maximum completion length).

  Returns:
    (loss_sum, weight, stats): stats are token means over the mask of kl (k3), clip_low / clip_high (ratio
    clipped from below with A < 0 / from above with A > 0, the tokens whose gradient the clip removes),
    clip_frac (either) and ratio.
  """
  m = mask_BN.astype(jnp.float32)
  adv = adv_B.astype(jnp.float32)[:, None]
  ratio = jnp.exp(logp_BN - old_logp_BN)
  clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  per_token = -jnp.minimum(ratio * adv, clipped * adv)
  stats = {}
  if beta:
    if ref_logp_BN is None:
      raise ValueError("grpo_objective with beta > 0 needs ref_logp_BN")
    d = ref_logp_BN - logp_BN
    kl = jnp.exp(d) - d - 1.0
    per_token = per_token + beta * kl
    stats["kl"] = _masked_mean(jax.lax.stop_gradient(kl), m)
  else:
    stats["kl"] = jnp.zeros((), jnp.float32)
  loss_sum, weight = aggregate(per_token, m, aggregation, max_len)
  r = jax.lax.stop_gradient(ratio)
  low = ((r < 1.0 - clip_low) & (adv < 0)).astype(jnp.float32)
  high = ((r > 1.0 + clip_high) & (adv > 0)).astype(jnp.float32)
  stats.update(clip_low=_masked_mean(low, m), clip_high=_masked_mean(high, m),
               clip_frac=_masked_mean(jnp.maximum(low, high), m), ratio=_masked_mean(r, m))
  return loss_sum, weight, stats


def grpo_loss_fn(cfg: tfm.Config, *, beta: float = 0.0, clip_low: float = 0.2, clip_high: float = 0.2,
                 aggregation: str = "seq_mean", max_len: int | None = None, temperature: float = 1.0,
                 forward_fn=None) -> LossFn:
  """GRPO on a rollout batch as a `LossFn`: `(loss_sum, weight, stats)`, the stats `grpo_objective`'s and the
  policy entropy (token mean over the completions).

  Batch keys: prompt [B, T], prompt_mask [B, T], tokens [B, N], completion_mask [B, N], old_logp [B, N],
  advantages [B], and ref_logp [B, N] when beta > 0. Log-probs are taken under `logits / temperature`, the
  policy `jaxlab.generate.sample` drew from. Other args as in `grpo_objective`.
  """
  if aggregation not in AGGREGATIONS:
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, found {aggregation!r}")
  if aggregation == "constant" and not max_len:
    raise ValueError("aggregation 'constant' needs max_len (the completion-length normalizer)")

  def loss_fn(params, batch, rng):
    del rng
    logp, ent = completion_logprobs(params, cfg, batch["prompt"], batch["prompt_mask"], batch["tokens"],
                                    temperature, entropy=True, forward_fn=forward_fn)
    mask = batch["completion_mask"]
    loss_sum, weight, stats = grpo_objective(
        logp, batch["old_logp"], batch["advantages"], mask, ref_logp_BN=batch.get("ref_logp"), beta=beta,
        clip_low=clip_low, clip_high=clip_high, aggregation=aggregation, max_len=max_len)
    stats["entropy"] = _masked_mean(jax.lax.stop_gradient(ent), mask.astype(jnp.float32))
    return loss_sum, weight, stats
  return loss_fn


# --------------------------------------------------------------------------------------- DPO, IPO, SFT

def sequence_logprobs(logits_BTV, targets_BT, mask_BT):
  """(sum of masked target log-probs [B], number of masked-in tokens [B]), fp32."""
  m = mask_BT.astype(jnp.float32)
  return jnp.sum(token_logprobs(logits_BTV, targets_BT) * m, axis=1), jnp.sum(m, axis=1)


def dpo_loss(chosen_logp_B, rejected_logp_B, ref_chosen_logp_B, ref_rejected_logp_B, beta: float = 0.1):
  """Per-pair sigmoid DPO loss -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r))) on sequence log-probs."""
  h = (chosen_logp_B - ref_chosen_logp_B) - (rejected_logp_B - ref_rejected_logp_B)
  return -jax.nn.log_sigmoid(beta * h)


def ipo_loss(chosen_logp_B, rejected_logp_B, ref_chosen_logp_B, ref_rejected_logp_B, beta: float = 0.1,
             chosen_len_B=None, rejected_len_B=None):
  """Per-pair IPO loss (h - 1 / (2 beta))^2, h the difference of log-ratios.

  With lengths given each log-ratio is divided by its completion's token count (TRL's choice, which it reports
  the IPO authors confirmed); without, sequence log-probs are used as in the paper's equation 17.
  """
  dc, dr = chosen_logp_B - ref_chosen_logp_B, rejected_logp_B - ref_rejected_logp_B
  if chosen_len_B is not None:
    dc = dc / jnp.maximum(chosen_len_B, 1.0)
  if rejected_len_B is not None:
    dr = dr / jnp.maximum(rejected_len_B, 1.0)
  return (dc - dr - 1.0 / (2.0 * beta)) ** 2


def _pair_forward(params, cfg, batch, forward_fn):
  """Chosen and rejected sequence log-probs and token counts from one forward over both halves."""
  inputs = jnp.concatenate([batch["chosen_inputs"], batch["rejected_inputs"]], axis=0)
  targets = jnp.concatenate([batch["chosen_targets"], batch["rejected_targets"]], axis=0)
  mask = jnp.concatenate([batch["chosen_mask"], batch["rejected_mask"]], axis=0)
  logits = (forward_fn or tfm.forward)(params, inputs, cfg).logits
  b = batch["chosen_inputs"].shape[0]
  logp_tok = token_logprobs(logits, targets) * mask.astype(jnp.float32)
  logp, count = jnp.sum(logp_tok, axis=1), jnp.sum(mask.astype(jnp.float32), axis=1)
  return logp[:b], logp[b:], count[:b], count[b:]


def pair_logprobs(params, cfg: tfm.Config, batch: dict, forward_fn=None):
  """(chosen_logp [B], rejected_logp [B]) sequence log-probs of a pair batch (see `dpo_loss_fn`)."""
  c, r, _, _ = _pair_forward(params, cfg, batch, forward_fn)
  return c, r


def dpo_loss_fn(cfg: tfm.Config, *, beta: float = 0.1, alpha: float = 0.0, kind: str = "sigmoid",
                ipo_length_normalize: bool = True, forward_fn=None) -> LossFn:
  """DPO or IPO on preference pairs, plus `alpha` times the chosen completions' token-mean NLL (RPO).

  Batch keys: chosen_inputs, chosen_targets, chosen_mask, rejected_inputs, rejected_targets, rejected_mask
  ([B, T] each; right-padded, masks 1 on completion targets only) and ref_chosen_logp, ref_rejected_logp [B]
  (computed once, `jaxlab.rl.dpo.reference_logprobs`). Returns (sum over pairs of the pair loss + alpha * B *
  NLL, B, {}), the NLL a token mean over this batch's chosen completions (as TRL's "sft" loss term).

  Args:
    cfg: the model config.
    beta: the DPO temperature (IPO's tau).
    alpha: weight of the NLL term (0: pure DPO/IPO).
    kind: "sigmoid" (DPO) or "ipo".
    ipo_length_normalize: IPO on per-token average log-ratios (see `ipo_loss`).
  """
  if kind not in ("sigmoid", "ipo"):
    raise ValueError(f"kind must be 'sigmoid' or 'ipo', found {kind!r}")
  if beta <= 0:
    raise ValueError(f"beta must be positive, found {beta}")

  def loss_fn(params, batch, rng):
    del rng
    c, r, nc, nr = _pair_forward(params, cfg, batch, forward_fn)
    rc, rr = batch["ref_chosen_logp"], batch["ref_rejected_logp"]
    if kind == "sigmoid":
      per_pair = dpo_loss(c, r, rc, rr, beta)
    else:
      lens = (nc, nr) if ipo_length_normalize else (None, None)
      per_pair = ipo_loss(c, r, rc, rr, beta, *lens)
    b = jnp.asarray(per_pair.shape[0], jnp.float32)
    loss_sum = jnp.sum(per_pair)
    if alpha:
      loss_sum = loss_sum + alpha * b * (-jnp.sum(c) / jnp.maximum(jnp.sum(nc), 1.0))
    return loss_sum, b, {}
  return loss_fn


def completion_loss_mask(prompt_len_B, length_B, t: int):
  """[B, t] target mask of right-padded rows `prompt + completion`: 1 where the target is a completion token.

  Targets are `sequence[1:]`, so target position j predicts token j + 1; it is in when prompt_len - 1 <= j <
  length - 1 (length = prompt + completion tokens of the row).
  """
  j = jnp.arange(t)[None, :]
  p = jnp.asarray(prompt_len_B)[:, None]
  n = jnp.asarray(length_B)[:, None]
  return ((j >= p - 1) & (j < n - 1)).astype(jnp.int32)


def sft_loss_fn(cfg: tfm.Config) -> LossFn:
  """Completion-only next-token loss: `lm_loss_fn` on batches whose `loss_mask` (required) marks completions."""
  inner = lm_loss_fn(cfg, document_mask=False)

  def loss_fn(params, batch, rng):
    if "loss_mask" not in batch:
      raise ValueError("sft_loss_fn needs batch['loss_mask'] (completion_loss_mask); found keys "
                       f"{sorted(batch)}")
    return inner(params, batch, rng)
  return loss_fn


# ------------------------------------------------------------------------------------------------- PRM

def prm_step_loss(logits_BTC, labels_BT, steps_BT):
  """(summed step loss, number of steps): at positions where `steps_BT` is 1, the label (1 right, 0 wrong) under
  sigmoid BCE for one logit (value head) or 2-class cross-entropy for two (step head: class 1 = right)."""
  z = logits_BTC.astype(jnp.float32)
  y = labels_BT.astype(jnp.float32)
  m = steps_BT.astype(jnp.float32)
  if z.shape[-1] == 1:
    per = jnp.maximum(z[..., 0], 0) - z[..., 0] * y + jnp.log1p(jnp.exp(-jnp.abs(z[..., 0])))
  else:
    per = -jnp.take_along_axis(jax.nn.log_softmax(z, -1), labels_BT[..., None].astype(jnp.int32), -1)[..., 0]
  return jnp.sum(per * m), jnp.sum(m)


def prm_loss_fn(lm_cfg: tfm.Config, head_cfg: heads.Config, freeze_lm: bool = True) -> LossFn:
  """PRM loss on params {"lm", "head"} and batches {tokens, mask, labels, steps} [B, T] (labels read where steps
  is 1, e.g. `heads.separator_mask`); `freeze_lm` stops gradients into the LM (head-only training)."""
  def loss_fn(params, batch, rng):
    del rng
    lm = jax.lax.stop_gradient(params["lm"]) if freeze_lm else params["lm"]
    h = heads.hidden_states(lm, lm_cfg, batch["tokens"], batch.get("mask"))
    return (*prm_step_loss(heads.logits(params["head"], head_cfg, h), batch["labels"], batch["steps"]), {})
  return loss_fn


# ------------------------------------------------------------------------------------------------- MCA

# Logical axes of MIND's token projection (`mca_head_init`), beside the model's own rules.
MCA_AXES = axes.rules(
    (r"mca_head/kernel", ("embed", "mlp"), "embed"),
    (r"mca_head/bias", ("mlp",), None),
)


def mca_head_init(key, d_model: int, dtype=jnp.float32) -> dict:
  """MIND's projection of token embeddings, a linear D -> D (`cls_linear` of the reference): normal weights of the
  variance of PyTorch's default Linear init (1 / 3D), zero bias."""
  return layers.linear_init(key, d_model, d_model, bias=True, std=(3 * d_model) ** -0.5, dtype=dtype)


def _normalize(x, eps: float = 1e-12):
  """x / max(|x|, eps), with finite gradients at x = 0: the square root is taken of the clamped squared norm."""
  return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), eps * eps))


def _extreme_mean(x_NR, mask_NR, k: int, lowest: bool):
  """Mean of the k lowest (or highest) entries of each row among those in `mask_NR` (fewer when fewer are in)."""
  big = jnp.finfo(jnp.float32).max
  sorted_ = jnp.sort(jnp.where(mask_NR, x_NR if lowest else -x_NR, big), axis=1)[:, :k]
  take = jnp.arange(sorted_.shape[1])[None, :] < jnp.sum(mask_NR, axis=1, keepdims=True)
  picked = jnp.sum(jnp.where(take, sorted_, 0.0), axis=1) / jnp.maximum(jnp.sum(take, axis=1), 1)
  return picked if lowest else -picked


def mca_loss(pred_BRTD, label_BRTD, role_BR, mask_BRT, margin: float = 0.2, top_k: int = 1):
  """Multi-rationale contrastive alignment (MIND, arXiv:2512.05530), per target token.

  A question's R rows share its prompt, so their targets are aligned by position. For each positive row i and
  target position t (`mask_BRT`), with cos the cosine of the projected embedding of the model's own prediction
  (`pred_BRTD[b, i, t]`) to the projected embedding of row j's target token there (`label_BRTD[b, j, t]`):
    relu(mean of the top_k highest cos over negative rows + margin - mean of the top_k lowest over positive rows).
  Row i's positives are the question's other positive rows (itself when it is the only one): the reference samples
  its positives apart from the trained rationale. Returns (sum over masked tokens, their count): MIND's loss is the
  token mean (reference `contrastive_loss_topk_extreme`, margin 0.2 and top_k 1 in its training script).

  Args:
    pred_BRTD: projected embeddings of the argmax predictions of every row.
    label_BRTD: projected embeddings of every row's target tokens.
    role_BR: 1 for a positive row, -1 for a negative one, 0 for an unused row.
    mask_BRT: the target positions of the positive rows (the CE mask).
  """
  if top_k < 1:
    raise ValueError(f"mca_loss: top_k must be >= 1, found {top_k}")
  b, r, t, _ = pred_BRTD.shape
  if label_BRTD.shape != pred_BRTD.shape or role_BR.shape != (b, r) or mask_BRT.shape != (b, r, t):
    raise ValueError(f"mca_loss: expected pred and label [B, R, T, D], role [B, R] and mask [B, R, T], found "
                     f"{pred_BRTD.shape}, {label_BRTD.shape}, {role_BR.shape}, {mask_BRT.shape}")
  cos_BITJ = jnp.einsum("bitd,bjtd->bitj", _normalize(pred_BRTD.astype(jnp.float32)),
                        _normalize(label_BRTD.astype(jnp.float32)))
  pos_BJ, neg_BJ = role_BR > 0, role_BR < 0
  alone_B = jnp.sum(pos_BJ, axis=1) == 1
  pos_BIJ = pos_BJ[:, None, :] & (~jnp.eye(r, dtype=bool)[None] | alone_B[:, None, None])
  pos_N = jnp.broadcast_to(pos_BIJ[:, :, None, :], cos_BITJ.shape).reshape(-1, r)
  neg_N = jnp.broadcast_to(neg_BJ[:, None, None, :], cos_BITJ.shape).reshape(-1, r)
  k = min(top_k, r)
  cos_N = cos_BITJ.reshape(-1, r)
  hinge = jax.nn.relu(_extreme_mean(cos_N, neg_N, k, lowest=False) + margin - _extreme_mean(cos_N, pos_N, k, True))
  valid_B = jnp.any(pos_BJ, axis=1) & jnp.any(neg_BJ, axis=1)
  w = mask_BRT.astype(jnp.float32) * (pos_BJ & valid_B[:, None])[:, :, None]
  return jnp.sum(hinge.reshape(b, r, t) * w), jnp.sum(w)


def mind_loss_fn(cfg: vlm.Config, *, alpha: float = 1.0, margin: float = 0.2, top_k: int = 1,
                 frozen: tuple[str, ...] = ("vision",)) -> LossFn:
  """MIND phase-1 loss of a VLM: next-token CE on the trained rationales + `alpha` * `mca_loss`.

  Batch: inputs, targets, loss_mask [B, R, T] (R trained rows per group, each a positive rationale under CE),
  pixels [B * R, H, W, C] (one image per row, rows in order); with alpha > 0 also mca_targets [B, S, T] and
  mca_role [B, S] (1 positive, -1 negative, 0 unused): the group's sampled rationales, which need their tokens only
  (no forward pass). A group's rows share the prompt, so targets align by position; a trained row's MCA positives
  are the group's other positive rows, trained or sampled (`mca_loss`). With alpha > 0 the params hold `mca_head`
  (`mca_head_init`) beside the VLM's: a token's MCA embedding is mca_head(the LM's input embedding of the token),
  for the argmax of the logits (no gradient through the argmax) and for each row's targets, as the reference's
  `cls_linear` over the shared embedding table. Returns (CE sum + alpha * MCA token mean * tokens, tokens, {}): the
  train step's division gives CE mean + alpha * MCA mean, MIND's loss.

  Args:
    cfg: the VLM config.
    alpha: the MCA weight (0: plain CE; the mca_* keys are not read).
    margin, top_k: as in `mca_loss`.
    frozen: top-level param groups whose gradients are stopped.
  """
  def loss_fn(params, batch, rng):
    del rng
    params = {k: jax.lax.stop_gradient(v) if k in frozen else v for k, v in params.items()}
    b, r, t = batch["inputs"].shape
    if batch["pixels"].shape[0] != b * r:
      raise ValueError(f"mind_loss_fn: expected one image per row ({b} x {r} = {b * r}), found "
                       f"{batch['pixels'].shape[0]}")
    if alpha and ("mca_head" not in params or "mca_targets" not in batch or "mca_role" not in batch):
      raise ValueError(f"mind_loss_fn: alpha {alpha} needs params['mca_head'] (losses.mca_head_init) and batch "
                       f"mca_targets, mca_role; found params {sorted(params)}, batch {sorted(batch)}")
    vlm_params = {k: v for k, v in params.items() if k != "mca_head"}
    out = vlm.forward(vlm_params, batch["inputs"].reshape(b * r, t), batch["pixels"], cfg)
    targets = batch["targets"].reshape(b * r, t)
    mask = batch["loss_mask"].reshape(b * r, t).astype(bool) & (targets != cfg.image_token_id)
    ce_sum, count = next_token_nll(out.logits, targets, mask)
    if not alpha:
      return ce_sum, count, {}
    s = batch["mca_targets"].shape[1]
    project = lambda ids: layers.linear(params["mca_head"], layers.embed(params["lm"]["embed"], ids), jnp.float32)
    pred = project(jnp.argmax(out.logits, axis=-1).reshape(b, r, t))
    pred = jnp.concatenate([pred, jnp.zeros((b, s, *pred.shape[2:]), pred.dtype)], axis=1)
    labels = project(jnp.concatenate([batch["targets"], batch["mca_targets"]], axis=1))
    mask_BRT = mask.reshape(b, r, t)
    role = jnp.concatenate([jnp.any(mask_BRT, axis=2).astype(jnp.int32), batch["mca_role"]], axis=1)
    mask_BRT = jnp.concatenate([mask_BRT, jnp.zeros((b, s, t), bool)], axis=1)
    mca_sum, mca_count = mca_loss(pred, labels, role, mask_BRT, margin, top_k)
    mca = mca_sum / jnp.maximum(mca_count, 1.0)
    return ce_sum + alpha * mca * jax.lax.stop_gradient(count), count, {}
  return loss_fn
