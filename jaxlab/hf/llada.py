"""HF <-> jaxlab for masked diffusion LMs: LLaDA-format (model_type "llada") and Dream-format ("Dream").

LLaDA checkpoints (GSAI-ML/LLaDA-8B-*, modeling_llada.py, LLaDALlamaBlock) name their tensors
  model.transformer.wte.weight                       [embedding_size, d_model]
  model.transformer.blocks.{i}.attn_norm.weight      RMSNorm before attention
  model.transformer.blocks.{i}.{q,k,v}_proj.weight   (+ .bias with include_qkv_bias / include_bias)
  model.transformer.blocks.{i}.attn_out.weight       output projection
  model.transformer.blocks.{i}.ff_norm.weight        RMSNorm before the MLP
  model.transformer.blocks.{i}.ff_proj.weight        gate: act(ff_proj x) * up_proj x
  model.transformer.blocks.{i}.up_proj.weight
  model.transformer.blocks.{i}.ff_out.weight         down projection
  model.transformer.ln_f.weight
  model.transformer.ff_out.weight                    LM head (absent with weight_tying)
and their config.json uses the OLMo-style keys (d_model, n_heads, mlp_hidden_size, rope_theta, ...). Only the
"llama" block with RMSNorm and rotary embeddings is supported; other settings are rejected by name.
Dream checkpoints are Qwen2 tensors (`jaxlab.hf.decoder`) with model_type "Dream", bidirectional attention
and the shifted logits of `mdm.Config.shift_logits`. The layout follows from the config (`layout`): shifted
logits are Dream's, unshifted LLaDA's.
"""
from __future__ import annotations

from jaxlab.hf import decoder
from jaxlab.hf.spec import Family, Tensor
from jaxlab.models import mdm
from jaxlab.nn.rope import Rope

# ModelConfig defaults of configuration_llada.py, used for keys a config.json leaves out.
LLADA_DEFAULTS = dict(d_model=768, n_heads=12, n_kv_heads=None, n_layers=12, mlp_ratio=4, mlp_hidden_size=None,
                      activation_type="swiglu", block_type="sequential", alibi=False, rope=False,
                      attention_layer_norm=False, input_emb_norm=False, layer_norm_type="default",
                      layer_norm_with_affine=True, rms_norm_eps=1e-5, max_sequence_length=1024,
                      rope_theta=10000.0, include_qkv_bias=False, include_bias=False, bias_for_layer_norm=None,
                      scale_logits=False, vocab_size=50257, embedding_size=50304, weight_tying=True,
                      eos_token_id=50256, pad_token_id=50256, mask_token_id=50256, init_std=0.02,
                      multi_query_attention=None)
_ACTS = {"silu": "silu", "gelu": "gelu", "relu": "relu"}


def layout(cfg: mdm.Config) -> str:
  """The checkpoint layout `cfg` is saved in: "dream" (Qwen2 names, shifted logits) or "llada"."""
  return "dream" if cfg.shift_logits else "llada"


def _llada_config(d: dict) -> mdm.Config:
  c = {**LLADA_DEFAULTS, **{k: v for k, v in d.items() if v is not None or k in ("n_kv_heads",)}}
  bad = []
  want = {"block_type": "llama", "layer_norm_type": "rms", "rope": True, "alibi": False,
          "attention_layer_norm": False, "input_emb_norm": False, "scale_logits": False,
          "layer_norm_with_affine": True}
  bad += [f"{k}={c[k]!r} (supported: {v!r})" for k, v in want.items() if c[k] != v]
  if c["activation_type"] not in _ACTS:
    bad.append(f"activation_type={c['activation_type']!r} (supported: {sorted(_ACTS)})")
  norm_bias = c["include_bias"] if c["bias_for_layer_norm"] is None else c["bias_for_layer_norm"]
  if norm_bias:
    bad.append("layer-norm biases (bias_for_layer_norm / include_bias) are not supported")
  if bad:
    raise NotImplementedError("LLaDA config: " + "; ".join(bad))
  n_kv = c["n_kv_heads"]
  if n_kv is None:
    n_kv = 1 if c["multi_query_attention"] else c["n_heads"]
  emb = c["embedding_size"] or c["vocab_size"]
  hidden = c["mlp_hidden_size"] or c["mlp_ratio"] * c["d_model"]
  return mdm.Config(
      vocab_size=emb, d_model=c["d_model"], n_layers=c["n_layers"], n_heads=c["n_heads"], n_kv_heads=n_kv,
      d_ff=hidden, max_position_embeddings=c["max_sequence_length"], rope=Rope(theta=float(c["rope_theta"])),
      norm_eps=c["rms_norm_eps"], activation=_ACTS[c["activation_type"]],
      qkv_bias=bool(c["include_bias"] or c["include_qkv_bias"]), o_bias=bool(c["include_bias"]),
      mlp_bias=bool(c["include_bias"]), tie_embeddings=bool(c["weight_tying"]), init_std=c["init_std"],
      bos_token_id=d.get("bos_token_id"), eos_token_id=c["eos_token_id"], pad_token_id=c["pad_token_id"],
      mask_token_id=c["mask_token_id"],
      text_vocab_size=c["vocab_size"] if c["vocab_size"] != emb else None)


