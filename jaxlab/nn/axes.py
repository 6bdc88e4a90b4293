"""Logical axis names for parameter pytrees.

Every parameter of every jaxlab model carries logical axis names ("vocab", "embed", "q_heads", "kv_heads",
"head_dim", "mlp", "layers", ...). Model families register suffix patterns of parameter paths with the names
of the trailing dimensions; any extra leading dimension is a stacked-layer axis named "layers". Optimizers
(SCALE's fan-in normalization) and the sharding rules read the names from here, so a plain param tree is
enough: `logical_axes(params)` needs no config.

Each pattern may also name its fan-in axis (the axis a linear map contracts over, or "vocab" for a token
embedding), used by per-output-unit normalizations.
"""
from __future__ import annotations

import dataclasses
import re

import jax

LAYERS = "layers"


@dataclasses.dataclass(frozen=True)
class Axes:
  names: tuple[str, ...]
  fan_in: str | None = None


_RULES: list[tuple[re.Pattern, Axes]] = []


def register(pattern: str, names: tuple[str, ...], fan_in: str | None = None) -> None:
  """Registers names for params whose '/'-joined path ends with `pattern` (a regex over path components)."""
  if fan_in is not None and fan_in not in names:
    raise ValueError(f"fan_in {fan_in!r} is not one of the axis names {names}")
  _RULES.append((re.compile(rf"(^|.*/){pattern}$"), Axes(tuple(names), fan_in)))


def path_str(path) -> str:
  """'a/b/c' for a jax key path (dict keys, sequence indices and attributes)."""
  parts = []
  for k in path:
    for attr in ("key", "idx", "name"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
    else:
      parts.append(str(k))
  return "/".join(parts)


def lookup(path: str, ndim: int) -> Axes:
  """The registered axes of one parameter, with leading stacked dimensions named "layers"."""
  for rx, axes in reversed(_RULES):  # later registrations refine earlier ones
    if rx.match(path):
      extra = ndim - len(axes.names)
      if extra < 0:
        raise ValueError(f"parameter {path!r} has {ndim} dims, its registered axes {axes.names} need "
                         f"at least {len(axes.names)}")
      return Axes((LAYERS,) * extra + axes.names, axes.fan_in)
  raise KeyError(f"no logical axes registered for parameter {path!r} (ndim {ndim}); "
                 "register them with jaxlab.nn.axes.register")


def logical_axes(params):
  """The pytree of logical-name tuples, structured like `params` (arrays or ShapeDtypeStructs)."""
  return jax.tree_util.tree_map_with_path(lambda p, x: lookup(path_str(p), x.ndim).names, params)


def fan_in_axes(params):
  """The pytree of fan-in axis indices (None where a parameter has none, e.g. norm scales)."""
  def one(p, x):
    axes = lookup(path_str(p), x.ndim)
    return None if axes.fan_in is None else axes.names.index(axes.fan_in)
  return jax.tree_util.tree_map_with_path(one, params)
