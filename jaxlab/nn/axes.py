"""Logical axis names for parameter pytrees.

Every parameter of every jaxlab model carries logical axis names ("vocab", "embed", "q_heads", "kv_heads",
"head_dim", "mlp", "layers", ...). A model family declares them as a value, its `AXES`: `Rules` of suffix
patterns of parameter paths with the names of the trailing dimensions; any extra leading dimension is a
stacked-layer axis named "layers". Rules compose with `+` (later rules refine earlier ones), so a model built
from parts passes the sum of its parts' rules. Optimizers (SCALE's fan-in normalization) and the sharding rules
take the rules of the tree they see: `logical_axes(params, tfm.AXES)`.

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


@dataclasses.dataclass(frozen=True)
class Rule:
  """Names for the params whose '/'-joined path ends with `pattern` (a regex over path components)."""
  pattern: str
  axes: Axes
  regex: re.Pattern = dataclasses.field(init=False, repr=False, compare=False)

  def __post_init__(self):
    if self.axes.fan_in is not None and self.axes.fan_in not in self.axes.names:
      raise ValueError(f"fan_in {self.axes.fan_in!r} is not one of the axis names {self.axes.names}")
    object.__setattr__(self, "regex", re.compile(rf"(^|.*/)(?:{self.pattern})$"))


@dataclasses.dataclass(frozen=True)
class Rules:
  """An ordered tuple of `Rule`s; the last rule matching a path gives its axes."""
  entries: tuple[Rule, ...] = ()

  def __add__(self, other: Rules) -> Rules:
    """`self` refined by `other`; rules of `other` already in `self` keep their place in `self`."""
    if not isinstance(other, Rules):
      return NotImplemented
    have = set(self.entries)
    return Rules(self.entries + tuple(r for r in other.entries if r not in have))

  def lookup(self, path: str, ndim: int) -> Axes:
    """The axes of the parameter at `path`, with leading stacked dimensions named "layers"."""
    for rule in reversed(self.entries):
      if rule.regex.match(path):
        extra = ndim - len(rule.axes.names)
        if extra < 0:
          raise ValueError(f"parameter {path!r} has {ndim} dims, its axes {rule.axes.names} need "
                           f"at least {len(rule.axes.names)}")
        return Axes((LAYERS,) * extra + rule.axes.names, rule.axes.fan_in)
    raise KeyError(f"no logical axes for parameter {path!r} (ndim {ndim}): none of the {len(self.entries)} "
                   "axis rules passed matches its path")


def rules(*specs) -> Rules:
  """`Rules` from (pattern, names) or (pattern, names, fan_in) triples, in order."""
  return Rules(tuple(Rule(pattern, Axes(tuple(names), fan_in)) for pattern, names, fan_in in
                     ((*s, None) if len(s) == 2 else s for s in specs)))


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


def require(rules, what: str) -> Rules:
  """`rules` when it is a `Rules`; otherwise a TypeError saying that `what` needs one."""
  if not isinstance(rules, Rules):
    raise TypeError(f"{what} needs the params' logical axis rules (a jaxlab.nn.axes.Rules such as "
                    f"transformer.AXES), found {type(rules).__name__}")
  return rules


def logical_axes(params, rules: Rules):
  """The pytree of logical-name tuples, structured like `params` (arrays or ShapeDtypeStructs)."""
  require(rules, "logical_axes")
  return jax.tree_util.tree_map_with_path(lambda p, x: rules.lookup(path_str(p), x.ndim).names, params)


def fan_in_axes(params, rules: Rules):
  """The pytree of fan-in axis indices (None where a parameter has none, e.g. norm scales)."""
  require(rules, "fan_in_axes")
  def one(p, x):
    axes = rules.lookup(path_str(p), x.ndim)
    return None if axes.fan_in is None else axes.names.index(axes.fan_in)
  return jax.tree_util.tree_map_with_path(one, params)
