"""The full preset's inputs for STLLM (arXiv 2507.05258; see experiments/stllm/__init__.py): REA's question files,
the scene point clouds, the EPIC-KITCHENS frames and a LLaVA-Video-class LM, all by path and checked before
anything loads.

REA rows (the reference's LLaVA-style JSON list): {"scene_id": "P01_01", "pointcloud": "<file>.npy" ([N, >= 6]:
xyz, rgb in 0..255), "conversations": [{"value": question}, {"value": answer}], "metadata": {"query_start_frame",
"query_stop_frame", and the task as "question_type" or "task"}, optional "c2ws": a folder of "<frame>.txt" 4x4
camera-to-world matrices, "K": a text file of the frames' 3x3 intrinsics in their own pixels, scaled here to
`room.image_size` as the reference scales them; needed with `ray_freqs` > 0, which encodes the video patches' rays}. Frames: `frames_dir/<P01>/<P01_01>/frame_%010d.jpg` (or `frames_dir/<P01_01>/...`),
`room.n_frames` sampled uniformly from start to stop. The LM: a transformers directory with config.json,
safetensors and tokenizer.json (the preset's Qwen/Qwen2-7B-Instruct once downloaded), loaded as `lm_config` says;
the video and point placeholders take the last two ids of its embedding table.
"""
from __future__ import annotations

import json
import os

import numpy as np

from experiments.stllm import rea

TASK_NAMES = {t.replace("_", " "): t for t in rea.TASKS} | {t: t for t in rea.TASKS}


def _need(key: str, path, kind: str):
  ok = isinstance(path, str) and (
      os.path.isdir(path) if kind == "dir" else os.path.isfile(path))
  if not ok:
    raise ValueError(f"stllm full preset: {key} must be an existing {'directory' if kind == 'dir' else 'file'}, "
                     f"found {path!r}")


def check_paths(cfg) -> None:
  """One-line errors naming the first missing input."""
  _need("rea_path", cfg.rea_path, "file")
  _need("rea_test_path", cfg.rea_test_path, "file")
  _need("points_dir", cfg.points_dir, "dir")
  _need("frames_dir", cfg.frames_dir, "dir")
  _need("lm_path", cfg.lm_path, "dir")
  missing = [f for f in ("config.json", "tokenizer.json") if not os.path.isfile(os.path.join(cfg.lm_path, f))]
  if missing:
    raise FileNotFoundError(f"stllm full preset: lm_path {cfg.lm_path} needs config.json and tokenizer.json, "
                            f"missing {missing}")


def read_rows(path: str) -> list[dict]:
  """The REA rows of `path`, each checked for the fields used (one-line error naming the file and row)."""
  with open(path) as f:
    rows = json.load(f)
  if not isinstance(rows, list) or not rows:
    raise ValueError(f"{path}: expected a non-empty JSON list of REA rows, found {type(rows).__name__}")
  for i, r in enumerate(rows):
    meta = r.get("metadata", {}) if isinstance(r, dict) else {}
    task = str(meta.get("question_type", meta.get("task", ""))).lower()
    if not isinstance(r, dict) or not {"scene_id", "pointcloud", "conversations"} <= set(r) or len(
        r["conversations"]) < 2 or not {"query_start_frame", "query_stop_frame"} <= set(meta):
      raise ValueError(f"{path} row {i}: expected scene_id, pointcloud, two conversations and metadata "
                       f"query_start_frame / query_stop_frame, found keys {sorted(r) if isinstance(r, dict) else r!r}")
    if task not in TASK_NAMES:
      raise ValueError(f"{path} row {i}: metadata question_type must be one of {sorted(TASK_NAMES)}, found {task!r}")
  return rows


def split_items(cfg) -> dict:
  """The full run's splits: REA's scenes (`scene_id`) and questions (scene, clip frames, question text) of the
  training file (`train`) and the evaluation file (`test`)."""
  def items(path):
    rows = read_rows(path)
    return {"scenes": sorted({r["scene_id"] for r in rows}),
            "questions": [{"scene": r["scene_id"], "start": int(r["metadata"]["query_start_frame"]),
                           "stop": int(r["metadata"]["query_stop_frame"]),
                           "question": " ".join(r["conversations"][0]["value"].replace("<image>", "")
                                                .replace("<pointcloud>", "").split())} for r in rows]}
  check_paths(cfg)
  return {"train": items(cfg.rea_path), "test": items(cfg.rea_test_path)}


def _frame_dir(frames_dir: str, scene: str) -> str:
  flat = os.path.join(frames_dir, scene)
  return flat if os.path.isdir(flat) else os.path.join(frames_dir, scene.split("_")[0], scene)


