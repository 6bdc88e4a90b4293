"""The scene VLM shared by the latentlens and lost_in_attention experiments (LatentLens, arXiv:2602.00462).

Three stages, each saved under `out_dir/artifacts` in HF formats and reused with `resume` (the VLM with the
`TrainConfig` it was trained with, `train.json`, so another experiment reuses it only for the same config):
(1) a word-level text LM (tokenizer: `scenes.vocabulary`) pretrained on caption-like and everyday text
(`scenes.text_corpus`); (2) a small CLIP-style ViT trained to predict every patch's colour and shape
(background patches: the background's colour and "none"); (3) only the LLaVA connector, with the ViT and LM
frozen as LatentLens trains its VLMs, on "<bos> <image>xP a red circle at the top left and ... on a gray
background . <eos>" with the loss on the caption tokens.
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import json
import os
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments._shared import recipes
from experiments.runner.overrides import config_dict
from jaxlab import hf, losses
from jaxlab import sharding as shd
from jaxlab.data import load_tokenizer
from jaxlab.data.tasks import scenes as scenes_lib
from jaxlab.models import transformer as tfm, vit, vlm
from jaxlab.nn import layers as nn_layers
from jaxlab.train import metrics as metrics_lib, schedules, state as state_lib

N_WORDS = len(scenes_lib.vocabulary())


def text_model(d: int, n_layers: int, ff: int, vocab: int = -(-N_WORDS // 16) * 16) -> tfm.Config:
  return tfm.Config(vocab_size=vocab, d_model=d, n_layers=n_layers, n_heads=4, d_ff=ff, max_position_embeddings=128,
                    bos_token_id=1, eos_token_id=2, pad_token_id=0)


def vision_model(d: int, n_layers: int) -> vit.Config:
  return vit.clip_config(image_size=48, patch_size=12, d_model=d, n_layers=n_layers, n_heads=4, d_ff=2 * d)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """The three training stages. `lm_styles` weighs `scenes.text_corpus`'s styles (caption, sentences, notes,
  patch grid, everyday text)."""
  scenes: scenes_lib.SceneConfig = scenes_lib.SceneConfig()
  text: tfm.Config = text_model(32, 2, 64)
  vision: vit.Config = vision_model(16, 1)
  n_texts: int = 200
  lm_steps: int = 8
  lm_batch: int = 8
  lm_seq_len: int = 64
  lm_lr: float = 3e-3
  lm_styles: tuple[float, float, float, float, float] = (0.1, 0.1, 0.2, 0.3, 0.3)
  lm_prefix_loss: bool = False  # False: no loss on the notes / patch-grid prefix before " , " (read, not written)
  n_train_scenes: int = 64
  vit_steps: int = 8
  vit_batch: int = 16
  vit_lr: float = 3e-3
  connector_steps: int = 8
  connector_batch: int = 8
  connector_lr: float = 3e-3
  log_every: int = 10
  seed: int = 0

  def __post_init__(self):
    for name in ("n_texts", "lm_steps", "lm_batch", "lm_seq_len", "n_train_scenes", "vit_steps", "vit_batch",
                 "connector_steps", "connector_batch", "log_every"):
      if getattr(self, name) < 1:
        raise ValueError(f"TrainConfig: {name} must be >= 1, found {getattr(self, name)}")
    n_words = len(scenes_lib.vocabulary(self.scenes))
    if self.text.vocab_size < n_words:
      raise ValueError(f"TrainConfig: text.vocab_size must cover the {n_words} scene words, found "
                       f"{self.text.vocab_size}")
    if (self.vision.image_size, self.vision.patch_size) != (self.scenes.image_size, self.scenes.patch_size):
      raise ValueError(f"TrainConfig: vision image/patch size {self.vision.image_size}/{self.vision.patch_size} "
                       f"must match the scenes' {self.scenes.image_size}/{self.scenes.patch_size}")


TRAIN_PRESETS = {
    "smoke": TrainConfig(),
    # connector_lr 1e-3: at 5e-3 the connector's outputs grew to ~250x the text embeddings' norm and last-bit
    # differences (one core instead of two) flipped the lens verdicts
    "cpu": TrainConfig(text=text_model(128, 3, 320), vision=vision_model(64, 2), n_texts=12000, lm_steps=1500,
                       lm_batch=32, lm_seq_len=64, lm_lr=6e-3, n_train_scenes=4000, vit_steps=400, vit_batch=64,
                       vit_lr=2e-3, connector_steps=1200, connector_batch=32, connector_lr=1e-3, log_every=50),
}


def _fit(name, loss_fn, params, tx, batches, steps, out_dir, log_every, seed, schedule=None):
  path = os.path.join(out_dir, f"metrics_{name}.jsonl")
  res, _ = recipes.fit(state_lib.create(params, tx, seed), loss_fn, tx, batches, steps, schedule=schedule,
                       metrics_path=path, log_every=log_every, desc=name)
  with open(os.path.join(out_dir, "metrics.jsonl"), "a") as f:
    for r in metrics_lib.read_jsonl(path):
      f.write(metrics_lib.json_line({"stage": name, **r}))
  return res.state.params, res.history


def _adamw(lr, steps):
  """(AdamW with clipping and a 10% warmup + cosine schedule, the schedule)."""
  schedule = schedules.get("cosine", lr, steps, max(1, steps // 10), 0.1)
  return recipes.optimizer(schedule, "adamw", grad_clip=1.0, b2=0.98, weight_decay=1e-4), schedule


def _sampler(arrays: dict, batch: int, seed: int):
  rng = np.random.default_rng(seed)
  n = len(next(iter(arrays.values())))
  while True:
    idx = rng.integers(0, n, batch)
    yield {k: jnp.asarray(v[idx]) for k, v in arrays.items()}


def pad_rows(rows: Sequence[Sequence[int]], length: int, pad: int = 0) -> np.ndarray:
  out = np.full((len(rows), length), pad, np.int32)
  for i, r in enumerate(rows):
    if len(r) > length:
      raise ValueError(f"a sequence of {len(r)} tokens exceeds the length {length}")
    out[i, :len(r)] = r
  return out


def normalize(images_NHWC, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)):
  return (np.asarray(images_NHWC, np.float32) - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)


def caption_batch(scenes, tok, cfg: vlm.Config):
  """Teacher-forcing arrays for "<bos> <image>xP caption <eos>": inputs, targets, loss_mask (caption tokens)."""
  rows = [[tok.bos_id] + [cfg.image_token_id] * cfg.tokens_per_image + tok.encode(c) + [tok.eos_id]
          for c in scenes.captions]
  seq = pad_rows(rows, max(map(len, rows)), tok.pad_id)
  inputs, targets = seq[:, :-1], seq[:, 1:]
  mask = (targets != tok.pad_id) & (targets != cfg.image_token_id)
  return {"inputs": inputs, "targets": targets, "loss_mask": mask.astype(np.int32)}


def _vit_loss(vcfg: vit.Config, n_colour: int, n_shape: int):
  def loss(params, batch, rng):
    del rng
    h = vit.forward(params["vit"], batch["pixels"], vcfg).last_hidden_state[:, 1:]
    out = 0.0
    for name, _n in (("colour", n_colour), ("shape", n_shape)):
      logits = nn_layers.linear(params["head"][name], h).astype(jnp.float32)
      out = out + jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, batch[name]))
    return out, jnp.asarray(h.shape[0] * h.shape[1] * 2, jnp.float32), {}
  return loss


def patch_targets(scenes, n_colours: int, n_shapes: int):
  """ViT targets per patch: colour (the object's, else n_colours + the background's index) and shape (the
  object's, else n_shapes for "none")."""
  obj = scenes.patch_object >= 0
  colour = np.where(obj, scenes.patch_colour, n_colours + scenes.background[:, None])
  return colour.astype(np.int32), np.where(obj, scenes.patch_shape, n_shapes).astype(np.int32)


class Artifacts(NamedTuple):
  cfg: vlm.Config
  params: dict
  tokenizer: object
  history: dict  # stage -> training log records (empty for a loaded checkpoint)
  scenes: scenes_lib.SceneConfig | None = None  # the scenes it was trained on


def artifacts_dir(run_dir: str) -> str:
  return os.path.join(run_dir, "artifacts")


def source_dirs(source: str, out_dir: str) -> list[str]:
  """Run directories that may hold a reusable VLM: `source` (a bare name: beside `out_dir`) and its reproduce
  siblings (seeds `.seedK`, reruns `-N`); [] for an empty source."""
  if not source:
    return []
  base = source if os.path.dirname(source) else os.path.join(os.path.dirname(os.path.abspath(out_dir)), source)
  return [base] + sorted(glob.glob(glob.escape(base) + ".seed*") + glob.glob(glob.escape(base) + "-*"))


def load_artifacts(run_dir: str, train: TrainConfig | None = None) -> Artifacts | None:
  """The trained VLM a run saved (llava directory with tokenizer.json), or None; with `train`, None also when
  the VLM was not trained with that config (or did not record it)."""
  d = os.path.join(artifacts_dir(run_dir), "vlm")
  if not os.path.exists(os.path.join(d, "config.json")):
    return None
  if train is not None:
    saved = os.path.join(d, "train.json")
    if not os.path.exists(saved):
      return None
    with open(saved) as f:
      if json.load(f) != config_dict(train):
        return None
  cfg, params = hf.load(d)
  hist, sc = {}, None
  if os.path.exists(os.path.join(d, "history.json")):
    with open(os.path.join(d, "history.json")) as f:
      hist = json.load(f)
  if os.path.exists(os.path.join(d, "scenes.json")):
    with open(os.path.join(d, "scenes.json")) as f:
      sc = scenes_lib.SceneConfig(**json.load(f))
  return Artifacts(cfg, params, load_tokenizer(d), hist, sc)


def load_checkpoint(path: str, param_dtype: str | None = None, dtype: str | None = None,
                    remat: bool = False) -> Artifacts:
  """A LLaVA checkpoint directory (config.json, safetensors, tokenizer.json), with errors that name what is missing;
  with `param_dtype`, its params cast to it and the config's dtypes set by `with_dtypes`."""
  if not path or not os.path.isdir(path):
    raise ValueError(f"vlm_path must be an existing LLaVA checkpoint directory, found {path!r}")
  missing = [f for f in ("config.json", "tokenizer.json") if not os.path.exists(os.path.join(path, f))]
  if missing:
    raise FileNotFoundError(f"{path}: a LLaVA checkpoint directory needs config.json and tokenizer.json, "
                            f"missing {missing}")
  cfg, params = hf.load(path, param_dtype)
  if not isinstance(cfg, vlm.Config):
    raise ValueError(f"{path}: expected a LLaVA (vision + connector + LM) checkpoint, found {type(cfg).__name__}")
  if param_dtype is not None:
    cfg = with_dtypes(cfg, param_dtype, dtype or param_dtype, remat)
  return Artifacts(cfg, params, load_tokenizer(path), {})


# ------------------------------------------------------------------------------- a checkpoint on a mesh

PROMPT_CHARS_PER_TOKEN = 3  # planning's estimate of a prompt's text tokens, with no tokenizer at hand


def with_dtypes(cfg: vlm.Config, param_dtype: str, dtype: str, remat: bool = False) -> vlm.Config:
  """`cfg` with the vision tower's and the LM's parameter and compute dtypes and `remat` set."""
  return dataclasses.replace(cfg, vision=cfg.vision.replace(param_dtype=param_dtype, dtype=dtype, remat=remat),
                             text=cfg.text.replace(param_dtype=param_dtype, dtype=dtype, remat=remat))


def checkpoint_config(ref: str, param_dtype: str, dtype: str, remat: bool = False) -> vlm.Config:
  """The VLM config of checkpoint `ref` (a directory, or a repo id whose architecture jaxlab ships:
  `jaxlab.hf.hub.config`) as `load_checkpoint(ref, param_dtype, dtype, remat)` gives it, without its weights."""
  from jaxlab.hf import hub
  cfg = hub.config(ref)
  if not isinstance(cfg, vlm.Config):
    raise ValueError(f"{ref}: expected a LLaVA (vision + connector + LM) checkpoint, found {type(cfg).__name__}")
  return with_dtypes(cfg, param_dtype, dtype, remat)


def abstract_params(cfg: vlm.Config, mesh, strategy: str):
  """ShapeDtypeStructs of `vlm.init(cfg)`'s params with their shardings on `mesh` by `strategy` (nothing allocated)."""
  return shd.sharded_shapes(vlm.init, mesh, strategy, cfg, jax.random.PRNGKey(0), axes=vlm.AXES)


def place(params, mesh, strategy: str):
  """`params` of a VLM laid out on `mesh` by `strategy` (`jaxlab.sharding.shard_params` with `vlm.AXES`)."""
  return shd.shard_params(params, mesh, strategy, axes=vlm.AXES)


def prompt_ids(tok, prompt: str, cfg: vlm.Config) -> list[int]:
  """A prompt with one "<image>" as token ids: bos (if the tokenizer has one), the text before, the image tokens,
  the text after."""
  before, sep, after = prompt.partition("<image>")
  if not sep:
    raise ValueError(f"prompt must contain '<image>', found {prompt!r}")
  return ([tok.bos_id] if tok.bos_id is not None else []) + tok.encode(before) + \
      [cfg.image_token_id] * cfg.tokens_per_image + tok.encode(after)


def planned_prompt(prompt: str, cfg: vlm.Config) -> list[int]:
  """`prompt_ids` as planning sees it without a tokenizer: bos, `PROMPT_CHARS_PER_TOKEN` characters per text token
  (ids 0), the image tokens where "<image>" stands."""
  before, _, after = prompt.partition("<image>")
  n = lambda text: -(-len(text) // PROMPT_CHARS_PER_TOKEN)
  return [cfg.text.bos_token_id or 0] + [0] * n(before) + [cfg.image_token_id] * cfg.tokens_per_image + \
      [0] * n(after)


def forward_flops(cfg: vlm.Config, images: int, rows: int, seq_len: int, train: bool = False) -> float:
  """2·N·tokens of a forward pass: the LM over `rows` x `seq_len` positions (`transformer.flops_per_token` / 3,
  attention included) and the vision tower and connector over every patch of `images` images; with `train`,
  6·N·tokens for the LM and the connector (the vision tower frozen: forward only)."""
  shapes = jax.eval_shape(functools.partial(vlm.init, cfg), jax.random.PRNGKey(0))
  count = lambda tree: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))
  per_image = 2.0 * (count(shapes["vision"]) * cfg.vision.seq_len + (3 if train else 1) * count(
      shapes["connector"]) * cfg.tokens_per_image)
  return tfm.flops_per_token(cfg.text, seq_len) / (1 if train else 3) * rows * seq_len + per_image * images


