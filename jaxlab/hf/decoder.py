"""HF <-> jaxlab for the decoder-LM family: llama, mistral, qwen2, qwen3, olmo2."""
from __future__ import annotations

from jaxlab.hf.spec import Family, Tensor
from jaxlab.models import transformer as tfm
from jaxlab.nn.rope import Rope

ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "olmo2": "Olmo2ForCausalLM"}

ACT_FROM_HF = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}
ACT_TO_HF = {"gelu_tanh": "gelu_pytorch_tanh"}


def _ids(v):
  return tuple(v) if isinstance(v, list) else v


def rope_from_hf(d: dict) -> Rope:
  """Both spellings: `rope_parameters` (with rope_theta inside) or `rope_theta` + `rope_scaling`."""
  params = d.get("rope_parameters") or d.get("rope_scaling")
  return Rope.from_hf(params, d.get("rope_theta", (params or {}).get("rope_theta", 10000.0)))


def config_from_hf(d: dict) -> tfm.Config:
  mt = d["model_type"]
  if d.get("use_sliding_window"):
    raise NotImplementedError(f"{mt}: per-layer sliding windows (use_sliding_window=true) are not supported")
  n_heads = d["num_attention_heads"]
  head_dim = d.get("head_dim")
  if head_dim == d["hidden_size"] // n_heads:
    head_dim = None
  attention_bias = bool(d.get("attention_bias", False))
  act = d.get("hidden_act", "silu")
  return tfm.Config(
      vocab_size=d["vocab_size"], d_model=d["hidden_size"], n_layers=d["num_hidden_layers"], n_heads=n_heads,
      n_kv_heads=d.get("num_key_value_heads") or n_heads, head_dim=head_dim, d_ff=d["intermediate_size"],
      max_position_embeddings=d.get("max_position_embeddings", 2048), rope=rope_from_hf(d),
      norm_eps=d.get("rms_norm_eps", 1e-6), activation=ACT_FROM_HF.get(act, act),
      qkv_bias=True if mt == "qwen2" else attention_bias, o_bias=attention_bias and mt != "qwen2",
      mlp_bias=bool(d.get("mlp_bias", False)),
      qk_norm={"qwen3": "head", "olmo2": "full"}.get(mt, "none"), post_norm=mt == "olmo2",
      tie_embeddings=bool(d.get("tie_word_embeddings", False)),
      sliding_window=d.get("sliding_window") if mt == "mistral" else None,
      init_std=d.get("initializer_range", 0.02),
      bos_token_id=d.get("bos_token_id"), eos_token_id=_ids(d.get("eos_token_id")),
      pad_token_id=d.get("pad_token_id"))


def model_type(cfg: tfm.Config) -> str:
  """The HF family whose architecture computes exactly what `cfg` describes."""
  if not cfg.causal:
    raise ValueError("a bidirectional (causal=False) config is not a decoder LM; save it with its own family")
  if cfg.post_norm or cfg.qk_norm == "full":
    if not (cfg.post_norm and cfg.qk_norm == "full") or cfg.qkv_bias != cfg.o_bias:
      raise ValueError("olmo2 needs post_norm with qk_norm='full' (and q/k/v/o biases all on or all off)")
    mt = "olmo2"
  elif cfg.qk_norm == "head":
    mt = "qwen3"
  elif cfg.qkv_bias and not cfg.o_bias:
    mt = "qwen2"
  elif cfg.sliding_window is not None:
    mt = "mistral"
  else:
    mt = "llama"
  if mt in ("llama", "qwen3") and cfg.qkv_bias != cfg.o_bias:
    raise ValueError(f"{mt} has one attention_bias for q/k/v/o; found qkv_bias={cfg.qkv_bias}, o_bias={cfg.o_bias}")
  if cfg.sliding_window is not None and mt != "mistral":
    raise ValueError(f"{mt} checkpoints cannot carry sliding_window={cfg.sliding_window}; only mistral "
                     "(no biases, no qk-norm, pre-norm) can")
  return mt


def config_to_hf(cfg: tfm.Config) -> dict:
  mt = model_type(cfg)
  rope = cfg.rope.to_hf()
  d = {"architectures": [ARCHITECTURES[mt]], "model_type": mt, "vocab_size": cfg.vocab_size,
       "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.n_layers,
       "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.kdim,
       "hidden_act": ACT_TO_HF.get(cfg.activation, cfg.activation),
       "max_position_embeddings": cfg.max_position_embeddings,
       "rms_norm_eps": cfg.norm_eps, "initializer_range": cfg.init_std,
       "tie_word_embeddings": cfg.tie_embeddings, "rope_theta": cfg.rope.theta, "rope_parameters": rope,
       "rope_scaling": None if cfg.rope.type == "default" else {k: v for k, v in rope.items() if k != "rope_theta"},
       "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id,
       "use_cache": True}
  if mt in ("llama", "qwen3", "olmo2"):
    d["attention_bias"] = cfg.o_bias
  if mt == "llama":
    d["mlp_bias"] = cfg.mlp_bias
  elif cfg.mlp_bias:
    raise ValueError(f"{mt} has no MLP biases; found mlp_bias=True")
  if mt in ("mistral", "qwen2", "qwen3"):
    d["sliding_window"] = cfg.sliding_window
  if mt in ("qwen2", "qwen3"):
    d["use_sliding_window"] = False
  if mt == "mistral" and (cfg.qkv_bias or cfg.o_bias):
    raise ValueError("mistral has no attention biases")
  return d


def tensors(cfg: tfm.Config) -> list[Tensor]:
  L = "model.layers.{i}."
  out = [Tensor("model.embed_tokens.weight", ("embed", "embedding")),
         Tensor("model.norm.weight", ("final_norm", "scale"))]
  for n in "qkvo":
    out.append(Tensor(f"{L}self_attn.{n}_proj.weight", ("layers", "attn", n, "kernel"), True))
    if (cfg.qkv_bias and n != "o") or (cfg.o_bias and n == "o"):
      out.append(Tensor(f"{L}self_attn.{n}_proj.bias", ("layers", "attn", n, "bias")))
  if cfg.qk_norm != "none":
    out += [Tensor(f"{L}self_attn.{n}_norm.weight", ("layers", "attn", f"{n}_norm", "scale")) for n in "qk"]
  for n in ("gate", "up", "down"):
    out.append(Tensor(f"{L}mlp.{n}_proj.weight", ("layers", "mlp", n, "kernel"), True))
    if cfg.mlp_bias:
      out.append(Tensor(f"{L}mlp.{n}_proj.bias", ("layers", "mlp", n, "bias")))
  if cfg.post_norm:
    out += [Tensor(f"{L}post_attention_layernorm.weight", ("layers", "post_attn_norm", "scale")),
            Tensor(f"{L}post_feedforward_layernorm.weight", ("layers", "post_mlp_norm", "scale"))]
  else:
    out += [Tensor(f"{L}input_layernorm.weight", ("layers", "attn_norm", "scale")),
            Tensor(f"{L}post_attention_layernorm.weight", ("layers", "mlp_norm", "scale"))]
  if not cfg.tie_embeddings:
    out.append(Tensor("lm_head.weight", ("lm_head", "kernel"), True))
  return out


FAMILY = Family(model_types=tuple(ARCHITECTURES), config_cls=tfm.Config, config_from_hf=config_from_hf,
                config_to_hf=config_to_hf, tensors=tensors, init=tfm.init, n_layers=lambda c: c.n_layers,
                redundant=lambda c: ("lm_head.weight",) if c.tie_embeddings else ())
