"""`--set key=value` overrides of frozen config dataclasses: typed parsing, dotted keys for nested configs,
validation with every override applied at once; `Required`, a preset's placeholder for a value the user must give."""
from __future__ import annotations

import ast
import dataclasses
import json
import types
import typing
from typing import Any

from jaxlab import choices


class OverrideError(ValueError):
  """A `--set key=value` that names no config field or does not parse as the field's type."""


class Required(str):
  """A preset's placeholder for a value only the user can give (a checkpoint, a dataset path), saying how to give
  it: `Required("--set model=PATH: a .gguf file or transformers directory")`.

  A str (its text), so a config holding one still validates and serializes; `unset_required(cfg)` finds them, and
  the runner refuses to start while one is left (`registry.config_for`).
  """
  __slots__ = ()

  def __repr__(self) -> str:
    return f"Required({str.__repr__(self)})"


class Hub(Required):
  """A preset's checkpoint or dataset named by its Hugging Face repo id: `Hub("GSAI-ML/LLaDA-8B-Instruct")`
  ("datasets/org/name" for a dataset). Before a run starts, `resolve_hubs` replaces it with the directory it was
  downloaded to (`jaxlab.hf.hub.local_path`); one not downloaded is an unset `Required` whose message is the command
  that fetches it. `experiments plan` reads its architecture without it (`jaxlab.hf.hub.architecture`)."""
  __slots__ = ()

  def __repr__(self) -> str:
    return f"Hub({str.__repr__(self)})"

  def how(self, key: str) -> str:
    from jaxlab.hf import hub
    return f"{self} is not downloaded: {hub.fetch_command(self)}, or --set {key}=PATH"


def resolve_hubs(cfg):
  """`cfg` with every `Hub` field (nested configs included) that is downloaded replaced by its local directory."""
  from jaxlab.hf import hub
  kw = {}
  for f in dataclasses.fields(cfg):
    v = getattr(cfg, f.name, None)
    if isinstance(v, Hub) and (path := hub.local_path(v)) is not None:
      kw[f.name] = path
    elif dataclasses.is_dataclass(v) and not isinstance(v, type):
      if (r := resolve_hubs(v)) is not v:
        kw[f.name] = r
  return dataclasses.replace(cfg, **kw) if kw else cfg


def unset_required(cfg, prefix: str = "") -> list[tuple[str, Required]]:
  """(dotted field name, placeholder) of every field of `cfg` (nested configs included) still holding a Required."""
  out = []
  for f in dataclasses.fields(cfg):
    v = getattr(cfg, f.name, None)
    if isinstance(v, Required):
      out.append((f"{prefix}{f.name}", v))
    elif dataclasses.is_dataclass(v) and not isinstance(v, type):
      out += unset_required(v, f"{prefix}{f.name}.")
  return out


