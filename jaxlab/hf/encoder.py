"""HF <-> jaxlab for BERT-family encoders (model_type "bert": BERT, MiniLM, all-MiniLM-L6-v2).

Loads `BertModel` checkpoints (`embeddings.*`, `encoder.layer.{i}.*`) and the encoder of `BertFor*` checkpoints
(the same names under `bert.`, `key_prefix` of config.json's `architectures`). Pooler and task-head weights
(`pooler.*`, `cls.*`, classifiers) are ignored; `save` writes a `BertModel` without a pooler (transformers then
initializes a pooler of its own, which `last_hidden_state` never uses). Keys a config.json leaves out take the
transformers `BertConfig` defaults.
"""
from __future__ import annotations

from jaxlab.hf.spec import Family, Tensor
from jaxlab.models import encoder

BERT_DEFAULTS = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                     intermediate_size=3072, hidden_act="gelu", max_position_embeddings=512, type_vocab_size=2,
                     layer_norm_eps=1e-12, initializer_range=0.02, pad_token_id=0,
                     position_embedding_type="absolute")
_ACT_FROM_HF = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
                "silu": "silu", "swish": "silu"}
_ACT_TO_HF = {"gelu_tanh": "gelu_pytorch_tanh"}
# Heads that BertFor* checkpoints carry next to the encoder; none of them is part of the encoder's params.
_HEADS = ("pooler.", "cls.", "classifier.", "qa_outputs.", "position_ids")


def key_prefix(d: dict) -> str:
  """The prefix of the encoder's tensor names in the checkpoint config.json `d` describes: "" or "bert."."""
  return "" if (d.get("architectures") or ["BertModel"])[0] == "BertModel" else "bert."


def config_from_hf(d: dict) -> encoder.Config:
  c = {**BERT_DEFAULTS, **{k: v for k, v in d.items() if v is not None or k == "pad_token_id"}}
  if c["position_embedding_type"] != "absolute":
    raise NotImplementedError(f"bert: position_embedding_type {c['position_embedding_type']!r} is not "
                              "supported; expected 'absolute'")
  if c.get("is_decoder") or c.get("add_cross_attention"):
    raise NotImplementedError("bert: decoder / cross-attention configs (is_decoder, add_cross_attention) are not "
                              "supported; expected a bidirectional encoder")
  act = c["hidden_act"]
  if act not in _ACT_FROM_HF:
    raise NotImplementedError(f"bert: hidden_act {act!r} is not supported; expected one of {sorted(_ACT_FROM_HF)}")
  return encoder.Config(
      vocab_size=c["vocab_size"], d_model=c["hidden_size"], n_layers=c["num_hidden_layers"],
      n_heads=c["num_attention_heads"], d_ff=c["intermediate_size"],
      max_position_embeddings=c["max_position_embeddings"], type_vocab_size=c["type_vocab_size"],
      activation=_ACT_FROM_HF[act], norm_eps=c["layer_norm_eps"], pad_token_id=c["pad_token_id"],
      init_std=c["initializer_range"])


def config_to_hf(cfg: encoder.Config) -> dict:
  return {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": cfg.vocab_size,
          "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
          "intermediate_size": cfg.d_ff, "hidden_act": _ACT_TO_HF.get(cfg.activation, cfg.activation),
          "max_position_embeddings": cfg.max_position_embeddings, "type_vocab_size": cfg.type_vocab_size,
          "layer_norm_eps": cfg.norm_eps, "initializer_range": cfg.init_std, "pad_token_id": cfg.pad_token_id,
          "position_embedding_type": "absolute", "hidden_dropout_prob": 0.1,
          "attention_probs_dropout_prob": 0.1, "use_cache": False}


def tensors(cfg: encoder.Config) -> list[Tensor]:
  """The `BertModel` names (a `BertFor*` checkpoint holds them under `key_prefix`)."""
  T = lambda hf, path, tr=False: Tensor(hf, path, tr)
  lin = lambda hf, path: [T(hf + ".weight", path + ("kernel",), True), T(hf + ".bias", path + ("bias",))]
  ln = lambda hf, path: [T(hf + ".weight", path + ("scale",)), T(hf + ".bias", path + ("bias",))]
  E, L = "embeddings.", "encoder.layer.{i}."
  out = [T(E + "word_embeddings.weight", ("embed", "embedding")),
         T(E + "position_embeddings.weight", ("pos_embed",)),
         T(E + "token_type_embeddings.weight", ("type_embed", "embedding"))]
  out += ln(E + "LayerNorm", ("embed_norm",))
  for hf, n in (("query", "q"), ("key", "k"), ("value", "v")):
    out += lin(f"{L}attention.self.{hf}", ("layers", "attn", n))
  out += lin(L + "attention.output.dense", ("layers", "attn", "o"))
  out += ln(L + "attention.output.LayerNorm", ("layers", "attn_norm"))
  out += lin(L + "intermediate.dense", ("layers", "mlp", "up")) + lin(L + "output.dense", ("layers", "mlp", "down"))
  return out + ln(L + "output.LayerNorm", ("layers", "mlp_norm"))


FAMILY = Family(model_types=("bert",), config_cls=encoder.Config, config_from_hf=config_from_hf,
                config_to_hf=config_to_hf, tensors=tensors, init=encoder.init, n_layers=lambda c: c.n_layers,
                ignore=_HEADS, key_prefix=key_prefix)
