"""Benchmarks against transformers (PyTorch eager) on the same weights (`train_step`, `generate`), and of the LM
input path feeding training (`input`).

MFU (PaLM, arXiv 2204.02311, appendix B) counts `transformer.flops_per_token` (6N + attention) for both
implementations against the machine's measured peak (`jaxlab.train.metrics.peak_flops`: NumPy fp32 GEMM on
CPU). The PyTorch model is the jaxlab model exported with `jaxlab.hf.save` and loaded by `from_pretrained`,
so both compute the same function; the report includes their initial losses / greedy tokens as a check.

  python -m experiments bench train_step [--model llama-60m --batch 8 --seq 256 --steps 3] [--out f.json]
  python -m experiments bench generate [--model llama-60m|smollm2-135m-instruct|PATH --new-tokens 128 --batches 1,8
      --weights fp32,bf16,int8,int8:0:sym --prompts random|chat] [--out f.json]
  python -m experiments bench serve [--model smollm2-135m-instruct --requests 24 --slots 8 --new-tokens 96]
  python -m experiments bench input --tokenizer DIR [--corpus stdlib --batch 512 --seq 256 --read-threads 0,2,4]
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import statistics
import tempfile
import time

import jax
import numpy as np

from experiments import registry
from jaxlab.models import transformer as tfm
from jaxlab.train import metrics as metrics_lib


def _model_cfg(name: str, dtype: str) -> tfm.Config:
  if name not in tfm.PRESETS:
    raise SystemExit(f"unknown model {name!r}; presets: {sorted(tfm.PRESETS)}")
  return tfm.PRESETS[name].replace(dtype=dtype, param_dtype=dtype)


def _hf_model(cfg: tfm.Config, params, torch_dtype):
  import transformers
  from jaxlab import hf
  with tempfile.TemporaryDirectory() as d:
    hf.save(d, cfg, jax.device_get(params), overwrite=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch_dtype)
  return model


def _timed(fn, steps: int, warmup: int) -> tuple[list[float], float]:
  t0 = time.perf_counter()
  for _ in range(warmup):
    fn()
  first = time.perf_counter() - t0
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return times, first


def _train_jax(cfg, params, tokens, lr, steps, warmup):
  import optax
  from jaxlab.train import state as st, step as sp
  tx = optax.adamw(lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0)
  state = st.TrainState(params, jax.jit(tx.init)(params), np.int32(0), jax.random.PRNGKey(0))
  step = sp.jit_train_step(sp.make_train_step(sp.lm_loss_fn(cfg, document_mask=False), tx))
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
  box = {"state": state, "losses": []}

  def one():
    box["state"], m = step(box["state"], batch)
    box["losses"].append(float(m["loss"]))  # blocks until the step is done
  times, first = _timed(one, steps, warmup)
  return times, first, box["losses"][0]


def _train_torch(model, tokens, lr, steps, warmup):
  import torch
  opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
  inputs = torch.from_numpy(np.asarray(tokens[:, :-1], np.int64))
  targets = torch.from_numpy(np.asarray(tokens[:, 1:], np.int64))
  model.train()
  losses = []

  def one():
    logits = model(input_ids=inputs).logits
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(float(loss.detach()))
  times, first = _timed(one, steps, warmup)
  return times, first, losses[0]


def _parser(prog: str, hf: bool = True) -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog=f"python -m experiments bench {prog}")
  p.add_argument("--model", default="llama-60m", help="a transformer.PRESETS name")
  p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  if not hf:
    return p
  p.add_argument("--no-hf", action="store_true", help="skip the transformers/PyTorch side")
  p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch intra-op threads")
  p.add_argument("--remeasure-peak", action="store_true",
                 help="measure the peak FLOP/s again and store it as this machine's cached value")
  return p


def _peak(remeasure: bool) -> float:
  if remeasure and not os.environ.get("JAXLAB_PEAK_FLOPS"):
    return metrics_lib.remeasure_peak_flops()
  return metrics_lib.peak_flops()


def bench_train_step(argv) -> dict:
  """Train-step throughput (fwd + bwd + AdamW, fp32 by default): jaxlab vs transformers eager."""
  p = _parser("train_step")
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--seq", type=int, default=256)
  p.add_argument("--steps", type=int, default=3, help="timed steps (median reported)")
  p.add_argument("--warmup", type=int, default=1, help="untimed steps first (the jax one compiles)")
  args = p.parse_args(argv)
  cfg = _model_cfg(args.model, args.dtype)
  peak = _peak(args.remeasure_peak)
  fpt = tfm.flops_per_token(cfg, args.seq)
  tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (args.batch, args.seq + 1)).astype(np.int32)
  params = tfm.init(cfg, jax.random.PRNGKey(0))
  n_tok = args.batch * args.seq
  out = {"model": args.model, "params": tfm.num_params(params), "batch": args.batch, "seq": args.seq,
         "dtype": args.dtype, "flops_per_token": fpt, "peak_flops": peak, "backend": jax.default_backend(),
         "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}
  hf_model = None
  if not args.no_hf:
    import torch
    torch.set_num_threads(args.threads)
    hf_model = _hf_model(cfg, params, getattr(torch, args.dtype))
  times, first, loss0 = _train_jax(cfg, params, tokens, 1e-3, args.steps, args.warmup)
  del params
  med = statistics.median(times)
  out.update(jax_step_s=med, jax_first_step_s=first, jax_tokens_per_s=n_tok / med,
             jax_mfu=fpt * n_tok / med / peak, jax_initial_loss=loss0)
  if hf_model is not None:
    import torch
    times, first, loss0 = _train_torch(hf_model, tokens, 1e-3, args.steps, args.warmup)
    med = statistics.median(times)
    out.update(hf_step_s=med, hf_first_step_s=first, hf_tokens_per_s=n_tok / med,
               hf_mfu=fpt * n_tok / med / peak, hf_initial_loss=loss0, torch_threads=torch.get_num_threads(),
               hf_attn_implementation=hf_model.config._attn_implementation)
    out["speedup_vs_hf"] = out["jax_tokens_per_s"] / out["hf_tokens_per_s"]
    out["initial_loss_abs_diff"] = abs(out["jax_initial_loss"] - out["hf_initial_loss"])
  return out


def _generate_models(spec: str, dtype: str, want_hf: bool):
  """(cfg, params, hf_model or None, gguf path or None) for a preset, a real-model name or a path."""
  from jaxlab import hf
  from jaxlab.models import registry as real
  if want_hf:
    import torch
    import transformers
  if spec in tfm.PRESETS:
    cfg = _model_cfg(spec, dtype)
    params = tfm.init(cfg, jax.random.PRNGKey(0))
    return cfg, params, (_hf_model(cfg, params, getattr(torch, dtype)).eval() if want_hf else None), None
  path = real.real_model_path(spec) if spec in real.REAL_MODELS else spec
  if not os.path.exists(path):
    raise SystemExit(f"--model {spec!r} is neither a preset {sorted(tfm.PRESETS)}, a real model "
                     f"{sorted(real.REAL_MODELS)} nor an existing .gguf file or transformers directory")
  cfg, params = hf.load(path, dtype=dtype)
  hf_model = None
  if want_hf:  # transformers dequantizes the same GGUF tensors, so both sides run the same weights
    kw = dict(gguf_file=os.path.basename(path)) if path.endswith(".gguf") else {}
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path) if kw else path, dtype=getattr(torch, dtype), **kw).eval()
  return cfg, params, hf_model, (path if path.endswith(".gguf") else None)


CHAT_MESSAGES = (
    "What is the capital of France, and what is it famous for?",
    "Write a short poem about the sea.",
    "Explain in simple terms how a rainbow forms.",
    "Give me three tips for staying focused while studying.",
    "What is the difference between a list and a tuple in Python?",
    "Summarize the plot of Romeo and Juliet in a few sentences.",
    "How do I make a cup of green tea?",
    "Why is the sky blue?",
)


def _chat_prompts(path: str, n: int) -> list[list[int]]:
  """The first n of CHAT_MESSAGES (cycled) as one-turn chats in the model's own template, token ids."""
  from jaxlab import data
  tok = data.load_tokenizer(path)
  msgs = [CHAT_MESSAGES[i % len(CHAT_MESSAGES)] for i in range(n)]
  return [tok.encode(tok.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True))
          for m in msgs]


