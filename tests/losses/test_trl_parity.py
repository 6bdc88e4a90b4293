"""GRPO and DPO/IPO losses and gradients against TRL's own loss code (`GRPOTrainer._compute_loss`,
`DPOTrainer._compute_loss`, run on a stand-in trainer object) on a tiny random LLaMA, loaded here by `hf.load`.

TRL scores tokens with its fused LM head (`trl.trainer.utils.add_fused_lm_head`); the policy's gradient is
compared on the LM head and the embedding. Prompts are unpadded: transformers numbers positions 0..T-1 whatever the
attention mask, jaxlab counts real tokens, and the two agree only without left padding."""
import contextlib
import types
from collections import defaultdict

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")
trl_dpo = pytest.importorskip("trl.trainer.dpo_trainer")
from trl.trainer.utils import add_fused_lm_head  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxlab import hf, losses  # noqa: E402
from jaxlab.rl import pair_batch  # noqa: E402

V, B, T, N = 64, 6, 5, 7
FIELDS = ("log_probs", "entropy", "mean_logits", "is_top1")


def _model(seed, path):
  torch.manual_seed(seed)
  cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                 rms_norm_eps=1e-6, initializer_range=0.3, tie_word_embeddings=False,
                                 bos_token_id=None, eos_token_id=None, pad_token_id=0)
  model = transformers.LlamaForCausalLM(cfg).float()
  model.save_pretrained(path)
  jcfg, params = hf.load(str(path))
  return model, jcfg, params


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  return _model(0, tmp_path_factory.mktemp("policy")), _model(1, tmp_path_factory.mktemp("ref"))


def _accelerator():
  return types.SimpleNamespace(num_processes=1, device=torch.device("cpu"), autocast=contextlib.nullcontext,
                               is_main_process=True,
                               gather=lambda x: x, gather_for_metrics=lambda x: x, reduce=lambda x, reduction: x)


def _grads(model):
  return {"lm_head": model.lm_head.weight.grad.numpy().T, "embed": model.model.embed_tokens.weight.grad.numpy()}


def _jax_grads(g):
  return {"lm_head": np.asarray(g["lm_head"]["kernel"]), "embed": np.asarray(g["embed"]["embedding"])}


TRL_GRPO = {"grpo": "seq_mean", "bnpo": "token_mean", "dapo": "token_mean", "dr_grpo": "constant"}


@pytest.mark.parametrize("loss_type", list(TRL_GRPO))
def test_grpo_matches_trl(models, loss_type):
  (model, cfg, params), _ = models
  beta, lo, hi, temperature = 0.05, 0.2, 0.28, 0.8
  rng = np.random.default_rng(0)
  prompt = rng.integers(1, V, (B, T)).astype(np.int32)
  tokens = rng.integers(1, V, (B, N)).astype(np.int32)
  lengths = np.array([N, 3, 5, 1, N, 6])
  cmask = (np.arange(N)[None] < lengths[:, None]).astype(np.int32)
  adv = rng.normal(0, 1, B).astype(np.float32)
  logp, _ = losses.completion_logprobs(params, cfg, jnp.asarray(prompt), jnp.ones((B, T), jnp.int32),
                                       jnp.asarray(tokens), temperature)
  old = (np.asarray(logp) + rng.normal(0, 0.4, (B, N))).astype(np.float32) * cmask
  ref = (np.asarray(logp) + rng.normal(0, 0.3, (B, N))).astype(np.float32) * cmask
  batch = {"prompt": prompt, "prompt_mask": np.ones((B, T), np.int32), "tokens": tokens, "completion_mask": cmask,
           "old_logp": old, "advantages": adv, "ref_logp": ref}
  terms = losses.grpo_loss_fn(cfg, beta=beta, clip_low=lo, clip_high=hi, aggregation=TRL_GRPO[loss_type],
                              max_len=N, temperature=temperature)

  def f(p):
    s, w, stats = terms(p, batch, None)
    return s / w, stats
  (loss, stats), g = jax.value_and_grad(f, has_aux=True)(params)

  add_fused_lm_head(model, temperature=temperature, outputs=FIELDS)
  model.zero_grad()
  model.train()
  trainer = types.SimpleNamespace(
      top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="token", beta=beta,
      loss_type=loss_type, epsilon_low=lo, epsilon_high=hi, use_vllm=False, vllm_importance_sampling_correction=False,
      model=model, current_gradient_accumulation_steps=1, max_completion_length=N, _entropy_bonus_enabled=False,
      aux_loss_enabled=False, _metrics={"train": defaultdict(list)}, accelerator=_accelerator(),
      args=types.SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1))
  trainer._get_per_token_logps_and_entropies = types.MethodType(
      trl_grpo.GRPOTrainer._get_per_token_logps_and_entropies, trainer)
  inputs = {"prompt_ids": torch.tensor(prompt, dtype=torch.long), "prompt_mask": torch.ones(B, T, dtype=torch.long),
            "completion_ids": torch.tensor(tokens, dtype=torch.long),
            "completion_mask": torch.tensor(cmask, dtype=torch.long), "advantages": torch.tensor(adv),
            "old_per_token_logps": torch.tensor(old), "ref_per_token_logps": torch.tensor(ref),
            "num_items_in_batch": torch.tensor(float(cmask.sum()))}
  ref_loss = trl_grpo.GRPOTrainer._compute_loss(trainer, model, inputs)
  ref_loss.backward()
  np.testing.assert_allclose(float(loss), float(ref_loss.detach()), rtol=1e-4, atol=1e-6)
  for k, v in _grads(model).items():
    np.testing.assert_allclose(_jax_grads(g)[k], v, rtol=1e-3, atol=1e-4 * np.abs(v).max(), err_msg=k)
  m = trainer._metrics["train"]
  assert float(stats["clip_low"]) > 0 and float(stats["clip_high"]) > 0
  for ours, theirs in [("kl", "kl"), ("entropy", "entropy"), ("clip_low", "clip_ratio/low_mean"),
                       ("clip_high", "clip_ratio/high_mean"), ("clip_frac", "clip_ratio/region_mean")]:
    np.testing.assert_allclose(float(stats[ours]), m[theirs][-1], rtol=1e-4, atol=1e-6, err_msg=ours)


