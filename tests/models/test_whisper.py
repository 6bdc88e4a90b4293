"""Whisper: a tiny random transformers `WhisperForConditionalGeneration` (saved, then loaded by jaxlab) gives
jaxlab's logits and greedy `generate` tokens; save -> transformers round trip; cached decoding == full
recompute; logical axes on every param; a tiny random model converted by CTranslate2's own converter (float32
and int8) loads to the transformers logits; clear errors on bad configs, mels and model.bin files."""
import os
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.audio import asr
from jaxlab.hf import whisper as hf_whisper
from jaxlab.models import whisper
from jaxlab.nn import axes

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CFG = whisper.PRESETS["tiny_random"]
EOT, SOT, PAD = 1, 2, 1
SUPPRESS, BEGIN = [5, 7, 11], [3, EOT]


def _hf_config():
  return transformers.WhisperConfig(
      vocab_size=CFG.vocab_size, num_mel_bins=CFG.n_mels, d_model=CFG.d_model, encoder_layers=CFG.encoder_layers,
      encoder_attention_heads=CFG.encoder_heads, encoder_ffn_dim=CFG.encoder_ffn, decoder_layers=CFG.decoder_layers,
      decoder_attention_heads=CFG.decoder_heads, decoder_ffn_dim=CFG.decoder_ffn,
      max_source_positions=CFG.max_source_positions, max_target_positions=CFG.max_target_positions,
      decoder_start_token_id=SOT, eos_token_id=EOT, pad_token_id=PAD, bos_token_id=EOT,
      suppress_tokens=SUPPRESS, begin_suppress_tokens=BEGIN)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  torch.manual_seed(0)
  model = transformers.WhisperForConditionalGeneration(_hf_config()).eval()
  with torch.no_grad():  # weights well away from the init's small values, 1s and 0s
    for name, p in model.named_parameters():
      if "embed_positions" not in name or "decoder" in name:
        p.normal_(0.0, 0.3 if p.ndim > 1 else 0.2).add_(1.0 if name.endswith("layer_norm.weight") else 0.0)
  d = str(tmp_path_factory.mktemp("hf_whisper"))
  model.save_pretrained(d)
  return d, model


def _mel(b=2, seed=0):
  return np.random.default_rng(seed).normal(size=(b, CFG.n_mels, CFG.n_frames)).astype(np.float32)


def _tokens(b=2, t=9, seed=1):
  return np.random.default_rng(seed).integers(0, CFG.vocab_size, (b, t)).astype(np.int32)


def _hf_logits(model, mel, tokens):
  with torch.no_grad():
    out = model(input_features=torch.from_numpy(mel), decoder_input_ids=torch.from_numpy(tokens.astype(np.int64)))
  return out.logits.numpy()


def test_logits_match_transformers(hf_dir):
  d, model = hf_dir
  cfg, params = hf_whisper.load(d)
  assert cfg == CFG
  mel, tokens = _mel(), _tokens()
  ours = np.asarray(jax.jit(whisper.forward, static_argnames="cfg")(params, mel, tokens, cfg))
  ref = _hf_logits(model, mel, tokens)
  assert np.abs(ref).max() > 1.0
  np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=1e-4)
  with torch.no_grad():
    enc = model.model.encoder(torch.from_numpy(mel)).last_hidden_state.numpy()
  np.testing.assert_allclose(np.asarray(whisper.encode(params, mel, cfg)), enc, atol=1e-4, rtol=1e-4)


def test_greedy_matches_transformers_generate(hf_dir):
  d, model = hf_dir
  cfg, params = hf_whisper.load(d)
  mel = _mel(b=3, seed=4)
  prompt = [SOT, 9, 4]
  n = CFG.max_target_positions - len(prompt)
  ours = asr.greedy(params, cfg, mel, prompt, EOT, suppress=SUPPRESS, begin_suppress=BEGIN, max_new_tokens=n)
  with torch.no_grad():  # the generic generate: its suppress / begin-suppress processors read the config
    ref = transformers.GenerationMixin.generate(
        model, input_features=torch.from_numpy(mel), decoder_input_ids=torch.tensor([prompt] * 3),
        max_new_tokens=n, do_sample=False, num_beams=1).numpy()[:, len(prompt):]
  for row, r in zip(ours, ref):
    r = list(r)
    expect = r[:r.index(EOT)] if EOT in r else r
    assert row == expect
  assert any(len(r) > 3 for r in ours)


