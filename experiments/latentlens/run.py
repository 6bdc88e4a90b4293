"""The run of latentlens: what `python -m experiments run latentlens` executes (its Config, presets and claims are in
`experiments/latentlens/__init__.py`, the paper and its departures in `experiments/latentlens/README.md`)."""
from __future__ import annotations

import functools
import json
import os
from math import comb
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from experiments._shared import vlm_pipeline as pipe
from jaxlab import sharding as shd
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


FULL_DTYPE = "bfloat16"  # a checkpoint's params and compute


def visual_fn(cfg: vlm.Config, tokens_T: Sequence[int]):
  """Jitted fn(params, pixels [B, H, W, C]) -> the hidden states of the image tokens of the prompt `tokens_T` at
  every LM layer (HF convention) [L+1, B, P, D]."""
  tokens_T = np.asarray(tokens_T, np.int32)
  pos = np.flatnonzero(tokens_T == cfg.image_token_id)

  @jax.jit
  def fn(params, pix):
    toks = jnp.broadcast_to(jnp.asarray(tokens_T), (pix.shape[0], len(tokens_T)))
    return vlm.forward(params, toks, pix, cfg, capture=("hidden_states",)).lm.hidden_states[:, :, pos]
  return fn


def hidden_fn(text_cfg: tfm.Config):
  """Jitted fn(lm params, tokens [B, T], mask [B, T]) -> hidden states [L+1, B, T, D]: the index's LM passes."""
  @jax.jit
  def fn(params, tokens_BT, mask_BT):
    return tfm.forward(params, tokens_BT, text_cfg, attention_mask_BT=mask_BT, capture=("hidden_states",)).hidden_states
  return fn


def visual_states(params, cfg: vlm.Config, tokens_T: Sequence[int], pixels_BHWC, batch: int) -> np.ndarray:
  """Hidden states of the visual tokens at every LM layer (HF convention): [L+1, N, P, D] float32."""
  fn = visual_fn(cfg, tokens_T)
  out = []
  for i in range(0, len(pixels_BHWC), batch):
    chunk = np.asarray(pixels_BHWC[i:i + batch], np.float32)
    n = len(chunk)
    if n < batch:  # one compiled shape
      chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch - n, 0)])
    out.append(np.asarray(fn(params, jnp.asarray(chunk)), np.float32)[:, :n])
  return np.concatenate(out, axis=1)


def vlm_config(cfg: Config) -> vlm.Config:
  """The VLM a run at `cfg` evaluates, without weights: the checkpoint's (`vlm_path`) as the run loads it, else the
  scene VLM of `cfg.train`."""
  if cfg.vlm_path is None:
    return pipe.scene_vlm_config(cfg.train)
  return pipe.checkpoint_config(cfg.vlm_path, FULL_DTYPE, FULL_DTYPE)