def lm_data(texts: Sequence[str], tok, seq_len: int, prefix_loss: bool = False) -> dict:
  """Next-token arrays for the text LM. Without `prefix_loss`, targets up to and including the first "," of a
  notes or patch-grid text (its prefix) carry no loss: the LM learns to read the prefix and write the caption,
  as a VLM learns from captions after image tokens, and never learns to predict prefix words."""
  rows = [tok.encode(t, add_bos=True, add_eos=True) for t in texts]
  seq = pad_rows(rows, seq_len + 1, tok.pad_id)
  mask = seq[:, 1:] != tok.pad_id
  if not prefix_loss:
    comma = tok.encode(",")[0]
    for i, r in enumerate(rows):
      if comma in r:
        mask[i, :r.index(comma)] = False
  return {"inputs": seq[:, :-1], "targets": seq[:, 1:], "loss_mask": mask.astype(np.int32)}


def _text_lm(cfg: TrainConfig, tok, out_dir, key):
  texts = scenes_lib.text_corpus(cfg.n_texts, cfg.scenes, seed=cfg.seed + 1, styles=cfg.lm_styles)
  data = lm_data(texts, tok, cfg.lm_seq_len, cfg.lm_prefix_loss)
  tx, sched = _adamw(cfg.lm_lr, cfg.lm_steps)
  return _fit("text_lm", losses.lm_loss_fn(cfg.text), tfm.init(cfg.text, key), tx,
              _sampler(data, cfg.lm_batch, cfg.seed), cfg.lm_steps, out_dir, cfg.log_every, cfg.seed, sched)


