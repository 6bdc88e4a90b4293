"""LoRA (arXiv:2106.09685) with rsLoRA scaling (arXiv:2312.03732) on any linear of any jaxlab model.

Targets are regexes over '/'-joined param paths, matched at the end of the path as in `jaxlab.nn.axes`
(shortcuts: q, k, v, o, gate, up, down, lm_head, all-linear). Model code is untouched: adapter params are a
separate flat dict keyed by the targeted kernel's path,

  {"layers/attn/q/kernel": {"lora_a": [L, in, r], "lora_b": [L, r, out]}},

and `merge(base, adapter, cfg)` returns params with kernel + scale * lora_a @ lora_b (per leading index), so
`tfm.forward(merge(base, adapter, cfg), ...)` is the adapter forward and `jax.grad` with respect to the
adapter tree trains only the adapter. In the paper's / PEFT's [out, in] orientation A = lora_a^T [r, in] and
B = lora_b^T [out, r]. Init as PEFT: A kaiming-uniform with a=sqrt(5) (U(+-1/sqrt(in))), B zeros. Scale
alpha/r, or alpha/sqrt(r) with rslora.

Logical axes: lora_a (in_name, "rank"), lora_b ("rank", out_name), where in/out names are the base kernel's
(e.g. ("embed", "rank") and ("rank", "q_heads") for attn/q), so adapters shard like their kernels and "rank"
stays replicated: `axis_rules(base_rules)` (e.g. `axis_rules(tfm.AXES)`) covers base params and adapters.

Axes: L stacked layers, r rank.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab import hf
from jaxlab.hf import io as hf_io
from jaxlab.nn import axes

SHORTCUTS = {
    "q": r"attn/q/kernel", "k": r"attn/k/kernel", "v": r"attn/v/kernel", "o": r"attn/o/kernel",
    "gate": r"mlp/gate/kernel", "up": r"mlp/up/kernel", "down": r"mlp/down/kernel", "lm_head": r"lm_head/kernel",
    "all-linear": r"(attn/(q|k|v|o)|mlp/(gate|up|down))/kernel",
}
ALL_LINEAR = ("q", "k", "v", "o", "gate", "up", "down")


@dataclasses.dataclass(frozen=True)
class Config:
  rank: int = 8
  alpha: float = 16.0
  targets: tuple[str, ...] = ("q", "v")  # shortcuts or path regexes
  rslora: bool = False

  def __post_init__(self):
    if isinstance(self.targets, str) or not isinstance(self.targets, tuple):
      object.__setattr__(self, "targets", (self.targets,) if isinstance(self.targets, str) else tuple(self.targets))
    if self.rank <= 0:
      raise ValueError(f"lora.Config: rank must be positive, found {self.rank}")
    if not self.targets:
      raise ValueError("lora.Config: targets must name at least one kernel, found none")
    compile_targets(self.targets)

  @property
  def scale(self) -> float:
    return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)

  def replace(self, **kw) -> "Config":
    return dataclasses.replace(self, **kw)


# ------------------------------------------------------------------------------------------ path utilities

def compile_targets(targets: Sequence[str]) -> list[re.Pattern]:
  out = []
  for t in targets:
    pat = SHORTCUTS.get(t, t)
    try:
      out.append(re.compile(rf"(^|.*/){pat}$"))
    except re.error as e:
      raise ValueError(f"target {t!r} is neither a shortcut {sorted(SHORTCUTS)} nor a valid regex: {e}") from None
  return out


def flatten(params) -> dict:
  """{'a/b/c': leaf} for a nested param dict."""
  return {axes.path_str(p): x for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}


def get_path(params, path: str):
  for k in path.split("/"):
    params = params[k]
  return params


def set_path(params, path: str, value):
  """A copy of `params` (copied along `path` only) with the leaf at `path` replaced."""
  k, _, rest = path.partition("/")
  out = dict(params)
  out[k] = set_path(params[k], rest, value) if rest else value
  return out


def target_paths(params, targets: Sequence[str]) -> dict[str, tuple[int, ...]]:
  """{path: shape} of the leaves matching any target; every target must match at least one matrix."""
  leaves = flatten(params)
  found = {}
  for t, rx in zip(targets, compile_targets(targets)):
    hits = [p for p in leaves if rx.match(p)]
    if not hits:
      kernels = sorted(p for p, x in leaves.items() if getattr(x, "ndim", 0) >= 2)
      raise ValueError(f"target {t!r} matched no parameter; matrices are {kernels}")
    for p in hits:
      if leaves[p].ndim < 2:
        raise ValueError(f"target {t!r} matched {p!r} of shape {leaves[p].shape}; expected a [.., in, out] kernel")
      found[p] = tuple(leaves[p].shape)
  return dict(sorted(found.items()))


def add_deltas(params, deltas: dict, sign: float = 1.0):
  """params with `sign * delta` added to each kernel named in `deltas` (computed in fp32, cast back)."""
  for path, d in deltas.items():
    w = get_path(params, path)
    if w.shape != d.shape:
      raise ValueError(f"{path}: kernel has shape {w.shape}, delta has {d.shape}")
    params = set_path(params, path, (w.astype(jnp.float32) + sign * d.astype(jnp.float32)).astype(w.dtype))
  return params


def kaiming_uniform(key, shape, fan_in: int, dtype=jnp.float32, a: float = math.sqrt(5)):
  """torch.nn.init.kaiming_uniform_(a=a): U(+-gain*sqrt(3/fan_in)), gain = sqrt(2/(1+a^2))."""
  bound = math.sqrt(2.0 / (1.0 + a * a)) * math.sqrt(3.0 / fan_in)
  return jax.random.uniform(key, shape, jnp.float32, -bound, bound).astype(dtype)


PRESETS = {"qv": Config(), "all": Config(targets=ALL_LINEAR), "rs-all": Config(targets=ALL_LINEAR, rslora=True)}


def axis_rules(base: axes.Rules) -> axes.Rules:
  """`base` plus the adapter leaves of every base matrix rule: lora_a (in_name, "rank"), lora_b ("rank", out_name)
  under the kernel's path, in/out names the kernel's last two."""
  adapters = []
  for rule in base.entries:
    if len(rule.axes.names) >= 2:
      i, o = rule.axes.names[-2:]
      adapters += [(rf"(?:{rule.pattern})/lora_a", (i, "rank"), i),
                   (rf"(?:{rule.pattern})/lora_b", ("rank", o), "rank")]
  return base + axes.rules(*adapters)


# ------------------------------------------------------------------------------------------------ LoRA

def init(cfg: Config, base_params, key, dtype=jnp.float32) -> dict:
  """Adapter params for every kernel matching `cfg.targets` (A kaiming-uniform, B zeros).

  Args:
    cfg: rank, alpha, targets.
    base_params: the model's params (arrays or ShapeDtypeStructs), only shapes are read.
    key: PRNG key.
    dtype: adapter param dtype.
  """
  paths = target_paths(base_params, cfg.targets)
  out = {}
  for k, (path, shape) in zip(jax.random.split(key, len(paths)), paths.items()):
    *lead, d_in, d_out = shape
    out[path] = {"lora_a": kaiming_uniform(k, (*lead, d_in, cfg.rank), d_in, dtype),
                 "lora_b": jnp.zeros((*lead, cfg.rank, d_out), dtype)}
  return out


def delta(leaf, scale: float):
  """scale * lora_a @ lora_b: the [.., in, out] kernel update, in fp32."""
  a, b = leaf["lora_a"].astype(jnp.float32), leaf["lora_b"].astype(jnp.float32)
  return scale * jnp.einsum("...ir,...ro->...io", a, b)


def deltas(adapter, cfg: Config) -> dict:
  return {p: delta(leaf, cfg.scale) for p, leaf in adapter.items()}


def merge(base_params, adapter, cfg: Config):
  """Effective params W + scale * A B for every adapted kernel (the adapter forward is the model on these)."""
  return add_deltas(base_params, deltas(adapter, cfg))


def unmerge(merged_params, adapter, cfg: Config):
  """Inverse of `merge`: W - scale * A B (exact up to floating-point rounding)."""
  return add_deltas(merged_params, deltas(adapter, cfg), sign=-1.0)


def linear(kernel, leaf, x, scale: float):
  """x @ W + scale * (x @ A) @ B without merging, for one (unstacked) kernel [in, out]."""
  return x @ kernel + scale * ((x @ leaf["lora_a"]) @ leaf["lora_b"])


def num_params(adapter) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(adapter))


# --------------------------------------------------------------------------------- frozen base via optax

def labels(params, trainable: Sequence[str]) -> dict:
  """A tree of "trainable" (path matches `re.search` of any pattern) or "frozen" labels."""
  rxs = [re.compile(t) for t in trainable]
  return jax.tree_util.tree_map_with_path(
      lambda p, _: "trainable" if any(rx.search(axes.path_str(p)) for rx in rxs) else "frozen", params)


def masked(tx: optax.GradientTransformation, params, trainable: Sequence[str]) -> optax.GradientTransformation:
  """`tx` on the trainable leaves, zero updates (no state, no weight decay) on the frozen ones.

  Args:
    tx: the optimizer of the trainable leaves.
    params: the full tree, e.g. {"base": base_params, "adapter": adapter}.
    trainable: path regexes (re.search), e.g. (r"^adapter/",).
  """
  return optax.multi_transform({"trainable": tx, "frozen": optax.set_to_zero()}, labels(params, trainable))


# --------------------------------------------------------------------------------------- PEFT layout

def _hf_modules(model_cfg) -> dict[str, tuple[str, bool]]:
  """{kernel path: (HF module name, possibly with "{i}", stacked?)} for the linears of the model's family."""
  fam = hf.family_of(model_cfg)
  out = {}
  for t in fam.tensors(model_cfg):
    if t.transpose and t.hf.endswith(".weight"):
      out["/".join(t.path)] = (t.hf[: -len(".weight")], "{i}" in t.hf)
  return out