def workloads(cfg: Config, mesh) -> list:
  """The index's LM passes (`hidden_fn`, one per `index_batch` contexts of `index_bucket` tokens: the length of a
  short phrase) and the VLM passes over the judged images (`visual_fn`), with abstract arguments at the preset's
  shapes (`experiments plan`; the prompt's length estimated by `vlm_pipeline.planned_prompt`). The lenses' top-k
  searches are not jitted units and are not planned."""
  from experiments.runner import plan as plan_lib
  vcfg = vlm_config(cfg)
  params = pipe.abstract_params(vcfg, mesh, cfg.strategy)
  b, t = cfg.index_batch, cfg.index_bucket
  idx = shd.abstract_rows({"tokens": ((b, t), "int32"), "mask": ((b, t), "int32")}, mesh)
  prompt = pipe.planned_prompt(cfg.prompt, vcfg) if cfg.vlm_path is not None else \
      [1] + [vcfg.image_token_id] * vcfg.tokens_per_image
  s = vcfg.vision.image_size
  pix = shd.abstract_rows({"pixels": ((cfg.eval_batch, s, s, 3), "float32")}, mesh)["pixels"]
  return [plan_lib.Workload("index_forward", "forward", hidden_fn(vcfg.text), (params["lm"], idx["tokens"],
                                                                                idx["mask"]),
                            -(-cfg.index_texts // b), tfm.flops_per_token(vcfg.text, t) / 3 * b * t),
          plan_lib.Workload("visual_forward", "forward", visual_fn(vcfg, prompt), (params, pix),
                            -(-cfg.n_eval_scenes // cfg.eval_batch),
                            pipe.forward_flops(vcfg, cfg.eval_batch, cfg.eval_batch, len(prompt)))]


def lens_ids(lm_params, text_cfg: tfm.Config, hs_LNPD, index: lenses.LatentIndex, k: int,
             layers: Sequence[int] | None = None):
  """Top-k token ids [len(layers), N, P, k] of each lens for the visual tokens' hidden states at `layers` (of the
  L+1 in `hs_LNPD`; None: all), and LatentLens's `Neighbors` (layers, contexts)."""
  sel = list(range(len(hs_LNPD)) if layers is None else layers)
  hs = jnp.asarray(hs_LNPD)
  logit = lenses.LogitLens.from_tfm(lm_params, text_cfg).over_layers(hs, k)[1][jnp.asarray(sel)]
  hs = hs[jnp.asarray(sel)]
  emb = lenses.EmbeddingLens.from_tfm(lm_params).topk(hs, k)[1]
  nb = lenses.LatentLens(index).search(hs, k)
  ids = {"latentlens": np.asarray(nb.token_id), "logitlens": np.asarray(logit), "embeddinglens": np.asarray(emb)}
  return ids, nb


def full_word(sentence: str, token: str) -> str:
  """The judge's word for a LatentLens neighbour, by the reference's rule (`evaluate_interpretability.py`): the first
  case-insensitive occurrence of the stripped token in its context sentence, widened to the whole word (letters,
  digits, `_`) when the token is part of a longer one; the token itself when it does not occur."""
  token = token.strip()
  at = sentence.lower().find(token.lower()) if sentence and token else -1
  if at < 0:
    return token
  start, end = at, at + len(token)
  inside = lambda i: 0 <= i < len(sentence) and (sentence[i].isalnum() or sentence[i] == "_")
  if not any(c.isspace() for c in token) and (inside(start - 1) or inside(end)):
    while inside(start - 1):
      start -= 1
    while inside(end):
      end += 1
  return sentence[start:end]


def lens_words(ids: dict, vocab: Sequence[str], nb: lenses.Neighbors, texts: Sequence[str]) -> dict:
  """{lens: [n_l, N, P, k] descriptions the judge reads}: each id's string, LatentLens's expanded to the full word of
  its context text (`full_word`), as the reference expands LatentLens's sub-word neighbours only."""
  words = np.asarray(vocab, dtype=object)
  out = {lens: words[a] for lens, a in ids.items()}
  ctx = np.asarray(nb.context)
  lat = out["latentlens"]
  out["latentlens"] = np.asarray([full_word(texts[int(c)], w) for c, w in zip(ctx.reshape(-1), lat.reshape(-1))],
                                 dtype=object).reshape(lat.shape)
  return out


def judge_layers(words: dict, images, grid: int, judge: judge_lib.Judge[JudgeItem], patches=None,
                 layers: Sequence[int] | None = None) -> dict:
  """{lens: [n_l] share of judged visual tokens interpretable}, plus the per-token verdicts {lens: [n_l, N, P]},
  for `words` {lens: [n_l, N, P, k] descriptions} (`lens_words`).

  Args:
    patches: [N, m] patch indices to judge per image (None: all).
    layers: the LM layer of each of the n_l rows, as the judge sees it (None: 0 .. n_l-1).
  """
  shares, verdicts = {}, {}
  for lens, a in words.items():
    n_l, n, p, _ = a.shape
    sel = np.broadcast_to(np.arange(p), (n, p)) if patches is None else np.asarray(patches)
    items = [JudgeItem(i, images[i], int(q), grid, lens, l if layers is None else int(layers[l]), tuple(a[l, i, q]))
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
  prompt = pipe.prompt_ids(art.tokenizer, cfg.prompt, art.cfg)
  return images, pipe.normalize(images, cfg.image_mean, cfg.image_std), prompt, texts, files


def _plot(path, shares: dict, chance_share: float | None, layers: Sequence[int]):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
  for lens, v in shares.items():
    ax.plot(layers, 100 * np.asarray(v), marker="o", label=lens)
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


def scene_data(cfg: Config, sc_cfg: scenes_lib.SceneConfig):
  """cpu pipeline: (judged scenes, index texts, the VLM's training captions), pairwise about different scenes."""
  train_captions = pipe.training_captions(cfg.train, sc_cfg)
  scenes = pipe.disjoint_scenes(cfg.n_eval_scenes, sc_cfg, cfg.seed + 3, train_captions)
  return scenes, index_texts(cfg.index_texts, sc_cfg, cfg.seed + 4, cfg.index_styles, scenes.captions), train_captions


def _scene_inputs(cfg: Config, art: pipe.Artifacts, res: dict, data=None):
  """cpu pipeline: evaluation scenes, prompt, index texts, judge; adds the captioning accuracies to `res`.
  `data`: `scene_data`'s answer where already drawn."""
  sc_cfg = art.scenes or cfg.train.scenes
  scenes, texts, _ = scene_data(cfg, sc_cfg) if data is None else data
  pixels = pipe.normalize(scenes.images)
  tok = art.tokenizer
  prompt = [tok.bos_id] + [art.cfg.image_token_id] * art.cfg.tokens_per_image
  batch = dict(pipe.caption_batch(scenes, tok, art.cfg), pixels=pixels)
  vocab = pipe.token_strings(tok, art.cfg.text.vocab_size)
  res["caption_attribute_accuracy"], per = pipe.attribute_accuracy(art.params, art.cfg, batch, vocab)
  for c, v in per.items():
    res[f"caption_accuracy.{c}"] = v
  for stage, h in art.history.items():
    if h:
      res[f"final_loss.{stage}"] = h[-1]["loss"]
  return scenes, pixels, prompt, texts, GroundTruthJudge(scenes)


PAPER_INDEX_LAYERS = (1, 2, 4, 8, 16, 24)  # and L-2, L-1 (reproduce/step2_extract_contextual.sh)
PAPER_JUDGED_LAYERS = (0, 1, 2, 4, 8, 16, 24)  # and L-2, L-1 (reproduce/step3_run_analysis.sh)


def _paper_layers(fixed: Sequence[int], n_layers: int) -> tuple[int, ...]:
  """`fixed` and L-2, L-1, kept in 0 .. L-1 (the paper neither stores nor judges the final-normed output L),
  deduplicated, increasing."""
  return tuple(sorted({l for l in (*fixed, n_layers - 2, n_layers - 1) if 0 <= l <= n_layers - 1}))


def default_index_layers(n_layers: int) -> tuple[int, ...]:
  """The paper's index layers {1, 2, 4, 8, 16, 24, L-2, L-1} of an `n_layers`-layer LM (HF convention)."""
  return _paper_layers(PAPER_INDEX_LAYERS, n_layers)


def default_judged_layers(n_layers: int) -> tuple[int, ...]:
  """The paper's judged visual layers [0, 1, 2, 4, 8, 16, 24, L-2, L-1] of an `n_layers`-layer LM."""
  return _paper_layers(PAPER_JUDGED_LAYERS, n_layers)


def text_scene(text: str) -> str | None:
  """The caption of the scene a `scenes_lib.text_corpus` text describes (styles 0, 2 and 3 end with it; style 1's
  sentences are put back in the caption's reading order), else None (style 4)."""
  caption = text.rpartition(" , ")[2]
  if caption.startswith("a ") and caption.endswith(" background ."):
    return caption
  objs, bg = [], None
  for sent in text.split(" ."):
    w = sent.split()
    if w[:3] == ["the", "background", "is"] and len(w) == 4:
      bg = w[3]
    elif w[:2] == ["there", "is"] and len(w) == 9:  # there is a C S at the R K
      objs.append((w[3], w[4], w[8], w[7]))
    elif w[:1] == ["the"] and len(w) == 8 and w[6] == "is":  # the S at the R K is C
      objs.append((w[7], w[1], w[5], w[4]))
    elif w:
      return None
  if bg is None or not objs or any(o[2] not in scenes_lib.COLS or o[3] not in scenes_lib.ROWS for o in objs):
    return None
  objs.sort(key=lambda o: (scenes_lib.ROWS.index(o[3]), scenes_lib.COLS.index(o[2])))
  return scenes_lib.caption([scenes_lib.Obj(c, sh, scenes_lib.ROWS.index(r), scenes_lib.COLS.index(k), (0, 0, 0))
                             for c, sh, k, r in objs], bg)


def _sha256(path: str) -> str:
  import hashlib
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def index_texts(n: int, sc_cfg: scenes_lib.SceneConfig, seed: int, styles, judged_captions) -> list[str]:
  """`scenes_lib.text_corpus(n, sc_cfg, seed, styles)` less the texts about a judged scene (the caption they
  carry is a judged image's)."""
  judged = set(judged_captions)
  return [t for t in scenes_lib.text_corpus(n, sc_cfg, seed=seed, styles=styles) if text_scene(t) not in judged]


def record_splits(out_dir: str, scenes, texts, train_captions=(), images=None) -> dict:
  """Records what the index and the VLM's training saw (`train`) against the judged images (`test`). cpu: scenes
  as their captions (the index texts' and the connector's training scenes vs the judged ones); full: the corpus
  lines vs the judged image files' sha256."""
  from experiments.runner import splits
  if scenes is not None:
    return splits.record(out_dir, "latentlens", {
        "train": {"scenes": list(train_captions) + [c for c in map(text_scene, texts) if c is not None]},
        "test": {"scenes": list(scenes.captions)}})
  return splits.record(out_dir, "latentlens", {"train": {"texts": list(texts)}, "test": {"images": list(images)}})


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  os.makedirs(out_dir, exist_ok=True)
  res = {}
  if cfg.vlm_path is None:
    data = scene_data(cfg, cfg.train.scenes)  # the scenes train_vlm trains with
    record_splits(out_dir, data[0], data[1], data[2])
    art = pipe.train_vlm(cfg.train, out_dir, resume)
    scenes, pixels, prompt, texts, judge = _scene_inputs(cfg, art, res, data if art.scenes in (None, cfg.train.scenes)
                                                         else None)
    images, patches = scenes.images, None
  else:
    judge = judge_lib.load(cfg.judge, "the full preset (an LLM judge of patch descriptions)")
    art = pipe.load_checkpoint(cfg.vlm_path, FULL_DTYPE, FULL_DTYPE)
    images, pixels, prompt, texts, files = _full_inputs(cfg, art)
    record_splits(out_dir, None, texts, images=[_sha256(os.path.join(cfg.images_path, f)) for f in files])
    scenes, patches = None, "sample"
  tok, tcfg, vc = art.tokenizer, art.cfg.text, art.cfg.vision
  params = art.params if cfg.mesh is None else pipe.place(art.params, shd.make_mesh(cfg.mesh), cfg.strategy)
  vocab = pipe.token_strings(tok, tcfg.vocab_size)
  layers = cfg.index_layers if cfg.index_layers is not None else default_index_layers(tcfg.n_layers)
  judged = cfg.judged_layers if cfg.judged_layers is not None else default_judged_layers(tcfg.n_layers)
  if max(judged) > tcfg.n_layers or max(layers) > tcfg.n_layers:
    raise ValueError(f"index_layers {layers} and judged_layers {judged} must be <= the LM's {tcfg.n_layers} layers")
  corpus = [tok.encode(t, add_bos=tok.bos_id is not None) for t in texts]
  index = lenses.build_index(functools.partial(hidden_fn(tcfg), params["lm"]), corpus, layers,
                             max_contexts=cfg.max_contexts, seed=cfg.seed, dtype=cfg.index_dtype,
                             decode=lambda i: vocab[i], pad_id=tok.pad_id or 0, batch_size=cfg.index_batch,
                             bucket=cfg.index_bucket)
  index.save(os.path.join(pipe.artifacts_dir(out_dir), "index"))
  hs = visual_states(params, art.cfg, prompt, pixels, cfg.eval_batch)
  hs = hs[:, :, hs.shape[2] - vc.n_patches:]  # class and register tokens have no patch
  if isinstance(patches, str):
    rng = np.random.default_rng(cfg.seed)
    m = min(cfg.full_patches_per_image, vc.n_patches)
    patches = np.stack([rng.choice(vc.n_patches, size=m, replace=False) for _ in images])
  ids, nb = lens_ids(params["lm"], tcfg, hs, index, cfg.top_k, judged)
  words = lens_words(ids, vocab, nb, texts)
  out = judge_layers(words, images, vc.grid, judge, patches, judged)
  shares = out["shares"]
  # items: each judged patch, its verdicts averaged over the judged layers (the same patches for every lens)
  res["per_item"] = {f"interpretable.{lens}.mean": out["verdicts"][lens].mean(axis=0).reshape(-1).tolist()
                     for lens in LENSES}
  for lens in LENSES:
    for l, v in zip(judged, shares[lens]):
      res[f"interpretable.{lens}.layer{l}"] = float(v)
    res[f"interpretable.{lens}.mean"] = float(np.mean(shares[lens]))
  chance_share = None
  if scenes is not None:
    scene_words = [w for w in scenes_lib.vocabulary(art.scenes or cfg.train.scenes) if w not in scenes_lib.SPECIALS]
    chance_share = chance(scenes, len(scene_words), cfg.top_k)
    res["interpretable.random.mean"] = chance_share
    obj = scenes.patch_object >= 0
    strict = judge_layers(words, images, vc.grid, GroundTruthJudge(scenes, generic=False), patches, judged)
    for lens in LENSES:
      v = out["verdicts"][lens]
      res[f"interpretable_object.{lens}.mean"] = float(v[:, obj].mean())
      res["per_item"][f"interpretable_object.{lens}.mean"] = v[:, obj].mean(axis=0).tolist()
      res[f"interpretable_background.{lens}.mean"] = float(v[:, ~obj].mean())
      res[f"interpretable_specific.{lens}.mean"] = float(strict["shares"][lens].mean())
      for j, l in enumerate(judged):
        res[f"interpretable_object.{lens}.layer{l}"] = float(v[j][obj].mean())
        res[f"interpretable_specific.{lens}.layer{l}"] = float(strict["shares"][lens][j])
    res["object_patch_share"] = float(obj.mean())
    top1 = judge_layers({k: v[..., :1] for k, v in words.items()}, images, vc.grid, judge, patches,
                        judged)["shares"]
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
  res["judged_layers"] = ",".join(map(str, judged))
  res["index_rows"] = int(index.vectors.shape[1])
  res["visual_tokens"] = int(hs.shape[1] * hs.shape[2])
  if jax.process_index() == 0:
    _plot(os.path.join(out_dir, "interpretable.png"), shares, chance_share, judged)
    _table(os.path.join(out_dir, "table.md"), shares, judged, res if scenes is not None else None)
    _write_examples(os.path.join(out_dir, "examples.json"), ids, nb, corpus, vocab, scenes, patches, judged)
  return res


def _table(path, shares, layers, res=None):
  """Markdown tables over the judged `layers`: all judged patches; with `res` (cpu preset) also object patches and
  the specific judge."""
  def table(title, get):
    rows = [title, "", "| layer | " + " | ".join(LENSES) + " |", "|---" * (len(LENSES) + 1) + "|"]
    for l in layers:
      rows.append(f"| {l} | " + " | ".join(f"{100 * get(n, l):.1f}" for n in LENSES) + " |")
    rows.append("| mean | " + " | ".join(f"{100 * np.mean([get(n, l) for l in layers]):.1f}" for n in LENSES) + " |")
    return "\n".join(rows) + "\n"
  text = table("% of visual tokens whose top-5 descriptions are judged interpretable",
               lambda n, l: shares[n][list(layers).index(l)])
  if res is not None:
    text += "\n" + table("Object patches only", lambda n, l: res[f"interpretable_object.{n}.layer{l}"])
    text += "\n" + table("Specific judge (background patches need the background's colour word)",
                         lambda n, l: res[f"interpretable_specific.{n}.layer{l}"])
  with open(path, "w") as f:
    f.write(text)


def _write_examples(path, ids, nb, corpus, vocab, scenes, patches, layers, n_images: int = 4):
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
        e[lens] = {f"layer{layers[l]}": list(words[a[l, i, q]]) for l in range(n_l)}
      e["latentlens_contexts"] = {
          f"layer{layers[l]}": [f"[L{int(nb.layer[l, i, q, j])}] " + " ".join(
              list(words[corpus[int(nb.context[l, i, q, j])][:int(nb.position[l, i, q, j])]]) + [f"*{words[a]}*"])
              for j, a in enumerate(ids["latentlens"][l, i, q])]
          for l in range(n_l)}
      ex.append(e)
  with open(path, "w") as f:
    json.dump(ex, f, indent=1)
