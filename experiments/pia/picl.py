"""PIC and PICL, the defense side of PIA ("Adversarial Self-Play for Persona-Invariant Safety Alignment", code
JiajiaLi-1130/PIA, src/PICL/robust_dpo.py).

PIC (persona-invariant consistency) pulls the model's next-token distributions on a chosen (refusal) response
after a persona-wrapped prompt towards its own distributions on the same response after the persona-free prompt:

  PIC_b = (1 / |R_b|) sum_{t in R_b} sum_{v in top_K(clean_t)} p_t(v) (log p_t(v) - log q_t(v)),

p = softmax of the clean side's logits (stop-gradient: the clean side is the target), q = softmax of the persona
side's, both over the whole vocabulary, the sum restricted to the clean side's top-K tokens (K = 100; ties at the
K-th value are kept, as the reference's >= threshold does), R_b the response tokens of row b. Rows whose KL is
not finite or above `max_kl` (100, as the reference) are left out, and PIC is the mean over the rest of the rows
that carry a persona. PICL trains one model on a batch of preference rows (persona-wrapped harmful prompt; chosen
= a refusal, rejected = a compliance) and SFT rows:

  PICL = (sum_pairs DPO_beta + alpha sum_sft_rows NLL_row) / (pairs + sft_rows) + lambda PIC,

DPO_beta the sigmoid DPO loss (beta 0.1, `jaxlab.losses.dpo_loss`) against stored reference log-probs, NLL_row the
token mean of an SFT row's completion NLL, alpha = 0.1, lambda = 1 (the reference's run.sh).

Batches (`picl_batch`): the pair keys of `jaxlab.rl.dpo.pair_batch` ([P, T] rows) plus ref log-probs
(`jaxlab.rl.dpo.reference_logprobs`), sft_inputs / sft_targets / sft_mask ([S, T]), and for PIC clean_inputs
[P, T] (persona-free prompt + chosen), persona_index / clean_index [P, N] (the positions whose logits predict
response token i on either side), response_mask [P, N] and has_persona [P].

Axes: P pairs, S SFT rows, T positions, N response tokens, V vocab, K top tokens.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import losses
from jaxlab.models import transformer as tfm
from jaxlab.rl import dpo


def top_k_kl(clean_logits_BNV, persona_logits_BNV, mask_BN, top_k: int = 100):
  """Per-row mean over masked positions of KL(clean || persona) restricted to the clean side's top-k tokens.

  The clean logits are stop-gradient. Returns (kl_B, count_B): rows with no masked position get 0 and count 0.
  """
  clean = jax.lax.stop_gradient(clean_logits_BNV.astype(jnp.float32))
  logq = jax.nn.log_softmax(persona_logits_BNV.astype(jnp.float32), axis=-1)
  logp = jax.nn.log_softmax(clean, axis=-1)
  k = min(top_k, clean.shape[-1])
  if k < 1:
    raise ValueError(f"top_k must be >= 1, found {top_k}")
  kth = jax.lax.top_k(clean, k)[0][..., -1:]
  keep = clean >= kth
  kl_BN = jnp.sum(jnp.where(keep, jnp.exp(logp) * (logp - logq), 0.0), axis=-1)
  m = mask_BN.astype(jnp.float32)
  count = jnp.sum(m, axis=1)
  return jnp.sum(kl_BN * m, axis=1) / jnp.maximum(count, 1.0), count


def pic_term(kl_B, count_B, has_persona_B, max_kl: float = 100.0):
  """(PIC: mean KL over the persona rows with responses and a finite KL <= max_kl, number of such rows)."""
  ok = (has_persona_B.astype(bool) & (count_B > 0) & jnp.isfinite(kl_B) & (kl_B <= max_kl))
  n = jnp.sum(ok.astype(jnp.float32))
  return jnp.sum(jnp.where(ok, kl_B, 0.0)) / jnp.maximum(n, 1.0), n


def _gather(logits_BTV, index_BN):
  return jnp.take_along_axis(logits_BTV, index_BN[..., None].astype(jnp.int32), axis=1)


STATS = ("dpo", "pic", "pic_rows", "reward_accuracy", "reward_margin", "sft")  # the aux of `picl_loss_fn`


def picl_loss_fn(cfg: tfm.Config, *, beta: float = 0.1, alpha: float = 0.1, lam: float = 1.0, top_k: int = 100,
                 max_kl: float = 100.0, forward_fn=None) -> losses.LossFn:
  """PICL as a `jaxlab.losses.LossFn`: (summed row losses + lambda * PIC * rows, rows, stats); stats: dpo, sft
  (alpha-weighted row means), pic (raw KL mean), pic_rows, reward_margin, reward_accuracy.

  With lam=0 it is DPO on the pairs plus alpha times the SFT rows' token-mean NLL, averaged over all rows.
  """
  if beta <= 0:
    raise ValueError(f"beta must be positive, found {beta}")
  fwd = forward_fn or tfm.forward

  def loss_fn(params, batch, rng):
    del rng
    p = batch["chosen_inputs"].shape[0]
    parts = [batch["chosen_inputs"], batch["rejected_inputs"]]
    targets = [batch["chosen_targets"], batch["rejected_targets"]]
    masks = [batch["chosen_mask"], batch["rejected_mask"]]
    s = batch["sft_inputs"].shape[0] if "sft_inputs" in batch else 0
    if s:
      parts.append(batch["sft_inputs"]), targets.append(batch["sft_targets"]), masks.append(batch["sft_mask"])
    logits = fwd(params, jnp.concatenate(parts, 0), cfg).logits
    m = jnp.concatenate(masks, 0).astype(jnp.float32)
    logp_tok = losses.token_logprobs(logits, jnp.concatenate(targets, 0)) * m
    seq, count = jnp.sum(logp_tok, axis=1), jnp.sum(m, axis=1)
    chosen, rejected = seq[:p], seq[p:2 * p]
    per_pair = losses.dpo_loss(chosen, rejected, batch["ref_chosen_logp"], batch["ref_rejected_logp"], beta)
    sft = jnp.zeros((), jnp.float32)
    if s:
      sft = alpha * jnp.sum(-seq[2 * p:] / jnp.maximum(count[2 * p:], 1.0))
    rows = jnp.asarray(p + s, jnp.float32)
    loss_sum = jnp.sum(per_pair) + sft
    pic, n_pic = jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32)
    if lam:
      clean_logits = fwd(params, batch["clean_inputs"], cfg).logits
      kl, cnt = top_k_kl(_gather(clean_logits, batch["clean_index"]), _gather(logits[:p], batch["persona_index"]),
                         batch["response_mask"], top_k)
      pic, n_pic = pic_term(kl, cnt, batch["has_persona"], max_kl)
      loss_sum = loss_sum + lam * pic * rows
    h = beta * jax.lax.stop_gradient((chosen - batch["ref_chosen_logp"]) - (rejected - batch["ref_rejected_logp"]))
    stats = {"dpo": jnp.mean(jax.lax.stop_gradient(per_pair)), "sft": jax.lax.stop_gradient(sft) / max(s, 1),
             "pic": jax.lax.stop_gradient(pic), "pic_rows": n_pic, "reward_margin": jnp.mean(h),
             "reward_accuracy": jnp.mean((h > 0).astype(jnp.float32))}
    return loss_sum, rows, stats
  return loss_fn


def picl_batch(persona_prompts: Sequence[Sequence[int]], clean_prompts: Sequence[Sequence[int]],
               chosen: Sequence[Sequence[int]], rejected: Sequence[Sequence[int]], length: int,
               sft_prompts: Sequence[Sequence[int]] = (), sft_completions: Sequence[Sequence[int]] = (),
               has_persona: Sequence[bool] | None = None, pad_id: int = 0) -> dict:
  """A PICL batch (without reference log-probs) from token lists; every row right-padded to `length`.

  Args:
    persona_prompts, clean_prompts: the persona-wrapped and the persona-free prompt of each pair.
    chosen, rejected: the refusal and the compliance of each pair.
    length: T; prompt + response of any row (either prompt) has at most T + 1 tokens.
    sft_prompts, sft_completions: SFT rows (the NLL term).
    has_persona: which pairs get the PIC term (default: every pair whose two prompts differ).
  """
  n = len(persona_prompts)
  if not n or not len(clean_prompts) == len(chosen) == len(rejected) == n:
    raise ValueError(f"picl_batch needs as many (at least one) persona prompts, clean prompts, chosen and rejected "
                     f"responses, found {n}, {len(clean_prompts)}, {len(chosen)}, {len(rejected)}")
  out = dpo.pair_batch(persona_prompts, chosen, rejected, length, pad_id)
  out["clean_inputs"] = dpo.sft_batch(clean_prompts, chosen, length, pad_id)["inputs"]
  width = max(1, max(len(c) for c in chosen))
  out["persona_index"] = np.zeros((n, width), np.int32)
  out["clean_index"] = np.zeros((n, width), np.int32)
  out["response_mask"] = np.zeros((n, width), np.int32)
  for i, (pp, cp, c) in enumerate(zip(persona_prompts, clean_prompts, chosen)):
    out["persona_index"][i, :len(c)] = len(pp) - 1 + np.arange(len(c))
    out["clean_index"][i, :len(c)] = len(cp) - 1 + np.arange(len(c))
    out["response_mask"][i, :len(c)] = 1
  flags = [list(a) != list(b) for a, b in zip(persona_prompts, clean_prompts)] if has_persona is None else has_persona
  if len(flags) != n:
    raise ValueError(f"has_persona needs one flag per pair ({n}), found {len(flags)}")
  out["has_persona"] = np.asarray(flags, bool)
  if len(sft_prompts):
    s = dpo.sft_batch(sft_prompts, sft_completions, length, pad_id)
    out.update(sft_inputs=s["inputs"], sft_targets=s["targets"], sft_mask=s["loss_mask"])
  return out
