"""MIND's sequences, samplers and greedy decoding on the VLM (arXiv:2512.05530; see experiments/mind/__init__.py).

Formats (words; "<image>" stands for the image's tokens):
  phase 1 / SFT   "<bos> <image> [hint the answer is X .] question ?" -> "[rationale] answer X <eos>"
  phase 2         "<bos> <image> [hint ...] question ? given rationale verdict" -> "answer X correct <eos>" or
                  "answer X wrong fix corrected-rationale <eos>"
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from experiments._shared import vlm_pipeline as pipe
from experiments.mind import rad
from jaxlab.data import load_tokenizer
from jaxlab.data.tasks import scenes as scenes_lib
from jaxlab.models import vlm

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class Split(NamedTuple):
  questions: list  # rad.Question
  pixels: np.ndarray  # [N scenes, H, W, C], normalized; question.scene indexes it
  captions: tuple = ()  # generated scenes: each scene's caption (its identity in splits.json)


def text(steps: Sequence[str]) -> str:
  return " ".join(steps)


def mislead(questions: Sequence[rad.Question], seed: int) -> list[rad.Question]:
  """The same questions, each with a wrong hint."""
  rng = np.random.default_rng(seed)
  return [q._replace(hint=rad.wrong_answer(q.kind, q.answer, rng)) for q in questions]


def scene_splits(cfg, scene_cfg: scenes_lib.SceneConfig, exclude: Sequence[str] = ()) -> tuple[Split, Split, Split]:
  """(train with a wrong, a right or no hint per question, test, test with wrong hints) over fresh scenes; no test
  scene is a training scene or one of `exclude` (captions, e.g. the scenes the VLM trained on)."""
  from experiments._shared.vlm_pipeline import disjoint_scenes
  train_sc = scenes_lib.generate(cfg.n_train_scenes, scene_cfg, seed=cfg.seed + 101)
  test_sc = disjoint_scenes(cfg.n_test_scenes, scene_cfg, cfg.seed + 202, [*train_sc.captions, *exclude])
  train = rad.generate(train_sc, cfg.rad, cfg.seed + 1, "train", scene_cfg)
  test = rad.generate(test_sc, cfg.rad, cfg.seed + 2, "none", scene_cfg)
  train_c, test_c = tuple(train_sc.captions), tuple(test_sc.captions)
  return (Split(train, pipe.normalize(train_sc.images), train_c), Split(test, pipe.normalize(test_sc.images), test_c),
          Split(mislead(test, cfg.seed + 3), pipe.normalize(test_sc.images), test_c))


def split_items(split: Split, image_ids: Sequence[str] | None = None) -> dict:
  """What splits.json records of a split: its scenes (captions) or images (`image_ids`, one per question's
  `scene` index), and its questions as {scene or image, question text without its hint}."""
  ids = list(split.captions) if image_ids is None else list(image_ids)
  kind = "scenes" if image_ids is None else "images"
  return {kind: ids, "questions": [{kind[:-1]: ids[q.scene], "question": q.words} for q in split.questions]}


def image_ids(path: str) -> list[str]:
  """The sha256 of each row's image file of a RAD JSON-lines file (rows as `load_jsonl` reads them)."""
  import hashlib
  base, out = os.path.dirname(os.path.abspath(path)), []
  with open(path) as f:
    for line in f:
      if line.strip():
        with open(os.path.join(base, json.loads(line)["image"]), "rb") as im:
          out.append(hashlib.sha256(im.read()).hexdigest())
  return out


