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
from typing import Literal

import jax

from experiments import registry
from experiments._shared.chat_models import answer, chat_ids, load_chat_model, resolve_model

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
  dtype: Literal["float32", "bfloat16"] = "float32"
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
    "full": Config(model=registry.Required("--set model=PATH: a .gguf file or a transformers directory"),
                   prompts=PROMPTS, max_new_tokens=256, dtype="bfloat16", timed_rerun=True),
}


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
    seed_key=None,
    results=("answers", "tokens_per_s", "new_tokens", "generate_s", "first_generate_s", "tokens_per_s_includes_compile",
             "load_s", "prompt_tokens", "model_path", "n_layers", "vocab_size")))

if __name__ == "__main__":
  repl()
