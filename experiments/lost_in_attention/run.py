"""The run of lost_in_attention: what `python -m experiments run lost_in_attention` executes (its Config, presets and claims are in
`experiments/lost_in_attention/__init__.py`, the paper and its departures in `experiments/lost_in_attention/README.md`)."""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from experiments import registry
from experiments._shared import vlm_pipeline as pipe
from experiments.runner import splits
from jaxlab.data.tasks import scenes as scenes_lib
from experiments.lost_in_attention import geometry
from jaxlab.models import vlm
from jaxlab.train import metrics as metrics_lib
from experiments.lost_in_attention import Config, IMAGE_MEAN, IMAGE_STD, INTERVENTIONS, MODULES


def eval_scenes(cfg: Config, sc_cfg: scenes_lib.SceneConfig) -> scenes_lib.Scenes:
  """The evaluated scenes: `n_eval_scenes` drawn with seed `seed + 5`, none of those the VLM trained on."""
  return pipe.disjoint_scenes(cfg.n_eval_scenes, sc_cfg, cfg.seed + 5,
                              pipe.training_captions(cfg.train, sc_cfg))


def record_splits(out_dir: str, train_captions, test_captions, images=None) -> dict:
  """Records the evaluated items (`test`): with `images` (full preset: the image files' sha256) captions and images,
  the checkpoint's training data unknown; else the scenes as their captions, against the VLM's training scenes
  (`train`)."""
  if images is not None:
    return splits.record(out_dir, "lost_in_attention", {"test": {"captions": list(test_captions),
                                                                 "images": list(images)}})
  return splits.record(out_dir, "lost_in_attention", {"train": {"scenes": list(train_captions)},
                                                      "test": {"scenes": list(test_captions)}})


def _scene_data(cfg: Config, art: pipe.Artifacts, sc: scenes_lib.Scenes | None = None):
  sc = eval_scenes(cfg, art.scenes or cfg.train.scenes) if sc is None else sc
  batch = dict(pipe.caption_batch(sc, art.tokenizer, art.cfg), pixels=pipe.normalize(sc.images))
  vocab = pipe.token_strings(art.tokenizer, art.cfg.text.vocab_size)
  attr = np.isin(np.asarray(vocab, dtype=object)[batch["targets"]], list(pipe.ATTRIBUTE_WORDS))
  batch["score_mask"] = (attr & (batch["loss_mask"] > 0)).astype(np.int32)
  return batch


def _full_rows(cfg: Config) -> list[dict]:
  """The first `n_eval_scenes` rows of the captions file."""
  if not cfg.captions_path or not os.path.isfile(cfg.captions_path):
    raise ValueError(f"the full preset needs captions_path: an existing JSON-lines file of {{image, caption}}, "
                     f"found {cfg.captions_path!r}")
  with open(cfg.captions_path) as f:
    return [json.loads(line) for line in f if line.strip()][:cfg.n_eval_scenes]