def test_cached_decoding_equals_full_recompute():
  params = whisper.init(CFG, jax.random.key(3))
  params = jax.tree.map(lambda x: x * 10.0 if x.ndim > 1 else x, params)
  mel, tokens = _mel(), _tokens(t=10)
  full = np.asarray(whisper.forward(params, mel, tokens, CFG))
  cache = whisper.init_cache(params, whisper.encode(params, mel, CFG), CFG)
  step = jax.jit(whisper.decode, static_argnames="cfg")
  logits, cache = step(params, tokens[:, :4], cache, CFG)  # a 4-token prefill, then one token at a time
  got = [np.asarray(logits)]
  for i in range(4, tokens.shape[1]):
    logits, cache = step(params, tokens[:, i:i + 1], cache, CFG)
    got.append(np.asarray(logits))
  assert step._cache_size() == 2  # one compile for the prefill, one for every later token
  np.testing.assert_allclose(np.concatenate(got, axis=1), full, atol=1e-4, rtol=1e-4)
  # decoder layers unstacked once (as the greedy loop passes them) give the same step
  dec = params["decoder"]
  unstacked = {**params, "decoder": {**dec, "layers": whisper.unstack_layers(dec["layers"], CFG.decoder_layers)}}
  cache = whisper.init_cache(params, whisper.encode(params, mel, CFG), CFG)
  np.testing.assert_allclose(np.asarray(step(unstacked, tokens[:, :4], cache, CFG)[0]), got[0], atol=1e-5)


def test_save_then_transformers_load(tmp_path):
  params = whisper.init(CFG, jax.random.key(5))
  params = jax.tree.map(lambda x: x * 5.0, params)
  hf_whisper.save(str(tmp_path), CFG, params, tokens={"decoder_start_token_id": SOT, "eos_token_id": EOT,
                                                      "pad_token_id": PAD, "bos_token_id": EOT})
  model = transformers.WhisperForConditionalGeneration.from_pretrained(str(tmp_path)).eval()
  mel, tokens = _mel(seed=7), _tokens(seed=8)
  np.testing.assert_allclose(_hf_logits(model, mel, tokens), np.asarray(whisper.forward(params, mel, tokens, CFG)),
                             atol=1e-4, rtol=1e-4)
  cfg2, params2 = hf_whisper.load(str(tmp_path))
  assert cfg2 == CFG
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, params2)
  from jaxlab import hf  # the generic entry points hand Whisper to jaxlab.hf.whisper
  hf.save(str(tmp_path / "generic"), CFG, params)
  cfg3, params3 = hf.load(str(tmp_path / "generic"))
  assert cfg3 == CFG
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, params3)
  with pytest.raises(FileExistsError):
    hf.save(str(tmp_path / "generic"), CFG, params)


def test_logical_axes_on_every_param():
  names = whisper.param_axes(CFG)
  shapes = jax.eval_shape(lambda: whisper.init(CFG, jax.random.key(0)))
  for n, s in zip(jax.tree.leaves(names, is_leaf=lambda x: isinstance(x, tuple)), jax.tree.leaves(shapes)):
    assert len(n) == len(s.shape)
  assert names["encoder"]["conv1"]["kernel"] == ("conv_width", "conv_in", "embed")
  assert names["decoder"]["layers"]["cross_attn"]["k"]["kernel"] == (axes.LAYERS, "embed", "kv_heads")


