"""bfcl_audio's True-Audio suite: Whisper encoder features -> a trained connector -> the LLM, no transcript.

The speech LLM is a `jaxlab.models.multimodal` splice model (LLaVA, arXiv 2304.08485): the ASR model's Whisper
encoder (arXiv 2212.04356, frozen) reads the clip's first 30 s log-mel window; `multimodal.WHISPER` keeps its
first `audio_tokens * audio_pool` positions (20 ms each) and mean-pools them in groups of `audio_pool`, so a
request becomes `audio_tokens` features (the cpu preset: 32 tokens of 0.48 s, the first 15.4 s; longer
requests are cut, and counted in `true_audio.cut`); LLaVA-1.5's 2-layer GELU MLP (arXiv 2310.03744), the only
trained params, maps them into the frozen LLM's embedding space, where they replace `audio_tokens` copies of
the placeholder token `audio_token` in the user turn.

Training is LLaVA's stage-1 feature alignment with transcripts for captions: the chat
  system: ALIGN_SYSTEM; user: <audio_tokens placeholders>; assistant: the request text
and a teacher-forced next-token loss on the assistant's tokens (`jaxlab.losses.multimodal_loss_fn`, LM frozen),
on espeak speech of BFCL requests that are not evaluated (held out by id and by text, the multi-turn suite's
turns included; round-robin over the wheel's ALIGN_SOURCES, so the full preset, which evaluates every Python and
multi-turn entry, aligns on the Java and JavaScript requests). The prompts are short (~30 + audio_tokens +
align_max_tokens tokens), so a step through the frozen 30-layer SmolLM2 is affordable on two cores, where
BFCL's 500-1500-token prompts are not; the frozen encoder's features are computed once per clip. Distilling the
LLM's own answers at BFCL's prompt (stage 2) is not done here.

Evaluation: BFCL's prompt with the request text replaced by the placeholders; the prompt's embeddings (features
spliced) are prefilled by `generate.sample(inputs_embeds_BTD=)` and decoded greedily. `wer.true_audio` is the
WER of the LLM's greedy answer to the alignment chat on the evaluated clips: how much of the request reaches
the LLM through the connector.

Axes: B batch, T positions, N audio tokens, E encoder width, D LM width.
"""
from __future__ import annotations

import hashlib
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments._shared import recipes
from experiments.bfcl_audio import speech
from jaxlab import losses
from jaxlab import sharding as shd
from jaxlab.audio import mel as mel_lib
from jaxlab.models import multimodal
from jaxlab.models import vlm
from jaxlab.train import schedules
from jaxlab.train import state as state_lib

ALIGN_SYSTEM = "Repeat the spoken request word for word."
ALIGN_SOURCES = ("simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "live_multiple",
                 "simple_java", "simple_javascript", "multi_turn_base")


def audio_token_id(tok, token: str) -> int:
  """The id of the placeholder string, which must be one token of the LLM's tokenizer."""
  ids = tok.encode(token)
  if len(ids) != 1:
    raise ValueError(f"audio_token must be a single token of the LLM's tokenizer, found {token!r} -> {len(ids)} "
                     f"tokens {ids[:8]}")
  return ids[0]


def model_config(lm_cfg, whisper_cfg, cfg, placeholder_id: int) -> multimodal.Config:
  return multimodal.Config(
      encoder=multimodal.WHISPER, text=lm_cfg, placeholder_id=placeholder_id, modality="audio clip",
      encoder_cfg=multimodal.WhisperFeatures(whisper_cfg, n_tokens=cfg.audio_tokens, pool=cfg.audio_pool))


def init_connector(mcfg: multimodal.Config, seed: int) -> dict:
  k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
  e = mcfg.encoder.width(mcfg.encoder_cfg)
  return multimodal.connector_init((k1, k2), e, mcfg.connector_dim, mcfg.text.d_model, bias=True,
                                   std=mcfg.text.init_std, dtype=jnp.float32)


FEATURE_BATCH = 8  # clips per call of the frozen encoder


def features_fn(mcfg: multimodal.Config):
  """The jitted frozen-encoder pass `featurizer` runs: (Whisper params, mels [B, n_mels, 3000]) -> [B, N, E]."""
  return jax.jit(lambda p, m: multimodal.whisper_features(p, m, mcfg.encoder_cfg))


def featurizer(whisper_params, mcfg: multimodal.Config, batch: int = FEATURE_BATCH):
  """clips (16 kHz) -> (features [n, N, E] of their first 30 s window, whether each was longer than the kept
  `n_tokens * pool` encoder positions)."""
  wc = mcfg.encoder_cfg
  fn = features_fn(mcfg)
  kept_s = wc.n_tokens * wc.pool * 2 * mel_lib.HOP / mel_lib.SAMPLE_RATE

  def features(clips):
    mels = [mel_lib.log_mel_30s(c, wc.whisper.n_mels) for c in clips]
    out = []
    for s in range(0, len(mels), batch):
      part = mels[s:s + batch]
      x = np.stack(part + [part[0]] * (batch - len(part)))
      out.append(np.asarray(fn(whisper_params, jnp.asarray(x)))[:len(part)])
    return np.concatenate(out), np.asarray([len(c) / mel_lib.SAMPLE_RATE > kept_s for c in clips])
  return features


