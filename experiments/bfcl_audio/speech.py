"""bfcl_audio's spoken requests: perturbation names and seeded clips (espeak-ng speech, text edits, noise)."""
from __future__ import annotations

import re
import zlib

import numpy as np

from experiments.bfcl_audio import perturb

_NOISE = re.compile(r"^(white|pink|babble)_(\d+)db$")
_RATE = re.compile(r"^rate_(\d+)$")
_ACCENT = re.compile(r"^accent_(.+)$")
# espeak-ng's English accents besides en-us (formant voices); the presets speak the first three: British,
# Scottish and Caribbean English
ACCENT_VOICES = ("en-gb", "en-gb-scotland", "en-029", "en-gb-x-rp", "en-gb-x-gbclan", "en-gb-x-gbcwmd", "en-us-nyc")
ACCENTS = ACCENT_VOICES[:3]


def parse_perturbation(name: str) -> dict:
  """"white_10db" -> {factor: white, snr_db: 10}; "rate_70" -> {factor: rate, rate: 0.7}; "accent_en-gb" ->
  {factor: accent, voice: en-gb} (a voice of ACCENT_VOICES); "disfluency"; "homophones"."""
  if m := _NOISE.match(name):
    return {"factor": m.group(1), "snr_db": int(m.group(2))}
  if m := _RATE.match(name):
    if int(m.group(1)) <= 0:
      raise ValueError(f"perturbation {name!r}: the rate percent must be positive")
    return {"factor": "rate", "rate": int(m.group(1)) / 100}
  if m := _ACCENT.match(name):
    if m.group(1) not in ACCENT_VOICES:
      raise ValueError(f"perturbation {name!r}: the accent must be one of {ACCENT_VOICES}")
    return {"factor": "accent", "voice": m.group(1)}
  if name in ("disfluency", "homophones"):
    return {"factor": name}
  raise ValueError(f"unknown perturbation {name!r}; expected <white|pink|babble>_<snr>db, rate_<percent>, "
                   "accent_<espeak English voice>, disfluency or homophones")


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
  """16 kHz speech of the item's request under `perturbation` ("clean" or a name `parse_perturbation` reads) in
  `voice` (an accent perturbation's own voice instead); meta records what was said and every setting with its
  seed."""
  from experiments.bfcl_audio import tts
  s = clip_seed(seed, item["id"], perturbation)
  text, meta = item["text"], {"perturbation": perturbation, "seed": s}
  spec = {"factor": "clean"} if perturbation == "clean" else parse_perturbation(perturbation)
  if spec["factor"] == "disfluency":
    text, meta["text_edit"] = perturb.disfluent(text, seed=s, entities=_string_values(item["ground_truth"]))
  elif spec["factor"] == "homophones":
    text, meta["text_edit"] = perturb.homophones(text, seed=s)
  audio, meta["tts"] = tts.synthesize(text, voice=spec.get("voice", voice), rate=spec.get("rate", 1.0), seed=s)
  if "snr_db" in spec:
    audio, meta["noise"] = perturb.add_noise(audio, spec["factor"], spec["snr_db"], seed=s)
  meta["spoken_text"] = text
  return audio, meta