@pytest.mark.parametrize("loss_types,kind,alpha", [(["sigmoid"], "sigmoid", 0.0), (["sigmoid", "sft"], "sigmoid", 0.6),
                                                    (["ipo"], "ipo", 0.0)])
def test_dpo_matches_trl(models, loss_types, kind, alpha):
  (model, cfg, params), (ref_model, _, ref_params) = models
  beta = 0.2
  prompts = [[3, 4, 5], [6, 7, 8, 9], [10, 11]]
  chosen = [[12, 13, 14], [15], [16, 17, 18, 19, 20]]
  rejected = [[21], [22, 23, 24], [25, 26]]
  length = 9
  batch = pair_batch(prompts, chosen, rejected, length, pad_id=0)
  rc, rr = losses.pair_logprobs(ref_params, cfg, batch)
  batch = dict(batch, ref_chosen_logp=np.asarray(rc), ref_rejected_logp=np.asarray(rr))
  lf = losses.dpo_loss_fn(cfg, beta=beta, alpha=alpha, kind=kind)

  def f(p):
    s, w, _ = lf(p, batch, None)
    return s / w
  loss, g = jax.value_and_grad(f)(params)

  rows = np.concatenate([np.concatenate([batch[f"{s}_inputs"], batch[f"{s}_targets"][:, -1:]], 1)
                         for s in ("chosen", "rejected")])
  attn = np.zeros_like(rows)
  cm = np.zeros_like(rows)
  for i, (p, c) in enumerate(list(zip(prompts, chosen)) + list(zip(prompts, rejected))):
    attn[i, :len(p) + len(c)] = 1
    cm[i, len(p):len(p) + len(c)] = 1
  add_fused_lm_head(model, outputs=FIELDS)
  model.zero_grad()
  model.train()
  trainer = types.SimpleNamespace(
      model=model, accelerator=_accelerator(), aux_loss_enabled=False, ld_alpha=None, precompute_ref_logps=True,
      f_divergence_type="reverse_kl", loss_types=loss_types, loss_weights=[1.0, alpha][:len(loss_types)], beta=beta,
      label_smoothing=0.0, use_weighting=False, _metrics={"train": defaultdict(list)}, _total_train_tokens=0,
      _tp_size=1)
  inputs = {"input_ids": torch.tensor(rows, dtype=torch.long), "attention_mask": torch.tensor(attn, dtype=torch.long),
            "completion_mask": torch.tensor(cm, dtype=torch.long), "ref_chosen_logps": torch.tensor(np.asarray(rc)),
            "ref_rejected_logps": torch.tensor(np.asarray(rr))}
  ref_loss = trl_dpo.DPOTrainer._compute_loss(trainer, model, inputs, return_outputs=False)
  ref_loss.backward()
  np.testing.assert_allclose(float(loss), float(ref_loss.detach()), rtol=1e-4, atol=1e-6)
  for k, v in _grads(model).items():
    np.testing.assert_allclose(_jax_grads(g)[k], v, rtol=1e-3, atol=1e-4 * np.abs(v).max(), err_msg=k)
  # TRL's reference forward over the same rows gives the log-probs we precomputed.
  add_fused_lm_head(ref_model, outputs=FIELDS)
  labels = torch.tensor(np.where(cm == 1, rows, -100), dtype=torch.long)
  with torch.no_grad():
    out = ref_model(input_ids=torch.tensor(rows, dtype=torch.long), attention_mask=torch.tensor(attn), labels=labels,
                    fused_lm_head=True)
  seq = out.log_probs.sum(1).numpy()
  np.testing.assert_allclose(np.concatenate([np.asarray(rc), np.asarray(rr)]), seq, rtol=1e-4)
