"""The optimizers of jaxlab.optim by name: `get(name, learning_rate, **hp)` and `names()`."""
from __future__ import annotations

import inspect
from typing import Callable, Literal

import optax

from jaxlab import choices
from jaxlab.nn.axes import Rules
from jaxlab.optim.apollo import apollo, apollo_mini
from jaxlab.optim.galore import galore
from jaxlab.optim.muon import muon
from jaxlab.optim.scale import colnorm_momentum, scale, sgd, sgd_colnorm


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
Optimizer = Literal["adamw", "sgd", "sgd_colnorm", "colnorm_momentum", "scale", "galore", "apollo", "apollo_mini",
                   "muon"]  # the names of REGISTRY, as a config field's type
choices.same(REGISTRY, Optimizer)


def names() -> list[str]:
  return list(REGISTRY)


def get(name: str, learning_rate: optax.ScalarOrSchedule, *, axes: Rules | None = None,
        **hp) -> optax.GradientTransformation:
  """The optimizer `name` at `learning_rate` (a float or an optax schedule) with hyperparameters `hp`.

  Args:
    name: one of `names()`.
    learning_rate: peak learning rate or schedule.
    axes: the params' logical axis rules (e.g. `tfm.AXES`), for every optimizer that tells matrices from vectors
      (all but adamw, which ignores them).
    **hp: keyword hyperparameters of that optimizer's factory (e.g. adam_lr, rank, weight_decay).
  """
  if name not in REGISTRY:
    raise ValueError(f"unknown optimizer {name!r}; expected one of {names()}")
  factory = REGISTRY[name]
  if "axes" in inspect.signature(factory).parameters:
    if axes is None:
      raise TypeError(f"optimizer {name!r} needs the params' logical axis rules: pass axes= (e.g. "
                      "transformer.AXES)")
    hp["axes"] = axes
  return factory(learning_rate, **hp)
