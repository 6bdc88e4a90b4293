"""Continuous batching: a fixed set of slots decoded together, a finished sequence's slot refilled at once by the
next waiting prompt (vLLM's and EasyDeL eSurge's scheduling), with no recompilation as requests come and go.

Each slot is a row of one preallocated KV cache (`sampling.layer_list_cache`, S = `capacity` positions per row)
used as a ring: every decode step writes all rows at the shared index, which advances modulo S. A row's keys carry
their positions (rotary embeddings are applied before caching, and `pos` marks each position's token position, -1
for none), so attention does not depend on where in the ring a token sits: a prompt admitted into a free row is
prefilled on its own and its keys written to the S-ring positions just before the shared index, every other
position of the row marked -1 (its stale keys are never attended); its decoding then continues the ring. A row never overwrites its own live keys while its prompt and
new tokens fit in S (checked). Two compiled programs serve everything: one decode step over every slot and one
prefill per prompt-length bucket (`prefix.bucket`).

A request's tokens are those `sampling.sample` gives it alone (greedy: the same argmax; sampling: its own key
stream, `fold_in(fold_in(key, request), step)`), whatever else shares the batch.

Axes: B slots, T prompt bucket, S ring positions, V vocab.
"""
from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.generate import prefix as prefix_lib
from jaxlab.generate import quant
from jaxlab.generate.sampling import _choose, layer_list_cache, layer_list_forward, split_layers, stop_ids


def _pick(logits_BV, keys_B, greedy, temperature, top_k, top_p):
  """(tokens [B], their log-probabilities [B] under log_softmax(logits / temperature), as `sampling.sample`)."""
  tok = jax.vmap(lambda lv, k: _choose(lv[None], k, greedy, temperature, top_k, top_p)[0])(logits_BV, keys_B)
  logp = jnp.take_along_axis(jax.nn.log_softmax(logits_BV / temperature, axis=-1), tok[:, None], axis=-1)[:, 0]
  return tok, logp


@functools.partial(jax.jit, static_argnames=("cfg", "greedy", "top_k"), donate_argnames=("cache",))
def _admit(params, cache, row, tokens_1T, mask_1T, key, temperature, top_p, *, cfg, greedy, top_k):
  """Prefills one prompt into ring row `row` ending just before the shared index; returns (cache, first token,
  its log-probability)."""
  t, s = tokens_1T.shape[1], cache["pos"].shape[1]
  out = layer_list_forward(params, tokens_1T, cfg, attention_mask_BT=mask_1T, cache=layer_list_cache(cfg, 1, t),
                           logits_at_B=jnp.asarray([t - 1]))
  at = (cache["index"] - t + jnp.arange(t)) % s
  def put(big, small):  # [B, G, S, K] <- [1, G, T, K] at (row, :, at); the row's other positions get pos -1
    return big.at[row, :, at].set(jnp.swapaxes(small[0], 0, 1))
  ks, vs = tuple(map(put, cache["k"], out.cache["k"])), tuple(map(put, cache["v"], out.cache["v"]))
  pos = cache["pos"].at[row].set(jnp.full((s,), -1, jnp.int32).at[at].set(out.cache["pos"][0]))
  tok, logp = _pick(out.logits[:, 0].astype(jnp.float32), key[None], greedy, temperature, top_k, top_p)
  return {"k": ks, "v": vs, "pos": pos, "index": cache["index"]}, tok[0], logp[0]


@functools.partial(jax.jit, static_argnames=("cfg", "greedy", "top_k"), donate_argnames=("cache",))
def _step(params, cache, tok_B, live_B, key, request_B, drawn_B, temperature, top_p, *, cfg, greedy, top_k):
  """One token for every slot (a free slot's token is written with position -1: never attended); slot b's request
  `request_B[b]` draws its token `drawn_B[b]`; returns (cache, tokens, their log-probabilities)."""
  out = layer_list_forward(params, tok_B[:, None], cfg, attention_mask_BT=live_B[:, None].astype(jnp.int32),
                           cache=cache)
  keys_B = jax.vmap(lambda r, j: jax.random.fold_in(jax.random.fold_in(key, r), j))(request_B, drawn_B)
  nxt, logp = _pick(out.logits[:, -1].astype(jnp.float32), keys_B, greedy, temperature, top_k, top_p)
  return {**out.cache, "index": out.cache["index"] % cache["pos"].shape[1]}, nxt, logp


