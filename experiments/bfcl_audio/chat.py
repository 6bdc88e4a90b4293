"""The LLM side of the harness, shared by the run and the call-format SFT: the chat an LLM answers for a BFCL item
(`request`), how a chat model answers batches of them (`chat_generator`) and the leaderboard's verdict on an output
(`check`)."""
from __future__ import annotations

import numpy as np

from experiments.bfcl_audio import CATEGORIES, bfcl
from experiments.bfcl_audio.bfcl import system_prompt
from jaxlab import sharding as shd


def request(item: dict, user_text: str) -> dict:
  """The chat an LLM answers: the system prompt (the entry's own system text appended, as BFCL does), the turn's
  earlier messages, and the last user message replaced by `user_text`."""
  msgs = list(item["messages"])
  last = max(i for i, m in enumerate(msgs) if m["role"] == "user")
  system = system_prompt(item["functions"])
  if msgs[0]["role"] == "system":
    system, msgs, last = system + "\n\n" + msgs[0]["content"], msgs[1:], last - 1
  return {"id": item["id"], "system": system, "history": msgs[:last], "user": user_text}


def check(item: dict, output):
  """The leaderboard verdict on one output."""
  if item["ground_truth"] is None:
    return bfcl.relevance_check(output, test_category=CATEGORIES[item["category"]])
  return bfcl.ast_check(item["functions"], output, item["ground_truth"], language="python",
                        test_category=CATEGORIES[item["category"]], mode="leaderboard")


def generation_fn(mcfg, max_new: int, stops, pad_id: int):
  """The jitted generation `chat_generator` runs on each batch: (params, tokens_BT, mask_BT, embeds_BTD) ->
  `jaxlab.generate.sample`'s SampleOutput, greedy, `max_new` new tokens, prefilled from `embeds_BTD`."""
  import jax
  from jaxlab.generate import sample
  return jax.jit(lambda params, toks, mask, x: sample(params, mcfg, toks, max_new, prompt_mask=mask,
                                                      stop_tokens=stops, pad_id=pad_id, inputs_embeds_BTD=x))


def chat_generator(model: str, max_new_tokens: int, batch_size: int, bucket: int = 128, *, loaded=None, mesh=None):
  """requests -> greedy answers of a chat model (`experiments._shared.chat_models`; `loaded`: its (cfg, params,
  tokenizer) when already loaded, params placed on `mesh` if given): prompts sorted by length, left-padded to a
  multiple of `bucket` tokens in batches of exactly `batch_size` rows (filler rows copy the batch's first, rows
  placed on `mesh` as `shard_rows` places them), so a run compiles once per length bucket rather than once per
  batch.

  `generate(requests, embed=None, max_new=None)`: a request is {system, history, user} or {messages} (a whole chat,
  as the multi-turn suite sends it). With `embed(tokens_BT, features_BNE) -> embeds_BTD` the
  requests carry "features" [N, E], spliced into their prompts for the prefill (true_audio). Text prompts are
  prefilled from their looked-up embeddings too, so text and spliced prompts of a length share one compiled
  generation program (`generation_fn`).
  """
  import jax
  from experiments._shared.chat_models import chat_ids, load_chat_model, stop_tokens
  from jaxlab.nn import layers
  mcfg, params, tok = loaded or load_chat_model(model)
  stops = stop_tokens(mcfg, tok)
  lookup = jax.jit(lambda t: layers.embed(params["embed"], t, np.dtype(mcfg.dtype)))
  programs = {}

  def generate(requests, embed=None, max_new=None):
    n_new = max_new or max_new_tokens
    if n_new not in programs:
      programs[n_new] = generation_fn(mcfg, n_new, stops, tok.batch_pad_id)
    ids = [tok.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=True) if "messages" in r
           else chat_ids(tok, r["user"], r["system"], r["history"]) for r in requests]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out = [None] * len(ids)
    for s in range(0, len(order), batch_size):
      part = order[s:s + batch_size]
      t = -(-max(len(ids[i]) for i in part) // bucket) * bucket
      toks = np.full((batch_size, t), tok.batch_pad_id, np.int32)
      mask = np.zeros((batch_size, t), np.int32)
      for b, i in enumerate(part):
        toks[b, t - len(ids[i]):], mask[b, t - len(ids[i]):] = ids[i], 1
      toks[len(part):], mask[len(part):] = toks[0], mask[0]
      toks, mask = shd.shard_rows((toks, mask), mesh)
      if embed is None:
        x = lookup(toks)
      else:
        x = embed(toks, np.stack([requests[i]["features"] for i in part + [part[0]] * (batch_size - len(part))]))
      res = programs[n_new](params, toks, mask, x)
      new, lengths = np.asarray(res.tokens), np.asarray(res.lengths)
      for b, i in enumerate(part):
        out[i] = tok.decode(new[b, :lengths[b]]).strip()
    return out

  return generate