def _dream_config(d: dict) -> mdm.Config:
  base = decoder.config_from_hf({**d, "model_type": "qwen2"})
  return mdm.Config.from_transformer(base, mask_token_id=d.get("mask_token_id", 151666), shift_logits=True)


def config_from_hf(d: dict) -> mdm.Config:
  return _dream_config(d) if d["model_type"] == "Dream" else _llada_config(d)


def _check_llada(cfg: mdm.Config):
  bad = []
  if cfg.rope != Rope(theta=cfg.rope.theta):
    bad.append(f"rope {cfg.rope} (LLaDA has plain rotary embeddings)")
  if cfg.kdim * cfg.n_heads != cfg.d_model:
    bad.append(f"head_dim {cfg.kdim} * n_heads {cfg.n_heads} != d_model {cfg.d_model}")
  if cfg.qk_norm != "none" or cfg.post_norm or cfg.sliding_window is not None:
    bad.append("qk_norm / post_norm / sliding_window")
  if cfg.activation not in _ACTS:
    bad.append(f"activation {cfg.activation!r}")
  if cfg.o_bias != cfg.mlp_bias or (cfg.o_bias and not cfg.qkv_bias):
    bad.append("biases must be q/k/v only (include_qkv_bias) or everywhere (include_bias)")
  if bad:
    raise ValueError("config cannot be written in the LLaDA format: " + "; ".join(bad))


def config_to_hf(cfg: mdm.Config) -> dict:
  if layout(cfg) == "dream":
    d = decoder.config_to_hf(cfg.transformer().replace(causal=True))
    if d["model_type"] != "qwen2":
      raise ValueError(f"a Dream checkpoint is a Qwen2 layout (q/k/v biases only); this config maps to "
                       f"{d['model_type']}")
    d.update(model_type="Dream", architectures=["DreamModel"], mask_token_id=cfg.mask_token_id, use_cache=False)
    return d
  _check_llada(cfg)
  return {
      "architectures": ["LLaDAModelLM"], "model_type": "llada", "block_type": "llama", "layer_norm_type": "rms",
      "rope": True, "alibi": False, "rope_full_precision": True, "flash_attention": False,
      "attention_layer_norm": False, "input_emb_norm": False, "scale_logits": False, "layer_norm_with_affine": True,
      "d_model": cfg.d_model, "n_heads": cfg.n_heads, "n_kv_heads": cfg.kv_heads, "n_layers": cfg.n_layers,
      "mlp_hidden_size": cfg.d_ff, "mlp_ratio": max(1, cfg.d_ff // cfg.d_model), "activation_type": cfg.activation,
      "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope.theta, "max_sequence_length": cfg.max_position_embeddings,
      "include_bias": cfg.o_bias, "include_qkv_bias": cfg.qkv_bias, "bias_for_layer_norm": False,
      "vocab_size": cfg.text_vocab_size or cfg.vocab_size, "embedding_size": cfg.vocab_size,
      "weight_tying": cfg.tie_embeddings, "init_std": cfg.init_std, "init_fn": "normal",
      "attention_dropout": 0.0, "residual_dropout": 0.0, "embedding_dropout": 0.0, "block_group_size": 1,
      "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id,
      "mask_token_id": cfg.mask_token_id, "use_cache": False,
  }


def tensors(cfg: mdm.Config) -> list[Tensor]:
  if layout(cfg) == "dream":
    return decoder.tensors(cfg)
  T, B = "model.transformer.", "model.transformer.blocks.{i}."
  out = [Tensor(T + "wte.weight", ("embed", "embedding")), Tensor(T + "ln_f.weight", ("final_norm", "scale")),
         Tensor(B + "attn_norm.weight", ("layers", "attn_norm", "scale")),
         Tensor(B + "ff_norm.weight", ("layers", "mlp_norm", "scale"))]
  linears = {"q_proj": ("attn", "q"), "k_proj": ("attn", "k"), "v_proj": ("attn", "v"), "attn_out": ("attn", "o"),
             "ff_proj": ("mlp", "gate"), "up_proj": ("mlp", "up"), "ff_out": ("mlp", "down")}
  for name, (group, p) in linears.items():
    out.append(Tensor(f"{B}{name}.weight", ("layers", group, p, "kernel"), True))
    has_bias = cfg.qkv_bias if p in "qkv" else (cfg.o_bias if p == "o" else cfg.mlp_bias)
    if has_bias:
      out.append(Tensor(f"{B}{name}.bias", ("layers", group, p, "bias")))
  if not cfg.tie_embeddings:
    out.append(Tensor(T + "ff_out.weight", ("lm_head", "kernel"), True))
  return out


def _redundant(cfg: mdm.Config) -> tuple[str, ...]:
  if not cfg.tie_embeddings:
    return ()
  return ("lm_head.weight",) if layout(cfg) == "dream" else ("model.transformer.ff_out.weight",)


FAMILY = Family(model_types=("llada", "Dream"), config_cls=mdm.Config, config_from_hf=config_from_hf,
                config_to_hf=config_to_hf, tensors=tensors, init=mdm.init, n_layers=lambda c: c.n_layers,
                redundant=_redundant)
