"""Chat models for the experiments: a registered real model (`jaxlab.models.registry`) or a .gguf / transformers
path loaded with its tokenizer and chat template, chat-formatted prompts, and batched generation; for `experiments
plan`, a chat model's config without its weights (`model_config`), its params placed on or abstract over a mesh
(`place`, `abstract_params`) and a generation as a planned workload (`generate_workload`)."""
from __future__ import annotations

import functools
import os

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab import hf
from jaxlab import sharding as shd
from jaxlab.data import tokenizers
from jaxlab.generate import continuous, sample
from jaxlab.hf import gguf as hf_gguf
from jaxlab.hf import hub
from jaxlab.models import registry as models
from jaxlab.models import transformer as tfm


def resolve_model(spec: str) -> str:
  """A registered real-model name -> its installed path; anything else must be an existing path."""
  if spec in models.REAL_MODELS:
    return models.real_model_path(spec)
  if not os.path.exists(spec):
    raise FileNotFoundError(f"model {spec!r} is neither a registered real model {sorted(models.REAL_MODELS)} nor "
                            "an existing .gguf file or transformers directory")
  return spec


def load_chat_model(spec: str, dtype: str = "float32", compute: str | None = None):
  """(cfg, params, tokenizer) of a chat model; the tokenizer must have a chat template and an eos token. Params
  are cast to `dtype`; `compute` (e.g. "bfloat16") also sets the config's compute dtype (activations, KV cache)."""
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
  return (cfg.replace(dtype=compute) if compute else cfg), params, tok


def model_config(spec: str, dtype: str = "float32", compute: str | None = None) -> tfm.Config:
  """The config `load_chat_model(spec, dtype, compute)` gives, read without weights: a repo id's architecture
  (downloaded, or the copy `jaxlab.hf.hub` ships), a registered real model or a path (`jaxlab.hf.hub.config`)."""
  cfg = hub.config(spec if hub.is_repo_id(spec) else resolve_model(spec), dtype)
  return cfg.replace(dtype=compute) if compute else cfg


def place(params, mesh, strategy: str):
  """`params` (a transformer's) placed on `mesh` by `strategy`'s rules; unchanged without a mesh."""
  return params if mesh is None else shd.shard_params(params, mesh, strategy, axes=tfm.AXES)


def abstract_params(cfg: tfm.Config, mesh, strategy: str):
  """ShapeDtypeStructs of a transformer's params at `cfg`, with the shardings `place` gives them on `mesh`."""
  return shd.sharded_shapes(tfm.init, mesh, strategy, cfg, jax.random.PRNGKey(0), axes=tfm.AXES)


def params_mesh(params):
  """The mesh abstract params are sharded over."""
  return jax.tree.leaves(params)[0].sharding.mesh


def generate_workload(name: str, cfg: tfm.Config, params, batch: int, prompt_len: int, max_new: int, steps: int,
                      *, temperature: float = 0.0, stop=(), pad_id: int = 0, return_logprobs: bool = False):
  """A planned `jaxlab.generate.sample` call (`experiments.runner.plan.Workload`, kind "generate"): `batch` left-
  padded prompts of `prompt_len` tokens (placed as `shard_rows` places them), `max_new` new tokens sampled at
  `temperature` (greedy at 0) over `params` (abstract, sharded), called `steps` times. Its analytic FLOPs are a
  forward's (`transformer.flops_per_token` / 3) over prompt + new tokens per row; the decode loop runs
  `max_new - 1` times."""
  from experiments.runner import plan as plan_lib

  def gen(params, prompt_BT, mask_BT, key):
    return sample(params, cfg, prompt_BT, max_new, temperature=temperature, key=key, prompt_mask=mask_BT,
                  stop_tokens=stop, pad_id=pad_id, return_logprobs=return_logprobs)
  mesh = params_mesh(params)
  rows = shd.abstract_rows({"rows": ((batch, prompt_len), np.int32)}, mesh)["rows"]
  key = jax.eval_shape(functools.partial(jax.random.key, 0))
  key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=NamedSharding(mesh, P()))
  tokens = prompt_len + max_new
  return plan_lib.Workload(name, "generate", jax.jit(gen), (params, rows, rows, key), steps,
                           tfm.flops_per_token(cfg, tokens) / 3 * batch * tokens, loop_trips=max_new - 1)


def chat_ids(tok, prompt: str, system: str | None = None, history=()) -> list[int]:
  msgs = ([{"role": "system", "content": system}] if system else []) + list(history)
  return tok.apply_chat_template(msgs + [{"role": "user", "content": prompt}], add_generation_prompt=True,
                                 tokenize=True)


def stop_tokens(cfg, tok) -> tuple[int, ...]:
  """The tokenizer's eos and the model config's eos id(s), sorted: where a chat answer ends."""
  ids = (cfg.eos_token_id,) if isinstance(cfg.eos_token_id, int) else (cfg.eos_token_id or ())
  return tuple(sorted({tok.eos_id, *ids}))


# continuous batching pays once answers are long enough for early finishers to free many decode steps: with
# SmolLM2-135M on pia's persona prompts (64 prompts, 32 slots, 2 CPUs) it measured 1.10x static batches at 128 new
# tokens and 0.88x at 24 (a prompt prefilled alone costs more than its share of a batched prefill)
CONTINUOUS_MIN_NEW = 128


def answer(cfg, params, tok, prompt_ids, max_new_tokens, temperature=0.0, top_p=None, key=None, slots=None):
  """Generates for a batch of token lists; returns (answers, new-token counts). `slots`: rows decoded at a time
  (default: all), by continuous batching (`jaxlab.generate.continuous`: a finished answer's row refilled at once
  by the next prompt, each answer the one the prompt gets alone, prompt i sampling from `fold_in(key, i)`) when
  `max_new_tokens >= CONTINUOUS_MIN_NEW`, else in `sample` batches of `slots` (batch j sampling from
  `fold_in(key, j)`)."""
  prompt_ids, stops = [list(p) for p in prompt_ids], stop_tokens(cfg, tok)
  slots = min(slots or len(prompt_ids), len(prompt_ids))
  if slots < len(prompt_ids) and max_new_tokens >= CONTINUOUS_MIN_NEW:
    rows = continuous.generate(params, cfg, prompt_ids, max_new_tokens, slots=slots, temperature=temperature,
                               top_p=top_p, key=key, stop_tokens=stops)
    return [tok.decode(r).strip() for r in rows], np.asarray([len(r) for r in rows], np.int32)
  texts, lengths = [], []
  for j, i in enumerate(range(0, len(prompt_ids), slots)):
    k = key if key is None or slots == len(prompt_ids) else jax.random.fold_in(key, j)
    out = sample(params, cfg, prompt_ids[i:i + slots], max_new_tokens, temperature=temperature, top_p=top_p, key=k,
                 stop_tokens=stops, pad_id=tok.batch_pad_id)
    n = np.asarray(out.lengths)
    texts += [tok.decode(t[:m]).strip() for t, m in zip(np.asarray(out.tokens), n)]
    lengths.append(n)
  return texts, np.concatenate(lengths)
