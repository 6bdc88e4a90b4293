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
from jaxlab import sharding as shd
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
  s, tok = art.cfg.vision.image_size, art.tokenizer
  images = np.stack([np.asarray(Image.open(os.path.join(base, r["image"])).convert("RGB").resize(
      (s, s), Image.BICUBIC), np.float32) / 255.0 for r in rows])
  head = pipe.prompt_ids(tok, cfg.prompt, art.cfg)
  seqs = [head + tok.encode(" " + r["caption"])[:cfg.max_caption_tokens] +
          ([tok.eos_id] if tok.eos_id is not None else []) for r in rows]
  seq = pipe.pad_rows(seqs, full_length(len(head), cfg), tok.pad_id or 0)
  inputs, targets = seq[:, :-1], seq[:, 1:]
  mask = np.zeros(targets.shape, np.int32)
  for i, q in enumerate(seqs):
    mask[i, len(head) - 1:len(q) - 1] = 1
  return {"inputs": inputs, "targets": targets, "loss_mask": mask, "score_mask": mask,
          "pixels": pipe.normalize(images, IMAGE_MEAN, IMAGE_STD)}


def full_length(head: int, cfg: Config) -> int:
  """Tokens of every full-preset row (inputs and targets one more): the prompt, the longest caption kept, eos."""
  return head + cfg.max_caption_tokens + 1


def _sha256(path: str) -> str:
  import hashlib
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


FULL_DTYPE = "bfloat16"  # a checkpoint's params and compute


def _trained(cfg: Config, out_dir: str, resume: bool):
  if cfg.vlm_path is not None:
    return pipe.load_checkpoint(cfg.vlm_path, FULL_DTYPE, FULL_DTYPE), "checkpoint"
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


def geometry_fn(cfg: vlm.Config):
  """Jitted fn(params, tokens [B, T], pixels) -> the LM's output with its hidden states and its attention and MLP
  updates at every layer (what `geometry.metrics_from_output` reads)."""
  return jax.jit(lambda p, t, x: vlm.forward(p, t, x, cfg, capture=("hidden_states", "attn_updates",
                                                                      "mlp_updates")).lm)


def predict_fn(cfg: vlm.Config):
  """Jitted fn(params, tokens [B, T], pixels) -> the greedy next token at every position [B, T] (no intervention;
  NoiseQKV changes only the params, so it runs this too)."""
  return jax.jit(lambda p, t, x: jnp.argmax(vlm.forward(p, t, x, cfg).logits, -1))


def geometry_metrics(art: pipe.Artifacts, batch: dict, size: int, params=None, *, intervention=None,
                     lm_params=None) -> dict:
  """{module: {metric: [L, N]}} over the first min_len positions of every sequence; `params` (default
  `art.params`) may be laid out on a mesh; under an intervention (`_intervene`), of the intervened model (op by op,
  as `accuracy`)."""
  valid = batch["inputs"] != (art.tokenizer.pad_id or 0)
  valid[:, 0] = True
  min_len = int(valid.sum(1).min())
  p = art.params if params is None else params
  p = p if lm_params is None else {**p, "lm": lm_params}
  if intervention is None:
    fn = geometry_fn(art.cfg)
  else:
    fn = lambda p, t, x: vlm.forward(p, t, x, art.cfg, intervention=intervention,
                                     capture=("hidden_states", "attn_updates", "mlp_updates")).lm
  out = {m: {} for m in MODULES}
  for b in _chunks(batch, size):
    lm = fn(p, jnp.asarray(b["inputs"][:, :min_len]), jnp.asarray(b["pixels"]))
    got = geometry.metrics_from_output(lm)
    for m in MODULES:
      for k, v in got[m].items():
        out[m].setdefault(k, []).append(np.asarray(v))
  return {m: {k: np.concatenate(v, axis=1) for k, v in d.items()} for m, d in out.items()}


def accuracy(art: pipe.Artifacts, batch: dict, size: int, *, intervention=None, lm_params=None, params=None,
             predict=None) -> float:
  """Teacher-forced next-token accuracy over `score_mask`; `params` (default `art.params`) may be laid out on a mesh,
  `predict` is `predict_fn(art.cfg)` when the caller holds one (an intervention runs op by op)."""
  p = art.params if params is None else params
  p = p if lm_params is None else {**p, "lm": lm_params}
  if intervention is None:
    predict = predict or predict_fn(art.cfg)
  else:
    predict = lambda p, t, x: jnp.argmax(vlm.forward(p, t, x, art.cfg, intervention=intervention).logits, -1)
  hits, total = 0, 0
  for b in _chunks(batch, size):
    pred = predict(p, jnp.asarray(b["inputs"]), jnp.asarray(b["pixels"]))
    m = b["score_mask"] > 0
    hits += int((np.asarray(pred) == b["targets"])[m].sum())
    total += int(m.sum())
  return hits / max(total, 1)


