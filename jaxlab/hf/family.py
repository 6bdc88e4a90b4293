"""The registry of Hugging Face checkpoint families: an explicit tuple, searched last match first.

`FAMILIES` lists every family `jaxlab.hf.load` and `save` know (decoder LMs, vision towers, diffusion LMs,
BERT-family encoders); `by_model_type` finds the one that reads a config.json's `model_type`, `family_of` the one
that saves a jaxlab config.
"""
from __future__ import annotations

from jaxlab.hf import decoder, encoder, llada, vision
from jaxlab.hf.spec import Family

FAMILIES: tuple[Family, ...] = (decoder.FAMILY, *vision.FAMILIES, llada.FAMILY, encoder.FAMILY)


def by_model_type(mt: str, families: tuple[Family, ...] = FAMILIES) -> Family:
  """The last family of `families` that reads config.json's `model_type` `mt`."""
  for fam in reversed(families):
    if mt in fam.model_types:
      return fam
  known = sorted(t for f in families for t in f.model_types)
  raise ValueError(f"unknown architecture: model_type {mt!r}; jaxlab loads {known}")


def family_of(cfg, families: tuple[Family, ...] = FAMILIES) -> Family:
  """The last family of `families` whose config class `cfg` is."""
  for fam in reversed(families):
    if isinstance(cfg, fam.config_cls):
      return fam
  raise TypeError(f"no Hugging Face family for config type {type(cfg).__name__}")
