"""Autoregressive sampling with a KV cache: greedy, temperature, top-k and nucleus (top-p) sampling.

Nucleus sampling is from Holtzman et al., "The Curious Case of Neural Text Degeneration" (arXiv 1904.09751);
top-k from Fan et al. (arXiv 1805.04833). The warpers follow the Hugging Face semantics and order: logits are
divided by the temperature, then top-k keeps every token scoring at least the k-th best, then top-p keeps the
smallest set of the most likely tokens whose probability sums to at least top_p (never fewer than one).

The prompt is prefilled in one forward pass; then one token per step is decoded inside a `jax.lax.while_loop`,
so a whole generation is a single compiled program, compiled once per (batch, prompt length, max_new_tokens)
and sampling-mode shape. Decoding stops early once every row has emitted a stop token or reached its length cap.

With the default transformer forward, the stacked layer params are split into one tree per layer once, before
the prefill, and the layers are run as an unrolled loop with one KV-cache array per layer
(`layer_list_forward`): inside the decode loop each matmul then reads its loop-invariant weight directly,
where the layer scan's dynamic slice copied every layer's weights (and each cache slot) on every step before
the dot (measured in `experiments/bench.py generate`; same ops per layer, so the same tokens).

`weights="bf16" | "int8" | "int4"` decodes with weight-only bf16, int8 or 4-bit matmul kernels (`jaxlab.generate.quant`): the
params are converted once per call, outside the compiled program (pass `quant.quantize(params, mode)` to
convert once for many calls; already converted params are used as they are).

`prefix=` (`jaxlab.generate.prefix.prefill`) reuses a prefilled prompt prefix's KV cache: only the tokens after it
are prefilled.

Axes: B batch, T prompt length, N new tokens, V vocab.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.generate import quant
from jaxlab.models import transformer as tfm

_TRACES = [0]  # incremented each time the generation program is traced (tests count recompilations)


class SampleOutput(NamedTuple):
  """What `sample` returns.

  tokens: [B, N] int32 new tokens only; after a row stops (or hits its length cap) it holds `pad_id`.
  lengths: [B] int32 number of generated tokens per row, the stop token included.
  sequences: [B, T + N] the (left-padded) prompt followed by `tokens`.
  prompt_mask: [B, T] int32, 1 where `sequences[:, :T]` is a real prompt token.
  logits: [B, N, V] float32 raw next-token logits at each step (before warping), only with `return_logits`.
  completion_mask: [B, N] int32, 1 on a row's first `lengths` tokens (the stop token included), else 0.
  logprobs: [B, N] float32 log-probability of each new token under the temperature-scaled policy
    `log_softmax(logits / temperature)` (top-k/top-p not applied; greedy scores under temperature 1), 0 where
    `completion_mask` is 0; only with `return_logprobs`.
  """
  tokens: Any
  lengths: Any
  sequences: Any
  prompt_mask: Any
  logits: Any = None
  completion_mask: Any = None
  logprobs: Any = None


def trace_count() -> int:
  """How many times the generation program has been traced (compiled) in this process."""
  return _TRACES[0]


def warp_logits(logits_BV, temperature=1.0, top_k: int | None = None, top_p=None):
  """Temperature, then top-k, then top-p filtering; removed tokens get -inf (HF's warper semantics).

  Args:
    logits_BV: float logits, last axis the vocabulary.
    temperature: positive divisor (a traced scalar is fine).
    top_k: keep tokens whose logit is >= the k-th largest (ties kept); None or 0 disables.
    top_p: nucleus mass in [0, 1]; None disables. Sorting ascending, a token is removed when the cumulative
      probability up to and including it is <= 1 - top_p; the most likely token is always kept.
  """
  x = logits_BV.astype(jnp.float32) / temperature
  if top_k:
    k = min(int(top_k), x.shape[-1])
    kth = jax.lax.top_k(x, k)[0][..., -1:]
    x = jnp.where(x < kth, -jnp.inf, x)
  if top_p is not None:
    order = jnp.argsort(x, axis=-1)
    sorted_x = jnp.take_along_axis(x, order, axis=-1)
    cum = jnp.cumsum(jax.nn.softmax(sorted_x, axis=-1), axis=-1)
    remove_sorted = (cum <= 1.0 - top_p).at[..., -1].set(False)
    remove = jnp.put_along_axis(jnp.zeros_like(remove_sorted), order, remove_sorted, axis=-1, inplace=False)
    x = jnp.where(remove, -jnp.inf, x)
  return x


def _choose(logits_BV, key, greedy, temperature, top_k, top_p):
  if greedy:
    return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
  x = warp_logits(logits_BV, temperature, top_k, top_p)
  return jax.random.categorical(key, x, axis=-1).astype(jnp.int32)


def split_layers(params):
  """`params` with `layers` (stacked on a leading axis) as a tuple of per-layer trees (QKernels included)."""
  n = jax.tree.leaves(params["layers"])[0].shape[0]
  return {**params, "layers": tuple(jax.tree.map(lambda a, i=i: a[i], params["layers"]) for i in range(n))}


def layer_list_cache(cfg: tfm.Config, batch: int, max_len: int):
  """`transformer.init_cache` with k/v as tuples of per-layer [B, G, S, K] arrays."""
  shape, dt = (batch, cfg.kv_heads, max_len, cfg.kdim), jnp.dtype(cfg.dtype)
  zeros = tuple(jnp.zeros(shape, dt) for _ in range(cfg.n_layers))
  return {"k": zeros, "v": zeros, "pos": jnp.full((batch, max_len), -1, jnp.int32), "index": jnp.zeros((), jnp.int32)}


def layer_list_forward(params, tokens_BT, cfg: tfm.Config, *, attention_mask_BT, cache, logits_at_B=None,
                       inputs_embeds_BTD=None):
  """`transformer.forward` with a KV cache over `split_layers` params and a `layer_list_cache` (`transformer.stack`
  unrolls the layers). With `logits_at_B` the head reads only that position of each row (logits [B, 1, V]: a
  prefill never holds [B, T, V])."""
  x = tfm.embed(params, tokens_BT, cfg, inputs_embeds_BTD)
  t = x.shape[1]
  frame = tfm.positions_and_mask(cfg, attention_mask_BT.astype(bool), cache)
  x, (ks, vs), _ = tfm.stack(params["layers"], x, frame, cfg, cache=cache)
  if logits_at_B is not None:
    x = jnp.take_along_axis(x, logits_at_B[:, None, None], axis=1)
  _, logits = tfm.head(params, x, cfg)
  return tfm.Output(logits=logits, cache={"k": ks, "v": vs, "pos": frame.k_pos, "index": cache["index"] + t})


@functools.partial(jax.jit, static_argnames=("cfg", "max_new", "greedy", "top_k", "use_top_p", "stop", "forward_fn",
                                             "init_cache_fn", "return_logits", "return_logprobs",
                                             "unrolled"))
def _generate(params, prompt_BT, mask_BT, embeds_BTD, key, temperature, top_p, max_length, pad_id, prefix_cache=None,
              *, cfg, max_new, greedy, top_k, use_top_p, stop, forward_fn, init_cache_fn, return_logits,
              return_logprobs, unrolled):
  _TRACES[0] += 1
  if unrolled:  # the per-layer copies are made once here, outside the decode loop
    params = split_layers(params)
  b, t = prompt_BT.shape
  top_p = top_p if use_top_p else None
  stop_ids = jnp.asarray(stop if stop else (-1,), jnp.int32)
  # Per-row cap on new tokens: max_length counts the row's real prompt tokens.
  limit_B = jnp.clip(max_length - jnp.sum(mask_BT, axis=1), 0, max_new)

  # With a prefix, the prompt (the tokens after it) and the new tokens go in the slots after the prefix's.
  cache = init_cache_fn(cfg, b, t + max_new - 1) if prefix_cache is None else prefix_cache
  last = t - 1 - jnp.argmax(mask_BT[:, ::-1], axis=1)  # last real prompt position (any padding side)
  embeds = {} if embeds_BTD is None else {"inputs_embeds_BTD": embeds_BTD}
  if forward_fn is layer_list_forward:
    out = forward_fn(params, prompt_BT, cfg, attention_mask_BT=mask_BT, cache=cache, logits_at_B=last, **embeds)
    logits_BV = out.logits[:, 0].astype(jnp.float32)
  else:
    out = forward_fn(params, prompt_BT, cfg, attention_mask_BT=mask_BT, cache=cache, **embeds)
    logits_BV = jnp.take_along_axis(out.logits, last[:, None, None], axis=1)[:, 0].astype(jnp.float32)

  def emit(i, logits_BV, tokens_BN, done_B, lengths_B, all_logits, logp_BN):
    tok = _choose(logits_BV, jax.random.fold_in(key, i), greedy, temperature, top_k, top_p)
    done_B = done_B | (lengths_B >= limit_B)
    if return_logprobs:
      scaled_BV = logits_BV / temperature
      picked_B = jnp.take_along_axis(scaled_BV, tok[:, None], axis=-1)[:, 0]
      logp_BN = logp_BN.at[:, i].set(jnp.where(done_B, 0.0, picked_B - jax.nn.logsumexp(scaled_BV, axis=-1)))
    tok = jnp.where(done_B, pad_id, tok)
    tokens_BN = tokens_BN.at[:, i].set(tok)
    lengths_B = lengths_B + (~done_B).astype(jnp.int32)
    done_B = done_B | jnp.isin(tok, stop_ids) | (lengths_B >= limit_B)
    if return_logits:
      all_logits = all_logits.at[:, i].set(logits_BV)
    return tok, tokens_BN, done_B, lengths_B, all_logits, logp_BN

  tokens_BN = jnp.full((b, max_new), pad_id, jnp.int32)
  all_logits = jnp.zeros((b, max_new, logits_BV.shape[-1]), jnp.float32) if return_logits else None
  logp_BN = jnp.zeros((b, max_new), jnp.float32) if return_logprobs else None
  tok, tokens_BN, done_B, lengths_B, all_logits, logp_BN = emit(
      0, logits_BV, tokens_BN, jnp.zeros((b,), bool), jnp.zeros((b,), jnp.int32), all_logits, logp_BN)

  def cond(state):
    i, _, _, _, done_B, _, _, _ = state
    return (i < max_new) & ~jnp.all(done_B)

  def body(state):
    i, cache, tok, tokens_BN, done_B, lengths_B, all_logits, logp_BN = state
    out = forward_fn(params, tok[:, None], cfg, attention_mask_BT=jnp.ones((b, 1), jnp.int32), cache=cache)
    tok, tokens_BN, done_B, lengths_B, all_logits, logp_BN = emit(
        i, out.logits[:, -1].astype(jnp.float32), tokens_BN, done_B, lengths_B, all_logits, logp_BN)
    return i + 1, out.cache, tok, tokens_BN, done_B, lengths_B, all_logits, logp_BN

  state = (jnp.asarray(1, jnp.int32), out.cache, tok, tokens_BN, done_B, lengths_B, all_logits, logp_BN)
  _, _, _, tokens_BN, _, lengths_B, all_logits, logp_BN = jax.lax.while_loop(cond, body, state)
  seq = jnp.concatenate([prompt_BT.astype(jnp.int32), tokens_BN], axis=1)
  completion_BN = (jnp.arange(max_new)[None, :] < lengths_B[:, None]).astype(jnp.int32)
  return SampleOutput(tokens_BN, lengths_B, seq, mask_BT.astype(jnp.int32), all_logits, completion_BN, logp_BN)


def _pad_prompts(prompt, prompt_mask, pad_id, vocab_size):
  if isinstance(prompt, (list, tuple)):
    rows = [list(prompt)] if not prompt or np.ndim(prompt[0]) == 0 else [list(r) for r in prompt]
    if prompt_mask is not None:
      raise ValueError("prompt_mask is only accepted with an array prompt; a list of token lists is padded here")
    if not rows or min(len(r) for r in rows) == 0:
      raise ValueError(f"every prompt needs at least one token, found lengths {[len(r) for r in rows]}")
    t = max(len(r) for r in rows)
    toks = np.full((len(rows), t), pad_id, np.int32)
    mask = np.zeros((len(rows), t), np.int32)
    for i, r in enumerate(rows):
      toks[i, t - len(r):] = r
      mask[i, t - len(r):] = 1
    prompt, prompt_mask = toks, mask
  prompt = jnp.asarray(prompt)
  if prompt.ndim != 2 or not jnp.issubdtype(prompt.dtype, jnp.integer):
    raise ValueError(f"prompt must be an int array [B, T] or a list of token lists, found {prompt.dtype} "
                     f"{prompt.shape}")
  mask = jnp.ones(prompt.shape, jnp.int32) if prompt_mask is None else jnp.asarray(prompt_mask).astype(jnp.int32)
  if mask.shape != prompt.shape:
    raise ValueError(f"prompt_mask shape {mask.shape} must equal prompt shape {prompt.shape}")
  if not isinstance(mask, jax.core.Tracer) and not isinstance(prompt, jax.core.Tracer):
    m, p = np.asarray(mask), np.asarray(prompt)
    if (m.sum(axis=1) == 0).any():
      raise ValueError(f"every prompt row needs a real token; rows {np.flatnonzero(m.sum(axis=1) == 0)} are empty")
    real = p[m.astype(bool)]
    if real.size and (real.min() < 0 or real.max() >= vocab_size):
      raise ValueError(f"prompt token ids must lie in [0, {vocab_size}), found [{real.min()}, {real.max()}]")
  return prompt.astype(jnp.int32), mask


def stop_ids(cfg, stop_tokens: Sequence[int] | None = None) -> tuple[int, ...]:
  """The ids that end a generated row: `cfg.eos_token_id` (an id or several) and `stop_tokens`, sorted."""
  eos = cfg.eos_token_id
  eos = () if eos is None else ((eos,) if isinstance(eos, int) else tuple(eos))
  return tuple(sorted({int(s) for s in (*eos, *(stop_tokens or ()))}))


def sample(params, cfg, prompt, max_new_tokens: int, *, temperature: float = 0.0, top_k: int | None = None,
           top_p: float | None = None, key=None, prompt_mask=None, stop_tokens: Sequence[int] | None = None,
           max_length: int | None = None, pad_id: int | None = None, forward_fn: Callable | None = None,
           init_cache_fn: Callable | None = None, return_logits: bool = False, return_logprobs: bool = False,
           weights: str = "fp32", inputs_embeds_BTD=None, prefix=None) -> SampleOutput:
  """Generates up to `max_new_tokens` tokens after each prompt; `sample(...).tokens` are the new tokens.

  Args:
    params: model params for `forward_fn`.
    cfg: the model config (hashable; a static argument of the compiled program).
    prompt: int array [B, T] (padding marked by `prompt_mask`, usually left padding), or a list of token
      lists of different lengths (left-padded here), or one list of ints (B = 1).
    max_new_tokens: number of decode steps; the output has this many columns.
    temperature: 0 for greedy (argmax); otherwise logits are divided by it before top-k/top-p and sampling.
    top_k: keep the k most likely tokens (ties included); None/0 disables. Ignored when greedy.
    top_p: nucleus sampling mass in [0, 1]; None disables. Ignored when greedy.
    key: PRNG key, required when temperature > 0; step i draws with `fold_in(key, i)`.
    prompt_mask: [B, T], 1 for real tokens, 0 for padding (HF `attention_mask`).
    stop_tokens: token ids ending a row, in addition to `cfg.eos_token_id` (pass a config with
      `eos_token_id=None` to ignore it). A stopped row emits `pad_id` afterwards.
    max_length: cap on a row's real prompt tokens plus generated tokens.
    pad_id: filler after a row stops and for padding list prompts; default `cfg.pad_token_id`, else 0.
    forward_fn: `fn(params, tokens_BT, cfg, attention_mask_BT=, cache=) -> obj with .logits, .cache`;
      default (with `init_cache_fn` also None) `layer_list_forward`, `transformer.forward` over split
      layers. Any family with the same KV-cache protocol can be sampled.
    init_cache_fn: `fn(cfg, batch, max_len) -> cache`; default `layer_list_cache` (with the default
      forward), else `transformer.init_cache`.
    return_logits: also return the raw logits of every step in `SampleOutput.logits`.
    return_logprobs: also return each new token's log-probability under `log_softmax(logits / temperature)`
      in `SampleOutput.logprobs` (what a teacher-forced forward over `sequences` scores; RL's old log-probs).
    weights: "fp32" (the params as given), "bf16", "int8" or "int4": weight-only bf16 / int8 / 4-bit matmul kernels
      (`quant.quantize`; int8 with the per-group scales of `quant.INT8`), dequantized inside each matmul.
    inputs_embeds_BTD: the prompt's input embeddings [B, T, D] for the prefill in place of looking up `prompt`
      (e.g. `multimodal.embed`'s spliced features); `prompt` still gives the shape, padding and stop handling.
      With a custom `forward_fn`, it must accept `inputs_embeds_BTD=`.
    prefix: a `prefix.PrefixCache` (`prefix.prefill`, with the same params and `weights`) that every prompt row
      starts with (its one row, or row i of as many as the batch) and extends by at least one token: only the
      tokens after it are prefilled. The outputs are those of the whole prompts (`sequences` and `prompt_mask`
      over them, left-padded); the default forward only, without `inputs_embeds_BTD`.

  Returns:
    SampleOutput(tokens [B, N], lengths [B], sequences [B, T + N], prompt_mask [B, T], logits,
    completion_mask [B, N], logprobs [B, N]).
  """
  if weights not in quant.MODES:
    raise ValueError(f"weights must be one of {quant.MODES}, found {weights!r}")
  if int(max_new_tokens) < 1:
    raise ValueError(f"max_new_tokens must be >= 1, found {max_new_tokens}")
  if temperature < 0:
    raise ValueError(f"temperature must be >= 0, found {temperature}")
  if top_k is not None and top_k < 0:
    raise ValueError(f"top_k must be None or >= 0, found {top_k}")
  if top_p is not None and not 0.0 <= top_p <= 1.0:
    raise ValueError(f"top_p must lie in [0, 1], found {top_p}")
  greedy = temperature == 0
  if not greedy and key is None:
    raise ValueError("sampling with temperature > 0 needs a PRNG key, found key=None")
  pad = int(pad_id if pad_id is not None else (cfg.pad_token_id if cfg.pad_token_id is not None else 0))
  stop = stop_ids(cfg, stop_tokens)
  whole, cap = None, np.iinfo(np.int32).max if max_length is None else int(max_length)
  if prefix is not None:  # the tokens after the prefix are the prompt; outputs show the whole prompts
    if forward_fn is not None or init_cache_fn is not None or inputs_embeds_BTD is not None:
      raise ValueError("prefix= needs the default forward and cache, without inputs_embeds_BTD")
    rows, prompt, prompt_mask = prefix.split(prompt, prompt_mask, pad)
    whole = _pad_prompts(rows, None, pad, cfg.vocab_size)
    if max_length is not None:  # a row's cap counts its prefix tokens
      cap = np.asarray([cap - len(prefix.tokens[i if len(prefix.tokens) > 1 else 0]) for i in range(len(rows))])
  prompt_BT, mask_BT = _pad_prompts(prompt, prompt_mask, pad, cfg.vocab_size)
  if key is None:
    key = jax.random.key(0)
  params = quant.quantize(params, weights)
  unrolled = forward_fn is None and init_cache_fn is None
  if unrolled:
    forward_fn, init_cache_fn = layer_list_forward, layer_list_cache
  if inputs_embeds_BTD is not None and tuple(inputs_embeds_BTD.shape[:2]) != tuple(prompt_BT.shape):
    raise ValueError(f"inputs_embeds_BTD must be [B, T, D] with [B, T] = the prompt's {tuple(prompt_BT.shape)}, "
                     f"found {tuple(inputs_embeds_BTD.shape)}")
  out = _generate(params, prompt_BT, mask_BT, inputs_embeds_BTD, key,
                  jnp.float32(1.0 if greedy else temperature), jnp.float32(1.0 if top_p is None else top_p),
                  jnp.asarray(cap, jnp.int32), jnp.int32(pad),
                  None if prefix is None else prefix.cache_for(len(rows), prompt_BT.shape[1] + int(max_new_tokens) - 1),
                  cfg=cfg,
                  max_new=int(max_new_tokens), greedy=greedy,
                  top_k=None if greedy or not top_k else int(top_k),
                  use_top_p=top_p is not None and not greedy, stop=stop, forward_fn=forward_fn or tfm.forward,
                  init_cache_fn=init_cache_fn or tfm.init_cache, return_logits=bool(return_logits),
                  return_logprobs=bool(return_logprobs), unrolled=unrolled)
  if whole is None:
    return out
  return out._replace(sequences=jnp.concatenate([whole[0], out.tokens], axis=1), prompt_mask=whole[1])
