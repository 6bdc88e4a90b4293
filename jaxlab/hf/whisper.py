"""Whisper checkpoints <-> jaxlab.models.whisper (arXiv 2212.04356): transformers and CTranslate2 layouts.

`load_transformers(dir)` reads a `WhisperForConditionalGeneration` directory (config.json + safetensors);
`save(dir, cfg, params)` writes one that transformers' `from_pretrained` loads. `load_ctranslate2(dir)` parses
a CTranslate2 Whisper `model.bin` with NumPy. Its layout (binary version 5 and 6): uint32 version, the spec name
and revision, uint32 variable count, then per variable a name, uint8 rank, uint32 dims, uint8 dtype id
(float32, int8, int16, int32, float16, bfloat16) and uint32 byte count followed by the raw data, and finally
aliases (name -> name). Strings are a uint16 length (including a trailing NUL) then the bytes. Quantized int8 /
int16 weights come with a `<name>_scale` per output row (float = int / scale). CTranslate2 fuses the
self-attention q/k/v (and the cross-attention k/v) rows into one matrix; the released models' key bias is zero
(any key bias only shifts every score of a query by the same amount, so it never changes attention).
`load(dir)` picks the layout from the files present.
"""
from __future__ import annotations

import json
import os
import re
import struct

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.hf import io
from jaxlab.models import whisper

# (name suffix, param path, kind): kind "linear" transposes [out, in] -> [in, out], "conv" [O, I, W] -> [W, I, O].
_ATTN = [("{p}.q_proj", ("q",)), ("{p}.k_proj", ("k",)), ("{p}.v_proj", ("v",)), ("{p}.out_proj", ("o",))]


def _hf_names(cfg: whisper.Config) -> list[tuple[str, tuple[str, ...], str]]:
  out = []
  lin = lambda hf, path, bias=True: [(hf + ".weight", path + ("kernel",), "linear")] + (
      [(hf + ".bias", path + ("bias",), "plain")] if bias else [])
  ln = lambda hf, path: [(hf + ".weight", path + ("scale",), "plain"), (hf + ".bias", path + ("bias",), "plain")]

  def attn(hf, path):
    rows = []
    for name, sub in _ATTN:
      rows += lin(name.format(p=hf), path + sub, bias=sub != ("k",))
    return rows

  E, D = "model.encoder.", "model.decoder."
  for n in ("conv1", "conv2"):
    out += [(f"{E}{n}.weight", ("encoder", n, "kernel"), "conv"), (f"{E}{n}.bias", ("encoder", n, "bias"), "plain")]
  el, dl = E + "layers.{i}.", D + "layers.{i}."
  out += attn(el + "self_attn", ("encoder", "layers", "attn")) + ln(el + "self_attn_layer_norm",
                                                                   ("encoder", "layers", "attn_norm"))
  out += lin(el + "fc1", ("encoder", "layers", "mlp", "up")) + lin(el + "fc2", ("encoder", "layers", "mlp", "down"))
  out += ln(el + "final_layer_norm", ("encoder", "layers", "mlp_norm"))
  out += ln(E + "layer_norm", ("encoder", "final_norm"))
  out += [(D + "embed_tokens.weight", ("decoder", "embed", "embedding"), "plain"),
          (D + "embed_positions.weight", ("decoder", "pos_embed"), "plain")]
  out += attn(dl + "self_attn", ("decoder", "layers", "attn")) + ln(dl + "self_attn_layer_norm",
                                                                   ("decoder", "layers", "attn_norm"))
  out += attn(dl + "encoder_attn", ("decoder", "layers", "cross_attn"))
  out += ln(dl + "encoder_attn_layer_norm", ("decoder", "layers", "cross_norm"))
  out += lin(dl + "fc1", ("decoder", "layers", "mlp", "up")) + lin(dl + "fc2", ("decoder", "layers", "mlp", "down"))
  out += ln(dl + "final_layer_norm", ("decoder", "layers", "mlp_norm"))
  out += ln(D + "layer_norm", ("decoder", "final_norm"))
  return out


def _get(tree, path):
  for k in path:
    tree = tree[k]
  return tree


def _set(tree, path, value):
  for k in path[:-1]:
    tree = tree.setdefault(k, {})
  tree[path[-1]] = value


def _relayout(a: np.ndarray, kind: str) -> np.ndarray:
  """HF <-> jaxlab layout of one tensor (each transposition is its own inverse)."""
  if kind == "linear":
    return np.swapaxes(a, -1, -2)
  if kind == "conv":
    return np.transpose(a, (2, 1, 0))
  return a


