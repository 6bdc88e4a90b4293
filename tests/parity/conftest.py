"""Shared set-up for parity tests: tiny random transformers (PyTorch) models saved as checkpoints."""
import os

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import shutil  # noqa: E402
import types  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from jaxlab import hf  # noqa: E402

transformers.logging.set_verbosity_error()

BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=3e-6)
# Family-specific features each one must exercise (qwen2 has q/k/v biases built in, olmo2 post-norms + qk-norm).
FAMILIES = {
    "llama": {},
    "mistral": {"sliding_window": 5},
    "qwen2": {},
    "qwen3": {"head_dim": 24},
    "olmo2": {},
}


def randomize_(model, seed: int):
  """Every parameter random, including norm scales (around 1) and biases, so no mapping hides behind 1s/0s."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=g)
      p.copy_(1.0 + 0.3 * noise if "norm" in name else 0.15 * noise)
  return model


def make_hf_model(model_type: str, seed: int = 0, **overrides):
  kw = {**BASE, **FAMILIES[model_type], **overrides}
  cfg = transformers.AutoConfig.for_model(model_type, **kw)
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
  return randomize_(model, seed).eval()


def _saved(tmp_path_factory, model_type: str, tied: bool):
  model = make_hf_model(model_type, seed=len(model_type) + int(tied), tie_word_embeddings=tied)
  path = str(tmp_path_factory.mktemp(f"{model_type}_{'tied' if tied else 'untied'}"))
  model.save_pretrained(path)
  cfg, params = hf.load(path)
  return types.SimpleNamespace(model_type=model_type, tied=tied, model=model, path=path, cfg=cfg, params=params)


@pytest.fixture(scope="module", params=list(FAMILIES))
def decoder_family(request, tmp_path_factory):
  """One saved untied decoder LM per family: namespace(model_type, tied, model, path, cfg, params)."""
  return _saved(tmp_path_factory, request.param, tied=False)


@pytest.fixture(scope="module", params=list(FAMILIES))
def tied_decoder_family(request, tmp_path_factory):
  return _saved(tmp_path_factory, request.param, tied=True)


@pytest.fixture(scope="module")
def llama_ckpt(tmp_path_factory):
  return _saved(tmp_path_factory, "llama", tied=False)


@pytest.fixture
def fresh_dir(tmp_path):
  """A path (not yet created) for a checkpoint to be written."""
  d = tmp_path / "ckpt"
  yield str(d)
  shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def hf_model():
  """`make_hf_model(model_type, seed, **overrides)`: a tiny random transformers causal LM."""
  return make_hf_model
