"""Token rows, batches and greedy answers for the STLLM models (arXiv 2507.05258; see experiments/stllm/__init__.py).

A row is "<bos> [<image> x V] [<points> x P] question answer <eos>" (V, P: the model's video and point token
counts); the loss is on the answer and <eos>, the Q-Former's text queries are the question's positions.
"""
from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np

from experiments._shared import vlm_pipeline as pipe
from experiments.stllm import model as model_lib, rea


def _round8(n: int) -> int:
  return -(-n // 8) * 8


class Rows:
  """Rows of one model over a question set, padded to one length."""

  def __init__(self, tok, cfg: model_lib.ModelConfig, data: rea.Data, max_new: int):
    self.tok, self.cfg, self.data = tok, cfg, data
    head = [tok.bos_id] + [cfg.video_id] * cfg.video_tokens + [cfg.points_id] * cfg.point_tokens
    self.prompts = [head + tok.encode(q.question) for q in data.questions]
    self.answers = [tok.encode(q.answer) + [tok.eos_id] for q in data.questions]
    self.n_head = len(head)
    self.length = _round8(max(len(p) + max(len(a), max_new) for p, a in zip(self.prompts, self.answers)))
    if self.length + cfg.n_prefix > cfg.text.max_position_embeddings:
      raise ValueError(f"rows of {self.length} tokens (+ {cfg.n_prefix} prefix) exceed the LM's "
                       f"{cfg.text.max_position_embeddings} positions")
    self.frames = pipe.normalize(data.frames) if cfg.uses_video else None
    self.max_new = max_new

  def question_mask(self, lengths) -> np.ndarray:
    m = np.zeros((len(lengths), self.length), bool)
    for i, n in enumerate(lengths):
      m[i, self.n_head:n] = True
    return m

  def _modal(self, rooms_B) -> dict:
    d, out = self.data, {}
    if self.cfg.uses_video:
      out["frames"] = self.frames[rooms_B]
    if self.cfg.point_tokens or self.cfg.n_prefix:
      out.update(xyz=d.xyz[rooms_B], rgb=d.rgb[rooms_B], mask=d.mask[rooms_B], c2w=d.c2w[rooms_B])
    if self.cfg.video_ray_freqs:
      out["intrinsics"] = d.k[rooms_B]
    return out

  def train_batch(self, idx) -> dict:
    rows = [self.prompts[i] + self.answers[i] for i in idx]
    seq = pipe.pad_rows(rows, self.length + 1, self.tok.pad_id)
    mask = np.zeros((len(idx), self.length), np.int32)
    for r, i in enumerate(idx):
      mask[r, len(self.prompts[i]) - 1:len(rows[r]) - 1] = 1
    out = {"tokens": seq[:, :-1], "targets": seq[:, 1:], "loss_mask": mask,
           "question_mask": self.question_mask([len(self.prompts[i]) for i in idx]),
           **self._modal(np.asarray([self.data.questions[i].room for i in idx]))}
    return {k: jnp.asarray(v) for k, v in out.items()}

  def sampler(self, batch: int, seed: int):
    rng = np.random.default_rng(seed)
    while True:
      yield self.train_batch(rng.integers(0, len(self.prompts), batch))

  def generate(self, params, decode, batch: int) -> list[str]:
    """Greedy answers (words up to the first <eos>, joined by spaces) to every question, `batch` rows a call."""
    out, n = [], len(self.prompts)
    for s in range(0, n, batch):
      idx = list(range(s, min(s + batch, n)))
      idx += [idx[0]] * (batch - len(idx))  # pad the last call to the compiled batch
      toks = pipe.pad_rows([self.prompts[i] for i in idx], self.length, self.tok.pad_id)
      lengths = [len(self.prompts[i]) for i in idx]
      b = {"tokens": jnp.asarray(toks), "question_mask": jnp.asarray(self.question_mask(lengths)),
           **{k: jnp.asarray(v) for k, v in self._modal(np.asarray([self.data.questions[i].room for i in idx])).items()}}
      got = np.asarray(decode(params, b, jnp.asarray(lengths, jnp.int32), self.max_new))
      for r, _i in enumerate(idx[:min(batch, n - s)]):
        gen = got[r, lengths[r]:lengths[r] + self.max_new].tolist()
        if self.tok.eos_id in gen:
          gen = gen[:gen.index(self.tok.eos_id)]
        out.append(" ".join(self.tok.decode(gen).split()))
    return out


def banned(tok, cfg: model_lib.ModelConfig) -> tuple[int, ...]:
  """Ids greedy decoding never writes: padding, bos and the placeholders."""
  return tuple(sorted({tok.pad_id, tok.bos_id, cfg.video_id, cfg.points_id}))


def answer_length(qs: Sequence[rea.Question], tok) -> int:
  return max(len(tok.encode(q.answer)) for q in qs) + 1
