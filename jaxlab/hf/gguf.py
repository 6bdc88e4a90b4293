"""GGUF (llama.cpp) checkpoints -> jaxlab decoder-LM params, through the `gguf` package's reader and dequantizer.

The config comes from the file's metadata (`{arch}.block_count`, `{arch}.attention.head_count`, ...) translated
to a transformers config dict and then read by the decoder family (jaxlab.hf.decoder), so a GGUF and a
safetensors checkpoint of the same model give the same `tfm.Config`. Tensors are dequantized one at a time
from the memory-mapped file with `gguf.quants.dequantize` and written straight into the stacked param
buffers (updated in place), so loading holds about one copy of the params in host memory: SmolLM2-135M peaks
at 1.66x its fp32 parameter bytes above the starting RSS, a third of that being the reader's parsed metadata.

llama.cpp's converter (convert_hf_to_gguf.py, `LlamaModel.permute`) reorders the rows of the llama q/k
projections from the rotate-half layout into interleaved pairs; `unpermute_rows` undoes it. qwen2/qwen3 use
NeoX rope in llama.cpp and are stored unpermuted. Absent `output.weight` means tied embeddings.

  cfg, params = hf.load("SmolLM2-135M-Instruct.Q4_1.gguf")   # jaxlab.hf.load dispatches on the suffix
"""
from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jaxlab.data import gguf_vocab
from jaxlab.hf import decoder as _decoder
from jaxlab.hf import spec as _spec

ARCHITECTURES = ("llama", "qwen2", "qwen3")  # general.architecture values this loader maps
PERMUTED_QK = ("llama",)  # architectures whose q/k rows llama.cpp permutes
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")

# GGUF tensor name -> transformers name (per-layer names carry "{i}").
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
_LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
          "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
          "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj",
          "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def _gguf():
  try:
    import gguf
  except ImportError as e:
    raise ImportError("reading GGUF files needs the gguf package: pip install gguf") from e
  return gguf


def open_reader(path):
  """A `gguf.GGUFReader` over `path` (memory-mapped), with truncation and corruption reported by name."""
  reader = gguf_vocab.open_reader(path)
  path, size = os.fspath(path), os.path.getsize(path)
  for t in reader.tensors:
    if t.data_offset + t.n_bytes > size:
      raise ValueError(f"{path}: tensor {t.name!r} ends at byte {t.data_offset + t.n_bytes}, past the end of "
                       f"the file ({size} bytes): truncated?")
  return reader


def metadata(reader, arrays: bool = False) -> dict:
  """The key/value metadata as Python values; arrays (the vocabulary, merges) only when `arrays`."""
  gguf = _gguf()
  out = {}
  for k, f in reader.fields.items():
    if not f.types or k.startswith("GGUF."):
      continue
    if f.types[0] == gguf.GGUFValueType.ARRAY and not arrays:
      continue
    out[k] = f.contents()
  return out


def _shape(t) -> tuple[int, ...]:
  """A tensor's shape in NumPy (row-major) order; GGUF lists dimensions fastest-first."""
  return tuple(int(d) for d in reversed(t.shape.tolist()))


def hf_name(name: str) -> str | None:
  """The transformers name of a GGUF tensor name, or None when it has no counterpart."""
  if name in _GLOBAL:
    return _GLOBAL[name]
  parts = name.split(".")
  if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER and parts[3] in ("weight", "bias"):
    return f"model.layers.{parts[1]}.{_LAYER[parts[2]]}.{parts[3]}"
  return None


