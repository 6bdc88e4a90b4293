"""Hugging Face checkpoints <-> jaxlab (config.json + safetensors), without torch.

`load(path)` reads a transformers-format directory (single or sharded safetensors, fp32/bf16/fp16), or a
llama.cpp `.gguf` file (jaxlab.hf.gguf), and returns (config, params) of the matching jaxlab family;
`save(path, cfg, params)` writes a directory that transformers' `from_pretrained` loads. Whisper goes through
`jaxlab.hf.whisper` (also CTranslate2 directories), reward models (an LM and its head) through
`jaxlab.hf.reward`. `FAMILIES` is the
registry: every family load and save know, in lookup order (the last match wins; `jaxlab.hf.family`); a family
is a `jaxlab.hf.spec.Family`.
"""
from __future__ import annotations

import os

from jaxlab.hf import decoder, encoder, io, llada, reward, spec as _spec, vision, whisper  # noqa: F401
from jaxlab.hf.io import read_config  # noqa: F401
from jaxlab.hf.family import FAMILIES, by_model_type, family_of  # noqa: F401
from jaxlab.hf.spec import Family, Tensor  # noqa: F401


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
  if d["model_type"] == "whisper":
    return whisper.load_transformers(path, dtype)
  if set(d.get("architectures") or ()) & set(reward.ARCHITECTURES.values()):
    raise ValueError(f"{path} holds a reward model ({d['architectures'][0]}): load it with jaxlab.hf.reward.load")
  fam = by_model_type(d["model_type"]).for_checkpoint(d)
  cfg = fam.config_from_hf(d)
  tensors = io.read_dir(path)
  _spec.check(fam, cfg, tensors, path)
  params = _spec.to_params(fam, cfg, tensors, dtype)
  stored = _spec.stored_dtype(tensors, dtype)
  if hasattr(cfg, "param_dtype") and stored:
    cfg = cfg.replace(param_dtype=stored)
  return cfg, params


def save(path: str, cfg, params, dtype=None, max_shard_bytes: int = 5 * 2**30, overwrite: bool = False) -> None:
  """Writes config.json and safetensors (sharded with an index past `max_shard_bytes`)."""
  io.check_writable(path, overwrite)
  if isinstance(cfg, whisper.whisper.Config):
    return whisper.save(path, cfg, params, dtype=dtype, max_shard_bytes=max_shard_bytes)
  fam = family_of(cfg)
  d = fam.config_to_hf(cfg)
  tensors = _spec.from_params(fam, cfg, params, dtype)
  _spec.check(fam, cfg, tensors, "params")
  io.write_checkpoint(path, d, tensors, max_shard_bytes)
