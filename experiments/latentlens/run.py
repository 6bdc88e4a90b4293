"""The run of latentlens: what `python -m experiments run latentlens` executes (its Config, presets and claims are in
`experiments/latentlens/__init__.py`, the paper and its departures in `experiments/latentlens/README.md`)."""
from __future__ import annotations

import json
import os
from math import comb
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from experiments._shared import vlm_pipeline as pipe
from jaxlab.data.tasks import scenes as scenes_lib
from jaxlab.evals import judge as judge_lib
from jaxlab.interp import lenses
from jaxlab.models import transformer as tfm, vlm
from experiments.latentlens import Config, LENSES


class JudgeItem(NamedTuple):
  image_index: int  # into the evaluated images
  image: np.ndarray  # [H, W, 3] in [0, 1]
  patch: int  # row-major index into the patch grid
  grid: int  # patches per side
  lens: str
  layer: int
  words: tuple[str, ...]  # the lens's top-k descriptions, best first


class GroundTruthJudge:
  """Interpretable iff a description (stripped, lower-cased) is one of `scenes_lib.truth_words` of the patch.

  Args:
    scenes: the evaluated scenes.
    generic: accept the word "background" for background patches; False requires the background's colour word,
      the one word there that tells this image's background from others (a constant "background" answer then
      scores nothing).
  """

  def __init__(self, scenes: scenes_lib.Scenes, generic: bool = True):
    self.scenes, self.generic = scenes, generic

  def __call__(self, items):
    drop = set() if self.generic else {"background"}
    return [bool({w.strip().lower() for w in it.words} & (scenes_lib.truth_words(self.scenes, it.image_index,
                                                                                 it.patch) - drop))
            for it in items]


def chance(scenes: scenes_lib.Scenes, n_words: int, k: int) -> float:
  """Mean over patches of P(k distinct uniform words among `n_words` include one of the patch's truth words)."""
  out = []
  for i in range(len(scenes.captions)):
    for p in range(scenes.patch_object.shape[1]):
      t = len(scenes_lib.truth_words(scenes, i, p))
      out.append(1 - comb(n_words - t, k) / comb(n_words, k))
  return float(np.mean(out))


def visual_states(params, cfg: vlm.Config, tokens_T: Sequence[int], pixels_BHWC, batch: int) -> np.ndarray:
  """Hidden states of the visual tokens at every LM layer (HF convention): [L+1, N, P, D] float32."""
  tokens_T = np.asarray(tokens_T, np.int32)
  pos = np.flatnonzero(tokens_T == cfg.image_token_id)

  @jax.jit
  def fn(pix):
    toks = jnp.broadcast_to(jnp.asarray(tokens_T), (pix.shape[0], len(tokens_T)))
    return vlm.forward(params, toks, pix, cfg, capture=("hidden_states",)).lm.hidden_states[:, :, pos]

  out = []
  for i in range(0, len(pixels_BHWC), batch):
    chunk = np.asarray(pixels_BHWC[i:i + batch], np.float32)
    n = len(chunk)
    if n < batch:  # one compiled shape
      chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch - n, 0)])
    out.append(np.asarray(fn(jnp.asarray(chunk)), np.float32)[:, :n])
  return np.concatenate(out, axis=1)


def lens_ids(lm_params, text_cfg: tfm.Config, hs_LNPD, index: lenses.LatentIndex, k: int):
  """Top-k token ids [L+1, N, P, k] of each lens for the visual tokens' hidden states, and LatentLens's
  `Neighbors` (layers, contexts)."""
  hs = jnp.asarray(hs_LNPD)
  logit = lenses.LogitLens.from_tfm(lm_params, text_cfg).over_layers(hs, k)[1]
  emb = lenses.EmbeddingLens.from_tfm(lm_params).topk(hs, k)[1]
  nb = lenses.LatentLens(index).search(hs, k)
  ids = {"latentlens": np.asarray(nb.token_id), "logitlens": np.asarray(logit), "embeddinglens": np.asarray(emb)}
  return ids, nb


