"""Hugging Face checkpoints <-> jaxlab (config.json + safetensors), without torch.

`load(path)` reads a transformers-format directory (single or sharded safetensors, fp32/bf16/fp16), or a
llama.cpp `.gguf` file (jaxlab.hf.gguf), and returns (config, params) of the matching jaxlab family;
`save(path, cfg, params)` writes a directory that transformers' `from_pretrained` loads. `FAMILIES` is the
registry: every family load and save know, in lookup order (the last match wins; `jaxlab.hf.family`); a family
is a `jaxlab.hf.spec.Family`.
"""
from __future__ import annotations

import json
import os

import numpy as np

from jaxlab.hf import decoder, encoder, io, llada, spec as _spec, vision  # noqa: F401
from jaxlab.hf.family import FAMILIES, by_model_type, family_of  # noqa: F401
from jaxlab.hf.spec import Family, Tensor  # noqa: F401


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
  fam = by_model_type(d["model_type"]).for_checkpoint(d)
  cfg = fam.config_from_hf(d)
  tensors = io.read_dir(path)
  _spec.check(fam, cfg, tensors, path)
  params = _spec.to_params(fam, cfg, tensors, dtype)
  first = next(iter(tensors.values())) if tensors else None
  stored = _spec.dtype_name(dtype or (first.dtype if first is not None else np.float32))
  if hasattr(cfg, "param_dtype") and stored in ("float32", "bfloat16", "float16"):
    cfg = cfg.replace(param_dtype=stored)
  return cfg, params


def save(path: str, cfg, params, dtype=None, max_shard_bytes: int = 5 * 2**30, overwrite: bool = False) -> None:
  """Writes config.json and safetensors (sharded with an index past `max_shard_bytes`)."""
  if os.path.exists(os.path.join(path, "config.json")) and not overwrite:
    raise FileExistsError(f"{path} already holds a checkpoint; pass overwrite=True to replace it")
  fam = family_of(cfg)
  d = fam.config_to_hf(cfg)
  tensors = _spec.from_params(fam, cfg, params, dtype)
  _spec.check(fam, cfg, tensors, "params")
  d["torch_dtype"] = d["dtype"] = _spec.dtype_name(next(iter(tensors.values())).dtype)
  if os.path.isdir(path):  # weights being replaced, or debris of a save interrupted before config.json
    for name in os.listdir(path):
      if name.endswith(".safetensors") or name == io.INDEX:
        os.remove(os.path.join(path, name))
  io.write_dir(path, tensors, max_shard_bytes)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(d, f, indent=2)

