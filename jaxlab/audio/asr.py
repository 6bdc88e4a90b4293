"""Speech recognition with Whisper (arXiv 2212.04356): the audio front end of bfcl_audio's Text-Audio setting.

`asr = load(model_dir)` reads a CTranslate2 or transformers Whisper directory with its tokenizer.json;
`asr.transcribe(audio)` returns the English transcript. Decoding follows Whisper's: the prompt
<|startoftranscript|><|en|><|transcribe|><|notimestamps|> (<|startoftranscript|><|notimestamps|> for the .en
models), the checkpoint's suppress_tokens on every step and begin_suppress_tokens (blank, end of text) on the
first, timestamps suppressed, greedy or beam search (patience 1, finished beams ranked by mean log-probability).
Audio longer than 30 s is cut into consecutive 30 s windows of one log-mel spectrogram, each decoded on its own;
the last window is filled with the spectrogram of silence (openai/whisper, transformers) or, with pad="zeros",
with 0.0 features (faster-whisper); the two can give different words on the same clip. Decoding steps run
over a fixed-size KV cache (greedy: the whole token loop is one jitted lax.while_loop; beam search: one jitted
step per token), so nothing recompiles per token.

Axes: B batch (windows or beams), T tokens, V vocab, F mel bins, N frames.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.audio import mel as mel_lib
from jaxlab.hf import whisper as hf_whisper
from jaxlab.models import whisper

PADS = ("silence", "zeros")

@functools.partial(jax.jit, static_argnames=("cfg",))
def _encode_and_prefill(params, mel_BFN, prompt_BT, cfg: whisper.Config):
  enc = whisper.encode(params, mel_BFN, cfg)
  cache = whisper.init_cache(params, enc, cfg)
  logits, cache = whisper.decode(params, prompt_BT, cache, cfg)
  return logits[:, -1], cache


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("cache",))
def _step(params, tokens_B, cache, cfg: whisper.Config):
  logits, cache = whisper.decode(params, tokens_B[:, None], cache, cfg)
  return logits[:, 0], cache


@functools.partial(jax.jit, donate_argnames=("cache",))
def _reorder(cache, parents_B):
  return {k: (v if k == "index" else tuple(jnp.take(a, parents_B, axis=0) for a in v)) for k, v in cache.items()}


def _mask(suppress, vocab: int) -> np.ndarray:
  m = np.zeros(vocab, bool)
  ids = np.asarray([t for t in suppress if 0 <= t < vocab], np.int64)
  m[ids] = True
  return m


def _check_decode_args(cfg, mel_BFN, prompt, max_new_tokens):
  if not prompt:
    raise ValueError("prompt must hold at least one token (<|startoftranscript|>)")
  if max_new_tokens < 1 or len(prompt) + max_new_tokens > cfg.max_target_positions:
    raise ValueError(f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) must be in "
                     f"[{len(prompt) + 1}, {cfg.max_target_positions}] (max_target_positions)")
  if np.ndim(mel_BFN) != 3:
    raise ValueError(f"mel_BFN must be [B, n_mels, frames], found shape {np.shape(mel_BFN)}")


@functools.partial(jax.jit, static_argnames=("cfg", "max_new_tokens", "eot"))
def _greedy_loop(params, logits_BV, cache, sup_V, first_V, cfg: whisper.Config, max_new_tokens: int, eot: int):
  # A program of its own, apart from the encoder: the cache then enters it in the layouts `whisper.init_cache`
  # gives, which the step's matmuls read in place; inside one program XLA chose to transpose it every step.
  b = logits_BV.shape[0]
  dec = params["decoder"]
  params = {**params, "decoder": {**dec, "layers": whisper.unstack_layers(dec["layers"], cfg.decoder_layers)}}
  tok = jnp.argmax(jnp.where(first_V, -jnp.inf, logits_BV), axis=-1).astype(jnp.int32)
  out = jnp.full((b, max_new_tokens), eot, jnp.int32).at[:, 0].set(tok)

  def cond(c):
    i, _, done, _ = c
    return (i < max_new_tokens) & ~jnp.all(done)

  def body(c):
    i, out, done, cache = c
    logits, cache = whisper.decode(params, jax.lax.dynamic_slice_in_dim(out, i - 1, 1, axis=1), cache, cfg)
    nxt = jnp.argmax(jnp.where(sup_V, -jnp.inf, logits[:, 0]), axis=-1).astype(jnp.int32)
    nxt = jnp.where(done, eot, nxt)
    out = jax.lax.dynamic_update_slice_in_dim(out, nxt[:, None], i, axis=1)
    return i + 1, out, done | (nxt == eot), cache

  _, out, _, _ = jax.lax.while_loop(cond, body, (jnp.ones((), jnp.int32), out, tok == eot, cache))
  return out


def greedy(params, cfg: whisper.Config, mel_BFN, prompt, eot: int, *, suppress=(), begin_suppress=(),
           max_new_tokens: int = 224) -> list[list[int]]:
  """Greedy tokens after `prompt` for each spectrogram, up to (not including) end of text.

  Args:
    prompt: the decoder prompt, shared by every row.
    suppress: token ids never generated; begin_suppress: ids not generated first.
  """
  _check_decode_args(cfg, mel_BFN, prompt, max_new_tokens)
  b = mel_BFN.shape[0]
  sup = jnp.asarray(_mask(suppress, cfg.vocab_size))
  first = jnp.asarray(_mask(tuple(suppress) + tuple(begin_suppress), cfg.vocab_size))
  prompt_BT = jnp.asarray(np.tile(np.asarray(prompt, np.int32), (b, 1)))
  logits, cache = _encode_and_prefill(params, jnp.asarray(mel_BFN, jnp.float32), prompt_BT, cfg)
  out = np.asarray(_greedy_loop(params, logits, cache, sup, first, cfg, max_new_tokens, int(eot)))
  return [[int(t) for t in row[:list(row).index(eot) if eot in row else len(row)]] for row in out]


def beam_search(params, cfg: whisper.Config, mel_1FN, prompt, eot: int, *, beam_size: int = 5, suppress=(),
                begin_suppress=(), max_new_tokens: int = 224) -> list[int]:
  """The best beam's tokens (without end of text) for one spectrogram [1, F, N].

  Keeps `beam_size` live hypotheses; stops once `beam_size` have ended (or at max_new_tokens); finished
  hypotheses are ranked by summed log-probability over their length.
  """
  _check_decode_args(cfg, mel_1FN, prompt, max_new_tokens)
  if mel_1FN.shape[0] != 1:
    raise ValueError(f"beam_search decodes one spectrogram [1, F, N], found batch {mel_1FN.shape[0]}")
  if beam_size < 1:
    raise ValueError(f"beam_size must be >= 1, found {beam_size}")
  k = beam_size
  sup = _mask(suppress, cfg.vocab_size)
  first = _mask(tuple(suppress) + tuple(begin_suppress), cfg.vocab_size)
  mel = jnp.repeat(jnp.asarray(mel_1FN, jnp.float32), k, axis=0)
  prompt_BT = jnp.asarray(np.tile(np.asarray(prompt, np.int32), (k, 1)))
  logits, cache = _encode_and_prefill(params, mel, prompt_BT, cfg)
  seqs = [[] for _ in range(k)]
  scores = np.full(k, -np.inf)
  scores[0] = 0.0  # identical rows at the start: expand only the first
  finished: list[tuple[float, list[int]]] = []
  for i in range(max_new_tokens):
    logp = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), np.float64)
    logp[:, first if i == 0 else sup] = -np.inf
    cand = scores[:, None] + logp
    order = np.argsort(-cand, axis=None)[:2 * k]
    parents, new_seqs, new_scores = [], [], []
    for flat in order:
      r, t = divmod(int(flat), cfg.vocab_size)
      s = cand[r, t]
      if not np.isfinite(s):
        break
      if t == eot:
        if len(finished) < k:
          finished.append((s / max(len(seqs[r]), 1), seqs[r]))
      elif len(new_seqs) < k:
        parents.append(r)
        new_seqs.append(seqs[r] + [t])
        new_scores.append(s)
      if len(new_seqs) == k:
        break
    if len(finished) >= k or not new_seqs or i == max_new_tokens - 1:
      break
    while len(new_seqs) < k:  # fewer finite candidates than beams: pad with dead rows
      parents.append(parents[0])
      new_seqs.append(new_seqs[0])
      new_scores.append(-np.inf)
    seqs, scores = new_seqs, np.asarray(new_scores)
    cache = _reorder(cache, jnp.asarray(parents, jnp.int32))
    logits, cache = _step(params, jnp.asarray([s[-1] for s in seqs], jnp.int32), cache, cfg)
  if not finished:
    finished = [(scores[j] / max(len(seqs[j]), 1), seqs[j]) for j in range(k) if np.isfinite(scores[j])]
  return max(finished, key=lambda f: f[0])[1]


@dataclasses.dataclass(frozen=True)
class Tokens:
  """Special token ids of one Whisper vocabulary."""
  sot: int
  eot: int
  prompt: tuple[int, ...]
  suppress: tuple[int, ...]
  begin_suppress: tuple[int, ...]


def _special_tokens(tok, cfg: whisper.Config, model_dir: str) -> Tokens:
  def tid(s):
    i = tok.token_to_id(s)
    if i is None:
      raise ValueError(f"{model_dir}: tokenizer.json has no token {s}; expected a Whisper tokenizer")
    return i

  sot, eot, nots = tid("<|startoftranscript|>"), tid("<|endoftext|>"), tid("<|notimestamps|>")
  multilingual = cfg.vocab_size >= 51865
  prompt = (sot, tid("<|en|>"), tid("<|transcribe|>"), nots) if multilingual else (sot, nots)
  suppress, begin = (), (tok.token_to_id("\u0120") or 220, eot)  # blank ("Ġ", a space) and end of text
  ct2 = os.path.join(model_dir, "config.json")
  if os.path.exists(ct2):
    with open(ct2) as f:
      d = json.load(f)
    suppress = tuple(d.get("suppress_ids") or d.get("suppress_tokens") or ())
    begin = tuple(d.get("suppress_ids_begin") or d.get("begin_suppress_tokens") or begin)
  gen = os.path.join(model_dir, "generation_config.json")
  if not suppress and os.path.exists(gen):
    with open(gen) as f:
      d = json.load(f)
    suppress = tuple(d.get("suppress_tokens") or ())
    begin = tuple(d.get("begin_suppress_tokens") or begin)
  timestamps = tuple(range(nots + 1, cfg.vocab_size))
  return Tokens(sot=sot, eot=eot, prompt=prompt, suppress=tuple(suppress) + timestamps, begin_suppress=begin)


def resample(audio: np.ndarray, sample_rate: int, target: int = mel_lib.SAMPLE_RATE) -> np.ndarray:
  """Polyphase resampling (scipy) from `sample_rate` to `target` Hz."""
  if not isinstance(sample_rate, (int, np.integer)) or sample_rate <= 0:
    raise ValueError(f"sample_rate must be a positive int (Hz), found {sample_rate!r}")
  if sample_rate == target:
    return audio
  if not 1000 <= sample_rate <= 384000:
    raise ValueError(f"sample_rate {sample_rate} Hz is outside the supported 1000..384000 Hz")
  from scipy import signal
  g = math.gcd(int(sample_rate), target)
  return signal.resample_poly(audio, target // g, int(sample_rate) // g).astype(np.float32)


class ASR:
  """A loaded Whisper model with its tokenizer; `transcribe(audio)` -> text."""

  def __init__(self, cfg: whisper.Config, params, tokenizer, tokens: Tokens):
    self.cfg, self.params, self.tokenizer, self.tokens = cfg, params, tokenizer, tokens

  def windows(self, audio_16k, pad: str = "silence") -> np.ndarray:
    """[W, n_mels, 3000]: consecutive 30 s windows of the audio's log-mel spectrogram.

    Args:
      pad: how the last window is filled past the audio. "silence": the spectrogram of the audio followed by
        30 s of zero samples, as openai/whisper and transformers compute it; "zeros": the spectrogram of the
        audio alone, each window padded with 0.0 features, as faster-whisper (CTranslate2) does.
    """
    if pad not in PADS:
      raise ValueError(f"pad must be one of {PADS}, found {pad!r}")
    a = mel_lib.check_audio(audio_16k)
    n = self.cfg.n_frames
    if pad == "silence":
      m = mel_lib.log_mel(a, self.cfg.n_mels, padding=mel_lib.N_SAMPLES)
      content = max(1, a.size // mel_lib.HOP)
      return np.stack([mel_lib.pad_or_trim(m[:, s:s + n], n) for s in range(0, content, n)])
    m = mel_lib.log_mel(a, self.cfg.n_mels, padding=mel_lib.HOP)
    content = max(1, m.shape[1] - 1)
    return np.stack([mel_lib.pad_or_trim(m[:, s:min(s + n, content)], n) for s in range(0, content, n)])

  def transcribe_tokens(self, audio_16k, *, beam_size: int = 1, max_new_tokens: int = 224,
                        pad: str = "silence") -> list[list[int]]:
    """Token ids (after the prompt, without end of text) of each 30 s window (`pad`: see `windows`)."""
    mels = self.windows(audio_16k, pad)
    t = self.tokens
    kw = dict(suppress=t.suppress, begin_suppress=t.begin_suppress, max_new_tokens=max_new_tokens)
    if beam_size == 1:
      return greedy(self.params, self.cfg, mels, t.prompt, t.eot, **kw)
    return [beam_search(self.params, self.cfg, m[None], t.prompt, t.eot, beam_size=beam_size, **kw) for m in mels]

  def transcribe(self, audio, sample_rate: int = mel_lib.SAMPLE_RATE, *, beam_size: int = 1,
                 max_new_tokens: int = 224, pad: str = "silence") -> str:
    """The transcript: each window's text, stripped, joined by single spaces.

    Args:
      audio: 1-D waveform (float in [-1, 1], or int PCM) at `sample_rate` Hz; resampled to 16 kHz.
      beam_size: 1 = greedy, else beam search with this many beams.
      pad: how the last 30 s window is filled past the audio, "silence" (Whisper's) or "zeros"
        (faster-whisper's); see `windows`.
    """
    a = mel_lib.check_audio(audio)
    a = resample(a, sample_rate)
    return self._text(self.transcribe_tokens(a, beam_size=beam_size, max_new_tokens=max_new_tokens, pad=pad))

  def transcribe_batch(self, audios, sample_rate: int = mel_lib.SAMPLE_RATE, *, max_new_tokens: int = 224,
                       pad: str = "silence", batch_size: int = 16) -> list[str]:
    """Greedy transcripts of several clips: the 30 s windows of all of them decoded together, `batch_size`
    windows per call (the last call padded, so one compilation per batch size); each equals `transcribe`."""
    if batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, found {batch_size}")
    mels = [self.windows(resample(mel_lib.check_audio(a), sample_rate), pad) for a in audios]
    if not mels:
      return []
    flat = np.concatenate(mels)
    b = min(batch_size, len(flat))
    t = self.tokens
    rows = []
    for s in range(0, len(flat), b):
      chunk = flat[s:s + b]
      chunk = np.concatenate([chunk, np.repeat(chunk[:1], b - len(chunk), 0)]) if len(chunk) < b else chunk
      rows += greedy(self.params, self.cfg, chunk, t.prompt, t.eot, suppress=t.suppress,
                     begin_suppress=t.begin_suppress, max_new_tokens=max_new_tokens)
    ends = np.cumsum([len(m) for m in mels])
    return [self._text(rows[e - len(m):e]) for m, e in zip(mels, ends)]

  def _text(self, token_rows) -> str:
    texts = [self.tokenizer.decode([i for i in row if i < self.tokens.eot]).strip() for row in token_rows]
    return " ".join(t for t in texts if t)


def load(model_dir: str, dtype=jnp.float32) -> ASR:
  """A Whisper ASR from a CTranslate2 or transformers directory that holds the model's tokenizer.json."""
  import tokenizers
  tj = os.path.join(model_dir, "tokenizer.json")
  if not os.path.exists(tj):
    raise FileNotFoundError(f"{model_dir}: expected tokenizer.json next to the Whisper weights")
  cfg, params = hf_whisper.load(model_dir, dtype)
  tok = tokenizers.Tokenizer.from_file(tj)
  return ASR(cfg, params, tok, _special_tokens(tok, cfg, model_dir))
