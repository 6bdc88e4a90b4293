"""Throughput benchmark of `jaxlab.generate.sample` (greedy decoding with a KV cache).

Measures decode throughput of the compiled generation program: new tokens per second over the batch, with
compilation timed separately. Stop tokens are disabled so every row generates `new_tokens` tokens.
"""
from __future__ import annotations

import time

import jax
import numpy as np

from jaxlab.generate import quant
from jaxlab.generate.sampling import sample


def bench_generate(cfg, params, batch: int, new_tokens: int, *, prompt_len: int = 16, repeats: int = 3,
                   seed: int = 0, weights: str = "fp32") -> dict:
  """Times greedy generation of `new_tokens` tokens for `batch` random prompts of `prompt_len` tokens.

  Args:
    cfg: model config (its eos token is ignored so every row runs to `new_tokens`).
    params: model params.
    batch: number of prompts generated together.
    new_tokens: tokens generated per prompt.
    prompt_len: prompt length in tokens.
    repeats: timed runs after the compiling one; the best is reported.
    seed: seed of the random prompts.
    weights: "fp32", "bf16" or "int8" (`quant.quantize`, converted once before timing).

  Returns:
    dict with tokens_per_s (batch * new_tokens / best seconds), seconds, compile_s (first call, including
    compilation), batch, prompt_len, new_tokens, weights, weight_bytes, tokens ([batch, new_tokens] greedy).
  """
  if batch < 1 or new_tokens < 1 or prompt_len < 1 or repeats < 1:
    raise ValueError(f"batch, new_tokens, prompt_len and repeats must be >= 1, found {batch}, {new_tokens}, "
                     f"{prompt_len}, {repeats}")
  cfg = cfg.replace(eos_token_id=None)
  params = quant.quantize(params, weights)
  prompt = np.random.default_rng(seed).integers(0, cfg.vocab_size, (batch, prompt_len), dtype=np.int32)
  t0 = time.perf_counter()
  tokens = np.asarray(sample(params, cfg, prompt, new_tokens).tokens)
  compile_s = time.perf_counter() - t0
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(sample(params, cfg, prompt, new_tokens).tokens)
    times.append(time.perf_counter() - t0)
  best = min(times)
  return {"tokens_per_s": batch * new_tokens / best, "seconds": best, "compile_s": compile_s, "batch": batch,
          "prompt_len": prompt_len, "new_tokens": new_tokens, "weights": weights,
          "weight_bytes": quant.weight_bytes(params), "tokens": tokens}
