"""Perturbations of spoken requests for bfcl_audio (BFCL Audio, experiments/bfcl_audio/README.md).

Text side: `disfluent` inserts fillers ("um", "uh", "you know"), repeats a word and adds false starts that the
speaker then corrects ("book a, I mean, book a table"); it never touches a protected word (anything with a digit,
a number word, a capitalized word past the first, or a caller-given entity), so every entity and number of the
request survives, and each inserted span is recorded. `homophones` rewrites entities listed in HOMOPHONES (names,
numbers, places) to another spelling of the same sound ("Stephen" -> "Steven", "two" -> "too"). Voice side:
`prosody` draws a speaking rate and pitch shift (arguments of `tts.synthesize`). Noise: white, pink (1/f power,
by shaping a white spectrum) and babble (several other synthesized utterances summed), mixed at a given SNR by
`mix_at_snr`. Everything is seeded and returns its choices in a meta dict.
"""
from __future__ import annotations

import re

import numpy as np

from experiments.bfcl_audio import tts

FILLERS = ("um", "uh", "you know", "like", "er")
EDITS = ("I mean", "sorry", "no wait", "let me rephrase")
NUMBER_WORDS = frozenset(
  "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
  "seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million "
  "billion first second third half quarter dozen".split())
UNITS = frozenset("am pm a.m. p.m. percent dollars dollar euros euro pounds usd eur kg km miles mph celsius "
                  "fahrenheit degrees hours minutes".split())  # protected right after a number
# Entity spellings -> other spellings of the same sound (equal espeak-ng en-us phonemes, in context too): names
# both ways; numbers and places only towards the common word ("two" -> "too", never "to": espeak reduces it).
HOMOPHONES = {"two": ("too",), "eight": ("ate",), "one": ("won",), "Rome": ("roam",), "Seoul": ("soul",),
              "Wales": ("whales",), "Greece": ("grease",), "Neil": ("kneel",)}
for _g in (("Stephen", "Steven"), ("Sean", "Shaun"), ("Ann", "Anne"), ("Claire", "Clare"), ("Mark", "Marc"),
           ("Jon", "John"), ("Sara", "Sarah"), ("Brian", "Bryan"), ("Alan", "Allan"), ("Philip", "Phillip"),
           ("Carl", "Karl"), ("Eric", "Erik"), ("Jean", "Gene"), ("Lynn", "Lin")):
  for _w in _g:
    HOMOPHONES[_w] = tuple(x for x in _g if x != _w)
_HOMOPHONE_OF = {k.lower(): v for k, v in HOMOPHONES.items()}
NOISE_KINDS = ("white", "pink", "babble")
BABBLE_TEXTS = ("The quarterly report is due at the end of the month.",
                "Could you turn the music down a little, please?",
                "We walked along the river until it started raining.",
                "My brother is moving to a new apartment next week.",
                "I think the train leaves from the other platform.",
                "She ordered a coffee and a slice of lemon cake.",
                "The children were playing football in the park.",
                "Remember to water the plants before you leave.")
_WORD = re.compile(r"\S+")


def _core(token: str) -> str:
  return token.strip(".,;:!?\"'()[]{}")


def protected(tokens: list[str], entities=()) -> list[bool]:
  """Which whitespace tokens carry an entity or number: digits, number words, units right after a number,
  capitalized words after the first, and tokens inside any of `entities` (caller-given strings, matched
  case-sensitively on word boundaries)."""
  text = " ".join(tokens)
  starts = np.cumsum([0] + [len(t) + 1 for t in tokens[:-1]])
  spans = [(m.start(), m.end()) for e in entities for m in re.finditer(rf"(?<!\w){re.escape(e)}(?!\w)", text)]
  out = []
  for i, (t, s) in enumerate(zip(tokens, starts)):
    c = _core(t)
    number = any(ch.isdigit() for ch in t) or c.lower() in NUMBER_WORDS
    unit = i > 0 and c.lower() in UNITS and (any(ch.isdigit() for ch in tokens[i - 1])
                                              or _core(tokens[i - 1]).lower() in NUMBER_WORDS)
    out.append(number or unit or (i > 0 and c[:1].isupper()) or any(a < s + len(t) and s < b for a, b in spans))
  return out


