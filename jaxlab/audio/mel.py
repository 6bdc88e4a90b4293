"""Whisper's log-mel front end (arXiv 2212.04356, section 2.2), in NumPy.

16 kHz audio, a 400-sample (25 ms) periodic Hann window every 160 samples (10 ms) over the reflect-padded
signal (centered frames), power spectrum with the last frame dropped, an 80 (or 128) bin mel filterbank on the
Slaney mel scale with Slaney area normalization (as librosa and transformers build it), log10 clamped at 1e-10,
floored 8 below its maximum, then (x + 4) / 4. One encoder window is 30 s: 480,000 samples, 3,000 frames.
"""
from __future__ import annotations

import numpy as np

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
CHUNK_SECONDS = 30
N_SAMPLES = SAMPLE_RATE * CHUNK_SECONDS  # 480,000
N_FRAMES = N_SAMPLES // HOP  # 3,000


def hz_to_mel(f):
  """Slaney mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above."""
  f = np.asarray(f, np.float64)
  lin = f / (200.0 / 3)
  logstep = np.log(6.4) / 27.0
  return np.where(f >= 1000.0, 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / logstep, lin)


def mel_to_hz(m):
  m = np.asarray(m, np.float64)
  logstep = np.log(6.4) / 27.0
  return np.where(m >= 15.0, 1000.0 * np.exp(logstep * (m - 15.0)), m * (200.0 / 3))


def mel_filters(n_mels: int = 80, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT) -> np.ndarray:
  """[n_mels, n_fft // 2 + 1] triangular filters from 0 to Nyquist, each normalized to unit area (Slaney)."""
  fft_hz = np.linspace(0, sample_rate / 2, n_fft // 2 + 1)
  mel_hz = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(sample_rate / 2), n_mels + 2))
  diff = np.diff(mel_hz)
  ramps = mel_hz[:, None] - fft_hz[None, :]
  lower = -ramps[:-2] / diff[:-1, None]
  upper = ramps[2:] / diff[1:, None]
  w = np.maximum(0.0, np.minimum(lower, upper))
  return w * (2.0 / (mel_hz[2:n_mels + 2] - mel_hz[:n_mels]))[:, None]


def check_audio(audio) -> np.ndarray:
  """A 1-D float waveform, or a clear error."""
  a = np.asarray(audio)
  if a.ndim != 1:
    raise ValueError(f"audio must be a 1-D waveform [samples], found shape {a.shape}")
  if a.size == 0:
    raise ValueError("audio is empty (0 samples); expected a 16 kHz waveform with at least one sample")
  if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
    raise ValueError(f"audio must be a float (or int PCM) array, found dtype {a.dtype}")
  if np.issubdtype(a.dtype, np.integer):
    a = a / float(np.iinfo(a.dtype).max + 1)
  a = a.astype(np.float32)
  if not np.all(np.isfinite(a)):
    raise ValueError("audio holds NaN or infinite samples")
  return a


def pad_or_trim(audio: np.ndarray, length: int = N_SAMPLES) -> np.ndarray:
  """Zero-pads or cuts the last axis to `length` samples (frames, for a spectrogram)."""
  n = audio.shape[-1]
  if n >= length:
    return audio[..., :length]
  return np.pad(audio, [(0, 0)] * (audio.ndim - 1) + [(0, length - n)])


def log_mel(audio, n_mels: int = 80, padding: int = 0) -> np.ndarray:
  """[n_mels, frames] float32 log-mel of a 16 kHz waveform, after appending `padding` zero samples.

  frames = (len(audio) + padding) // 160; the dynamic-range floor (max - 8) is taken over the whole output.
  """
  a = check_audio(audio).astype(np.float64)
  if padding:
    a = np.pad(a, (0, padding))
  if a.size <= N_FFT // 2:
    raise ValueError(f"audio of {a.size} samples is too short for reflect padding; expected more than {N_FFT // 2}")
  x = np.pad(a, (N_FFT // 2, N_FFT // 2), mode="reflect")
  n_frames = 1 + (x.size - N_FFT) // HOP
  idx = np.arange(N_FFT)[None, :] + HOP * np.arange(n_frames)[:, None]
  window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)  # periodic Hann
  power = np.abs(np.fft.rfft(x[idx] * window, axis=-1)) ** 2  # [frames, n_fft/2+1]
  mel = mel_filters(n_mels) @ power[:-1].T
  logm = np.log10(np.maximum(mel, 1e-10))
  logm = np.maximum(logm, logm.max() - 8.0)
  return ((logm + 4.0) / 4.0).astype(np.float32)


def log_mel_30s(audio, n_mels: int = 80) -> np.ndarray:
  """[n_mels, 3000]: the audio zero-padded or cut to 30 s, then its log-mel (one encoder window)."""
  return log_mel(pad_or_trim(check_audio(audio)), n_mels)