def _weights_variant(params, spec: str):
  """'fp32', 'bf16', 'int8' (quant.INT8), 'int4' (quant.INT4) or 'MODE:GROUP[:SCHEME[:HEAD]]' -> quantized params."""
  from jaxlab.generate import quant
  mode, *rest = spec.split(":")
  kw = dict(zip(("group", "scheme", "head"), rest))
  if "group" in kw:
    kw["group"] = int(kw["group"])
  return quant.quantize(params, mode, **kw)


def _llama_cpp_server(path: str, batch: int, ctx_per_row: int, threads: int):
  """An xllamacpp (llama.cpp) server on the GGUF file with `batch` slots of `ctx_per_row` tokens; None when
  xllamacpp is not installed."""
  try:
    import xllamacpp
  except ImportError:
    return None
  p = xllamacpp.CommonParams()
  p.model.path = path
  p.n_parallel = batch
  p.n_ctx = batch * ctx_per_row  # split evenly over the slots
  p.cpuparams.n_threads = p.cpuparams_batch.n_threads = threads
  p.warmup = False
  return xllamacpp.Server(p)


def _timed_once(fn, with_tokens: bool = False):
  """(fn's tokens or None, seconds fn took)."""
  t0 = time.perf_counter()
  tokens = fn()
  return (tokens if with_tokens else None), time.perf_counter() - t0