def disfluent(text: str, *, seed: int = 0, n_fillers: int = 1, n_repeats: int = 1, n_false_starts: int = 1,
              entities=()) -> tuple[str, dict]:
  """`text` with fillers, word repetitions and corrected false starts inserted between words.

  Args:
    n_fillers, n_repeats, n_false_starts: how many of each to insert (fewer when the text has too few
      unprotected words).
    entities: strings that must come through unchanged (function-call argument values); words inside them are
      neither repeated nor restarted.
  Returns:
    (new text, meta): meta["edits"] lists each insertion (kind, word index it precedes, inserted text) and
    meta["spans"] the [start, end) character spans of the inserted text in the new text; deleting them gives
    back `text` with its whitespace collapsed.
  """
  if not isinstance(text, str) or not text.strip():
    raise ValueError(f"text must be a non-empty string, found {text!r}")
  if min(n_fillers, n_repeats, n_false_starts) < 0:
    raise ValueError(f"counts must be >= 0, found fillers={n_fillers} repeats={n_repeats} "
                     f"false_starts={n_false_starts}")
  rng = np.random.default_rng(seed)
  tokens = _WORD.findall(text)
  prot = protected(tokens, entities)
  # an insertion before word i never splits a run of protected words ("San Francisco", "7:30 pm")
  slots = [i for i in range(len(tokens)) if i == 0 or not (prot[i - 1] and prot[i])]
  free = [i for i in slots if not prot[i] and _core(tokens[i])]
  before: dict[int, list[tuple[str, str]]] = {}  # word index -> insertions spoken before it
  edits = []

  def add(kind, i, s):
    before.setdefault(i, []).append((kind, s))
    edits.append(dict(kind=kind, before_word=int(i), text=s))

  for _ in range(n_fillers):
    i = int(rng.choice(slots))
    add("filler", i, str(rng.choice(FILLERS)) + ",")
  for i in rng.permutation(free)[:n_repeats]:
    add("repeat", int(i), _core(tokens[i]))
  starts = [i for i in free if i + 1 < len(tokens) and not prot[i + 1] and _core(tokens[i + 1])]
  for i in rng.permutation(starts)[:n_false_starts]:
    n = 1 + int(rng.integers(0, 2))
    words = [_core(t) for t in tokens[i:i + n]]
    add("false_start", int(i), " ".join(words) + ", " + str(rng.choice(EDITS)) + ",")
  out, spans, pos = [], [], 0
  for i in range(len(tokens) + 1):
    for _, s in before.get(i, []):
      start = pos + (1 if out else 0)
      spans.append((start, start + len(s)))
      out.append(s)
      pos = start + len(s)
    if i < len(tokens):
      pos += (1 if out else 0) + len(tokens[i])
      out.append(tokens[i])
  new = " ".join(out)
  return new, dict(kind="disfluency", seed=int(seed), edits=edits, spans=spans)


def homophones(text: str, *, seed: int = 0, p: float = 1.0) -> tuple[str, dict]:
  """Rewrite each word listed in HOMOPHONES (with probability p) to another spelling of the same sound.

  Returns (new text with whitespace collapsed, meta); meta["rewrites"] lists (word index, original,
  replacement): the new text sounds like the original while its spelling, the one a transcript must recover,
  differs.
  """
  if not 0.0 <= p <= 1.0:
    raise ValueError(f"p must be a probability in [0, 1], found {p}")
  rng = np.random.default_rng(seed)
  tokens = _WORD.findall(text)
  rewrites = []
  for i, t in enumerate(tokens):
    c = _core(t)
    alts = _HOMOPHONE_OF.get(c.lower())
    if alts is None or rng.random() >= p:
      continue
    new = str(rng.choice(alts))
    if c[:1].isupper():
      new = new[:1].upper() + new[1:]
    tokens[i] = t.replace(c, new, 1)
    rewrites.append(dict(word=i, original=c, replacement=new))
  return " ".join(tokens), dict(kind="homophones", seed=int(seed), p=float(p), rewrites=rewrites)


def prosody(*, seed: int = 0, rate=(0.75, 1.3), pitch=(-3.0, 3.0)) -> dict:
  """A speaking rate factor and a pitch shift (semitones) drawn uniformly: keyword arguments of tts.synthesize."""
  for name, r in (("rate", rate), ("pitch", pitch)):
    if len(r) != 2 or r[0] > r[1]:
      raise ValueError(f"{name} must be a (low, high) range, found {r!r}")
  if rate[0] <= 0:
    raise ValueError(f"rate range must be positive, found {rate!r}")
  rng = np.random.default_rng(seed)
  return dict(rate=float(rng.uniform(*rate)), pitch=float(rng.uniform(*pitch)))


def white_noise(n: int, *, seed: int = 0) -> np.ndarray:
  """Gaussian white noise scaled to unit RMS, float32 [n]."""
  x = np.random.default_rng(seed).standard_normal(n)
  return (x / np.sqrt(np.mean(x ** 2))).astype(np.float32)


