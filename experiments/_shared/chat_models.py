"""Chat models for the experiments: a registered real model (`jaxlab.models.registry`) or a .gguf / transformers
path loaded with its tokenizer and chat template, chat-formatted prompts, and batched generation."""
from __future__ import annotations

import os

import numpy as np

from jaxlab import hf
from jaxlab.data import tokenizers
from jaxlab.generate import sample
from jaxlab.hf import gguf as hf_gguf
from jaxlab.models import registry as models


def resolve_model(spec: str) -> str:
  """A registered real-model name -> its installed path; anything else must be an existing path."""
  if spec in models.REAL_MODELS:
    return models.real_model_path(spec)
  if not os.path.exists(spec):
    raise FileNotFoundError(f"model {spec!r} is neither a registered real model {sorted(models.REAL_MODELS)} nor "
                            "an existing .gguf file or transformers directory")
  return spec


def load_chat_model(spec: str, dtype: str = "float32"):
  """(cfg, params, tokenizer) of a chat model; the tokenizer must have a chat template and an eos token."""
  path = resolve_model(spec)
  if path.endswith(".gguf"):  # one parse of the file serves the tokenizer and the weights
    reader = hf_gguf.open_reader(path)
    tok = tokenizers.HFTokenizer.from_gguf(path, reader=reader)
  else:
    tok = tokenizers.load(path)
  if tok.chat_template is None:
    raise ValueError(f"{path}: the tokenizer has no chat template, so prompts cannot be formatted as chat")
  tok.require("eos", "chat generation (to stop at the end of the assistant turn)")
  cfg, params = hf_gguf.load(path, dtype, reader) if path.endswith(".gguf") else hf.load(path, dtype=dtype)
  if cfg.vocab_size < tok.vocab_size:
    raise ValueError(f"{path}: tokenizer vocabulary ({tok.vocab_size}) exceeds the model's ({cfg.vocab_size})")
  return cfg, params, tok


def chat_ids(tok, prompt: str, system: str | None = None, history=()) -> list[int]:
  msgs = ([{"role": "system", "content": system}] if system else []) + list(history)
  return tok.apply_chat_template(msgs + [{"role": "user", "content": prompt}], add_generation_prompt=True,
                                 tokenize=True)


def stop_tokens(cfg, tok) -> tuple[int, ...]:
  """The tokenizer's eos and the model config's eos id(s), sorted: where a chat answer ends."""
  ids = (cfg.eos_token_id,) if isinstance(cfg.eos_token_id, int) else (cfg.eos_token_id or ())
  return tuple(sorted({tok.eos_id, *ids}))


def answer(cfg, params, tok, prompt_ids, max_new_tokens, temperature=0.0, top_p=None, key=None):
  """Generates for a batch of token lists; returns (answers, new-token counts)."""
  out = sample(params, cfg, list(prompt_ids), max_new_tokens, temperature=temperature, top_p=top_p, key=key,
               stop_tokens=stop_tokens(cfg, tok), pad_id=tok.batch_pad_id)
  toks, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  return [tok.decode(t[:n]).strip() for t, n in zip(toks, lengths)], lengths