def _llama_cpp_round(path, rows, ctx_per_row: int, threads: int, new_tokens: int, with_tokens: bool = False):
  """(tokens or None, seconds) of one llama.cpp round on a server of its own, started and warmed before the
  clock and gone after it: an idle server's OpenMP threads, spinning under OMP_WAIT_POLICY=active, would
  otherwise take a core from the rounds of the other variants."""
  server = _llama_cpp_server(path, len(rows), ctx_per_row, threads)
  _llama_cpp_generate(server, rows, 2)
  t0 = time.perf_counter()
  tokens = _llama_cpp_generate(server, rows, new_tokens, with_tokens)
  return tokens, time.perf_counter() - t0


def _llama_cpp_generate(server, rows, new_tokens: int, with_tokens: bool = False):
  """Greedy completions of the token rows as concurrent requests (the server batches them over its slots); the
  [batch, new_tokens] token ids with `with_tokens` (read from the per-token log-probs), else None."""
  from concurrent.futures import ThreadPoolExecutor
  req = {"max_tokens": new_tokens, "temperature": 0.0, "top_k": 1, "ignore_eos": True, "cache_prompt": False}
  if with_tokens:
    req["logprobs"] = 1

  def one(row):
    r = server.handle_completions(dict(req, prompt=[int(t) for t in row]))
    if "choices" not in r:
      raise RuntimeError(f"llama.cpp failed: {r}")
    return [c["id"] for c in r["choices"][0]["logprobs"]["content"]] if with_tokens else None
  with ThreadPoolExecutor(len(rows)) as ex:
    out = list(ex.map(one, rows))
  return np.asarray(out) if with_tokens else None


