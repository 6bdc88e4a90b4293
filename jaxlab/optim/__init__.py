"""Optimizers as optax GradientTransformations over param trees with logical axis rules, and a registry by name.

`get(name, learning_rate, **hp)` builds any of `names()`: the SCALE family (arXiv 2506.16659: sgd, sgd_colnorm,
colnorm_momentum, scale), adamw, galore (arXiv 2403.03507), apollo / apollo_mini (arXiv 2412.05270) and muon.
Every optimizer but adamw tells matrices from vectors by the params' logical axes, so it takes their rules
(`axes=tfm.AXES`, see `jaxlab.nn.axes`; stacked "layers" excluded).
The factories shadow their modules' names here; the modules are `scale_lib`, `galore_lib`, `apollo_lib`,
`muon_lib` (or `importlib.import_module("jaxlab.optim.scale")`).
"""
from __future__ import annotations

from jaxlab.optim import apollo as apollo_lib, galore as galore_lib, memory, muon as muon_lib, scale as scale_lib
from jaxlab.optim.apollo import apollo, apollo_mini
from jaxlab.optim.galore import galore
from jaxlab.optim.muon import muon
from jaxlab.optim.registry import REGISTRY, Optimizer, adamw, get, names
from jaxlab.optim.scale import colnorm_momentum, param_info, scale, sgd, sgd_colnorm

__all__ = ["REGISTRY", "Optimizer", "adamw", "apollo", "apollo_lib", "apollo_mini", "colnorm_momentum", "galore",
           "galore_lib", "get", "memory", "muon", "muon_lib", "names", "param_info", "scale", "scale_lib", "sgd",
           "sgd_colnorm"]