def _intervene(name: str, art, key, layers, noise_std, lm_params=None):
  """(intervention, lm_params) for `name` applied in `layers` (of `lm_params`, default art.params["lm"])."""
  if name == "noise_delta":
    return geometry.noise_update(key, layers=layers, std=noise_std), None
  if name == "noise_qkv":
    return None, geometry.gaussian_qkv(art.params["lm"] if lm_params is None else lm_params, key, layers)
  if name == "fixed_attention":
    return geometry.fixed_attention("uniform", layers=layers), None
  raise ValueError(f"unknown intervention {name!r}; expected one of {INTERVENTIONS}")


def workloads(cfg: Config, mesh) -> list:
  """The geometry passes (`geometry_fn`, unmodified and under each intervention) and the accuracy passes
  (`predict_fn`; the interventions' passes have its shapes and cost), with abstract arguments at the preset's shapes (`experiments plan`). A checkpoint's rows are
  planned at the prompt's estimated length (`vlm_pipeline.planned_prompt`): the geometry over the prompt, the
  accuracy over prompt + `max_caption_tokens` + eos; the scene VLM's at the longest caption of its scenes."""
  from experiments.runner import plan as plan_lib
  if cfg.vlm_path is None:
    vcfg = pipe.scene_vlm_config(cfg.train)
    head = 1 + vcfg.tokens_per_image
    longest = head + max(len(c.split()) for c in eval_scenes(cfg, cfg.train.scenes).captions) + 1
  else:
    vcfg = pipe.checkpoint_config(cfg.vlm_path, FULL_DTYPE, FULL_DTYPE)
    head = len(pipe.planned_prompt(cfg.prompt, vcfg))
    longest = full_length(head, cfg)
  params = pipe.abstract_params(vcfg, mesh, cfg.strategy)
  b, s = cfg.eval_batch, vcfg.vision.image_size
  x = shd.abstract_rows({"geometry": ((b, head), "int32"), "tokens": ((b, longest - 1), "int32"),
                         "pixels": ((b, s, s, 3), "float32")}, mesh)
  chunks = -(-cfg.n_eval_scenes // b)
  passes = 1 + len(INTERVENTIONS) * (1 + (vcfg.text.n_layers if cfg.per_layer else 0))
  return [plan_lib.Workload("geometry_forward", "forward", geometry_fn(vcfg), (params, x["geometry"], x["pixels"]),
                            chunks * (1 + len(INTERVENTIONS)), pipe.forward_flops(vcfg, b, b, head)),
          plan_lib.Workload("accuracy_forward", "forward", predict_fn(vcfg), (params, x["tokens"], x["pixels"]),
                            chunks * passes, pipe.forward_flops(vcfg, b, b, longest - 1))]


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
  params = art.params if cfg.mesh is None else pipe.place(art.params, shd.make_mesh(cfg.mesh), cfg.strategy)
  predict = predict_fn(art.cfg)
  geo = geometry_metrics(art, batch, cfg.eval_batch, params)
  for m in MODULES:
    for metric in ("rid", "mixig", "delta_s", "delta_d"):
      v = geo[m][metric]
      res[f"{metric}.{m}"] = float(v.mean())
      if metric in ("rid", "mixig"):
        for l in range(n_layers):
          res[f"{metric}.{m}.layer{l}"] = float(v[l].mean())
  key = jax.random.PRNGKey(cfg.seed + 7)
  acc = {"none": accuracy(art, batch, cfg.eval_batch, params=params, predict=predict)}
  acc_layers = {}
  for name in INTERVENTIONS:
    iv, lm = _intervene(name, art, key, list(range(n_layers)), cfg.noise_std, params["lm"])
    acc[name] = accuracy(art, batch, cfg.eval_batch, intervention=iv, lm_params=lm, params=params, predict=predict)
    geo_iv = geometry_metrics(art, batch, cfg.eval_batch, params, intervention=iv, lm_params=lm)
    for m in MODULES:
      for metric in ("rid", "mixig"):
        res[f"{metric}.{m}.{name}"] = float(geo_iv[m][metric].mean())
    if cfg.per_layer:
      acc_layers[name] = []
      for l in range(n_layers):
        iv, lm = _intervene(name, art, key, [l], cfg.noise_std, params["lm"])
        acc_layers[name].append(accuracy(art, batch, cfg.eval_batch, intervention=iv, lm_params=lm, params=params,
                                         predict=predict))
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
