"""Chat with a real pretrained model offline: SmolLM2-135M-Instruct (arXiv 2502.02737) from its GGUF file.

Each prompt becomes a one-turn conversation rendered with the model's own chat template, all prompts are
left-padded into one batch and answered by `jaxlab.generate.sample` (greedy by default) until the
end-of-turn token. Prints prompt, answer and decode speed; returns `answers` and `tokens_per_s`.

  python -m experiments run chat --preset cpu
  python -m experiments run chat --preset full --set model=/path/to/model.gguf   (or a transformers directory)
  python -m experiments.chat [--model PATH_OR_NAME]                              (interactive)
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import jax
import numpy as np

from experiments import registry
from jaxlab import hf
from jaxlab.hf import gguf as hf_gguf
from jaxlab.data import tokenizers
from jaxlab.generate import sample
from jaxlab.models import registry as models

PROMPTS = ("What is the capital of France?", "Give me three tips for staying focused while studying.",
           "Write a Python function that checks whether a number is prime.", "Why is the sky blue? Answer briefly.")


@dataclasses.dataclass(frozen=True)
class Config:
  """chat settings. `model` is a registered real model (jaxlab.models.registry) or a .gguf / HF directory path."""
  model: str = "smollm2-135m-instruct"
  prompts: tuple[str, ...] = PROMPTS[:2]
  system: str | None = None  # None: the template's default system turn (if it has one)
  max_new_tokens: int = 16
  temperature: float = 0.0
  top_p: float | None = None
  seed: int = 0
  dtype: str = "float32"
  timed_rerun: bool = False  # time a second, already compiled generation for tokens_per_s

  def __post_init__(self):
    if not self.prompts or not all(isinstance(p, str) and p for p in self.prompts):
      raise ValueError(f"prompts must be non-empty strings, found {self.prompts!r}")
    if self.max_new_tokens < 1:
      raise ValueError(f"max_new_tokens must be >= 1, found {self.max_new_tokens}")
    if self.dtype not in ("float32", "bfloat16"):
      raise ValueError(f"dtype must be float32 or bfloat16, found {self.dtype!r}")


PRESETS = {
    "smoke": Config(),
    "cpu": Config(prompts=PROMPTS, max_new_tokens=64, timed_rerun=True),
    "full": Config(model="REQUIRED: --set model=PATH (a .gguf file or a transformers directory)", prompts=PROMPTS,
                   max_new_tokens=256, dtype="bfloat16", timed_rerun=True),
}


def resolve_model(spec: str) -> str:
  """A registered real-model name -> its installed path; anything else must be an existing path."""
  if spec.startswith("REQUIRED"):
    raise ValueError(f"this preset needs a model: {spec}")
  if spec in models.REAL_MODELS:
    return models.real_model_path(spec)
  if not os.path.exists(spec):
    raise FileNotFoundError(f"model {spec!r} is neither a registered real model {sorted(models.REAL_MODELS)} nor "
                            "an existing .gguf file or transformers directory")
  return spec


def load_chat_model(spec: str, dtype: str = "float32"):
  """(cfg, params, tokenizer) of a chat model; the tokenizer must have a chat template and an eos token."""
  path = resolve_model(spec)
  if path.endswith(".gguf"):  # one parse of the file serves the tokenizer and the weights
    reader = hf_gguf.open_reader(path)
    tok = tokenizers.HFTokenizer.from_gguf(path, reader=reader)
  else:
    tok = tokenizers.load(path)
  if tok.chat_template is None:
    raise ValueError(f"{path}: the tokenizer has no chat template, so prompts cannot be formatted as chat")
  tok.require("eos", "chat generation (to stop at the end of the assistant turn)")
  cfg, params = hf_gguf.load(path, dtype, reader) if path.endswith(".gguf") else hf.load(path, dtype=dtype)
  if cfg.vocab_size < tok.vocab_size:
    raise ValueError(f"{path}: tokenizer vocabulary ({tok.vocab_size}) exceeds the model's ({cfg.vocab_size})")
  return cfg, params, tok


def chat_ids(tok, prompt: str, system: str | None = None, history=()) -> list[int]:
  msgs = ([{"role": "system", "content": system}] if system else []) + list(history)
  return tok.apply_chat_template(msgs + [{"role": "user", "content": prompt}], add_generation_prompt=True,
                                 tokenize=True)


def answer(cfg, params, tok, prompt_ids, max_new_tokens, temperature=0.0, top_p=None, key=None):
  """Generates for a batch of token lists; returns (answers, new-token counts)."""
  stops = tuple(sorted({tok.eos_id, *((cfg.eos_token_id,) if isinstance(cfg.eos_token_id, int) else
                                      (cfg.eos_token_id or ()))}))
  out = sample(params, cfg, list(prompt_ids), max_new_tokens, temperature=temperature, top_p=top_p, key=key,
               stop_tokens=stops, pad_id=tok.batch_pad_id)
  toks, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  return [tok.decode(t[:n]).strip() for t, n in zip(toks, lengths)], lengths


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  del resume  # one short generation: nothing to resume
  t0 = time.perf_counter()
  mcfg, params, tok = load_chat_model(cfg.model, cfg.dtype)
  load_s = time.perf_counter() - t0
  prompt_ids = [chat_ids(tok, p, cfg.system) for p in cfg.prompts]
  key = jax.random.key(cfg.seed) if cfg.temperature > 0 else None
  gen = lambda: answer(mcfg, params, tok, prompt_ids, cfg.max_new_tokens, cfg.temperature, cfg.top_p, key)
  t0 = time.perf_counter()
  answers, lengths = gen()
  first_s = time.perf_counter() - t0
  gen_s = first_s
  if cfg.timed_rerun:
    t0 = time.perf_counter()
    answers, lengths = gen()
    gen_s = time.perf_counter() - t0
  n_new = int(lengths.sum())
  with open(os.path.join(out_dir, "metrics.jsonl"), "w") as f:
    for p, a, n in zip(cfg.prompts, answers, lengths.tolist()):
      print(f"\n>>> {p}\n{a}", flush=True)
      f.write(json.dumps({"prompt": p, "answer": a, "new_tokens": n}) + "\n")
  tps = n_new / gen_s
  print(f"\n{n_new} tokens in {gen_s:.2f}s: {tps:.1f} tokens/s"
        f"{' (compile included)' if not cfg.timed_rerun else ''}; load {load_s:.1f}s", flush=True)
  return {"answers": answers, "tokens_per_s": tps, "new_tokens": n_new, "generate_s": gen_s,
          "first_generate_s": first_s, "tokens_per_s_includes_compile": not cfg.timed_rerun, "load_s": load_s,
          "prompt_tokens": [len(p) for p in prompt_ids], "model_path": resolve_model(cfg.model),
          "n_layers": mcfg.n_layers, "vocab_size": mcfg.vocab_size}


def repl(argv=None) -> None:
  """Interactive multi-turn chat on the terminal (empty line or EOF quits, /reset clears the history)."""
  ap = argparse.ArgumentParser(prog="python -m experiments.chat", description="chat with an offline model")
  ap.add_argument("--model", default=PRESETS["cpu"].model, help="registered real model name or a path")
  ap.add_argument("--max-new-tokens", type=int, default=256)
  ap.add_argument("--temperature", type=float, default=0.0)
  ap.add_argument("--system", default=None)
  args = ap.parse_args(argv)
  cfg, params, tok = load_chat_model(args.model)
  history, key = [], jax.random.key(0)
  while True:
    try:
      line = input("you> ").strip()
    except EOFError:
      break
    if not line:
      break
    if line == "/reset":
      history = []
      continue
    key, sub = jax.random.split(key)
    (reply,), _ = answer(cfg, params, tok, [chat_ids(tok, line, args.system, history)], args.max_new_tokens,
                         args.temperature, key=sub if args.temperature > 0 else None)
    print(f"bot> {reply}", flush=True)
    history += [{"role": "user", "content": line}, {"role": "assistant", "content": reply}]


registry.register(registry.Experiment(
    name="chat", config_cls=Config, presets=PRESETS, run=run,
    description="answer fixed prompts with SmolLM2-135M-Instruct (GGUF, chat template, greedy)",
    seed_key=None))

if __name__ == "__main__":
  repl()