def align_prompt(tok, placeholder_id: int, n_tokens: int, audio_token: str) -> list[int]:
  """The alignment chat up to the assistant's answer, with `n_tokens` placeholders as the user turn."""
  from experiments._shared.chat_models import chat_ids
  ids = chat_ids(tok, audio_token * n_tokens, ALIGN_SYSTEM)
  if ids.count(placeholder_id) != n_tokens:
    raise ValueError(f"the chat template turned {n_tokens} audio tokens into {ids.count(placeholder_id)}")
  return ids


def align_batch(prompt: list[int], texts, tok, stop_id: int, max_tokens: int) -> dict:
  """inputs/targets/loss_mask [n, T]: prompt + the text's tokens (cut to `max_tokens`) + stop, loss on the answer."""
  t = len(prompt) + max_tokens + 1
  seq = np.full((len(texts), t + 1), tok.batch_pad_id, np.int32)
  mask = np.zeros((len(texts), t), np.int32)
  for i, text in enumerate(texts):
    ans = tok.encode(text)[:max_tokens] + [stop_id]
    seq[i, :len(prompt) + len(ans)] = prompt + ans
    mask[i, len(prompt) - 1:len(prompt) - 1 + len(ans)] = 1
  return {"inputs": seq[:, :-1], "targets": seq[:, 1:], "loss_mask": mask}