def _vit(cfg: TrainConfig, train, pixels, out_dir, key):
  n_col, n_shape = len(scenes_lib.COLOURS), len(cfg.scenes.shapes)
  colour, shape = patch_targets(train, n_col, n_shape)
  k1, k2, k3 = jax.random.split(key, 3)
  d = cfg.vision.d_model
  params = {"vit": vit.init(cfg.vision, k1),
            "head": {"colour": nn_layers.linear_init(k2, d, n_col + len(scenes_lib.BACKGROUNDS), bias=True),
                     "shape": nn_layers.linear_init(k3, d, n_shape + 1, bias=True)}}
  tx, sched = _adamw(cfg.vit_lr, cfg.vit_steps)
  params, h = _fit("vit", _vit_loss(cfg.vision, n_col, n_shape), params, tx,
                   _sampler({"pixels": pixels, "colour": colour, "shape": shape}, cfg.vit_batch, cfg.seed + 1),
                   cfg.vit_steps, out_dir, cfg.log_every, cfg.seed, sched)
  return params["vit"], h


def scene_vlm_config(cfg: TrainConfig) -> vlm.Config:
  """The scene VLM `train_vlm` trains: its ViT and text LM joined by a connector on the ViT's last layer."""
  return vlm.Config(vision=cfg.vision, text=cfg.text, image_token_id=scenes_lib.vocabulary(cfg.scenes).index(
      "<image>"), feature_layers=(-1,))