def _check_shapes(cfg: whisper.Config, params, source: str) -> None:
  want = jax.eval_shape(lambda: whisper.init(cfg, jax.random.key(0)))
  bad = []
  for path, w in jax.tree_util.tree_flatten_with_path(want)[0]:
    names = tuple(k.key for k in path)
    try:
      got = tuple(_get(params, names).shape)
    except KeyError:
      bad.append(f"missing {'/'.join(names)} (expected shape {w.shape})")
      continue
    if got != tuple(w.shape):
      bad.append(f"{'/'.join(names)}: expected shape {tuple(w.shape)}, found {got}")
  if bad:
    raise ValueError(f"{source}: weights do not match the whisper config:\n  " + "\n  ".join(bad[:20]))


def config_from_hf(d: dict) -> whisper.Config:
  if d.get("model_type") != "whisper":
    raise ValueError(f"expected a whisper config.json (model_type 'whisper'), found model_type "
                     f"{d.get('model_type')!r}")
  if d.get("activation_function", "gelu") != "gelu" or d.get("scale_embedding", False):
    raise NotImplementedError(f"whisper: expected activation_function 'gelu' and scale_embedding false, found "
                              f"{d.get('activation_function')!r}, {d.get('scale_embedding')!r}")
  if d.get("d_model") is None:
    raise ValueError("whisper config.json has no d_model")
  return whisper.Config(
      vocab_size=d["vocab_size"], n_mels=d["num_mel_bins"], d_model=d["d_model"], encoder_layers=d["encoder_layers"],
      encoder_heads=d["encoder_attention_heads"], encoder_ffn=d["encoder_ffn_dim"], decoder_layers=d["decoder_layers"],
      decoder_heads=d["decoder_attention_heads"], decoder_ffn=d["decoder_ffn_dim"],
      max_source_positions=d["max_source_positions"], max_target_positions=d["max_target_positions"],
      init_std=d.get("init_std", 0.02))


def config_to_hf(cfg: whisper.Config, tokens: dict | None = None) -> dict:
  """config.json for `cfg`; `tokens` overrides the special token ids (decoder_start_token_id, eos, ...)."""
  d = {"architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper", "vocab_size": cfg.vocab_size,
       "num_mel_bins": cfg.n_mels, "d_model": cfg.d_model, "encoder_layers": cfg.encoder_layers,
       "encoder_attention_heads": cfg.encoder_heads, "encoder_ffn_dim": cfg.encoder_ffn,
       "decoder_layers": cfg.decoder_layers, "decoder_attention_heads": cfg.decoder_heads,
       "decoder_ffn_dim": cfg.decoder_ffn, "max_source_positions": cfg.max_source_positions,
       "max_target_positions": cfg.max_target_positions, "activation_function": "gelu", "scale_embedding": False,
       "init_std": cfg.init_std, "tie_word_embeddings": True, "is_encoder_decoder": True, "use_cache": True}
  return {**d, **(tokens or {})}


def load_transformers(path: str, dtype=None):
  """(cfg, params) from a transformers `WhisperForConditionalGeneration` / `WhisperModel` directory."""
  f = os.path.join(path, "config.json")
  if not os.path.exists(f):
    raise FileNotFoundError(f"{path}: expected a transformers Whisper directory with config.json")
  with open(f) as fh:
    cfg = config_from_hf(json.load(fh))
  tensors = io.read_dir(path)
  prefix = "" if any(k.startswith("model.") for k in tensors) else "model."
  params: dict = {}
  for hf, p, kind in _hf_names(cfg):
    name = hf[len("model."):] if prefix else hf
    n = cfg.encoder_layers if p[0] == "encoder" else cfg.decoder_layers
    names = [name.format(i=i) for i in range(n)] if "{i}" in name else [name]
    missing = [k for k in names if k not in tensors]
    if missing:
      raise ValueError(f"{path}: missing tensor {missing[0]}")
    arr = np.stack([tensors[k] for k in names]) if "{i}" in name else tensors[name]
    _set(params, p, np.asarray(_relayout(arr, kind)))
  _check_shapes(cfg, params, path)
  params = jax.tree.map(lambda a: jnp.asarray(a, dtype=dtype or a.dtype), params)
  return cfg, params