def export_peft(path: str, adapter, cfg: Config, model_cfg, base_model_name_or_path: str | None = None) -> None:
  """Writes adapter_config.json + adapter_model.safetensors as PEFT's `save_pretrained` does.

  Args:
    path: output directory.
    adapter: params from `init` (targets must be linears of a family registered in jaxlab.hf).
    cfg: the adapter config.
    model_cfg: the base model's config (maps param paths to HF module names).
    base_model_name_or_path: recorded in adapter_config.json.
  """
  modules = _hf_modules(model_cfg)
  tensors, names = {}, set()
  for p, leaf in adapter.items():
    if p not in modules:
      raise ValueError(f"{p}: no Hugging Face module for this kernel; exportable kernels are {sorted(modules)}")
    mod, stacked = modules[p]
    a = np.asarray(jax.device_get(leaf["lora_a"]), np.float32)
    b = np.asarray(jax.device_get(leaf["lora_b"]), np.float32)
    items = [(mod.format(i=i), a[i], b[i]) for i in range(a.shape[0])] if stacked else [(mod, a, b)]
    for name, ai, bi in items:
      tensors[f"base_model.model.{name}.lora_A.weight"] = np.ascontiguousarray(ai.T)
      tensors[f"base_model.model.{name}.lora_B.weight"] = np.ascontiguousarray(bi.T)
    names.add(mod.rsplit(".", 1)[-1])
  conf = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": cfg.rank, "lora_alpha": cfg.alpha,
          "use_rslora": cfg.rslora, "target_modules": sorted(names), "lora_dropout": 0.0, "bias": "none",
          "fan_in_fan_out": False, "init_lora_weights": True, "use_dora": False, "rank_pattern": {},
          "alpha_pattern": {}, "modules_to_save": None, "layers_to_transform": None, "layers_pattern": None,
          "inference_mode": True, "base_model_name_or_path": base_model_name_or_path}
  os.makedirs(path, exist_ok=True)
  hf_io.write_file(os.path.join(path, "adapter_model.safetensors"), tensors)
  with open(os.path.join(path, "adapter_config.json"), "w") as f:
    json.dump(conf, f, indent=2)