@pytest.mark.parametrize("quantization,atol", [("float32", 1e-4), ("int8", None)])
def test_ctranslate2_converted_model_loads(hf_dir, tmp_path, quantization, atol):
  ct2 = pytest.importorskip("ctranslate2")
  d, model = hf_dir
  out = str(tmp_path / "ct2")
  ct2.converters.TransformersConverter(d).convert(out, quantization=quantization)
  cfg, params = hf_whisper.load(out)
  assert cfg == CFG
  mel, tokens = _mel(seed=2), _tokens(seed=3)
  ref = _hf_logits(model, mel, tokens)
  ours = np.asarray(whisper.forward(params, mel, tokens, cfg))
  if atol is not None:
    np.testing.assert_allclose(ours, ref, atol=atol, rtol=1e-4)
  else:  # int8 rows with a scale each: the dequantized weights are within half a step of the float ones
    _, dense = hf_whisper.load(d)
    w, w_ref = params["encoder"]["layers"]["mlp"]["up"]["kernel"], dense["encoder"]["layers"]["mlp"]["up"]["kernel"]
    step = np.abs(np.asarray(w_ref)).max(axis=-2, keepdims=True) / 127
    assert np.all(np.abs(np.asarray(w) - np.asarray(w_ref)) <= step / 2 + 1e-6)
    assert np.corrcoef(ours.ravel(), ref.ravel())[0, 1] > 0.99


def test_bad_config_and_mel():
  with pytest.raises(ValueError, match="encoder_heads .* must divide d_model"):
    CFG.replace(encoder_heads=5)
  with pytest.raises(ValueError, match="param_dtype"):
    CFG.replace(param_dtype="int8")
  params = whisper.init(CFG, jax.random.key(0))
  with pytest.raises(ValueError, match=r"mel_BFT must be \[B, 8, 32\].*found shape \(1, 8, 31\)"):
    whisper.encode(params, jnp.zeros((1, 8, 31)), CFG)


def _ct2_file(variables, version=6):
  """A model.bin in CTranslate2's serialized layout (as ctranslate2.specs.model_spec writes it)."""
  def s(x):
    return struct.pack("<H", len(x) + 1) + x.encode() + b"\0"
  ids = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.int32): 3,
         np.dtype(np.float16): 4}
  out = struct.pack("<I", version) + s("WhisperSpec") + struct.pack("<II", 3, len(variables))
  for name, a in variables.items():
    out += s(name) + struct.pack("<B", a.ndim) + b"".join(struct.pack("<I", n) for n in a.shape)
    out += struct.pack("<BI", ids[a.dtype], a.nbytes) + a.tobytes()
  return out + struct.pack("<I", 0)


def test_bad_ctranslate2_files(hf_dir, tmp_path):
  ct2 = pytest.importorskip("ctranslate2")
  out = str(tmp_path / "ct2")
  ct2.converters.TransformersConverter(hf_dir[0]).convert(out, quantization="float16")
  _, v = hf_whisper.read_ct2(os.path.join(out, "model.bin"))
  good = {k: np.array(a) for k, a in v.items() if k != "decoder/projection/weight"}
  f = tmp_path / "model.bin"
  f.write_bytes(_ct2_file(good))
  hf_whisper.load_ctranslate2(str(f))  # our writer's layout is what the loader reads
  blob = f.read_bytes()
  f.write_bytes(blob[:len(blob) // 2])
  with pytest.raises(ValueError, match="truncated CTranslate2 model.bin"):
    hf_whisper.load_ctranslate2(str(f))
  f.write_bytes(_ct2_file(good, version=9))
  with pytest.raises(ValueError, match="binary version 5 or 6, found version 9"):
    hf_whisper.load_ctranslate2(str(f))
  bad = dict(good, **{"encoder/conv1/weight": good["encoder/conv1/weight"].astype(np.int32)})
  f.write_bytes(_ct2_file(bad))
  with pytest.raises(ValueError, match="'encoder/conv1/weight' has dtype int32; expected float32"):
    hf_whisper.load_ctranslate2(str(f))