def save(path: str, cfg: whisper.Config, params, tokens: dict | None = None, dtype=None,
         max_shard_bytes: int = 5 * 2**30) -> None:
  """Writes config.json and model.safetensors in the `WhisperForConditionalGeneration` layout."""
  _check_shapes(cfg, params, "params")
  out = {}
  for hf, p, kind in _hf_names(cfg):
    arr = np.asarray(jax.device_get(_get(params, p)))
    arr = _relayout(arr.astype(dtype) if dtype is not None else arr, kind)
    if "{i}" in hf:
      for i in range(arr.shape[0]):
        out[hf.format(i=i)] = np.ascontiguousarray(arr[i])
    else:
      out[hf] = np.ascontiguousarray(arr)
  first = out["model.decoder.embed_tokens.weight"]
  out["model.encoder.embed_positions.weight"] = whisper.sinusoids(cfg.max_source_positions,
                                                                  cfg.d_model).astype(first.dtype)
  io.write_checkpoint(path, config_to_hf(cfg, tokens), out, max_shard_bytes)


# CTranslate2 ----------------------------------------------------------------------------------------------
CT2_DTYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")  # type ids 0..5 in model.bin


def _ct2_numpy(type_id: int):
  import ml_dtypes
  return {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: ml_dtypes.bfloat16}[type_id]


