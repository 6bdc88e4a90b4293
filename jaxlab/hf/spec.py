"""A model family's bridge to Hugging Face checkpoints: config translation plus a tensor name map.

Each family lists its tensors as `Tensor(hf_name, param_path, transpose)`; names containing "{i}" are per
layer and stack onto the leading `layers` axis of the jaxlab param. Loading checks every name and shape
before building anything, so a bad checkpoint fails with the tensor, the expected and the found shape.
The registry of families is `jaxlab.hf.family`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.hf.io import dtype_name  # noqa: F401  (re-exported: families name stored dtypes)


@dataclasses.dataclass(frozen=True)
class Tensor:
  hf: str  # e.g. "model.layers.{i}.self_attn.q_proj.weight"
  path: tuple[str, ...]  # e.g. ("layers", "attn", "q", "kernel")
  transpose: bool = False  # HF stores Linear weights [out, in]; jaxlab kernels are [in, out]
  n_layers: int | None = None  # layer count of a "{i}" tensor when it differs from the family's (sub-models)


@dataclasses.dataclass(frozen=True)
class Family:
  model_types: tuple[str, ...]
  config_cls: type
  config_from_hf: Callable[[dict], Any]
  config_to_hf: Callable[[Any], dict]  # must set "model_type" and "architectures"
  tensors: Callable[[Any], list[Tensor]]
  init: Callable  # init(cfg, key) -> params, used through jax.eval_shape for the expected shapes
  n_layers: Callable[[Any], int]
  ignore: tuple[str, ...] = ("rotary_emb.inv_freq",)  # substrings of checkpoint names that carry no params
  redundant: Callable[[Any], tuple[str, ...]] = lambda cfg: ()  # names allowed but unused (tied copies)
  # Prefix of every tensor name in the checkpoint a config.json dict describes (e.g. "bert." for BertFor*);
  # `save` writes the family's own names, without one.
  key_prefix: Callable[[dict], str] = lambda d: ""

  def for_checkpoint(self, d: dict) -> "Family":
    """The family reading the checkpoint whose config.json is `d` (its tensor names under `key_prefix(d)`)."""
    pre = self.key_prefix(d)
    if not pre:
      return self
    return dataclasses.replace(self, tensors=lambda cfg: [dataclasses.replace(t, hf=pre + t.hf)
                                                          for t in self.tensors(cfg)])


def _count(fam: "Family", cfg, t: Tensor) -> int:
  return fam.n_layers(cfg) if t.n_layers is None else t.n_layers


def _get(tree, path):
  for k in path:
    tree = tree[k]
  return tree


def set_path(tree, path, value):
  for k in path[:-1]:
    tree = tree.setdefault(k, {})
  tree[path[-1]] = value


def _hf_shape(t: Tensor, shape):
  return tuple(shape[::-1]) if t.transpose else tuple(shape)


def expected_shapes(fam: Family, cfg) -> dict[str, tuple[tuple[int, ...], Tensor]]:
  shapes = jax.eval_shape(lambda: fam.init(cfg, jax.random.key(0)))
  out = {}
  for t in fam.tensors(cfg):
    try:
      shape = _get(shapes, t.path).shape
    except KeyError as e:
      raise KeyError(f"tensor map entry {t.hf} points at missing param {'/'.join(t.path)}") from e
    if "{i}" in t.hf:
      for i in range(_count(fam, cfg, t)):
        out[t.hf.format(i=i)] = (_hf_shape(t, shape[1:]), t)
    else:
      out[t.hf] = (_hf_shape(t, shape), t)
  return out


def check(fam: Family, cfg, tensors: dict[str, np.ndarray], source: str) -> None:
  want = expected_shapes(fam, cfg)
  skip = set(fam.redundant(cfg))
  have = {k: v for k, v in tensors.items() if not any(s in k for s in fam.ignore) and k not in skip}
  missing = sorted(set(want) - set(have))
  unexpected = sorted(set(have) - set(want))
  problems = [f"missing tensor {k} (expected shape {want[k][0]})" for k in missing]
  problems += [f"unexpected tensor {k} (shape {tuple(have[k].shape)})" for k in unexpected]
  problems += [f"tensor {k}: expected shape {want[k][0]}, found {tuple(have[k].shape)}"
               for k in sorted(set(want) & set(have)) if tuple(have[k].shape) != want[k][0]]
  if problems:
    shown = "\n  ".join(problems[:20]) + (f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else "")
    raise ValueError(f"{source}: checkpoint does not match the {cfg.__class__.__module__} config:\n  {shown}")


def to_params(fam: Family, cfg, tensors: dict[str, np.ndarray], dtype=None) -> dict:
  params: dict = {}
  for t in fam.tensors(cfg):
    if "{i}" in t.hf:
      arr = np.stack([tensors[t.hf.format(i=i)] for i in range(_count(fam, cfg, t))])
    else:
      arr = tensors[t.hf]
    if t.transpose:
      arr = np.swapaxes(arr, -1, -2)
    set_path(params, t.path, jnp.asarray(arr, dtype=dtype or arr.dtype))
  return params


def from_params(fam: Family, cfg, params, dtype=None) -> dict[str, np.ndarray]:
  out = {}
  for t in fam.tensors(cfg):
    arr = np.asarray(jax.device_get(_get(params, t.path)))
    if dtype is not None:
      arr = arr.astype(dtype)
    if t.transpose:
      arr = np.swapaxes(arr, -1, -2)
    if "{i}" in t.hf:
      for i in range(_count(fam, cfg, t)):
        out[t.hf.format(i=i)] = np.ascontiguousarray(arr[i])
    else:
      out[t.hf] = np.ascontiguousarray(arr)
  return out


def stored_dtype(tensors: dict[str, np.ndarray], dtype=None) -> str | None:
  """The param dtype a loaded checkpoint's config should carry: `dtype` if given, else the first tensor's, when
  it is one of float32 / bfloat16 / float16 (None otherwise, and for no tensors without `dtype`)."""
  first = next(iter(tensors.values()), None)
  name = dtype_name(dtype or (first.dtype if first is not None else np.float32))
  return name if name in ("float32", "bfloat16", "float16") else None