def load_jsonl(path: str | None, cfg: vlm.Config) -> Split:
  """A RAD JSON-lines file: rows {"image", "question", "answer", "positives": [str], "negatives": [{"text",
  "flaw"}], "hint"?} with images relative to the file."""
  from PIL import Image
  if not path or not os.path.isfile(path):
    raise ValueError(f"the full preset needs an existing RAD JSON-lines file, found {path!r}")
  with open(path) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  if not rows:
    raise ValueError(f"{path}: no rows")
  base, need = os.path.dirname(os.path.abspath(path)), {"image", "question", "answer", "positives", "negatives"}
  for i, r in enumerate(rows):
    if not isinstance(r, dict) or not need <= set(r) or not r["positives"]:
      raise ValueError(f"{path} row {i}: expected keys {sorted(need)} with at least one positive, found {r!r}")
    if not os.path.isfile(os.path.join(base, r["image"])):
      raise FileNotFoundError(f"{path} row {i}: image {os.path.join(base, r['image'])} not found")
  qs, images, s = [], [], cfg.vision.image_size
  for i, r in enumerate(rows):
    img = os.path.join(base, r["image"])
    images.append(np.asarray(Image.open(img).convert("RGB").resize((s, s), Image.BICUBIC), np.float32) / 255.0)
    negs = tuple(rad.Negative((n["text"],), n.get("flaw", "unknown"), 0) for n in r["negatives"])
    qs.append(rad.Question(i, "file", r["question"], (), str(r["answer"]), tuple((p,) for p in r["positives"]),
                           negs, r.get("hint")))
  return Split(qs, pipe.normalize(np.stack(images), CLIP_MEAN, CLIP_STD))