def type_name(tp) -> str:
  """A field type as `--help` shows it; a Literal as its values joined by "|" ("adamw|sgd")."""
  origin, args = typing.get_origin(tp), typing.get_args(tp)
  if origin is typing.Literal:
    return "|".join(map(str, args))
  if any(typing.get_origin(a) is typing.Literal for a in args):
    if origin in (typing.Union, types.UnionType):
      return "|".join("None" if a is type(None) else type_name(a) for a in args)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
      return f"tuple[{type_name(args[0])}, ...]"
  return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _parse(text: str, tp, key: str):
  origin, args = typing.get_origin(tp), typing.get_args(tp)
  bad = OverrideError(f"--set {key}={text!r}: expected {type_name(tp)}")
  if tp is Any:
    try:
      return ast.literal_eval(text)
    except (ValueError, SyntaxError):
      return text
  if origin in (typing.Union, types.UnionType):
    if type(None) in args and text.strip().lower() in ("none", "null"):
      return None
    first = None
    for a in (a for a in args if a is not type(None)):
      try:
        return _parse(text, a, key)
      except OverrideError as e:
        first = first or (e if typing.get_origin(a) is typing.Literal else None)
    raise first or bad
  if origin is typing.Literal:
    for a in args:
      if str(a) == text:
        return a
    raise OverrideError(choices.message(key, args, text))
  if tp is bool:
    low = text.strip().lower()
    if low in ("true", "1", "yes", "on"):
      return True
    if low in ("false", "0", "no", "off"):
      return False
    raise bad
  if tp is int:
    try:
      return int(text.strip().replace("_", ""))
    except ValueError:
      raise bad from None
  if tp is float:
    try:
      return float(text)
    except ValueError:
      raise bad from None
  if tp is str:
    return text
  if origin in (tuple, list):
    try:
      items = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      items = [s for s in text.split(",") if s.strip()]
    if not isinstance(items, (tuple, list)):
      items = [items]
    elem = args[0] if args else Any
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis or origin is list:
      vals = [_parse(str(v), elem, key) for v in items]
    elif origin is tuple and args:
      if len(items) != len(args):
        raise OverrideError(f"--set {key}={text!r}: expected {len(args)} items, found {len(items)}")
      vals = [_parse(str(v), a, key) for v, a in zip(items, args)]
    else:
      vals = list(items)
    return tuple(vals) if origin is tuple else vals
  if dataclasses.is_dataclass(tp):
    raise OverrideError(f"--set {key}: is a nested config ({tp.__name__}); set its fields as {key}.<field>=...")
  raise OverrideError(f"--set {key}: fields of type {type_name(tp)} cannot be set from the command line")


def _replace_all(cfg, changes: dict, prefix: str = ""):
  """`cfg` with `changes` ({field: text, or {subfield: ...} for a nested config}) applied in one
  `dataclasses.replace` per config, so validation sees every override together (steps=2 with warmup_steps=1)."""
  if not dataclasses.is_dataclass(cfg):
    raise OverrideError(f"--set {prefix}{next(iter(changes))}: {prefix.rstrip('.')} is not a nested config")
  fields = {f.name for f in dataclasses.fields(cfg) if f.init}
  hints = choices.hints(type(cfg))
  values = {}
  for name, change in changes.items():
    if name not in fields:
      raise OverrideError(f"--set {prefix}{name}: unknown key {name!r} for {type(cfg).__name__}; "
                          f"known keys: {sorted(fields)}")
    if isinstance(change, dict):
      values[name] = _replace_all(getattr(cfg, name), change, f"{prefix}{name}.")
    else:
      values[name] = _parse(change, hints.get(name, Any), f"{prefix}{name}")
  return dataclasses.replace(cfg, **values)


def apply_overrides(cfg, items) -> Any:
  """`cfg` with `key=value` overrides (dotted keys reach nested configs: model.d_model=128).

  Each value is parsed as its field's annotated type (int, float, bool, str, X | None, tuple[...]);
  an unknown key, a bad value or a config that fails its own validation (checked once, with every
  override applied) raises OverrideError naming the keys, before anything else runs. A config class may map
  former flat keys to their nested places in a `renamed_keys` class variable ({"eval_every": "eval.every"}).
  """
  changes: dict = {}
  renamed = getattr(type(cfg), "renamed_keys", {})
  for item in items or ():
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
      raise OverrideError(f"--set expects key=value, found {item!r}")
    key = renamed.get(key, key)
    *parents, leaf = key.split(".")
    node = changes
    for part in parents:
      node = node.setdefault(part, {})
      if not isinstance(node, dict):
        raise OverrideError(f"--set {key}: {part!r} is set as a value and as a nested config")
    if isinstance(node.get(leaf), dict):
      raise OverrideError(f"--set {key}: is a nested config; set its fields as {key}.<field>=...")
    node[leaf] = text
  if not changes:
    return cfg
  try:
    return _replace_all(cfg, changes)
  except OverrideError:
    raise
  except (ValueError, TypeError) as e:
    given = " ".join(f"{i.partition('=')[0].strip()}={i.partition('=')[2]!r}" for i in items)
    raise OverrideError(f"--set {given}: {e}") from e


def config_dict(cfg) -> dict:
  return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def flatten(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    key = f"{prefix}{k}"
    if isinstance(v, dict):
      out.update(flatten(v, key + "."))
    else:
      out[key] = v
  return out
