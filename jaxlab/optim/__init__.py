"""Optimizers as optax GradientTransformations over registered param trees, and a registry by name.

`get(name, learning_rate, **hp)` builds any of `names()`: the SCALE family (arXiv 2506.16659: sgd, sgd_colnorm,
colnorm_momentum, scale), adamw, galore (arXiv 2403.03507), apollo / apollo_mini (arXiv 2412.05270) and muon.
Every optimizer tells matrices from vectors by the logical axes of `jaxlab.nn.axes` (stacked "layers" excluded).
The factories shadow their modules' names here; the modules are `scale_lib`, `galore_lib`, `apollo_lib`,
`muon_lib` (or `importlib.import_module("jaxlab.optim.scale")`).
"""
from __future__ import annotations

from typing import Callable

import optax

from jaxlab.optim import apollo as apollo_lib, galore as galore_lib, memory, muon as muon_lib, scale as scale_lib
from jaxlab.optim.apollo import apollo, apollo_mini
from jaxlab.optim.galore import galore
from jaxlab.optim.muon import muon
from jaxlab.optim.scale import colnorm_momentum, param_info, scale, sgd, sgd_colnorm

__all__ = ["REGISTRY", "adamw", "apollo", "apollo_lib", "apollo_mini", "colnorm_momentum", "galore", "galore_lib",
           "get", "memory", "muon", "muon_lib", "names", "param_info", "scale", "scale_lib", "sgd", "sgd_colnorm"]


def adamw(learning_rate: optax.ScalarOrSchedule, *, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          weight_decay: float = 0.0) -> optax.GradientTransformation:
  """optax.adamw with the papers' defaults (weight decay 0)."""
  return optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)


REGISTRY: dict[str, Callable[..., optax.GradientTransformation]] = {
    "adamw": adamw,
    "sgd": sgd,
    "sgd_colnorm": sgd_colnorm,
    "colnorm_momentum": colnorm_momentum,
    "scale": scale,
    "galore": galore,
    "apollo": apollo,
    "apollo_mini": apollo_mini,
    "muon": muon,
}


def names() -> list[str]:
  return list(REGISTRY)


def get(name: str, learning_rate: optax.ScalarOrSchedule, **hp) -> optax.GradientTransformation:
  """The optimizer `name` at `learning_rate` (a float or an optax schedule) with hyperparameters `hp`.

  Args:
    name: one of `names()`.
    learning_rate: peak learning rate or schedule.
    **hp: keyword hyperparameters of that optimizer's factory (e.g. adam_lr, rank, weight_decay).
  """
  if name not in REGISTRY:
    raise ValueError(f"unknown optimizer {name!r}; expected one of {names()}")
  return REGISTRY[name](learning_rate, **hp)