def load_split(path: str, cfg) -> rea.Data:
  """Questions, point clouds (sampled / padded to `room.n_points`), frames and cameras of one REA file."""
  from PIL import Image
  rows, rc = read_rows(path), cfg.room
  rng = np.random.default_rng(cfg.seed)
  qs, xyz, rgb, mask, frames, c2ws, ks = [], [], [], [], [], [], []
  for i, r in enumerate(rows):
    meta = r["metadata"]
    task = TASK_NAMES[str(meta.get("question_type", meta.get("task"))).lower()]
    q = r["conversations"][0]["value"].replace("<image>", "").replace("<pointcloud>", "")
    qs.append(rea.Question(i, task, " ".join(q.split()), " ".join(r["conversations"][1]["value"].split())))
    pc_path = os.path.join(cfg.points_dir, r["pointcloud"])
    if not os.path.isfile(pc_path):
      raise FileNotFoundError(f"{path} row {i}: point cloud {pc_path} not found")
    pc = np.load(pc_path)
    take = rng.choice(len(pc), min(len(pc), rc.n_points), replace=False)
    pad = rc.n_points - len(take)
    xyz.append(np.pad(pc[take, :3], ((0, pad), (0, 0))).astype(np.float32))
    rgb.append(np.pad(pc[take, 3:6] / 255.0, ((0, pad), (0, 0))).astype(np.float32))
    mask.append(np.arange(rc.n_points) < len(take))
    lo, hi = int(meta["query_start_frame"]), int(meta["query_stop_frame"])
    idx = np.linspace(lo, hi, rc.n_frames).round().astype(int)
    d = _frame_dir(cfg.frames_dir, r["scene_id"])
    fr = []
    for k in idx:
      f = os.path.join(d, f"frame_{k:010d}.jpg")
      if not os.path.isfile(f):
        raise FileNotFoundError(f"{path} row {i}: frame {f} not found")
      im = Image.open(f)
      size_wh = im.size
      fr.append(np.asarray(im.convert("RGB").resize((rc.image_size,) * 2, Image.BICUBIC), np.float32) / 255)
    frames.append(np.stack(fr))
    ks.append(_intrinsics(cfg, r, i, path, size_wh))
    cams = np.tile(np.eye(4, dtype=np.float32), (rc.n_frames, 1, 1))
    if r.get("c2ws"):
      for j, k in enumerate(idx):
        p = os.path.join(cfg.points_dir, r["c2ws"], f"{k}.txt")
        if os.path.isfile(p):
          cams[j] = np.loadtxt(p).reshape(4, 4)
    c2ws.append(cams)
  return rea.Data(qs, np.stack(xyz), np.stack(rgb), np.stack(mask), np.stack(frames), np.stack(c2ws), np.stack(ks), [])


def _intrinsics(cfg, row: dict, i: int, path: str, size_wh) -> np.ndarray:
  """[3, 3] float32: the row's "K" file scaled from its frames' width x height to `room.image_size` square
  (fx, cx by the width's factor, fy, cy by the height's); without one, a placeholder that nothing reads (allowed
  only with ray_freqs=0)."""
  s = cfg.room.image_size
  if not row.get("K"):
    if cfg.ray_freqs:
      raise ValueError(f"{path} row {i}: no \"K\" (the frames' intrinsics file), which ray_freqs={cfg.ray_freqs} "
                       "needs for the video patches' rays; set ray_freqs=0 to run without ray encoding")
    return np.array([[s, 0, s / 2], [0, s, s / 2], [0, 0, 1]], np.float32)
  p = os.path.join(cfg.points_dir, row["K"])
  if not os.path.isfile(p):
    raise FileNotFoundError(f"{path} row {i}: intrinsics file {p} not found")
  k = np.loadtxt(p).reshape(3, 3)
  k[0] *= s / size_wh[0]
  k[1] *= s / size_wh[1]
  k[2] = (0, 0, 1)
  return k.astype(np.float32)


PARAM_DTYPE, COMPUTE_DTYPE = "float32", "bfloat16"  # the LM's params (AdamW's master copy) and compute dtype


def lm_config(text):
  """The LM's config as the full preset trains it: fp32 params, bf16 compute, each layer rematerialized."""
  return text.replace(param_dtype=PARAM_DTYPE, dtype=COMPUTE_DTYPE, remat=True)


def load(cfg):
  """(train, test, tokenizer, LM config, LM params, video id, points id) of the full preset."""
  from jaxlab import hf
  from jaxlab.data import load_tokenizer
  from jaxlab.models import transformer as tfm
  check_paths(cfg)
  text, params = hf.load(cfg.lm_path, PARAM_DTYPE)
  if not isinstance(text, tfm.Config):
    raise ValueError(f"lm_path {cfg.lm_path}: expected a decoder LM checkpoint, found {type(text).__name__}")
  text = lm_config(text)
  tok = load_tokenizer(cfg.lm_path)
  return (load_split(cfg.rea_path, cfg), load_split(cfg.rea_test_path, cfg), tok, text, params,
          text.vocab_size - 1, text.vocab_size - 2)
