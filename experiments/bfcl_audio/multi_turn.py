"""bfcl_audio's multi-turn suite: BFCL v4's multi-turn categories (multi_turn_base, multi_turn_miss_func,
multi_turn_miss_param, multi_turn_long_context) played as the leaderboard's prompt-style handler plays them.

An entry is a conversation with stateful APIs (a file system, a ticket system, a trading bot, ...). The LLM gets
BFCL's prompt-style system prompt over the function docs of the entry's involved classes (the wheel's
multi_turn_func_doc files, less the functions a miss_func entry holds out). Each user turn is appended, then the
model steps: its output is decoded (`experiments.bfcl_audio.bfcl.decode_execute`); output that decodes to no call ends the
turn; decoded calls run on the entry's API instances (`experiments.bfcl_audio.bfcl_multi_turn.execute`; one set per entry,
kept across turns), and each result goes back to the model as a "tool" message named by its call. A turn that has
called in more than `max_steps` steps is forced to quit, and the entry with it (so at most max_steps + 1 model
steps run per turn, as on the leaderboard with its limit of 20). A turn whose functions were held out (miss_func)
has no user text: its message is the wheel's "more functions" prompt carrying their docs. Scoring is
`bfcl_multi_turn.check` on the calls of every step.

Every step's prompt is the previous step's prompt plus the model's output and the new messages, so
`prefix_chat_generator` prefills each conversation's function docs and earlier turns once and keeps their KV cache
(`jaxlab.generate.prefix`): a step computes only its new tokens.
"""
from __future__ import annotations

import json
import os
from typing import Literal

import numpy as np

from experiments.bfcl_audio import bfcl
from experiments.bfcl_audio import bfcl_multi_turn
from jaxlab import choices

CATEGORIES = bfcl.MULTI_TURN_CATEGORIES
Category = Literal["multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"]
choices.same(CATEGORIES, Category)
ERRORS = ("force_terminated", "empty_turn_model_response", "instance_state_mismatch",
          "execution_response_mismatch")  # bfcl_multi_turn.check's error types, less the "multi_turn:" prefix


def function_docs(classes) -> list[dict]:
  """The function docs of the named API classes, from the wheel's multi_turn_func_doc files."""
  from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING
  path = os.path.join(bfcl_multi_turn.require_bfcl_eval(), "data", "multi_turn_func_doc")
  docs = []
  for c in classes:
    with open(os.path.join(path, MULTI_TURN_FUNC_DOC_FILE_MAPPING[c])) as f:
      docs += [json.loads(line) for line in f if line.strip()]
  return docs


def load_multi_turn(categories, n: int) -> list[dict]:
  """The first `n` entries of each category: the wheel's entry plus category, ground_truth (per turn, call
  strings), functions (the docs the system prompt lists), held_out ({turn: docs added at that turn}) and texts
  (per turn, the user's text; None on a held-out turn)."""
  entries = []
  for c in categories:
    if c not in CATEGORIES:
      raise ValueError(choices.message("multi_turn category", CATEGORIES, c))
    questions, answers = bfcl.load(c)
    for q in questions[:n]:
      docs = function_docs(q["involved_classes"])
      held = {}
      for t, names in q.get("missed_function", {}).items():
        held[int(t)] = [next(d for d in docs if d["name"] == name) for name in names]
        docs = [d for d in docs if d not in held[int(t)]]
      texts = []
      for t, msgs in enumerate(q["question"]):
        if [m["role"] for m in msgs] != ([] if t in held else ["user"]):
          raise ValueError(f"{q['id']} turn {t}: expected {'no message' if t in held else 'one user message'}, "
                           f"found roles {[m['role'] for m in msgs]}")
        texts.append(None if t in held else msgs[0]["content"])
      entries.append(dict(q, category=c, ground_truth=answers[q["id"]]["ground_truth"], functions=docs,
                          held_out=held, texts=texts))
  return entries


def held_out_message(docs) -> str:
  """The user message of a held-out turn: the wheel's prompt for functions added mid-conversation."""
  from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING
  return DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=docs)


def _calls(output: str) -> list[str]:
  try:
    return bfcl.decode_execute(output)
  except bfcl.DecodeError:
    return []


def _play(entry: dict, user_texts, max_steps: int):
  """One entry as a coroutine: yields each prompt (a message list), is sent the model's text for it, and returns
  (model_turns, record)."""
  methods = bfcl_multi_turn.public_methods(bfcl_multi_turn.api_instances(entry))
  messages = [{"role": "system", "content": bfcl.system_prompt(entry["functions"])}]
  model_turns, turns = [], []
  for t, text in enumerate(user_texts):
    text = held_out_message(entry["held_out"][t]) if t in entry["held_out"] else text
    messages.append({"role": "user", "content": text})
    steps, record = [], {"user": text, "steps": []}
    for _ in range(max_steps + 1):
      output = yield list(messages)
      messages.append({"role": "assistant", "content": output})
      calls = _calls(output)
      results = bfcl_multi_turn.execute(calls, methods)
      record["steps"].append({"output": output, "calls": calls, "results": results})
      if not calls:
        break
      messages += [{"role": "tool", "name": c, "content": r} for c, r in zip(calls, results)]
      steps.append(calls)
    model_turns.append(steps)
    turns.append(record)
    if len(steps) > max_steps:
      break
  forced = bool(model_turns) and len(model_turns[-1]) > max_steps
  return model_turns, {"id": entry["id"], "category": entry["category"], "turns": turns, "forced_quit": forced}