def train_vlm(cfg: TrainConfig, out_dir: str, resume: bool = False) -> Artifacts:
  """Stages 1-3 (text LM, ViT, connector); each stage's model is saved under `out_dir/artifacts` and, with
  `resume`, loaded instead of trained again."""
  art = artifacts_dir(out_dir)
  os.makedirs(art, exist_ok=True)
  words = scenes_lib.vocabulary(cfg.scenes)
  scenes_lib.save_tokenizer(os.path.join(art, "tokenizer"), words)
  tok = load_tokenizer(os.path.join(art, "tokenizer"))
  hist = {}
  key = jax.random.PRNGKey(cfg.seed)
  stage_dirs = {s: os.path.join(art, s) for s in ("text_lm", "vit", "vlm")}
  done = {s: resume and os.path.exists(os.path.join(d, "config.json")) for s, d in stage_dirs.items()}
  if done["vlm"]:
    return load_artifacts(out_dir)

  if done["text_lm"]:
    lm_params = hf.load(stage_dirs["text_lm"])[1]
  else:
    lm_params, hist["text_lm"] = _text_lm(cfg, tok, out_dir, jax.random.fold_in(key, 1))
    hf.save(stage_dirs["text_lm"], cfg.text, lm_params, overwrite=True)

  train = scenes_lib.generate(cfg.n_train_scenes, cfg.scenes, seed=cfg.seed + 2)
  pixels = normalize(train.images)
  if done["vit"]:
    vit_params = hf.load(stage_dirs["vit"])[1]
  else:
    vit_params, hist["vit"] = _vit(cfg, train, pixels, out_dir, jax.random.fold_in(key, 2))
    hf.save(stage_dirs["vit"], cfg.vision, vit_params, overwrite=True)

  vcfg = scene_vlm_config(cfg)
  params = {**vlm.init(vcfg, jax.random.fold_in(key, 3)), "vision": vit_params, "lm": lm_params}
  data = dict(caption_batch(train, tok, vcfg), pixels=pixels)
  tx, sched = _adamw(cfg.connector_lr, cfg.connector_steps)
  params, hist["connector"] = _fit("connector", losses.vlm_loss_fn(vcfg, freeze=True), params, vlm.connector_only(tx),
                                   _sampler(data, cfg.connector_batch, cfg.seed + 2), cfg.connector_steps, out_dir,
                                   cfg.log_every, cfg.seed, sched)
  d = stage_dirs["vlm"]
  hf.save(d, vcfg, params, overwrite=True)
  scenes_lib.save_tokenizer(d, words)
  with open(os.path.join(d, "history.json"), "w") as f:
    json.dump(hist, f)
  with open(os.path.join(d, "scenes.json"), "w") as f:
    json.dump(dataclasses.asdict(cfg.scenes), f)
  with open(os.path.join(d, "train.json"), "w") as f:
    json.dump(config_dict(cfg), f)
  return Artifacts(vcfg, params, tok, hist, cfg.scenes)


