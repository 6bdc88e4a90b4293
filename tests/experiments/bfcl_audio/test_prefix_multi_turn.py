"""bfcl_audio's multi-turn generation with each conversation's earlier prompt kept as a KV cache
(`multi_turn.prefix_chat_generator`) answers every step as `run.chat_generator` (whole prompts prefilled) does:
two conversations played step by step (each step reading its earlier steps from the cache), on a tiny random model with SmolLM2's tokenizer and chat template."""
import jax
import pytest

from experiments.bfcl_audio import multi_turn as mt
from experiments.bfcl_audio import run as run_exp
from jaxlab import data
from jaxlab.models import registry
from jaxlab.models import transformer as tfm


@pytest.fixture(scope="module")
def loaded():
  tok = data.load_tokenizer(registry.real_model_path("smollm2-135m-instruct"))
  cfg = tfm.Config.tiny(vocab_size=tok.vocab_size, init_std=0.2, eos_token_id=None, pad_token_id=0)
  return cfg, tfm.init(cfg, jax.random.key(0)), tok


def test_cached_steps_answer_as_whole_prompts(loaded):
  whole = run_exp.chat_generator("unused", 10, 1, loaded=loaded)
  cached = mt.prefix_chat_generator(loaded, 10, room=256)
  chats = [[{"role": "system", "content": "You call functions: ls(), cd(folder), mkdir(dir_name). " * 6}],
           [{"role": "system", "content": "You are a trading bot with get_stock_info(symbol)."}]]
  tok, reusable = loaded[2], 0
  for step in range(4):
    for c in chats:
      if step:  # the last step's prompt less its last token (which `sample` prefills) is kept
        reusable += len(tok.apply_chat_template(c[:-2], add_generation_prompt=True, tokenize=True)) - 1
      c.append({"role": "user", "content": f"Step {step}: list the folder and make a directory named d{step}."})
    want = [whole([{"messages": c}])[0] for c in chats]
    got = cached(chats)
    assert got == want
    for c, text in zip(chats, got):
      c.append({"role": "assistant", "content": text})
      c.append({"role": "tool", "name": "ls()", "content": f'{{"current_directory_content": ["f{step}.txt"]}}'})
  assert cached.counts["reused_tokens"] == reusable