def _full_data(cfg: Config, art: pipe.Artifacts, rows: list[dict] | None = None):
  """The full preset's batch from `rows` (default `_full_rows(cfg)`)."""
  from PIL import Image
  rows = _full_rows(cfg) if rows is None else rows
  base = os.path.dirname(os.path.abspath(cfg.captions_path))
  if not rows:
    raise ValueError(f"{cfg.captions_path}: no rows")
  for i, r in enumerate(rows):
    if not isinstance(r, dict) or not {"image", "caption"} <= set(r):
      raise ValueError(f"{cfg.captions_path} row {i}: expected keys image and caption, found {r!r}")
    if not os.path.isfile(os.path.join(base, r["image"])):
      raise FileNotFoundError(f"{cfg.captions_path} row {i}: image {os.path.join(base, r['image'])} not found")
  if "<image>" not in cfg.prompt:
    raise ValueError(f"prompt must contain '<image>', found {cfg.prompt!r}")
  s, tok, vc = art.cfg.vision.image_size, art.tokenizer, art.cfg
  images = np.stack([np.asarray(Image.open(os.path.join(base, r["image"])).convert("RGB").resize(
      (s, s), Image.BICUBIC), np.float32) / 255.0 for r in rows])
  before, _, after = cfg.prompt.partition("<image>")
  head = ([tok.bos_id] if tok.bos_id is not None else []) + tok.encode(before) + \
      [vc.image_token_id] * vc.tokens_per_image + tok.encode(after)
  seqs = [head + tok.encode(" " + r["caption"]) + ([tok.eos_id] if tok.eos_id is not None else []) for r in rows]
  seq = pipe.pad_rows(seqs, max(map(len, seqs)), tok.pad_id or 0)
  inputs, targets = seq[:, :-1], seq[:, 1:]
  mask = np.zeros(targets.shape, np.int32)
  for i, q in enumerate(seqs):
    mask[i, len(head) - 1:len(q) - 1] = 1
  return {"inputs": inputs, "targets": targets, "loss_mask": mask, "score_mask": mask,
          "pixels": pipe.normalize(images, IMAGE_MEAN, IMAGE_STD)}


def _sha256(path: str) -> str:
  import hashlib
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def _trained(cfg: Config, out_dir: str, resume: bool):
  if cfg.vlm_path is not None:
    return pipe.load_checkpoint(cfg.vlm_path), "checkpoint"
  for d in pipe.source_dirs(cfg.source, out_dir):
    art = pipe.load_artifacts(d, cfg.train)
    if art is not None:
      return art, "reused"
  art = pipe.load_artifacts(out_dir) if resume else None
  if art is not None:
    return art, "reused"
  if cfg.source:
    print(f"lost_in_attention: no VLM trained with this train config under {cfg.source!r}; training one here",
          flush=True)
  return pipe.train_vlm(cfg.train, out_dir, resume), "trained"


def _chunks(batch: dict, size: int):
  n = len(batch["inputs"])
  for i in range(0, n, size):
    yield {k: v[i:i + size] for k, v in batch.items()}


def geometry_metrics(art: pipe.Artifacts, batch: dict, size: int) -> dict:
  """{module: {metric: [L, N]}} over the first min_len positions of every sequence."""
  valid = batch["inputs"] != (art.tokenizer.pad_id or 0)
  valid[:, 0] = True
  min_len = int(valid.sum(1).min())
  fn = jax.jit(lambda p, t, x: vlm.forward(p, t, x, art.cfg, capture=(
      "hidden_states", "attn_updates", "mlp_updates")).lm)
  out = {m: {} for m in MODULES}
  for b in _chunks(batch, size):
    lm = fn(art.params, jnp.asarray(b["inputs"][:, :min_len]), jnp.asarray(b["pixels"]))
    got = geometry.metrics_from_output(lm)
    for m in MODULES:
      for k, v in got[m].items():
        out[m].setdefault(k, []).append(np.asarray(v))
  return {m: {k: np.concatenate(v, axis=1) for k, v in d.items()} for m, d in out.items()}


def accuracy(art: pipe.Artifacts, batch: dict, size: int, *, intervention=None, lm_params=None) -> float:
  """Teacher-forced next-token accuracy over `score_mask`."""
  p = art.params if lm_params is None else {**art.params, "lm": lm_params}
  hits, total = 0, 0
  for b in _chunks(batch, size):
    logits = vlm.forward(p, jnp.asarray(b["inputs"]), jnp.asarray(b["pixels"]), art.cfg,
                         intervention=intervention).logits
    m = b["score_mask"] > 0
    hits += int((np.asarray(jnp.argmax(logits, -1)) == b["targets"])[m].sum())
    total += int(m.sum())
  return hits / max(total, 1)


