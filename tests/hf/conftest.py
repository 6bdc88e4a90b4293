"""Writes tiny GGUF files from transformers models with the `gguf` package's GGUFWriter, as llama.cpp would.

llama.cpp's converter permutes the q/k rows of llama models (convert_hf_to_gguf.py, LlamaModel.permute:
per head, [2, K/2] -> [K/2, 2]); qwen2/qwen3 are stored as they are. Matrices get the requested type:
F32/F16/BF16/Q4_0/Q4_1/Q8_0 are quantized from the weights by `gguf.quants.quantize`; the K-quants, which that
package cannot quantize, are filled with random bytes below 0x20 (every float16 scale they contain is then
finite and below 2**-7), so their values are whatever `gguf.quants.dequantize` makes of them. Tests reach these
helpers through the `gguf_files` fixture.
"""
import sys

import numpy as np
import pytest

NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
         "lm_head.weight": "output.weight"}
LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
         "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
         "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(hf: str) -> str:
  if hf in NAMES:
    return NAMES[hf]
  parts = hf.split(".")
  return f"blk.{parts[2]}.{LAYER['.'.join(parts[3:-1])]}.{parts[-1]}"


def llama_cpp_permute(w, n_head):
  return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def encode(w, qtype: str, rng):
  """(array, raw_dtype) for GGUFWriter.add_tensor."""
  import gguf
  T = gguf.GGMLQuantizationType
  if qtype == "F32":
    return np.ascontiguousarray(w, np.float32), None
  if qtype in ("F16", "BF16", "Q4_0", "Q4_1", "Q8_0"):
    return gguf.quants.quantize(np.ascontiguousarray(w, np.float32), T[qtype]), T[qtype]
  shape = gguf.quants.quant_shape_to_byte_shape(w.shape, T[qtype])
  return rng.integers(0, 0x20, shape, dtype=np.uint8), T[qtype]


def write(path, model, qtype: str = "F32", *, tie: bool = False, vocab=None, seed: int = 0, extra_tensors=(),
          arch: str | None = None, permute: bool | None = None):
  """Writes `model` (a transformers causal LM) to `path` as GGUF; 1-D tensors stay F32 as in llama.cpp.

  Args:
    vocab: optional (tokens, merges, token_types) written as tokenizer metadata ("gpt2" model).
    extra_tensors: (name, float32 array) pairs appended as they are.
    arch: general.architecture to write (default: the config's model_type).
    permute: apply llama.cpp's q/k permutation (default: for llama).
  """
  import gguf
  c = model.config
  arch = arch or c.model_type
  permute = arch == "llama" if permute is None else permute
  head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
  w = gguf.GGUFWriter(str(path), arch)  # writes general.architecture itself
  w.add_block_count(c.num_hidden_layers)
  w.add_context_length(c.max_position_embeddings)
  w.add_embedding_length(c.hidden_size)
  w.add_feed_forward_length(c.intermediate_size)
  w.add_head_count(c.num_attention_heads)
  w.add_head_count_kv(c.num_key_value_heads)
  w.add_key_length(head_dim)
  w.add_value_length(head_dim)
  w.add_rope_dimension_count(head_dim)
  w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
  w.add_layer_norm_rms_eps(c.rms_norm_eps)
  w.add_vocab_size(c.vocab_size)
  if vocab is not None:
    tokens, merges, types = vocab
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types(types)
  for key, value in (("bos", c.bos_token_id), ("eos", c.eos_token_id), ("pad", c.pad_token_id)):
    if value is not None:
      getattr(w, f"add_{key}_token_id")(value)
  rng = np.random.default_rng(seed)
  for name, p in model.state_dict().items():
    if "rotary_emb" in name or (tie and name == "lm_head.weight"):
      continue
    a = p.detach().float().numpy()
    if permute and (".q_proj." in name or ".k_proj." in name):
      a = llama_cpp_permute(a, c.num_attention_heads if ".q_proj." in name else c.num_key_value_heads)
    data, raw = encode(a, qtype if a.ndim == 2 else "F32", rng)
    w.add_tensor(gguf_name(name), data, raw_dtype=raw)
  for name, a in extra_tensors:
    w.add_tensor(name, np.asarray(a, np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


@pytest.fixture(scope="session")
def gguf_files():
  return sys.modules[__name__]