def read_ct2(path: str) -> tuple[str, dict[str, np.ndarray]]:
  """(spec name, {variable name: array}) of a CTranslate2 model.bin; aliases resolve to their target."""
  with open(path, "rb") as fh:
    buf = fh.read()
  pos = 0

  def take(fmt: str):
    nonlocal pos
    size = struct.calcsize("<" + fmt)
    if pos + size > len(buf):
      raise ValueError(f"{path}: truncated CTranslate2 model.bin: needed {size} bytes at offset {pos}, "
                       f"file has {len(buf)}")
    vals = struct.unpack_from("<" + fmt, buf, pos)
    pos += size
    return vals[0] if len(vals) == 1 else vals

  def string() -> str:
    nonlocal pos
    n = take("H")
    if pos + n > len(buf):
      raise ValueError(f"{path}: truncated CTranslate2 model.bin: string of {n} bytes at offset {pos}")
    s = buf[pos:pos + n - 1].decode("utf-8", errors="replace")
    pos += n
    return s

  version = take("I")
  if version not in (5, 6):
    raise ValueError(f"{path}: expected a CTranslate2 model.bin of binary version 5 or 6, found version {version} "
                     "(corrupt file or an unsupported CTranslate2 version)")
  spec = string()
  take("I")  # spec revision
  count = take("I")
  out: dict[str, np.ndarray] = {}
  for _ in range(count):
    name = string()
    rank = take("B")
    dims = [take("I") for _ in range(rank)]
    type_id = take("B")
    nbytes = take("I")
    if type_id >= len(CT2_DTYPES):
      raise ValueError(f"{path}: variable {name!r} has unknown dtype id {type_id}; expected 0..5 {CT2_DTYPES}")
    dt = np.dtype(_ct2_numpy(type_id))
    if nbytes != int(np.prod(dims, dtype=np.int64)) * dt.itemsize:
      raise ValueError(f"{path}: variable {name!r} holds {nbytes} bytes, its shape {dims} and dtype "
                       f"{CT2_DTYPES[type_id]} need {int(np.prod(dims)) * dt.itemsize}: corrupt file?")
    if pos + nbytes > len(buf):
      raise ValueError(f"{path}: truncated CTranslate2 model.bin: variable {name!r} needs {nbytes} bytes at "
                       f"offset {pos}, file has {len(buf)}")
    out[name] = np.frombuffer(buf, dt, count=nbytes // dt.itemsize, offset=pos).reshape(dims)
    pos += nbytes
  for _ in range(take("I")):
    alias, target = string(), string()
    if target not in out:
      raise ValueError(f"{path}: alias {alias!r} points at missing variable {target!r}")
    out[alias] = out[target]
  return spec, out


def _ct2_float(v: dict, name: str, source: str) -> np.ndarray:
  if name not in v:
    raise ValueError(f"{source}: missing variable {name!r}")
  a = v[name]
  if a.dtype in (np.float32, np.float16) or a.dtype.name == "bfloat16":
    return a.astype(np.float32)
  if a.dtype in (np.int8, np.int16) and name + "_scale" in v:
    scale = v[name + "_scale"].astype(np.float32)
    return a.astype(np.float32) / scale.reshape(scale.shape + (1,) * (a.ndim - scale.ndim))
  raise ValueError(f"{source}: variable {name!r} has dtype {a.dtype.name}; expected float32, float16, bfloat16, "
                   "or int8/int16 with a _scale")


def config_from_ct2(v: dict, source: str = "model.bin") -> whisper.Config:
  def shape(name):
    if name not in v:
      raise ValueError(f"{source}: missing variable {name!r} (is this a CTranslate2 Whisper model?)")
    return v[name].shape

  scalar = lambda name: int(np.asarray(v[name]).reshape(-1)[0]) if name in v else shape(name)
  count = lambda side: len({k.split("/")[1] for k in v if re.match(rf"{side}/layer_\d+/", k)})
  vocab, d = shape("decoder/embeddings/weight")
  return whisper.Config(
      vocab_size=vocab, n_mels=shape("encoder/conv1/weight")[1], d_model=d, encoder_layers=count("encoder"),
      encoder_heads=scalar("encoder/num_heads"), encoder_ffn=shape("encoder/layer_0/ffn/linear_0/weight")[0],
      decoder_layers=count("decoder"), decoder_heads=scalar("decoder/num_heads"),
      decoder_ffn=shape("decoder/layer_0/ffn/linear_0/weight")[0],
      max_source_positions=shape("encoder/position_encodings/encodings")[0],
      max_target_positions=shape("decoder/position_encodings/encodings")[0])


def load_ctranslate2(path: str, dtype=jnp.float32):
  """(cfg, params) from a CTranslate2 Whisper directory (model.bin) or the model.bin itself."""
  f = os.path.join(path, "model.bin") if os.path.isdir(path) else path
  if not os.path.exists(f):
    raise FileNotFoundError(f"{path}: expected a CTranslate2 directory with model.bin")
  spec, v = read_ct2(f)
  if spec != "WhisperSpec":
    raise ValueError(f"{f}: expected a CTranslate2 WhisperSpec model, found spec {spec!r}")
  cfg = config_from_ct2(v, f)
  d = cfg.d_model
  g = lambda name: _ct2_float(v, name, f)

  def ln(name):
    return {"scale": g(name + "/gamma"), "bias": g(name + "/beta")}

  def lin(name, rows=slice(None)):
    return {"kernel": g(name + "/weight")[rows].T, "bias": g(name + "/bias")[rows]}

  def attn_fused(name):  # q/k/v fused along the output rows
    q, k, v_ = (lin(name + "/linear_0", slice(j * d, (j + 1) * d)) for j in range(3))
    return {"q": q, "k": {"kernel": k["kernel"]}, "v": v_, "o": lin(name + "/linear_1")}

  def cross(name):
    k, v_ = (lin(name + "/linear_1", slice(j * d, (j + 1) * d)) for j in range(2))
    return {"q": lin(name + "/linear_0"), "k": {"kernel": k["kernel"]}, "v": v_, "o": lin(name + "/linear_2")}

  def mlp(name):
    return {"up": lin(name + "/linear_0"), "down": lin(name + "/linear_1")}

  def layers_of(side, n, parts):
    per = [{k: fn(f"{side}/layer_{i}/{sub}") for k, (sub, fn) in parts.items()} for i in range(n)]
    return jax.tree.map(lambda *xs: np.stack(xs), *per)

  enc_parts = {"attn_norm": ("self_attention/layer_norm", ln), "attn": ("self_attention", attn_fused),
               "mlp_norm": ("ffn/layer_norm", ln), "mlp": ("ffn", mlp)}
  dec_parts = {**enc_parts, "cross_norm": ("attention/layer_norm", ln), "cross_attn": ("attention", cross)}
  conv = lambda n: {"kernel": np.transpose(g(f"encoder/{n}/weight"), (2, 1, 0)), "bias": g(f"encoder/{n}/bias")}
  params = {"encoder": {"conv1": conv("conv1"), "conv2": conv("conv2"),
                        "layers": layers_of("encoder", cfg.encoder_layers, enc_parts),
                        "final_norm": ln("encoder/layer_norm")},
            "decoder": {"embed": {"embedding": g("decoder/embeddings/weight")},
                        "pos_embed": g("decoder/position_encodings/encodings"),
                        "layers": layers_of("decoder", cfg.decoder_layers, dec_parts),
                        "final_norm": ln("decoder/layer_norm")}}
  _check_shapes(cfg, params, f)
  return cfg, jax.tree.map(lambda a: jnp.asarray(a, dtype), params)


def load(path: str, dtype=None):
  """(cfg, params) from a CTranslate2 (model.bin) or transformers (config.json + safetensors) Whisper directory."""
  if os.path.exists(os.path.join(path, "model.bin")) or str(path).endswith("model.bin"):
    return load_ctranslate2(path, dtype or jnp.float32)
  return load_transformers(path, dtype)
