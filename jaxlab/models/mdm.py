"""Masked diffusion LM (LLaDA, arXiv 2502.09992; Dream, arXiv 2508.15487): a bidirectional transformer that
predicts the tokens hidden behind a [MASK] id, and its training loss.

The network is the shared transformer (`jaxlab.models.transformer`) with `causal=False`; `Config` extends
`transformer.Config` with the mask token, the EOS/pad conventions and `shift_logits`. LLaDA predicts token i
from position i. Dream (initialised from the causal Qwen2.5) keeps the AR alignment: the prediction for token
i is read at position i-1 and position 0 reads its own output, i.e. logits[:, i] = raw[:, i-1] for i >= 1
(Dream's `torch.cat([logits[:, :1], logits[:, :-1]], 1)`); `forward` applies that shift when
`shift_logits=True`, so callers always get "logits[:, i] predicts token i".

Loss (LLaDA GUIDELINES.md): per sequence t ~ U(0, 1], p = (1 - eps) t + eps; each token is replaced by [MASK]
with probability p; cross-entropy on the masked tokens weighted 1/p.
  pretraining: sum over masked tokens of CE/p, divided by B*T.
  SFT: prompt tokens are never masked; each sequence's sum of CE/p is divided by its answer length (everything
    after the prompt, the EOS padding included: LLaDA pads answers with EOS and trains on them), then averaged
    over the batch.

Axes: B batch, T positions, V vocab.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.models import transformer as tfm
from jaxlab.nn.rope import Rope

AXES = tfm.AXES
Output = tfm.Output
init_cache = tfm.init_cache
num_params = tfm.num_params


def _old_axis_names(fn):
  """Also accepts the keywords of the former B-L naming (tokens_BL, logits_BLV, masked_BL) as their _BT names."""
  @functools.wraps(fn)
  def wrapped(*args, **kw):
    for old in [k for k in kw if k.endswith(("_BL", "_BLV"))]:
      kw[old.replace("_BL", "_BT")] = kw.pop(old)
    return fn(*args, **kw)
  return wrapped


@dataclasses.dataclass(frozen=True)
class Config(tfm.Config):
  """`transformer.Config` fields plus:

  mask_token_id: id of [MASK] (must be < vocab_size).
  shift_logits: Dream's convention (see module docstring); False for LLaDA.
  text_vocab_size: LLaDA's `vocab_size` when it is smaller than its embedding rows (`embedding_size`);
    None = vocab_size.
  """
  causal: bool = False
  mask_token_id: int = -1
  shift_logits: bool = False
  text_vocab_size: int | None = None

  def __post_init__(self):
    super().__post_init__()
    if self.causal:
      raise ValueError("mdm.Config: a masked diffusion LM is bidirectional; found causal=True")
    if not 0 <= self.mask_token_id < self.vocab_size:
      raise ValueError(f"mdm.Config: mask_token_id must be in [0, {self.vocab_size}), found {self.mask_token_id}")
    if self.text_vocab_size is not None and not 0 < self.text_vocab_size <= self.vocab_size:
      raise ValueError(f"mdm.Config: text_vocab_size must be in (0, {self.vocab_size}], found {self.text_vocab_size}")

  @property
  def eos_id(self) -> int:
    """The (first) EOS id, used to pad SFT answers."""
    e = self.eos_token_id
    if e is None:
      raise ValueError("mdm.Config has no eos_token_id")
    return e[0] if isinstance(e, tuple) else e

  @classmethod
  def tiny(cls, **kw) -> "Config":
    return dataclasses.replace(PRESETS["tiny"], **kw)

  @classmethod
  def from_transformer(cls, c: tfm.Config, **kw) -> "Config":
    fields = {f.name: getattr(c, f.name) for f in dataclasses.fields(tfm.Config)}
    fields["causal"] = False
    return cls(**{**fields, **kw})

  def transformer(self) -> tfm.Config:
    """The same network as a plain `transformer.Config` (drops the diffusion fields)."""
    return tfm.Config(**{f.name: getattr(self, f.name) for f in dataclasses.fields(tfm.Config)})


PRESETS: dict[str, Config] = {
    "tiny": Config(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128,
                   max_position_embeddings=512, mask_token_id=63, eos_token_id=62, pad_token_id=62),
    # GSAI-ML/LLaDA-8B-{Base,Instruct} config.json.
    "llada-8b": Config(vocab_size=126464, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32, d_ff=12288,
                       max_position_embeddings=4096, rope=Rope(theta=500000.0), norm_eps=1e-5,
                       mask_token_id=126336, eos_token_id=126081, pad_token_id=126081, bos_token_id=126080),
    # Dream-org/Dream-v0-{Base,Instruct}-7B (Qwen2.5-7B shapes).
    "dream-7b": Config(vocab_size=152064, d_model=3584, n_layers=28, n_heads=28, n_kv_heads=4, d_ff=18944,
                       max_position_embeddings=131072, rope=Rope(theta=1000000.0), norm_eps=1e-6, qkv_bias=True,
                       mask_token_id=151666, eos_token_id=151643, pad_token_id=151643, bos_token_id=151643,
                       shift_logits=True),
}


def init(cfg: Config, key) -> dict:
  """Random params in the transformer layout (see `transformer.init`)."""
  return tfm.init(cfg, key)


@_old_axis_names
def shift(logits_BTV):
  """Dream's alignment: out[:, 0] = logits[:, 0], out[:, i] = logits[:, i-1]."""
  return jnp.concatenate([logits_BTV[:, :1], logits_BTV[:, :-1]], axis=1)