def judge_layers(ids: dict, vocab: Sequence[str], images, grid: int, judge: judge_lib.Judge[JudgeItem],
                 patches=None) -> dict:
  """{lens: [L+1] share of judged visual tokens interpretable}, plus the per-token verdicts {lens: [L+1, N, P]}.

  Args:
    patches: [N, m] patch indices to judge per image (None: all).
  """
  words = np.asarray(vocab, dtype=object)
  shares, verdicts = {}, {}
  for lens, a in ids.items():
    n_l, n, p, _ = a.shape
    sel = np.broadcast_to(np.arange(p), (n, p)) if patches is None else np.asarray(patches)
    items = [JudgeItem(i, images[i], int(q), grid, lens, l, tuple(words[a[l, i, q]]))
             for l in range(n_l) for i in range(n) for q in sel[i]]
    ok = np.asarray(list(judge(items)), bool)
    if ok.shape != (len(items),):
      raise ValueError(f"the judge returned {ok.shape[0] if ok.ndim else ok} verdicts for {len(items)} items")
    v = ok.reshape(n_l, n, sel.shape[1])
    verdicts[lens], shares[lens] = v, v.mean(axis=(1, 2))
  return {"shares": shares, "verdicts": verdicts}


def _full_inputs(cfg: Config, art: pipe.Artifacts):
  from PIL import Image
  for name in ("images_path", "corpus_path"):
    if not getattr(cfg, name) or not os.path.exists(getattr(cfg, name)):
      raise ValueError(f"the full preset needs {name}: an existing path, found {getattr(cfg, name)!r}")
  exts = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
  files = sorted(f for f in os.listdir(cfg.images_path) if f.lower().endswith(exts))[:cfg.n_eval_scenes]
  if not files:
    raise ValueError(f"{cfg.images_path}: no images ({exts})")
  s = art.cfg.vision.image_size
  images = np.stack([np.asarray(Image.open(os.path.join(cfg.images_path, f)).convert("RGB").resize(
      (s, s), Image.BICUBIC), np.float32) / 255.0 for f in files])
  with open(cfg.corpus_path) as f:
    texts = [line.strip() for line in f if line.strip()][:cfg.index_texts]
  before, sep, after = cfg.prompt.partition("<image>")
  if not sep:
    raise ValueError(f"prompt must contain '<image>', found {cfg.prompt!r}")
  tok = art.tokenizer
  prompt = ([tok.bos_id] if tok.bos_id is not None else []) + tok.encode(before) + \
      [art.cfg.image_token_id] * art.cfg.tokens_per_image + tok.encode(after)
  return images, pipe.normalize(images, cfg.image_mean, cfg.image_std), prompt, texts, files


def _plot(path, shares: dict, chance_share: float | None):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
  for lens, v in shares.items():
    ax.plot(range(len(v)), 100 * np.asarray(v), marker="o", label=lens)
  if chance_share is not None:
    ax.axhline(100 * chance_share, color="gray", ls="--", label="random words")
  ax.set_xlabel("LM layer (0 = input embeddings)")
  ax.set_ylabel("% visual tokens interpretable (top-5)")
  ax.set_ylim(0, 100)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)


def _scene_inputs(cfg: Config, art: pipe.Artifacts, res: dict):
  """cpu pipeline: evaluation scenes, prompt, index texts, judge; adds the captioning accuracies to `res`."""
  sc_cfg = art.scenes or cfg.train.scenes
  scenes = scenes_lib.generate(cfg.n_eval_scenes, sc_cfg, seed=cfg.seed + 3)
  pixels = pipe.normalize(scenes.images)
  tok = art.tokenizer
  prompt = [tok.bos_id] + [art.cfg.image_token_id] * art.cfg.tokens_per_image
  texts = scenes_lib.text_corpus(cfg.index_texts, sc_cfg, seed=cfg.seed + 4, styles=cfg.index_styles)
  batch = dict(pipe.caption_batch(scenes, tok, art.cfg), pixels=pixels)
  vocab = pipe.token_strings(tok, art.cfg.text.vocab_size)
  res["caption_attribute_accuracy"], per = pipe.attribute_accuracy(art.params, art.cfg, batch, vocab)
  for c, v in per.items():
    res[f"caption_accuracy.{c}"] = v
  for stage, h in art.history.items():
    if h:
      res[f"final_loss.{stage}"] = h[-1]["loss"]
  return scenes, pixels, prompt, texts, GroundTruthJudge(scenes)