def extend_vocab(art: pipe.Artifacts, words: Sequence[str], tok_dir: str, seed: int):
  """(vlm config, params, tokenizer) with `words` as the vocabulary (the artifacts' words first, ids kept); new
  embedding rows and head columns start at the mean of the trained ones plus N(0, 0.02) noise."""
  old = art.cfg.text
  n_old = art.tokenizer.vocab_size
  for i, w in enumerate(words[:n_old]):
    if art.tokenizer.encode(w) != [i]:
      raise ValueError(f"extend_vocab: the VLM's tokenizer maps {w!r} to {art.tokenizer.encode(w)}, expected [{i}]")
  n = -(-len(words) // 16) * 16
  lm = dict(art.params["lm"])
  rng = np.random.default_rng(seed)
  if n > old.vocab_size:
    emb = np.asarray(lm["embed"]["embedding"], np.float32)
    extra = emb[:n_old].mean(0) + rng.normal(0, 0.02, (n - old.vocab_size, emb.shape[1]))
    lm["embed"] = {"embedding": jnp.asarray(np.concatenate([emb, extra]), lm["embed"]["embedding"].dtype)}
    if "lm_head" in lm:
      k = np.asarray(lm["lm_head"]["kernel"], np.float32)
      cols = k[:, :n_old].mean(1, keepdims=True) + rng.normal(0, 0.02, (k.shape[0], n - old.vocab_size))
      lm["lm_head"] = {**lm["lm_head"], "kernel": jnp.asarray(np.concatenate([k, cols], 1), k.dtype)}
      if "bias" in lm["lm_head"]:
        b = np.asarray(lm["lm_head"]["bias"])
        lm["lm_head"]["bias"] = jnp.asarray(np.concatenate([b, np.full(n - old.vocab_size, b[:n_old].mean())]))
  text_cfg = dataclasses.replace(old, vocab_size=max(n, old.vocab_size))
  scenes_lib.save_tokenizer(tok_dir, list(words))
  return art.cfg.replace(text=text_cfg), {**art.params, "lm": lm}, load_tokenizer(tok_dir)


def final_answer(words: Sequence[str]) -> str:
  """The word after the last "answer" that has one ("" when there is none)."""
  idx = [i for i, w in enumerate(words[:-1]) if w == "answer"]
  return words[idx[-1] + 1] if idx else ""


def rationale_of(words: Sequence[str]) -> str:
  """A phase-1 output's rationale: the words before the first "answer"."""
  return " ".join(words[:words.index("answer")] if "answer" in words else words)


def verdict(words: Sequence[str]) -> str:
  """A phase-2 output's verdict: the word after "answer X"."""
  return words[2] if len(words) > 2 and words[0] == "answer" and words[2] in ("correct", "wrong") else ""


def phase2_target(given_is_positive: bool, corrected: str, answer: str) -> str:
  """The phase-2 output for a given rationale, the answer first (the reference's QCMG-AE "The answer is (X).
  BECAUSE: ..."): the answer, the verdict, for a wrong one the corrected rationale."""
  return f"answer {answer} correct" if given_is_positive else f"answer {answer} wrong fix {corrected}"


def phase2_prompt(question: str, given: str) -> str:
  return f"{question} given {given} verdict"


def given_negatives(split: Split, seed: int) -> tuple[list[str], list[str]]:
  """One negative rationale per question, the flaws in turn: (texts, flaws)."""
  texts, flaws = [], []
  for i, q in enumerate(split.questions):
    by_flaw = {n.flaw: n for n in q.negatives}
    n = by_flaw.get(rad.FLAWS[(i + seed) % len(rad.FLAWS)], q.negatives[i % len(q.negatives)])
    texts.append(text(n.steps))
    flaws.append(n.flaw)
  return texts, flaws


def _round16(n: int) -> int:
  return -(-n // 16) * 16


def decoder(cfg: vlm.Config, length: int, pad: int):
  """The jitted greedy loop fn(params, tokens [B, length], lengths [B], pixels, max_new) -> tokens: `max_new` new
  tokens written after each row's prompt (`lengths`), every step a full forward; image and `pad` ids never written."""
  banned = jnp.asarray([cfg.image_token_id, pad])

  def run(params, tokens_BT, lengths_B, pixels, max_new):
    rows = jnp.arange(tokens_BT.shape[0])

    def body(i, toks):
      logits = vlm.forward(params, toks, pixels, cfg).logits[rows, lengths_B + i - 1].astype(jnp.float32)
      nxt = jnp.argmax(logits.at[:, banned].set(-jnp.inf), -1).astype(toks.dtype)
      return toks.at[rows, jnp.minimum(lengths_B + i, length - 1)].set(nxt)
    return jax.lax.fori_loop(0, max_new, body, tokens_BT)
  return jax.jit(run)


class Encoder:
  """Token rows and greedy decoding for one tokenizer and VLM config."""

  def __init__(self, tok, cfg: vlm.Config, seq_len: int, trim: bool = True):
    self.tok, self.cfg, self.seq_len, self.trim = tok, cfg, seq_len, trim
    self.image = [cfg.image_token_id] * cfg.tokens_per_image
    self.pad = tok.pad_id or 0
    self._decode = {}

  def _length(self, items) -> int:
    return self.row_length(prompt + ([] if target is None else self.encode(target)) for _, prompt, target, *_ in items)

  def row_length(self, seqs) -> int:
    """Input length of rows holding `seqs` (+ eos): with `trim` the longest rounded up to 32 (at most seq_len),
    else seq_len (every row set one shape: fewer compilations, more compute)."""
    n = max(len(x) for x in seqs)
    if n > self.seq_len:
      raise ValueError(f"a sequence of {n + 1} tokens exceeds seq_len {self.seq_len} + 1; raise seq_len")
    return min(self.seq_len, -(-n // 32) * 32) if self.trim else self.seq_len

  def encode(self, s: str) -> list[int]:
    return self.tok.encode(s)

  def prompt(self, q: rad.Question, given: str | None = None) -> list[int]:
    head = ([self.tok.bos_id] if self.tok.bos_id is not None else []) + self.image
    return head + self.encode(q.prompt if given is None else phase2_prompt(q.prompt, given))

  def row(self, prompt: list[int], target: str | None, length: int, loss: bool = True):
    """(inputs, targets, loss_mask) for prompt + target + eos; the mask is on the target (nowhere without loss)."""
    tgt = [] if target is None else self.encode(target) + [self.tok.eos_id]
    seq = prompt + tgt
    if len(seq) > length + 1:
      raise ValueError(f"a sequence of {len(seq)} tokens exceeds seq_len {length} + 1; raise seq_len")
    seq = seq + [self.pad] * (length + 1 - len(seq))
    mask = np.zeros(length, np.int32)
    if loss:
      mask[len(prompt) - 1:len(prompt) - 1 + len(tgt)] = 1
    return np.asarray(seq[:-1], np.int32), np.asarray(seq[1:], np.int32), mask

  def _rows(self, items, length: int | None = None):
    """items: (question, prompt ids, target text or None[, loss]) -> stacked inputs, targets, loss masks."""
    length = length or self._length(items)
    rows = [self.row(prompt, target, length, *loss) for _q, prompt, target, *loss in items]
    return tuple(np.stack(x) for x in zip(*rows))

  def sft_rows(self, split: Split, style: str):
    """[Q, 1, T] rows of answer-only ("answer") or single-rationale ("rationale": the first positive) SFT."""
    items = []
    for q in split.questions:
      target = f"answer {q.answer}" if style == "answer" else f"{text(q.positives[0])} answer {q.answer}"
      items.append((q, self.prompt(q), target))
    inp, tgt, msk = self._rows(items, self.phase1_length(split))
    return {"inputs": inp[:, None], "targets": tgt[:, None], "loss_mask": msk[:, None]}

  def phase1_length(self, split: Split) -> int:
    """The row length of every phase-1 and SFT row (one compiled train step for all of them)."""
    return self._length([(q, self.prompt(q), f"{text(r)} answer {q.answer}") for q in split.questions
                         for r in q.positives])

  def phase1_pools(self, split: Split):
    """Every question's rationale rows for phase 1, rows of one question sharing its prompt (MCA aligns targets by
    position): positives [Q, K, T] ("R" under CE; inputs, targets, loss_mask) and negatives' targets [Q, F, T], with
    their counts per question (K the most positives of a question, F the flaws)."""
    k = max(len(q.positives) for q in split.questions)
    length = self.phase1_length(split)
    pos, neg, n_pos, n_neg = [], [], [], []
    for q in split.questions:
      p = self.prompt(q)
      items = [(q, p, text(r)) for r in q.positives] + [(q, p, None)] * (k - len(q.positives))
      pos.append(self._rows(items, length))
      negs = [(q, p, text(n.steps), False) for n in q.negatives[:len(rad.FLAWS)]]
      neg.append(self._rows(negs + [(q, p, None)] * (len(rad.FLAWS) - len(negs)), length)[1])
      n_pos.append(len(q.positives))
      n_neg.append(len(negs))
    inp, tgt, msk = (np.stack(x) for x in zip(*pos))
    return {"inputs": inp, "targets": tgt, "loss_mask": msk, "neg_targets": np.stack(neg),
            "n_pos": np.asarray(n_pos), "n_neg": np.asarray(n_neg)}

  def phase2_rows(self, split: Split):
    """[M, 1, T] rows over every (question, given positive or negative) pair and the pair's kind (1 / -1)."""
    items, kinds, scenes = [], [], []
    for q in split.questions:
      for r in q.positives:
        items.append((q, self.prompt(q, text(r)), phase2_target(True, "", q.answer)))
        kinds.append(1)
        scenes.append(q.scene)
      for n in q.negatives:
        items.append((q, self.prompt(q, text(n.steps)),
                      phase2_target(False, text(q.positives[n.base]), q.answer)))
        kinds.append(-1)
        scenes.append(q.scene)
    inp, tgt, msk = self._rows(items)
    return {"inputs": inp[:, None], "targets": tgt[:, None], "loss_mask": msk[:, None]}, np.asarray(kinds), \
        np.asarray(scenes)

  def _sampler(self, arrays: dict, scene_M, pixels, groups: int, per_group: int, seed: int, pools=None):
    """Batches of `groups` groups: rows [groups, per_group, T] drawn from M rows [M, 1, T] (per_group of them a
    group, from `pools` half and half when given), or `groups` groups drawn from [M, R, T] (per_group 1);
    pixels one per row."""
    rng = np.random.default_rng(seed)
    n, rows = len(scene_M), groups * per_group
    while True:
      if pools is None:
        idx = rng.integers(0, n, rows)
      else:
        idx = np.concatenate([rng.choice(p, rows // 2 + (rows % 2) * (i == 0)) for i, p in enumerate(pools)])
      batch = {k: v[idx] for k, v in arrays.items()}
      r = batch["inputs"].shape[1]
      if per_group > 1:
        batch = {k: v.reshape(groups, per_group * r, *v.shape[2:]) for k, v in batch.items()}
      yield {**{k: jnp.asarray(v) for k, v in batch.items()},
             "pixels": jnp.asarray(np.repeat(pixels[scene_M[idx]], r, axis=0))}

  def sft_sampler(self, split: Split, style: str, groups: int, per_group: int, seed: int):
    return self._sampler(self.sft_rows(split, style), np.asarray([q.scene for q in split.questions]), split.pixels,
                         groups, per_group, seed)

  def phase1_sampler(self, split: Split, groups: int, per_group: int, sampled: int, negatives: bool, seed: int):
    """P2CL phase-1 batches of groups * per_group questions, each with one of its positives drawn at random under CE
    (the rationale alone, the reference's QCM-E target). Without negatives, rows [groups, per_group, T] (the
    structure of `sft_sampler`'s batches: one compiled step). With negatives, rows [groups * per_group, 1, T] and,
    for MCA, `sampled` positives and `sampled` negatives of each question drawn without replacement (all of them
    where it has fewer; the rest role 0): mca_targets [G, S, T], mca_role [G, S] (1 / -1 / 0)."""
    pools = self.phase1_pools(split)
    k, f = pools["inputs"].shape[1], pools["neg_targets"].shape[1]
    sp, sn = min(sampled, k), min(sampled, f)
    scene_Q = np.asarray([q.scene for q in split.questions])
    rng = np.random.default_rng(seed)
    g = groups * per_group
    while True:
      qi = rng.integers(0, len(scene_Q), g)
      ri = np.asarray([rng.integers(pools["n_pos"][q]) for q in qi])
      batch = {key: pools[key][qi, ri][:, None] for key in ("inputs", "targets", "loss_mask")}
      if negatives:
        mca = np.zeros((g, sp + sn, pools["targets"].shape[-1]), np.int32)
        role = np.zeros((g, sp + sn), np.int32)
        for i, q in enumerate(qi):
          p = rng.choice(pools["n_pos"][q], min(sp, pools["n_pos"][q]), replace=False)
          n = rng.choice(pools["n_neg"][q], min(sn, pools["n_neg"][q]), replace=False)
          mca[i, :len(p)], role[i, :len(p)] = pools["targets"][q, p], 1
          mca[i, sp:sp + len(n)], role[i, sp:sp + len(n)] = pools["neg_targets"][q, n], -1
        batch.update(mca_targets=mca, mca_role=role)
      else:
        batch = {key: v.reshape(groups, per_group, -1) for key, v in batch.items()}
      yield {**{key: jnp.asarray(v) for key, v in batch.items()}, "pixels": jnp.asarray(split.pixels[scene_Q[qi]])}

  def phase2_sampler(self, split: Split, groups: int, per_group: int, seed: int):
    arrays, kinds, scenes = self.phase2_rows(split)
    pools = [np.flatnonzero(kinds == 1), np.flatnonzero(kinds == -1)]
    return self._sampler(arrays, scenes, split.pixels, groups, per_group, seed, pools)

  def _decoder(self, length: int):
    """The jitted greedy loop for a token buffer of `length` (`decoder`)."""
    if length not in self._decode:
      self._decode[length] = decoder(self.cfg, length, self.pad)
    return self._decode[length]

  def generate(self, params, split: Split, given: Sequence[str] | None, batch: int, max_new: int,
               min_length: int = 0) -> list[list[str]]:
    """Greedy outputs (words up to the first eos) for every question; with `given`, phase-2 prompts. The token
    buffer holds max(min_length, longest prompt + max_new) positions, rounded up to 16."""
    prompts = [self.prompt(q, None if given is None else given[i]) for i, q in enumerate(split.questions)]
    length = _round16(max(min_length, max(map(len, prompts)) + max_new))
    fn = self._decoder(length)
    words = []
    for s in range(0, len(prompts), batch):
      chunk = prompts[s:s + batch]
      qs = split.questions[s:s + batch]
      toks = np.full((batch, length), self.pad, np.int32)
      for i, p in enumerate(chunk):
        toks[i, :len(p)] = p
      scenes = [q.scene for q in qs] + [qs[0].scene] * (batch - len(chunk))
      toks[len(chunk):, :len(chunk[0])] = chunk[0]
      out = np.asarray(fn(params, jnp.asarray(toks), jnp.asarray([len(p) for p in chunk] + [len(chunk[0])] *
                                                                  (batch - len(chunk)), jnp.int32),
                          jnp.asarray(split.pixels[scenes]), jnp.asarray(max_new, jnp.int32)))
      for i, p in enumerate(chunk):
        gen = out[i, len(p):len(p) + max_new].tolist()
        if self.tok.eos_id in gen:
          gen = gen[:gen.index(self.tok.eos_id)]
        words.append(self.tok.decode(gen).split())
    return words

  def max_target(self, split: Split, phase: int) -> int:
    """Tokens (eos included) of the longest phase-1 (1) or phase-2 (2) target in `split`."""
    if phase == 1:  # the longest of a phase-1 rationale and sft_rationale's "R answer X"
      return max(len(self.encode(f"{text(r)} answer {q.answer}")) for q in split.questions for r in q.positives) + 1
    return max(len(self.encode(phase2_target(False, text(r), q.answer))) for q in split.questions
               for r in q.positives) + 1