def bench_generate(argv) -> dict:
  """Greedy generation throughput (new tokens/s over the batch): jaxlab.generate.sample with fp32, bf16 and
  int8 weights against HF generate (fp32, same weights) and, for a GGUF model with xllamacpp installed,
  llama.cpp on the original file (its quantized blocks, `--threads` threads): the batch's prompts go to one
  llama.cpp server with `batch` slots as concurrent requests, so llama.cpp batches them as it serves them.
  Variants run in alternating rounds in one process; the best round of each is reported, with ratios
  (`*_vs_llama_cpp`: jaxlab tokens/s over llama.cpp's) and greedy-token agreement: the fraction of the
  [batch, new_tokens] positions whose token equals fp32 jaxlab's (stop tokens off, so every row runs to
  new_tokens). Prompts are
  random token ids (`--prompts random`) or, for a model with a tokenizer and chat template (a GGUF file), the
  first `batch` of CHAT_MESSAGES as one-turn chats (`--prompts chat`, left-padded to a common length)."""
  p = _parser("generate")
  p.set_defaults(model="llama-60m")
  p.add_argument("--new-tokens", type=int, default=128)
  p.add_argument("--prompt-len", type=int, default=16)
  p.add_argument("--batches", default="1,8", help="comma-separated batch sizes")
  p.add_argument("--weights", default="fp32,bf16,int8",
                 help="comma-separated jaxlab weight modes: fp32, bf16, int8, int4 or MODE:GROUP[:SCHEME[:HEAD]]")
  p.add_argument("--prompts", default="random", choices=["random", "chat"],
                 help="random token ids, or chat prompts in the model's template (a GGUF model)")
  p.add_argument("--repeats", type=int, default=2, help="timed rounds (each runs every variant once)")
  p.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp even when it is installed")
  p.add_argument("--llama-omp-wait", choices=["passive", "active"], default=None,
                 help="OMP_WAIT_POLICY for llama.cpp's OpenMP threads (default: the environment's; 'passive' "
                      "stops idle threads spinning, which on a machine shared with other jobs costs llama.cpp "
                      "most of its speed)")
  args = p.parse_args(argv)
  if args.llama_omp_wait:  # read when the OpenMP runtime loads, so before torch or xllamacpp is imported
    os.environ["OMP_WAIT_POLICY"] = args.llama_omp_wait.upper()
  from jaxlab.generate import quant, sample
  modes = [m for m in args.weights.split(",") if m]
  if "fp32" not in modes:
    modes.insert(0, "fp32")
  cfg, params, hf_model, gguf = _generate_models(args.model, args.dtype, not args.no_hf)
  cfg = cfg.replace(eos_token_id=None)
  if args.prompts == "chat" and not gguf:
    raise SystemExit("--prompts chat needs a GGUF model (its tokenizer and chat template)")
  out = {"model": args.model, "dtype": args.dtype, "new_tokens": args.new_tokens, "prompt_len": args.prompt_len,
         "prompts": args.prompts,
         "params": tfm.num_params(params), "backend": jax.default_backend(), "cpu_count": os.cpu_count(),
         "load_avg_1m_start": os.getloadavg()[0], "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "")}
  qparams = {m: _weights_variant(params, m) for m in modes}
  out.update({f"jax_{m}_weight_bytes": quant.weight_bytes(q) for m, q in qparams.items()})
  if hf_model is not None:
    import torch
    torch.set_num_threads(args.threads)
    out["torch_threads"] = torch.get_num_threads()
  for b in (int(x) for x in args.batches.split(",")):
    if args.prompts == "chat":
      rows = _chat_prompts(gguf, b)
      t = max(len(r) for r in rows)
      prompt = np.array([[0] * (t - len(r)) + r for r in rows], np.int32)
      mask = np.array([[0] * (t - len(r)) + [1] * len(r) for r in rows], np.int32)
    else:
      prompt = np.random.default_rng(b).integers(0, cfg.vocab_size, (b, args.prompt_len)).astype(np.int32)
      mask = np.ones_like(prompt)
    out[f"b{b}_prompt_tokens"] = int(mask.sum())
    runs, tokens = {}, {}
    for m in modes:
      runs[f"jax_{m}"] = lambda q=qparams[m], prompt=prompt, mask=mask: np.asarray(
          sample(q, cfg, prompt, args.new_tokens, prompt_mask=mask).tokens)
    if hf_model is not None:
      import torch
      ids = torch.from_numpy(prompt.astype(np.int64))
      kw = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                attention_mask=torch.from_numpy(mask.astype(np.int64)), pad_token_id=0)

      def hf_run():
        with torch.inference_mode():
          return hf_model.generate(ids, **kw)[:, prompt.shape[1]:].numpy()  # noqa: B023 (timed in this iteration)
      runs["hf"] = hf_run
    timed = {name: functools.partial(_timed_once, fn) for name, fn in runs.items()}
    if gguf and not args.no_llama_cpp and importlib.util.find_spec("xllamacpp") is not None:
      rows = [r[k > 0] for r, k in zip(prompt, mask)]
      out["llama_cpp_threads"] = args.threads
      timed["llama_cpp"] = functools.partial(_llama_cpp_round, gguf, rows, prompt.shape[1] + args.new_tokens + 16,
                                             args.threads, args.new_tokens)
    for name, fn in timed.items():  # compiles the jax programs
      tokens[name], seconds = fn(with_tokens=True)
      out[f"{name}_b{b}_first_call_s"] = seconds
    best = {name: float("inf") for name in timed}
    for r in range(args.repeats):
      for name in (list(timed) if r % 2 == 0 else list(timed)[::-1]):
        best[name] = min(best[name], timed[name]()[1])
    for name in timed:
      out[f"{name}_b{b}_tokens_per_s"] = b * args.new_tokens / best[name]
      out[f"{name}_b{b}_agreement_with_jax_fp32"] = float(np.mean(tokens[name] == tokens["jax_fp32"]))
      if name != "hf" and "hf" in timed:
        out[f"{name}_b{b}_speedup_vs_hf"] = best["hf"] / best[name]
      if name.startswith("jax_") and "llama_cpp" in timed:
        out[f"{name}_b{b}_vs_llama_cpp"] = best["llama_cpp"] / best[name]
  out["load_avg_1m_end"] = os.getloadavg()[0]
  return out