def import_peft(path: str, model_cfg, dtype=jnp.float32) -> tuple[Config, dict]:
  """(cfg, adapter) from a PEFT LoRA directory for a base model with config `model_cfg`."""
  with open(os.path.join(path, "adapter_config.json")) as f:
    conf = json.load(f)
  if conf.get("peft_type") != "LORA":
    raise ValueError(f"{path}: expected peft_type LORA, found {conf.get('peft_type')!r}")
  for key in ("rank_pattern", "alpha_pattern"):
    if conf.get(key):
      raise ValueError(f"{path}: per-module {key} is not supported, found {conf[key]}")
  if conf.get("use_dora") or conf.get("fan_in_fan_out") or conf.get("bias", "none") != "none":
    raise ValueError(f"{path}: only plain LoRA (no DoRA, fan_in_fan_out, or biases) is supported")
  tensors = hf_io.read_file(os.path.join(path, "adapter_model.safetensors"))
  tensors = {re.sub(r"\.lora_(A|B)\.[^.]+\.weight$", r".lora_\1.weight", k): v for k, v in tensors.items()}
  adapter, used = {}, set()
  n_layers = getattr(model_cfg, "n_layers", None)
  for p, (mod, stacked) in _hf_modules(model_cfg).items():
    names = [mod.format(i=i) for i in range(n_layers)] if stacked else [mod]
    keys = [(f"base_model.model.{n}.lora_A.weight", f"base_model.model.{n}.lora_B.weight") for n in names]
    present = [ka in tensors for ka, _ in keys]
    if not any(present):
      continue
    if not all(present):
      raise ValueError(f"{path}: {mod} is adapted in only some layers; expected all {len(names)}")
    a = np.stack([tensors[ka].T for ka, _ in keys]) if stacked else tensors[keys[0][0]].T
    b = np.stack([tensors[kb].T for _, kb in keys]) if stacked else tensors[keys[0][1]].T
    adapter[p] = {"lora_a": jnp.asarray(a, dtype), "lora_b": jnp.asarray(b, dtype)}
    used.update(k for pair in keys for k in pair)
  unknown = sorted(set(tensors) - used)
  if unknown:
    raise ValueError(f"{path}: tensors with no matching model linear: {unknown[:5]}")
  if not adapter:
    raise ValueError(f"{path}: no LoRA tensors found")
  cfg = Config(rank=int(conf["r"]), alpha=float(conf["lora_alpha"]), targets=tuple(re.escape(p) for p in adapter),
               rslora=bool(conf.get("use_rslora", False)))
  return cfg, dict(sorted(adapter.items()))
