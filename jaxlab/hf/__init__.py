"""Hugging Face checkpoints <-> jaxlab (config.json + safetensors), without torch.

`load(path)` reads a transformers-format directory (single or sharded safetensors, fp32/bf16/fp16), or a
llama.cpp `.gguf` file (jaxlab.hf.gguf), and returns (config, params) of the matching jaxlab family;
`save(path, cfg, params)` writes a directory that transformers' `from_pretrained` loads. `FAMILIES` is the
registry: every family load and save know, in lookup order (the last match wins; `jaxlab.hf.family`).
"""
from __future__ import annotations

import json
import os

import numpy as np

from jaxlab.hf import decoder, encoder, family as _family, io, llada, vision
from jaxlab.hf.family import Family, Tensor

FAMILIES: tuple[Family, ...] = (decoder.FAMILY, *vision.FAMILIES, llada.FAMILY, encoder.FAMILY)


def family_of(cfg) -> Family:
  """The family of FAMILIES that saves `cfg`'s config class."""
  return _family.family_of(cfg, FAMILIES)


def read_config(path: str) -> dict:
  f = os.path.join(path, "config.json")
  if not os.path.exists(f):
    raise FileNotFoundError(f"{path}: expected a transformers-format directory with config.json")
  with open(f) as fh:
    return json.load(fh)


def load(path: str, dtype=None):
  """(cfg, params) from a transformers-format directory or a `.gguf` file (jaxlab.hf.gguf).

  `dtype` casts params (default: as stored; float32 for GGUF, whose tensors are dequantized).
  """
  if os.fspath(path).endswith(".gguf"):
    from jaxlab.hf import gguf as _gguf
    return _gguf.load(path, dtype)
  d = read_config(path)
  if "model_type" not in d:
    raise ValueError(f"{path}/config.json has no model_type")
  fam = _family.by_model_type(d["model_type"], FAMILIES).for_checkpoint(d)
  cfg = fam.config_from_hf(d)
  tensors = io.read_dir(path)
  _family.check(fam, cfg, tensors, path)
  params = _family.to_params(fam, cfg, tensors, dtype)
  first = next(iter(tensors.values())) if tensors else None
  stored = _family.dtype_name(dtype or (first.dtype if first is not None else np.float32))
  if hasattr(cfg, "param_dtype") and stored in ("float32", "bfloat16", "float16"):
    cfg = cfg.replace(param_dtype=stored)
  return cfg, params


def save(path: str, cfg, params, dtype=None, max_shard_bytes: int = 5 * 2**30, overwrite: bool = False) -> None:
  """Writes config.json and safetensors (sharded with an index past `max_shard_bytes`)."""
  if os.path.exists(os.path.join(path, "config.json")) and not overwrite:
    raise FileExistsError(f"{path} already holds a checkpoint; pass overwrite=True to replace it")
  fam = family_of(cfg)
  d = fam.config_to_hf(cfg)
  tensors = _family.from_params(fam, cfg, params, dtype)
  _family.check(fam, cfg, tensors, "params")
  d["torch_dtype"] = d["dtype"] = _family.dtype_name(next(iter(tensors.values())).dtype)
  if os.path.isdir(path):  # weights being replaced, or debris of a save interrupted before config.json
    for name in os.listdir(path):
      if name.endswith(".safetensors") or name == io.INDEX:
        os.remove(os.path.join(path, name))
  io.write_dir(path, tensors, max_shard_bytes)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(d, f, indent=2)

