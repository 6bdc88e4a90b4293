"""Choice fields of config dataclasses, typed as `typing.Literal` and checked in one place.

A field annotated `Literal["a", "b"]`, `Literal["a", "b"] | None` or `tuple[Literal["a", "b"], ...]` holds one of
those values (or None, or a tuple of them). `check(cfg)` verifies every such field of a config (and of the configs
nested in it), failing with one line: `optimizer must be one of ['adamw', 'sgd'], found 'adam'`. `values(tp)` gives
a Literal's values in order, so that a module's tuple of names is derived from its type (`NAMES = values(Name)`),
and `same(names, tp)` fails at import when a table keyed by name (a dict of functions) drifts from its Literal.

Annotations may be strings (`from __future__ import annotations`): they are resolved with `typing.get_type_hints`.
"""
from __future__ import annotations

import dataclasses
import functools
import sys
import types
import typing
from typing import Any, Callable, Literal


def values(tp) -> tuple:
  """The values of a Literal type, in order (nested Literals flattened); a TypeError for any other type."""
  if typing.get_origin(tp) is not Literal:
    raise TypeError(f"expected a typing.Literal type, found {tp!r}")
  return typing.get_args(tp)


def same(names, tp) -> None:
  """Raises TypeError unless `names` (a tuple, or a dict's keys) are exactly the values of Literal `tp`, in order."""
  if tuple(names) != values(tp):
    raise TypeError(f"names {list(names)} differ from the values of {tp!r}")


def _choice(tp) -> tuple[str, tuple] | None:
  """("one" | "optional" | "each", allowed values) for a choice annotation; None for any other."""
  origin, args = typing.get_origin(tp), typing.get_args(tp)
  if origin is Literal:
    return "one", args
  if origin in (typing.Union, types.UnionType):
    rest = [a for a in args if a is not type(None)]
    if len(rest) == 1 and len(rest) < len(args) and typing.get_origin(rest[0]) is Literal:
      return "optional", typing.get_args(rest[0])
  if origin is tuple and len(args) == 2 and args[1] is Ellipsis and typing.get_origin(args[0]) is Literal:
    return "each", typing.get_args(args[0])
  return None


def hints(cls) -> dict[str, Any]:
  """The resolved annotations of a dataclass's fields; a field whose string annotation cannot be resolved (a class
  defined inside a function) is left out."""
  return dict(_hints(cls))


@functools.lru_cache(maxsize=None)
def _hints(cls) -> tuple[tuple[str, Any], ...]:
  try:
    resolved = typing.get_type_hints(cls)
  except (NameError, TypeError):
    resolved, scope = {}, dict(vars(sys.modules[cls.__module__])) if cls.__module__ in sys.modules else {}
    for f in dataclasses.fields(cls):
      try:
        resolved[f.name] = eval(f.type, scope) if isinstance(f.type, str) else f.type  # as get_type_hints does
      except Exception:  # noqa: BLE001  (a name local to the function that defined the class)
        continue
  return tuple((f.name, resolved[f.name]) for f in dataclasses.fields(cls) if f.name in resolved)


@functools.lru_cache(maxsize=None)
def _choices(cls) -> tuple[tuple[str, str, tuple], ...]:
  out = []
  for name, tp in _hints(cls):
    c = _choice(tp)
    if c is not None:
      out.append((name, *c))
  return tuple(out)


def _raise(message: str):
  raise ValueError(message)


def message(name: str, allowed, found) -> str:
  """The one-line error for a value outside a field's choices."""
  return f"{name} must be one of {list(allowed)}, found {found!r}"


def check(cfg, fail: Callable[[str], Any] = _raise, prefix: str = "", nested: bool = True) -> None:
  """Calls `fail(message)` (default: raises ValueError) for the first choice field of `cfg` whose value is not one
  of its Literal's values; with `nested`, the dataclass instances in its fields are checked too, their fields
  named `prefix` + `field.subfield`."""
  if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
    raise TypeError(f"choices.check expects a dataclass instance, found {type(cfg).__name__}")
  for name, kind, allowed in _choices(type(cfg)):
    v = getattr(cfg, name)
    if kind == "optional" and v is None:
      continue
    found = [x for x in (v if kind == "each" and isinstance(v, (tuple, list)) else (v,)) if x not in allowed]
    if found:
      fail(message(f"{prefix}{name}", allowed, found[0]))
  if nested:
    for f in dataclasses.fields(cfg):
      v = getattr(cfg, f.name, None)
      if dataclasses.is_dataclass(v) and not isinstance(v, type):
        check(v, fail, f"{prefix}{f.name}.", nested)