def generate(params, cfg, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, slots: int = 8,
             capacity: int | None = None, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, key=None, stop_tokens: Sequence[int] = (), weights: str = "fp32",
             stats: dict | None = None, return_logprobs: bool = False):
  """Generates up to `max_new_tokens` after every prompt with `slots` sequences decoded at a time.

  Args:
    params, cfg: the transformer (stacked layers) and its config.
    prompts: token lists, of any lengths and in any number; admitted in order as slots free up.
    max_new_tokens: the cap on each request's new tokens.
    slots: rows decoded together (B).
    capacity: ring positions per row (default: the longest prompt's bucket + max_new_tokens); a request whose
      prompt bucket plus max_new_tokens exceeds it is an error.
    temperature, top_k, top_p, key: as in `sampling.sample` (greedy at temperature 0; request i draws its step j
      with `fold_in(fold_in(key, i), j)`).
    stop_tokens: ids that end a request (with `cfg.eos_token_id`); the stop token is kept in its output.
    weights: "fp32", "bf16" or "int8", as in `sampling.sample`.
    stats: filled with "steps" (decode steps run) and "admitted" (prefills) when given.
    return_logprobs: also return each new token's log-probability under `log_softmax(logits / temperature)`
      (temperature 1 when greedy), as `sampling.sample`'s `logprobs` (RL's old-policy log-probs).

  Returns:
    Each prompt's new tokens, in the order of `prompts`; with `return_logprobs`, (those, their log-probabilities).
  """
  if not prompts or min(len(p) for p in prompts) < 1:
    raise ValueError("continuous.generate: expected a non-empty list of non-empty prompts")
  if int(max_new_tokens) < 1 or int(slots) < 1:
    raise ValueError(f"continuous.generate: max_new_tokens and slots must be >= 1, found {max_new_tokens}, {slots}")
  greedy = temperature == 0
  if not greedy and key is None:
    raise ValueError("continuous.generate: sampling with temperature > 0 needs a PRNG key, found key=None")
  longest = max(prefix_lib.bucket(len(p)) for p in prompts)
  s = int(capacity or longest + max_new_tokens)
  if longest + max_new_tokens > s:
    raise ValueError(f"continuous.generate: a prompt of {longest} positions (bucketed) + {max_new_tokens} new tokens "
                     f"does not fit a ring of {s} positions; raise capacity")
  stop = set(stop_ids(cfg, stop_tokens))
  key = jax.random.key(0) if key is None else key
  params = split_layers(quant.quantize(params, weights))
  static = dict(cfg=cfg, greedy=greedy, top_k=None if greedy or not top_k else int(top_k))
  temp, p_mass = jnp.float32(1.0 if greedy else temperature), jnp.float32(1.0 if top_p is None else top_p)
  cache = layer_list_cache(cfg, slots, s)
  cache = {**cache, "v": tuple(jnp.zeros_like(a) for a in cache["v"])}  # k and v share arrays there; both donated
  outputs: list[list[int]] = [[] for _ in prompts]
  logps: list[list[float]] = [[] for _ in prompts]
  owner = [-1] * slots  # the request each slot serves
  tok = np.zeros(slots, np.int32)
  waiting = list(range(len(prompts)))[::-1]
  n_steps = n_admitted = 0

  def finished(i):
    return len(outputs[i]) >= max_new_tokens or (outputs[i] and outputs[i][-1] in stop)

  while waiting or any(o >= 0 for o in owner):
    for b in range(slots):
      while owner[b] < 0 and waiting:
        i = waiting.pop()
        toks, mask = prefix_lib.left_pad([list(prompts[i])], 0)
        cache, first, lp = _admit(params, cache, jnp.int32(b), jnp.asarray(toks), jnp.asarray(mask),
                                  jax.random.fold_in(jax.random.fold_in(key, i), 0), temp, p_mass, **static)
        n_admitted += 1
        outputs[i].append(int(first))
        logps[i].append(float(lp))
        if not finished(i):
          owner[b], tok[b] = i, int(first)
    live = np.asarray([o >= 0 for o in owner])
    if not live.any():
      continue
    request = np.asarray([max(o, 0) for o in owner], np.int32)
    drawn = np.asarray([len(outputs[r]) for r in request], np.int32)
    cache, nxt, lp = _step(params, cache, jnp.asarray(tok), jnp.asarray(live), key, jnp.asarray(request),
                           jnp.asarray(drawn), temp, p_mass, **static)
    n_steps += 1
    nxt, lp = np.asarray(nxt), np.asarray(lp)
    for b, i in enumerate(owner):
      if i >= 0:
        outputs[i].append(int(nxt[b]))
        logps[i].append(float(lp[b]))
        tok[b] = nxt[b]
        if finished(i):
          owner[b] = -1
  if stats is not None:
    stats.update(steps=n_steps, admitted=n_admitted)
  return (outputs, logps) if return_logprobs else outputs