@_old_axis_names
def forward(params, tokens_BT, cfg: Config, **kw) -> Output:
  """Logits [B, T, V] whose position i predicts token i (Dream's shift applied when `cfg.shift_logits`).

  Args:
    params: from `init` or `hf.load`.
    tokens_BT: int tokens, [MASK] where hidden.
    cfg: the model config.
    **kw: passed to `transformer.forward` (attention_mask_BT, positions_BT, attn_mask_BTS, cache, capture...).
  """
  if not isinstance(cfg, Config):
    raise TypeError(f"mdm.forward expects an mdm.Config, found {type(cfg).__name__}")
  out = tfm.forward(params, tokens_BT, cfg, **kw)
  return out._replace(logits=shift(out.logits)) if cfg.shift_logits else out


@_old_axis_names
def forward_process(key, tokens_BT, mask_token_id: int, *, prompt_len_B=None, eps: float = 1e-3):
  """LLaDA's forward (noising) process.

  Returns:
    (noisy_BT, masked_BT, p_B): tokens with [MASK] where masked, the boolean mask, and each row's masking
    probability p = (1 - eps) t + eps with t ~ U[0, 1). Positions < prompt_len_B are never masked.
  """
  b, length = tokens_BT.shape
  kt, km = jax.random.split(key)
  p_B = (1.0 - eps) * jax.random.uniform(kt, (b,)) + eps
  masked = jax.random.uniform(km, (b, length)) < p_B[:, None]
  if prompt_len_B is not None:
    masked &= jnp.arange(length)[None, :] >= jnp.asarray(prompt_len_B)[:, None]
  return jnp.where(masked, mask_token_id, tokens_BT), masked, p_B


@_old_axis_names
def masked_ce(logits_BTV, tokens_BT, masked_BT, p_B, *, prompt_len_B=None):
  """The LLaDA objective from logits (see module docstring); `prompt_len_B` given selects the SFT form.

  Returns:
    (loss, masked_token_count).
  """
  b, length = tokens_BT.shape
  logp = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
  ce = -jnp.take_along_axis(logp, tokens_BT[..., None], axis=-1)[..., 0]
  w = jnp.where(masked_BT, ce / p_B[:, None], 0.0)
  if prompt_len_B is None:
    loss = jnp.sum(w) / (b * length)
  else:
    answer_len = jnp.maximum(length - jnp.asarray(prompt_len_B), 1).astype(jnp.float32)
    loss = jnp.mean(jnp.sum(w, axis=1) / answer_len)
  return loss, jnp.sum(masked_BT)


@_old_axis_names
def loss(params, tokens_BT, cfg: Config, key, *, prompt_len_B=None, eps: float = 1e-3):
  """Masked-diffusion training loss on clean tokens (pretraining, or SFT when `prompt_len_B` is given).

  Args:
    params: model params.
    tokens_BT: clean int tokens; for SFT, prompt then answer padded with EOS to T.
    cfg: the model config.
    key: PRNG key for t and the masks.
    prompt_len_B: int [B] prompt lengths (SFT) or None (pretraining).
    eps: floor of the masking probability.

  Returns:
    (loss, metrics dict with "masked_tokens" and "mask_rate").
  """
  noisy, masked, p_B = forward_process(key, tokens_BT, cfg.mask_token_id, prompt_len_B=prompt_len_B, eps=eps)
  logits = forward(params, noisy, cfg).logits
  value, n = masked_ce(logits, tokens_BT, masked, p_B, prompt_len_B=prompt_len_B)
  return value, {"masked_tokens": n, "mask_rate": jnp.mean(p_B)}


def pack_sft(prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]], length: int, eos_id: int):
  """LLaDA SFT batch: prompt + answer + EOS padding up to `length` (the padding is part of the answer).

  Returns:
    (tokens [B, length] int32, prompt_len [B] int32) as NumPy arrays.
  """
  if len(prompts) != len(answers):
    raise ValueError(f"got {len(prompts)} prompts but {len(answers)} answers")
  out = np.full((len(prompts), length), eos_id, np.int32)
  plen = np.zeros(len(prompts), np.int32)
  for i, (p, a) in enumerate(zip(prompts, answers)):
    if len(p) + len(a) > length:
      raise ValueError(f"example {i}: prompt ({len(p)}) + answer ({len(a)}) tokens exceed length {length}")
    out[i, :len(p)] = p
    out[i, len(p):len(p) + len(a)] = a
    plen[i] = len(p)
  return out, plen
