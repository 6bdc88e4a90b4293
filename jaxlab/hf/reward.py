"""Reward models in the transformers layouts the public PRM checkpoints use: a decoder LM plus a head
(jaxlab.models.heads) in one directory.

- step head, Qwen2.5-Math-PRM (arXiv 2501.07301): architecture `Qwen2ForProcessRewardModel`, `num_labels` 2,
  tensors `model.*` (the decoder, no `lm_head`) and `score.0` (D -> D), `score.2` (D -> 2).
- value head, Skywork-o1-Open-PRM: architecture `Qwen2ForPrmModel`, the causal LM's tensors (`model.*`,
  `lm_head` unless tied) and `v_head.summary` (D -> 1).

A checkpoint without `lm_head` loads with the LM head tied to the embedding, so `transformer.forward` runs; its
logits are then not a language model's, but the hidden states every head reads are exact. `load(path)` returns
(lm_cfg, lm_params, head_cfg, head_params); `save` writes a directory `load` (and the checkpoints' own modeling
code, with `trust_remote_code`) reads back.
"""
from __future__ import annotations

import dataclasses

from jaxlab.hf import io, spec
from jaxlab.hf.family import by_model_type, family_of
from jaxlab.models import heads

ARCHITECTURES = {"step": "Qwen2ForProcessRewardModel", "value": "Qwen2ForPrmModel"}
_PREFIX = {"step": "score.", "value": "v_head."}


def _head_tensors(cfg: heads.Config) -> list[spec.Tensor]:
  if cfg.kind == "value":
    return [spec.Tensor("v_head.summary.weight", ("v_head", "summary", "kernel"), True),
            spec.Tensor("v_head.summary.bias", ("v_head", "summary", "bias"))]
  return [spec.Tensor(f"score.{i}.{w}", ("score", name, k), w == "weight")
          for i, name in ((0, "dense"), (2, "out")) for w, k in (("weight", "kernel"), ("bias", "bias"))]


def _head_family(kind: str) -> spec.Family:
  return spec.Family(model_types=(ARCHITECTURES[kind],), config_cls=heads.Config, config_from_hf=None,
                     config_to_hf=None, tensors=_head_tensors, init=heads.init, n_layers=lambda c: 0)


def kind_of(config: dict, source: str = "config.json") -> str:
  """"step" or "value" from a checkpoint's `architectures`."""
  found = config.get("architectures") or []
  for kind, arch in ARCHITECTURES.items():
    if arch in found:
      return kind
  raise ValueError(f"{source}: expected a reward model with architectures {sorted(ARCHITECTURES.values())}, "
                   f"found {found}")


def load(path: str, dtype=None):
  """(lm_cfg, lm_params, head_cfg, head_params) of a reward-model directory."""
  d = io.read_config(path)
  kind = kind_of(d, f"{path}/config.json")
  tensors = io.read_dir(path)
  prefix = _PREFIX[kind]
  head_t = {k: v for k, v in tensors.items() if k.startswith(prefix)}
  lm_t = {k: v for k, v in tensors.items() if not k.startswith(prefix)}
  if "lm_head.weight" not in lm_t:
    d = {**d, "tie_word_embeddings": True}
  fam = by_model_type(d["model_type"]).for_checkpoint(d)
  lm_cfg = fam.config_from_hf(d)
  spec.check(fam, lm_cfg, lm_t, path)
  lm_params = spec.to_params(fam, lm_cfg, lm_t, dtype)
  stored = spec.stored_dtype(lm_t, dtype)
  if stored:
    lm_cfg = lm_cfg.replace(param_dtype=stored)
  head_cfg = heads.Config(kind=kind, d_model=lm_cfg.d_model)
  hfam = _head_family(kind)
  spec.check(hfam, head_cfg, head_t, path)
  head_params = spec.to_params(hfam, head_cfg, head_t, dtype)
  return lm_cfg, lm_params, dataclasses.replace(head_cfg, param_dtype=stored or head_cfg.param_dtype), head_params


def save(path: str, lm_cfg, lm_params, head_cfg: heads.Config, head_params, dtype=None,
         max_shard_bytes: int = 5 * 2**30, overwrite: bool = False) -> None:
  """Writes the LM and its head as one checkpoint of the head's layout (a step PRM drops `lm_head`)."""
  if head_cfg.d_model != lm_cfg.d_model:
    raise ValueError(f"head d_model {head_cfg.d_model} does not match the LM's d_model {lm_cfg.d_model}")
  io.check_writable(path, overwrite)
  fam = family_of(lm_cfg)
  d = fam.config_to_hf(lm_cfg)
  tensors = spec.from_params(fam, lm_cfg, lm_params, dtype)
  if head_cfg.kind == "step":
    tensors.pop("lm_head.weight", None)
  d.update(architectures=[ARCHITECTURES[head_cfg.kind]], num_labels=head_cfg.classes)
  hfam = _head_family(head_cfg.kind)
  head_t = spec.from_params(hfam, head_cfg, head_params, dtype)
  spec.check(hfam, head_cfg, head_t, "head params")
  io.write_checkpoint(path, d, {**tensors, **head_t}, max_shard_bytes)