def default_index_layers(n_layers: int) -> tuple[int, ...]:
  """Every hidden state 0 .. L (the paper stores 8 layers of 28-32-layer LMs, up to L-1; a 3-layer LM has
  too few to choose from, and its visual tokens at the output layer L find no match below it)."""
  return tuple(range(n_layers + 1))


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  os.makedirs(out_dir, exist_ok=True)
  res = {}
  if cfg.vlm_path is None:
    art = pipe.train_vlm(cfg.train, out_dir, resume)
    scenes, pixels, prompt, texts, judge = _scene_inputs(cfg, art, res)
    images, patches = scenes.images, None
  else:
    judge = judge_lib.load(cfg.judge, "the full preset (an LLM judge of patch descriptions)")
    art = pipe.load_checkpoint(cfg.vlm_path)
    images, pixels, prompt, texts, _ = _full_inputs(cfg, art)
    scenes, patches = None, "sample"
  tok, tcfg, vc = art.tokenizer, art.cfg.text, art.cfg.vision
  vocab = pipe.token_strings(tok, tcfg.vocab_size)
  layers = cfg.index_layers if cfg.index_layers is not None else default_index_layers(tcfg.n_layers)
  corpus = [tok.encode(t, add_bos=tok.bos_id is not None) for t in texts]
  index = lenses.build_index(lenses.tfm_hidden_fn(art.params["lm"], tcfg), corpus, layers,
                             max_contexts=cfg.max_contexts, seed=cfg.seed, dtype=cfg.index_dtype,
                             decode=lambda i: vocab[i], pad_id=tok.pad_id or 0, bucket=64)
  index.save(os.path.join(pipe.artifacts_dir(out_dir), "index"))
  hs = visual_states(art.params, art.cfg, prompt, pixels, cfg.eval_batch)
  hs = hs[:, :, hs.shape[2] - vc.n_patches:]  # class and register tokens have no patch
  if isinstance(patches, str):
    rng = np.random.default_rng(cfg.seed)
    m = min(cfg.full_patches_per_image, vc.n_patches)
    patches = np.stack([rng.choice(vc.n_patches, size=m, replace=False) for _ in images])
  ids, nb = lens_ids(art.params["lm"], tcfg, hs, index, cfg.top_k)
  out = judge_layers(ids, vocab, images, vc.grid, judge, patches)
  shares = out["shares"]
  for lens in LENSES:
    for l, v in enumerate(shares[lens]):
      res[f"interpretable.{lens}.layer{l}"] = float(v)
    res[f"interpretable.{lens}.mean"] = float(np.mean(shares[lens]))
  chance_share = None
  if scenes is not None:
    words = [w for w in scenes_lib.vocabulary(art.scenes or cfg.train.scenes) if w not in scenes_lib.SPECIALS]
    chance_share = chance(scenes, len(words), cfg.top_k)
    res["interpretable.random.mean"] = chance_share
    obj = scenes.patch_object >= 0
    strict = judge_layers(ids, vocab, images, vc.grid, GroundTruthJudge(scenes, generic=False), patches)
    for lens in LENSES:
      v = out["verdicts"][lens]
      res[f"interpretable_object.{lens}.mean"] = float(v[:, obj].mean())
      res[f"interpretable_background.{lens}.mean"] = float(v[:, ~obj].mean())
      res[f"interpretable_specific.{lens}.mean"] = float(strict["shares"][lens].mean())
      for l in range(len(v)):
        res[f"interpretable_object.{lens}.layer{l}"] = float(v[l][obj].mean())
        res[f"interpretable_specific.{lens}.layer{l}"] = float(strict["shares"][lens][l])
    res["object_patch_share"] = float(obj.mean())
    top1 = judge_layers({k: v[..., :1] for k, v in ids.items()}, vocab, images, vc.grid, judge, patches)["shares"]
    for lens in LENSES:
      res[f"interpretable_top1.{lens}.mean"] = float(np.mean(top1[lens]))
  lat, log = shares["latentlens"], shares["logitlens"]
  res["latentlens_over_logitlens"] = float(np.mean(lat) / max(np.mean(log), 1e-9))
  res["latentlens_above_logitlens_every_layer"] = bool(np.all(lat > log))
  # The connector's output scale is only weakly tied to the captioning loss (the LM reads it through RMSNorm)
  # and drifts with training; it decides how much the LM's layers move the visual tokens, and so which lens wins.
  for l in range(hs.shape[0]):
    res[f"visual_token_norm.layer{l}"] = float(np.linalg.norm(hs[l], axis=-1).mean())
  res["text_embedding_norm"] = float(np.linalg.norm(np.asarray(art.params["lm"]["embed"]["embedding"],
                                                               np.float32)[:tok.vocab_size], axis=-1).mean())
  res["index_layers"] = ",".join(map(str, layers))
  res["index_rows"] = int(index.vectors.shape[1])
  res["visual_tokens"] = int(hs.shape[1] * hs.shape[2])
  if jax.process_index() == 0:
    _plot(os.path.join(out_dir, "interpretable.png"), shares, chance_share)
    _table(os.path.join(out_dir, "table.md"), shares, res if scenes is not None else None)
    _write_examples(os.path.join(out_dir, "examples.json"), ids, nb, corpus, vocab, scenes, patches)
  return res