CATEGORIES = {"colour": tuple(scenes_lib.COLOURS), "shape": scenes_lib.SHAPES + scenes_lib.DIGITS + scenes_lib.FASHION,
              "row": scenes_lib.ROWS, "col": scenes_lib.COLS, "background": tuple(scenes_lib.BACKGROUNDS)}
ATTRIBUTE_WORDS = frozenset(w for ws in CATEGORIES.values() for w in ws)


def token_strings(tok, vocab_size: int) -> list[str]:
  """Each id's string (stripped); ids past the tokenizer's vocabulary (model padding) read "<id N>"."""
  return [tok.decode([i], skip_special=False).strip() if i < tok.vocab_size else f"<id {i}>"
          for i in range(vocab_size)]


def attribute_accuracy(params, cfg: vlm.Config, batch: dict, vocab: Sequence[str], *, intervention=None,
                       lm_params=None) -> tuple[float, dict]:
  """Teacher-forced next-token accuracy on the caption's attribute words (the tokens that depend on the image).

  Args:
    params: VLM params.
    cfg: the VLM config.
    batch: from `caption_batch` plus "pixels".
    vocab: token id -> string.
    intervention: a `transformer.Intervention` applied in every LM block.
    lm_params: replaces params["lm"] (e.g. Gaussian Q/K/V weights).

  Returns:
    (accuracy over all attribute words, {category: accuracy} over CATEGORIES present in the batch).
  """
  p = params if lm_params is None else {**params, "lm": lm_params}
  logits = vlm.forward(p, jnp.asarray(batch["inputs"]), jnp.asarray(batch["pixels"]), cfg,
                       intervention=intervention).logits
  words = np.asarray(vocab, dtype=object)[batch["targets"]]
  hit = np.asarray(jnp.argmax(logits, -1)) == batch["targets"]
  scored = batch["loss_mask"] > 0
  per = {c: float(hit[np.isin(words, list(ws)) & scored].mean()) for c, ws in CATEGORIES.items()
         if (np.isin(words, list(ws)) & scored).any()}
  return float(hit[np.isin(words, list(ATTRIBUTE_WORDS)) & scored].mean()), per


def training_captions(train: TrainConfig, sc_cfg: scenes_lib.SceneConfig) -> list[str]:
  """Captions of the scenes `train_vlm` trains the ViT and the connector on (its draw, seed `train.seed + 2`)."""
  return scenes_lib.generate(train.n_train_scenes, sc_cfg, seed=train.seed + 2).captions


def disjoint_scenes(n: int, sc_cfg: scenes_lib.SceneConfig, seed: int, exclude) -> scenes_lib.Scenes:
  """The first `n` scenes of `scenes_lib.generate(m, sc_cfg, seed)` (m = n, doubled while too few remain) whose
  caption is not in `exclude`: `generate(n, sc_cfg, seed)` itself when none of its captions is excluded."""
  exclude, m = set(exclude), n
  while True:
    sc = scenes_lib.generate(m, sc_cfg, seed=seed)
    keep = [i for i, c in enumerate(sc.captions) if c not in exclude][:n]
    if len(keep) == n:
      return sc if keep == list(range(m)) else scenes_lib.Scenes(
          *(a[keep] for a in sc[:5]), [sc.objects[i] for i in keep], [sc.captions[i] for i in keep])
    m *= 2