def config_dict(md: dict, tensor_names) -> dict:
  """A transformers config dict for the model the metadata describes (the decoder family reads it).

  Args:
    md: `metadata(reader)`.
    tensor_names: names of the file's tensors (ties, biases and the vocabulary size are read off them).
  """
  arch = md.get("general.architecture")
  if arch not in ARCHITECTURES:
    raise ValueError(f"GGUF architecture {arch!r} is not supported; jaxlab maps {list(ARCHITECTURES)}")
  names = set(tensor_names)

  def get(key, default=KeyError):
    v = md.get(f"{arch}.{key}", default)
    if v is KeyError:
      raise ValueError(f"GGUF metadata lacks {arch}.{key}, which a {arch} model needs")
    return v

  if get("expert_count", 0):
    raise NotImplementedError(f"{arch} with {get('expert_count')} experts (MoE) is not supported")
  if "rope_freqs.weight" in names:
    raise NotImplementedError("per-frequency rope factors (tensor rope_freqs.weight, llama-3.1 style) are not "
                              "supported")
  d_model, n_heads = int(get("embedding_length")), int(get("attention.head_count"))
  head_dim = int(get("attention.key_length", d_model // n_heads))
  n_rot = int(get("rope.dimension_count", head_dim))
  if n_rot != head_dim:
    raise NotImplementedError(f"partial rotary embeddings (rope.dimension_count {n_rot} < head dim {head_dim}) "
                              "are not supported")
  rope = {"rope_type": "default", "rope_theta": float(get("rope.freq_base", 10000.0))}
  scaling = get("rope.scaling.type", "none")
  if scaling == "linear":
    rope.update(rope_type="linear", factor=float(get("rope.scaling.factor")))
  elif scaling != "none":
    raise NotImplementedError(f"rope scaling {scaling!r} in GGUF metadata is not supported (only 'linear')")
  vocab = md.get(f"{arch}.vocab_size")
  if vocab is None:
    vocab = md.get("tokenizer.ggml.tokens") or None
  d = {"model_type": arch, "hidden_size": d_model, "num_hidden_layers": int(get("block_count")),
       "num_attention_heads": n_heads, "num_key_value_heads": int(get("attention.head_count_kv", n_heads)),
       "head_dim": head_dim, "intermediate_size": int(get("feed_forward_length")),
       "max_position_embeddings": int(get("context_length", 2048)),
       "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)), "rope_parameters": rope,
       "tie_word_embeddings": "output.weight" not in names,
       "attention_bias": "blk.0.attn_q.bias" in names and arch == "llama",
       "vocab_size": int(vocab) if vocab is not None else None,
       "bos_token_id": md.get("tokenizer.ggml.bos_token_id"), "eos_token_id": md.get("tokenizer.ggml.eos_token_id"),
       "pad_token_id": md.get("tokenizer.ggml.padding_token_id")}
  return d


def unpermute_rows(w, n_heads: int):
  """Inverse of llama.cpp's q/k row permutation: per head, interleaved pairs back to two rotate-half halves."""
  rows = w.shape[0]
  return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _dequantize(t, permute_heads: int | None):
  gguf = _gguf()
  w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32).reshape(_shape(t))
  return unpermute_rows(w, permute_heads) if permute_heads else w


def load(path, dtype=None, reader=None):
  """(tfm.Config, params) from a GGUF file of a llama / qwen2 / qwen3 decoder.

  Args:
    path: the .gguf file.
    dtype: param dtype (float32 default, or bfloat16 / float16); tensors are dequantized to fp32 then cast.
    reader: `open_reader(path)` already done (to share one parse with the tokenizer).
  """
  path = os.fspath(path)
  reader = reader if reader is not None else open_reader(path)
  bad = [(t.name, t.tensor_type.name) for t in reader.tensors if t.tensor_type.name not in SUPPORTED_TYPES]
  if bad:
    raise ValueError(f"{path}: unsupported GGUF tensor type {bad[0][1]} (tensor {bad[0][0]}"
                     f"{f' and {len(bad) - 1} more' if len(bad) > 1 else ''}); jaxlab dequantizes {SUPPORTED_TYPES}")
  md = metadata(reader)
  tensors = {t.name: t for t in reader.tensors}
  d = config_dict(md, tensors)
  if d["vocab_size"] is None and "token_embd.weight" in tensors:
    d["vocab_size"] = _shape(tensors["token_embd.weight"])[0]
  cfg = _decoder.config_from_hf(d)
  unknown = sorted(n for n in tensors if hf_name(n) is None)
  if unknown:
    raise ValueError(f"{path}: GGUF tensors with no {d['model_type']} counterpart: {unknown[:5]}")
  by_hf = {hf_name(n): t for n, t in tensors.items()}
  _spec.check(_decoder.FAMILY, cfg, {k: jax.ShapeDtypeStruct(_shape(t), np.float32) for k, t in by_hf.items()},
                path)

  pdt = np.dtype(ml_dtypes.bfloat16 if str(dtype) in ("bfloat16", "bf16") else dtype or np.float32)
  name = _spec.dtype_name(pdt)
  if name not in ("float32", "bfloat16", "float16"):
    raise ValueError(f"dtype must be float32, bfloat16 or float16, found {dtype!r}")
  cfg = cfg.replace(param_dtype=name)
  permuted = d["model_type"] in PERMUTED_QK
  heads = {"q_proj": cfg.n_heads, "k_proj": cfg.kv_heads}
  shapes = _spec.expected_shapes(_decoder.FAMILY, cfg)
  params: dict = {}
  for t in _decoder.tensors(cfg):
    per_layer = "{i}" in t.hf
    names = [t.hf.format(i=i) for i in range(cfg.n_layers)] if per_layer else [t.hf]
    one = shapes[names[0]][0]
    arr = jnp.zeros((len(names), *(one[::-1] if t.transpose else one)), pdt) if per_layer else None
    for i, n in enumerate(names):
      w = _dequantize(by_hf[n], heads.get(n.split(".")[-2]) if permuted else None)
      w = np.ascontiguousarray(w.T if t.transpose else w, pdt)
      arr = _put_layer(arr, np.int32(i), w) if per_layer else jnp.asarray(w)
      del w
    _spec.set_path(params, t.path, arr)
  return cfg, params


@functools.partial(jax.jit, donate_argnums=0)
def _put_layer(stack, i, w):
  """stack[i] = w in place (the donated stack is reused), so a layer stack is never held twice."""
  return jax.lax.dynamic_update_index_in_dim(stack, w, i, 0)