def pink_noise(n: int, *, seed: int = 0) -> np.ndarray:
  """Noise with power ~ 1/f (-10 dB per decade): a white spectrum scaled by 1/sqrt(f), unit RMS, float32 [n]."""
  if n < 2:
    raise ValueError(f"pink noise needs n >= 2 samples, found {n}")
  rng = np.random.default_rng(seed)
  spec = rng.standard_normal(n // 2 + 1) + 1j * rng.standard_normal(n // 2 + 1)
  f = np.arange(n // 2 + 1, dtype=np.float64)
  spec[0] = 0.0
  spec[1:] /= np.sqrt(f[1:])
  x = np.fft.irfft(spec, n)
  return (x / np.sqrt(np.mean(x ** 2))).astype(np.float32)


def babble_noise(n: int, *, seed: int = 0, talkers: int = 6, texts=BABBLE_TEXTS, engine: str = "espeak"):
  """Sum of `talkers` other utterances (drawn from `texts`, random voices, rates and pitch), each looped from a
  random offset to n samples; unit RMS float32 [n], and meta with what each talker said."""
  if talkers < 1:
    raise ValueError(f"babble needs talkers >= 1, found {talkers}")
  if n < 1:
    raise ValueError(f"babble needs n >= 1 samples, found {n}")
  rng = np.random.default_rng(seed)
  vs = tts.voices(engine)
  out, who = np.zeros(n, np.float64), []
  for _ in range(talkers):
    kw = dict(voice=str(rng.choice(vs)), rate=float(rng.uniform(0.85, 1.2)), pitch=float(rng.uniform(-4, 4)))
    text = str(rng.choice(list(texts)))
    a, _ = tts.synthesize(text, engine=engine, **kw)
    a = a / max(np.sqrt(np.mean(a.astype(np.float64) ** 2)), 1e-12)
    off = int(rng.integers(0, a.size))
    out += np.resize(np.roll(a, -off), n)
    who.append(dict(text=text, offset=off, **kw))
  out /= max(np.sqrt(np.mean(out ** 2)), 1e-12)
  return out.astype(np.float32), dict(talkers=who, engine=engine)


def noise(kind: str, n: int, *, seed: int = 0, **kw) -> tuple[np.ndarray, dict]:
  """(unit-RMS noise [n], meta) of kind "white", "pink" or "babble" (kw go to babble_noise)."""
  if kind not in NOISE_KINDS:
    raise ValueError(f"noise kind must be one of {NOISE_KINDS}, found {kind!r}")
  meta = dict(kind=kind, seed=int(seed))
  if kind == "babble":
    x, m = babble_noise(n, seed=seed, **kw)
    return x, {**meta, **m}
  return (white_noise if kind == "white" else pink_noise)(n, seed=seed), meta


def mix_at_snr(speech, noise_, snr_db: float) -> np.ndarray:
  """speech + g * noise with g chosen so that 10 log10(sum speech^2 / sum (g noise)^2) = snr_db over the whole
  clip; the noise is looped or cut to the speech's length. The result may exceed [-1, 1] (see add_noise)."""
  s = np.asarray(speech, np.float64)
  z = np.asarray(noise_, np.float64)
  if s.ndim != 1 or z.ndim != 1 or s.size == 0 or z.size == 0:
    raise ValueError(f"speech and noise must be non-empty 1-D waveforms, found shapes {s.shape} and {z.shape}")
  if not np.isfinite(snr_db):
    raise ValueError(f"snr_db must be finite, found {snr_db}")
  z = np.resize(z, s.size)
  ps, pz = np.sum(s ** 2), np.sum(z ** 2)
  if ps == 0 or pz == 0:
    raise ValueError(f"speech and noise must have non-zero energy, found {ps} and {pz}")
  g = np.sqrt(ps / (pz * 10.0 ** (snr_db / 10.0)))
  return (s + g * z).astype(np.float32)


def add_noise(speech, kind: str, snr_db: float, *, seed: int = 0, **kw) -> tuple[np.ndarray, dict]:
  """Speech with `kind` noise at `snr_db`, scaled down (speech and noise alike, so the SNR holds) if it would clip.

  Returns (float32 waveform, meta with the noise's meta, snr_db and the output gain).
  """
  s = np.asarray(speech, np.float32)
  z, meta = noise(kind, s.size, seed=seed, **kw)
  y = mix_at_snr(s, z, snr_db)
  peak = float(np.max(np.abs(y)))
  gain = 1.0 if peak <= 1.0 else 0.99 / peak
  return (y * gain).astype(np.float32), {**meta, "snr_db": float(snr_db), "gain": gain}