def _table(path, shares, res=None):
  """Markdown tables: all judged patches; with `res` (cpu preset) also object patches and the specific judge."""
  def table(title, get):
    rows = [title, "", "| layer | " + " | ".join(LENSES) + " |", "|---" * (len(LENSES) + 1) + "|"]
    for l in range(len(shares[LENSES[0]])):
      rows.append(f"| {l} | " + " | ".join(f"{100 * get(n, l):.1f}" for n in LENSES) + " |")
    rows.append("| mean | " + " | ".join(f"{100 * np.mean([get(n, l) for l in range(len(shares[n]))]):.1f}"
                                        for n in LENSES) + " |")
    return "\n".join(rows) + "\n"
  text = table("% of visual tokens whose top-5 descriptions are judged interpretable", lambda n, l: shares[n][l])
  if res is not None:
    text += "\n" + table("Object patches only", lambda n, l: res[f"interpretable_object.{n}.layer{l}"])
    text += "\n" + table("Specific judge (background patches need the background's colour word)",
                         lambda n, l: res[f"interpretable_specific.{n}.layer{l}"])
  with open(path, "w") as f:
    f.write(text)


def _write_examples(path, ids, nb, corpus, vocab, scenes, patches, n_images: int = 4):
  """The first images' descriptions per lens and layer; LatentLens neighbours with their layer and context."""
  words = np.asarray(vocab, dtype=object)
  ex = []
  n_l, n, p, _ = ids["latentlens"].shape
  for i in range(min(n_images, n)):
    for q in (range(p) if patches is None else patches[i]):
      e = {"image": i, "patch": int(q)}
      if scenes is not None:
        e["truth"] = sorted(scenes_lib.truth_words(scenes, i, int(q)))
      for lens, a in ids.items():
        e[lens] = {f"layer{l}": list(words[a[l, i, q]]) for l in range(n_l)}
      e["latentlens_contexts"] = {
          f"layer{l}": [f"[L{int(nb.layer[l, i, q, j])}] " + " ".join(
              list(words[corpus[int(nb.context[l, i, q, j])][:int(nb.position[l, i, q, j])]]) + [f"*{words[a]}*"])
              for j, a in enumerate(ids["latentlens"][l, i, q])]
          for l in range(n_l)}
      ex.append(e)
  with open(path, "w") as f:
    json.dump(ex, f, indent=1)