def _intervene(name: str, art, key, layers, noise_std):
  """(intervention, lm_params) for `name` applied in `layers`."""
  if name == "noise_delta":
    return geometry.noise_update(key, layers=layers, std=noise_std), None
  if name == "noise_qkv":
    return None, geometry.gaussian_qkv(art.params["lm"], key, layers)
  if name == "fixed_attention":
    return geometry.fixed_attention("uniform", layers=layers), None
  raise ValueError(f"unknown intervention {name!r}; expected one of {INTERVENTIONS}")


def _plots(out_dir: str, geo: dict, acc_layers: dict, acc: dict):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axs = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
  for ax, metric in zip(axs, ("rid", "mixig")):
    for m in MODULES:
      v = geo[m][metric]
      ax.errorbar(range(v.shape[0]), v.mean(1), yerr=v.std(1), marker="o", capsize=3, label=m)
    ax.set_xlabel("LM layer")
    ax.set_ylabel(metric.upper() if metric == "rid" else "MixIG")
    ax.grid(alpha=0.3)
    ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "geometry_per_layer.png"))
  plt.close(fig)
  if acc_layers:
    series = {name: (list(range(len(v))), list(v)) for name, v in acc_layers.items()}
    n = len(next(iter(acc_layers.values())))
    series["none"] = (list(range(n)), [acc["none"]] * n)
    registry.plot_curves(os.path.join(out_dir, "accuracy_per_layer.png"), series, xlabel="intervened LM layer",
                         ylabel="attribute-word accuracy", title="one layer at a time")


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  os.makedirs(out_dir, exist_ok=True)
  if cfg.vlm_path is None:
    sc = eval_scenes(cfg, cfg.train.scenes)  # the scenes the reused or trained VLM trains with
    record_splits(out_dir, pipe.training_captions(cfg.train, cfg.train.scenes), sc.captions)
  art, origin = _trained(cfg, out_dir, resume)
  if cfg.vlm_path is not None:
    rows = _full_rows(cfg)
    batch = _full_data(cfg, art, rows)
    base = os.path.dirname(os.path.abspath(cfg.captions_path))
    record_splits(out_dir, None, [r["caption"] for r in rows], [_sha256(os.path.join(base, r["image"])) for r in rows])
  else:
    batch = _scene_data(cfg, art, sc if art.scenes in (None, cfg.train.scenes) else None)
  n_layers = art.cfg.text.n_layers
  res = {"vlm": origin}
  geo = geometry_metrics(art, batch, cfg.eval_batch)
  for m in MODULES:
    for metric in ("rid", "mixig", "delta_s", "delta_d"):
      v = geo[m][metric]
      res[f"{metric}.{m}"] = float(v.mean())
      if metric in ("rid", "mixig"):
        for l in range(n_layers):
          res[f"{metric}.{m}.layer{l}"] = float(v[l].mean())
  key = jax.random.PRNGKey(cfg.seed + 7)
  acc = {"none": accuracy(art, batch, cfg.eval_batch)}
  acc_layers = {}
  for name in INTERVENTIONS:
    iv, lm = _intervene(name, art, key, list(range(n_layers)), cfg.noise_std)
    acc[name] = accuracy(art, batch, cfg.eval_batch, intervention=iv, lm_params=lm)
    if cfg.per_layer:
      acc_layers[name] = []
      for l in range(n_layers):
        iv, lm = _intervene(name, art, key, [l], cfg.noise_std)
        acc_layers[name].append(accuracy(art, batch, cfg.eval_batch, intervention=iv, lm_params=lm))
        res[f"accuracy.{name}.layer{l}"] = acc_layers[name][-1]
  for name, v in acc.items():
    res[f"accuracy.{name}"] = v
  res["scored_tokens"] = int(batch["score_mask"].sum())
  if jax.process_index() == 0:
    _plots(out_dir, geo, acc_layers, acc)
    with open(os.path.join(out_dir, "metrics.jsonl"), "a") as f:
      for l in range(n_layers):
        f.write(metrics_lib.json_line({"layer": l, **{f"{k}.{m}": float(geo[m][k][l].mean()) for m in MODULES
                                                     for k in geometry.METRICS}}))
  return res