def connector_optimizer(steps: int, lr: float):
  """(schedule, tx): AdamW (10% warmup, cosine) on the connector alone, zero updates for the frozen LM."""
  schedule = schedules.get("cosine", lr, steps, max(1, steps // 10), 0.1)
  return schedule, vlm.connector_only(recipes.optimizer(schedule, "adamw", grad_clip=1.0, weight_decay=0.0))


def connector_loss(mcfg: multimodal.Config):
  """The alignment loss: next-token loss on the answer, gradients to the connector alone."""
  return losses.multimodal_loss_fn(mcfg, freeze=True)


def train_connector(mcfg: multimodal.Config, lm_params, connector, data: dict, *, steps: int, batch: int,
                    lr: float, seed: int, metrics_path: str | None = None, mesh=None):
  """`connector_optimizer`'s AdamW on the connector alone through the frozen LM (`recipes.fit` of
  `connector_loss`); data: align_batch's arrays plus features, batch rows placed on `mesh` as `shard_rows` places
  them. Returns (connector, loss history)."""
  schedule, tx = connector_optimizer(steps, lr)
  # the step donates its state, which holds copies, so the caller's params stay alive
  state = state_lib.create(jax.tree.map(jnp.copy, {"connector": connector, "lm": lm_params}), tx, seed)
  rng = np.random.default_rng(seed)
  n = len(data["inputs"])

  def batches():
    while True:
      idx = rng.choice(n, batch, replace=n < batch)
      yield shd.shard_rows({k: jnp.asarray(v[idx]) for k, v in data.items()}, mesh)

  res, _ = recipes.fit(state, connector_loss(mcfg), tx, batches(), steps,
                       schedule=schedule, metrics_path=metrics_path, log_every=max(1, steps // 20),
                       desc="connector")
  return res.state.params["connector"], [float(r["loss"]) for r in res.history if "loss" in r]


def save_connector(path: str, connector, meta: dict) -> None:
  os.makedirs(path, exist_ok=True)
  flat = {"/".join(str(getattr(k, "key", k)) for k in p): np.asarray(v)
          for p, v in jax.tree_util.tree_flatten_with_path(connector)[0]}
  np.savez(os.path.join(path, "connector.npz"), **flat)
  with open(os.path.join(path, "connector.json"), "w") as f:
    json.dump(meta, f, indent=1)


def load_connector(path: str, meta: dict):
  """(the saved connector, its record), or None when absent or trained with other settings."""
  try:
    with open(os.path.join(path, "connector.json")) as f:
      record = json.load(f)
    if record.get("settings") != meta:
      return None
    z = np.load(os.path.join(path, "connector.npz"))
  except FileNotFoundError:
    return None
  out: dict = {}
  for k in z.files:
    a, b = k.split("/")
    out.setdefault(a, {})[b] = jnp.asarray(z[k])
  return out, record


class SpeechLLM:
  """The trained splice model: `answer(items, clips)` -> the LLM's BFCL answers to the spoken requests;
  `repeat(clips)` -> its answers to the alignment chat."""

  def __init__(self, mcfg, lm_params, connector, tok, features, generate, audio_token: str):
    self.mcfg, self.tok, self.features, self.generate = mcfg, tok, features, generate
    self.audio_text = audio_token * mcfg.encoder_cfg.n_tokens
    self.embed = jax.jit(lambda t, f: multimodal.embed({"lm": lm_params, "connector": connector}, t, None, mcfg,
                                                       features_BNE=f))
    self.cut, self._last = 0, None

  def _features(self, clips):
    if self._last is None or self._last[0] is not clips:  # answer and repeat hear the same clips
      self._last = (clips, *self.features(clips))
    return self._last[1:]

  def answer(self, requests, clips):
    """requests: bfcl_audio.request(item, <anything>) dicts; their user text becomes the placeholders. Counts
    in `cut` the clips longer than the audio the features keep."""
    feats, cut = self._features(clips)
    self.cut = int(cut.sum())
    return self.generate([dict(r, user=self.audio_text, features=f) for r, f in zip(requests, feats)], self.embed)

  def repeat(self, clips, max_new_tokens: int):
    feats, _ = self._features(clips)
    reqs = [{"id": str(i), "system": ALIGN_SYSTEM, "history": [], "user": self.audio_text, "features": f}
            for i, f in enumerate(feats)]
    return self.generate(reqs, self.embed, max_new_tokens)


def align_items(cfg, exclude_ids, exclude_texts=()) -> list[dict]:
  """Up to `cfg.align_clips` BFCL requests (id, text: the first turn's last user message) whose ids are not in
  `exclude_ids` and whose texts (whitespace collapsed) are not in `exclude_texts` (the evaluated ones, of any
  category or turn), round-robin over the wheel's ALIGN_SOURCES so every kind is heard."""
  from experiments.bfcl_audio import bfcl
  from experiments.runner import splits
  held = {splits.canonical(t) for t in exclude_texts}
  pools = []
  for name in ALIGN_SOURCES:
    pool = []
    for q in bfcl.load(name)[0]:
      users = [m for m in q["question"][0] if m["role"] == "user"]
      if users and q["id"] not in exclude_ids and splits.canonical(users[-1]["content"]) not in held:
        pool.append({"id": q["id"], "text": users[-1]["content"], "ground_truth": None})
    pools.append(pool)
  out, i = [], 0
  while len(out) < cfg.align_clips and any(i < len(p) for p in pools):
    out += [p[i] for p in pools if i < len(p)]
    i += 1
  if not out:
    raise ValueError(f"no BFCL request of {ALIGN_SOURCES} is left for the connector's alignment once the "
                     "evaluated ones are held out")
  return out[:cfg.align_clips]


def build(cfg, loaded, asr_model, generate, out_dir: str, exclude_ids, resume: bool = False,
          exclude_texts=(), mesh=None) -> SpeechLLM:
  """Trains (or, with `resume`, reloads) the connector on `align_items(cfg, exclude_ids, exclude_texts)` (rows on
  `mesh`, where the LM's params are) and returns the speech LLM."""
  lm_cfg, lm_params, tok = loaded
  pid = audio_token_id(tok, cfg.audio_token)
  mcfg = model_config(lm_cfg, asr_model.cfg, cfg, pid)
  features = featurizer(asr_model.params, mcfg)
  meta = {k: getattr(cfg, k) for k in ("model", "asr_model", "voice", "audio_token", "audio_tokens", "audio_pool",
                                        "align_clips", "align_steps", "align_batch", "align_lr",
                                        "align_max_tokens", "n_per_category", "seed")}
  meta["held_out"] = hashlib.sha256(json.dumps(sorted(set(exclude_ids) | set(exclude_texts))).encode()).hexdigest()
  art = os.path.join(out_dir, "artifacts")
  loaded_connector = load_connector(art, meta) if resume else None
  if cfg.align_steps == 0:  # an untrained connector (the smoke preset)
    connector, record = init_connector(mcfg, cfg.seed), {"settings": meta, "history": [], "clips": 0}
  elif loaded_connector is None:
    t0 = time.time()
    items = align_items(cfg, exclude_ids, exclude_texts)
    clips = [speech.make_clip(it, "clean", seed=cfg.seed + 1, voice=cfg.voice)[0] for it in items]
    feats, cut = features(clips)
    prompt = align_prompt(tok, pid, cfg.audio_tokens, cfg.audio_token)
    data = align_batch(prompt, [it["text"] for it in items], tok, tok.eos_id, cfg.align_max_tokens)
    data["features"] = feats
    print(f"bfcl_audio: true_audio connector, {len(items)} clips ({int(cut.sum())} cut) in {time.time() - t0:.0f} s;"
          f" {cfg.align_steps} steps of {cfg.align_batch}", flush=True)
    connector, hist = train_connector(mcfg, lm_params, init_connector(mcfg, cfg.seed), data, steps=cfg.align_steps,
                                      batch=cfg.align_batch, lr=cfg.align_lr, seed=cfg.seed,
                                      metrics_path=os.path.join(out_dir, "metrics_connector.jsonl"), mesh=mesh)
    record = {"settings": meta, "history": hist, "clips": len(items), "train_s": time.time() - t0}
    save_connector(art, connector, record)
  else:
    connector, record = loaded_connector
  llm = SpeechLLM(mcfg, lm_params, connector, tok, features, generate, cfg.audio_token)
  llm.record = record
  return llm