def prefix_chat_generator(loaded, max_new_tokens: int, room: int = 2048, keep: int = 16):
  """message lists -> greedy answers, the texts `chat.chat_generator` gives for them, with the KV cache of each
  conversation's last prompt kept (`jaxlab.generate.prefix`): a prompt that extends a kept one prefills only its
  new tokens, then decodes after them. Chats are generated one at a time (each has its own prefix).

  Args:
    loaded: the chat model's (cfg, params, tokenizer) (`experiments._shared.chat_models.load_chat_model`).
    max_new_tokens: tokens generated per answer.
    room: a conversation's cache grows by this many slots when full (one compiled program per size).
    keep: caches kept, the most recently used; a conversation whose cache was dropped starts over.

  Returns `generate_chat(message_lists) -> texts`; its `counts` are the prompt tokens seen and those read from
  a kept cache.
  """
  from experiments._shared.chat_models import stop_tokens
  from jaxlab.generate import prefix as prefix_lib
  from jaxlab.generate import sample
  cfg, params, tok = loaded
  stops, kept = stop_tokens(cfg, tok), []

  def extends(pc, ids):
    head = pc.tokens[0]
    return len(head) < len(ids) and tuple(ids[:len(head)]) == head

  def answer(ids):
    base = max((pc for pc in kept if extends(pc, ids)), key=lambda pc: len(pc.tokens[0]), default=None)
    head = ids[:-1]  # the last token is prefilled by `sample`, which needs one after the prefix
    if base is not None and len(base.tokens[0]) == len(head):
      pc = base
    else:
      more = len(head) - (0 if base is None else len(base.tokens[0]))
      need = (0 if base is None else base.length) + prefix_lib.bucket(more)
      fits = base is not None and need <= base.capacity
      pc = prefix_lib.prefill(params, cfg, head, prefix=base, capacity=None if fits else (need // room + 1) * room)
    counts["prompt_tokens"] += len(ids)
    if base is not None:
      counts["reused_tokens"] += len(base.tokens[0])
      kept.remove(base)
    kept.append(pc)
    del kept[:-keep]
    res = sample(params, cfg, [ids], max_new_tokens, prefix=pc, stop_tokens=stops, pad_id=tok.batch_pad_id)
    return tok.decode(np.asarray(res.tokens[0, :int(res.lengths[0])])).strip()

  def generate_chat(chats):
    return [answer(tuple(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True))) for m in chats]
  generate_chat.counts = counts = {"prompt_tokens": 0, "reused_tokens": 0}
  return generate_chat


def run_entries(entries, generate_chat, user_texts, max_steps: int) -> list[tuple[list, dict]]:
  """Plays the entries in lockstep, one `generate_chat(message_lists) -> texts` call per round over every entry
  still playing; per entry (model_turns, record) as `run_entry` gives."""
  for e, u in zip(entries, user_texts, strict=True):
    if len(u) != len(e["question"]):
      raise ValueError(f"{e['id']}: expected a user text for each of its {len(e['question'])} turns, found {len(u)}")
  games = [_play(e, u, max_steps) for e, u in zip(entries, user_texts)]
  out, prompts = [None] * len(games), {}

  def advance(i, reply):
    try:
      prompts[i] = games[i].send(reply)
    except StopIteration as stop:
      prompts.pop(i, None)
      out[i] = stop.value

  for i in range(len(games)):
    advance(i, None)
  while prompts:
    live = sorted(prompts)
    for i, reply in zip(live, generate_chat([prompts[i] for i in live]), strict=True):
      advance(i, reply)
  return out


def run_entry(entry: dict, generate_chat, user_texts, max_steps: int) -> tuple[list, dict]:
  """One entry: per turn, the user message (`user_texts[t]`), then model steps until one decodes to no call (or
the step limit forces the entry to quit).

  Returns model_turns (per turn, per calling step, the decoded call strings: what `bfcl_multi_turn.check` takes)
  and a record (per turn, the user text and each step's output, calls and results; forced_quit).
  """
  return run_entries([entry], generate_chat, [user_texts], max_steps)[0]


def score_multi_turn(entries, played) -> list[dict]:
  """Per entry, its record with the leaderboard's verdict: valid, error_type ("" when valid), error."""
  out = []
  for entry, (model_turns, record) in zip(entries, played, strict=True):
    v = bfcl_multi_turn.check(model_turns, entry["ground_truth"], entry)
    out.append(dict(record, valid=bool(v.valid), error_type=v.error_type, error=list(v.error)))
  return out