def bench_input(argv) -> dict:
  """Packed-batch throughput of `data.lm_batches` per reader-thread count, then `train.loop.train_loop` on
  those batches with the next batch read while the step runs (as it is) against a step that blocks before the
  next read (host and device in series), in alternating rounds."""
  import optax
  from experiments._shared.data import load_corpus
  from jaxlab import data as data_lib
  from jaxlab.train import loop as loop_lib, state as st, step as sp
  p = _parser("input", hf=False)
  p.add_argument("--corpus", default="stdlib", help="'stdlib', a JSONL/parquet/text path or hf:NAME")
  p.add_argument("--tokenizer", default="byte", help="'byte' or a tokenizer.json (directory)")
  p.add_argument("--batch", type=int, default=512)
  p.add_argument("--seq", type=int, default=256)
  p.add_argument("--batches", type=int, default=10, help="timed batches per measurement")
  p.add_argument("--read-threads", default="0,2,4", help="comma-separated reader-thread counts")
  p.add_argument("--loop-steps", type=int, default=10, help="timed train steps per round (0: skip the loop)")
  p.add_argument("--rounds", type=int, default=2)
  args = p.parse_args(argv)
  docs, tok = load_corpus(args.corpus), data_lib.load_tokenizer(args.tokenizer)
  n_tok = args.batch * args.seq
  out = {"corpus": args.corpus, "tokenizer": args.tokenizer, "batch": args.batch, "seq": args.seq,
         "backend": jax.default_backend(), "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}

  def batches(threads):
    return data_lib.lm_batches(docs, tok, args.seq, args.batch, read_threads=threads)

  threads = [int(t) for t in args.read_threads.split(",")]
  rates = {t: [] for t in threads}
  for _ in range(args.rounds):
    for t in threads:
      it = batches(t)
      next(it)  # reader threads started, prefetch buffer filling
      times, _ = _timed(lambda it=it: next(it), args.batches, 0)
      rates[t].append(n_tok * args.batches / sum(times))  # a total: the window-shuffle buffer refills in bursts
  out.update({f"input_tokens_per_s.threads_{t}": max(r) for t, r in rates.items()})
  if args.loop_steps <= 0:
    return out

  cfg = _model_cfg(args.model, args.dtype).replace(vocab_size=max(tok.vocab_size, 8))
  tx = optax.adamw(1e-4)
  step = sp.jit_train_step(sp.make_train_step(sp.lm_loss_fn(cfg), tx))
  serial = lambda state, batch: jax.block_until_ready(step(state, batch))
  state = st.create(tfm.init(cfg, jax.random.PRNGKey(0)), tx)
  it = batches(max(threads))
  state = loop_lib.train_loop(state, step, it, 2, desc="compile").state
  secs = {"overlapped": [], "serial": []}
  for r in range(args.rounds):
    for name in ("overlapped", "serial") if r % 2 == 0 else ("serial", "overlapped"):
      fn, start = (step if name == "overlapped" else serial), int(state.step)
      t0 = time.perf_counter()
      state = jax.block_until_ready(loop_lib.train_loop(state, fn, it, start + args.loop_steps, desc=name).state)
      secs[name].append((time.perf_counter() - t0) / args.loop_steps)
  out.update(model=args.model, loop_step_s_overlapped=min(secs["overlapped"]), loop_step_s_serial=min(secs["serial"]),
             loop_speedup=min(secs["serial"]) / min(secs["overlapped"]))
  return out


def bench_serve(argv) -> dict:
  """Serving many chat requests whose answers end at different lengths (the model's own end of turn): static
  batches of `slots` (`sample`: each batch decodes until its longest answer ends) against continuous batching with
  `slots` slots (`continuous.generate`: a finished answer's slot takes the next request at once). Both greedy on the
  same prompts (CHAT_MESSAGES cycled), in alternating rounds; reported: generated tokens/s of each (the best round),
  their ratio `continuous_vs_static`, decode steps of each, and whether every request's tokens agree."""
  p = _parser("serve", hf=False)
  p.set_defaults(model="smollm2-135m-instruct")
  p.add_argument("--requests", type=int, default=24)
  p.add_argument("--slots", type=int, default=8)
  p.add_argument("--new-tokens", type=int, default=96)
  p.add_argument("--repeats", type=int, default=2)
  args = p.parse_args(argv)
  from jaxlab.generate import continuous, sample
  cfg, params, _, gguf = _generate_models(args.model, args.dtype, False)
  if not gguf:
    raise SystemExit("bench serve needs a GGUF chat model (its tokenizer and chat template), e.g. "
                     "smollm2-135m-instruct")
  rows = _chat_prompts(gguf, args.requests)
  n, b = args.new_tokens, args.slots  # both stop at the model's end of turn (cfg.eos_token_id)

  def static():
    out = []
    for i in range(0, len(rows), b):
      res = sample(params, cfg, rows[i:i + b], n)
      out += [np.asarray(res.tokens[j, :int(res.lengths[j])]).tolist() for j in range(len(rows[i:i + b]))]
    return out

  def served():
    return continuous.generate(params, cfg, rows, n, slots=b, stats=stats)
  stats: dict = {}
  outs = {"static": static(), "continuous": served()}  # compiles
  best = {k: float("inf") for k in outs}
  for r in range(args.repeats):
    for name, fn in (("static", static), ("continuous", served))[::1 if r % 2 == 0 else -1]:
      t0 = time.perf_counter()
      fn()
      best[name] = min(best[name], time.perf_counter() - t0)
  tokens = sum(len(o) for o in outs["static"])
  lengths = [len(o) for o in outs["static"]]
  return {"model": args.model, "requests": args.requests, "slots": b, "new_tokens": n, "generated_tokens": tokens,
          "answer_tokens_min_max": [min(lengths), max(lengths)],
          "static_tokens_per_s": tokens / best["static"], "continuous_tokens_per_s": tokens / best["continuous"],
          "continuous_vs_static": best["static"] / best["continuous"],
          "decode_steps_static": sum(max(lengths[i:i + b]) - 1 for i in range(0, len(rows), b)),
          "decode_steps_continuous": stats["steps"], "same_tokens": outs["static"] == outs["continuous"],
          "load_avg_1m": os.getloadavg()[0]}


def bench_rollout(argv) -> dict:
  """GRPO rollouts (`jaxlab.rl.sample_rollout`, G samples of each of P chat prompts at temperature 1, ending at the
  model's end of turn) with all B = P * G rows in one `sample` batch against continuous batching with `slots` slots.
  The two draw different samples (one batch key against a key per row), so each is reported as its generated
  tokens/s (the best of alternating rounds), with their ratio `continuous_vs_one_batch` and the tokens drawn."""
  p = _parser("rollout", hf=False)
  p.set_defaults(model="smollm2-135m-instruct")
  p.add_argument("--prompts", type=int, default=8)
  p.add_argument("--group", type=int, default=8)
  p.add_argument("--slots", type=int, default=16)
  p.add_argument("--new-tokens", type=int, default=64)
  p.add_argument("--repeats", type=int, default=2)
  args = p.parse_args(argv)
  import jax
  from jaxlab.rl import sample_rollout
  cfg, params, _, gguf = _generate_models(args.model, args.dtype, False)
  if not gguf:
    raise SystemExit("bench rollout needs a GGUF chat model (its chat template), e.g. smollm2-135m-instruct")
  rows = _chat_prompts(gguf, args.prompts)
  kinds = {"one_batch": None, "continuous": args.slots}

  def roll(name, r):
    ro = sample_rollout(params, cfg, rows, [{}] * len(rows), group_size=args.group, max_new_tokens=args.new_tokens,
                        key=jax.random.key(r), temperature=1.0, slots=kinds[name])
    return int(ro.completion_mask.sum())
  for name in kinds:
    roll(name, 0)  # compiles
  speed, drawn = {k: 0.0 for k in kinds}, {k: [] for k in kinds}
  for r in range(args.repeats):
    for name in list(kinds)[::1 if r % 2 == 0 else -1]:
      t0 = time.perf_counter()
      n = roll(name, r + 1)
      speed[name] = max(speed[name], n / (time.perf_counter() - t0))
      drawn[name].append(n)
  return {"model": args.model, "rows": args.prompts * args.group, "slots": args.slots, "new_tokens": args.new_tokens,
          "tokens_drawn": drawn, "one_batch_tokens_per_s": speed["one_batch"],
          "continuous_tokens_per_s": speed["continuous"],
          "continuous_vs_one_batch": speed["continuous"] / speed["one_batch"], "load_avg_1m": os.getloadavg()[0]}


registry.register_bench("train_step", bench_train_step,
                        "llama-60m train step (fwd+bwd+AdamW) tokens/s and MFU, jaxlab vs transformers eager")
registry.register_bench("generate", bench_generate,
                        "greedy generation tokens/s (batch 1 and 8), jaxlab.generate.sample fp32/bf16/int8 vs HF "
                        "generate (and llama.cpp on a GGUF model)")
registry.register_bench("serve", bench_serve,
                        "many chat requests of different answer lengths: continuous batching vs static batches, "
                        "tokens/s")
registry.register_bench("rollout", bench_rollout,
                        "GRPO rollouts of G samples per prompt: every row in one sample batch vs continuous batching, "
                        "tokens/s")
registry.register_bench("input", bench_input,
                        "LM input pipeline tokens/s per reader-thread count; train loop with the next batch read "
                        "during the step vs in series")
