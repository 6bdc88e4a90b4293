"""The run of spec_dllm: what `python -m experiments run spec_dllm` executes (its Config, presets and claims are in
`experiments/spec_dllm/__init__.py`, the paper and its departures in `experiments/spec_dllm/README.md`)."""
from __future__ import annotations

import collections
import functools
import json
import math
import os
import re
import shutil
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments import registry
from experiments.runner import plan as plan_lib, splits
from experiments._shared.recipes import optimizer
from jaxlab import hf, losses, sharding as shd
from jaxlab.evals import sandbox
from jaxlab.hf import hub
from jaxlab.generate import diffusion
from experiments.spec_dllm import speculative
from jaxlab.models import mdm
from jaxlab.train import metrics as metrics_lib, state as state_lib, step as step_lib
from jaxlab.train.checkpoint import Checkpointer
from experiments.spec_dllm import Config, EOS, EQ, PLUS


def _digits(v: int, width: int | None = None) -> list[int]:
  s = str(v) if width is None else str(v).zfill(width)
  return [int(c) for c in s]


def _held_out(a, b):
  return (a * 7919 + b * 104729) % 16 == 0


def arithmetic(rng: np.random.RandomState, n: int, digits: int, gen_length: int, held_out: bool):
  """n problems a+b with d-digit operands, digits least significant first (the order carries propagate in).

  Returns:
    prompts [n, 2d+2] ("a_0..a_{d-1} + b_0..b_{d-1} ="), answers [n, gen_length]: the d+1 digits of a+b,
    least significant first, then <eos>.
  """
  out_a, out_b = [], []
  while len(out_a) < n:
    a, b = rng.randint(0, 10 ** digits, size=(2, 4 * n))
    keep = _held_out(a, b) == held_out
    out_a += a[keep].tolist()
    out_b += b[keep].tolist()
  a, b = np.array(out_a[:n]), np.array(out_b[:n])
  rev = lambda v, width: _digits(int(v), width)[::-1]
  prompts = np.array([rev(x, digits) + [PLUS] + rev(y, digits) + [EQ] for x, y in zip(a, b)], np.int32)
  answers = np.full((n, gen_length), EOS, np.int32)
  answers[:, :digits + 1] = [rev(v, digits + 1) for v in a + b]
  return prompts, answers


def arithmetic_correct(gen: np.ndarray, answers: np.ndarray) -> np.ndarray:
  """Exact match of the digits before the first <eos> (and an <eos> after them)."""
  def cut(row):
    hit = np.nonzero(row == EOS)[0]
    return tuple(row[:hit[0]]) if len(hit) else None
  return np.array([cut(g) is not None and cut(g) == cut(a) for g, a in zip(gen, answers)])


def train_batch(cfg: Config, s: int):
  """The problems of training step `s`: (prompts, answers) as `arithmetic` returns them, never held out."""
  return arithmetic(np.random.RandomState(cfg.seed * 100003 + s), cfg.batch_size, cfg.digits, cfg.gen_length,
                    held_out=False)


def eval_problems(cfg: Config):
  """The held-out problems the arithmetic task is evaluated on: (prompts, answers)."""
  return arithmetic(np.random.RandomState(10_000 + cfg.seed), cfg.eval_examples, cfg.digits, cfg.gen_length,
                    held_out=True)


def problem_text(prompt) -> str:
  """A prompt's canonical text, as the model reads it ("321+654=": digits least significant first)."""
  return "".join({PLUS: "+", EQ: "="}.get(int(t), str(int(t))) for t in prompt)


def arithmetic_splits(cfg: Config) -> dict:
  """{"train": every problem a training step draws, "test": the evaluated ones}, as problem texts."""
  train = [problem_text(p) for s in range(cfg.train_steps) for p in train_batch(cfg, s)[0]]
  return {"train": {"problems": train}, "test": {"problems": [problem_text(p) for p in eval_problems(cfg)[0]]}}


def train(cfg: Config, out_dir: str, resume: bool):
  mc = cfg.model
  sched = optax.warmup_cosine_decay_schedule(0.0, cfg.lr, cfg.warmup_steps, max(cfg.train_steps, cfg.warmup_steps + 1),
                                             cfg.lr * 0.1)
  tx = optimizer(sched, "adamw", grad_clip=1.0, b1=0.9, b2=0.98, weight_decay=cfg.weight_decay)
  init = lambda: state_lib.create(mdm.init(mc, jax.random.key(cfg.seed)), tx)
  # checkpoints hold {"params", "opt", "step"}: the state's rng is unused (each step's masking key is drawn below)
  to_tree = lambda st: {"params": st.params, "opt": st.opt_state, "step": st.step}
  ckpt = Checkpointer(os.path.join(out_dir, "checkpoints"), keep=2, async_=False) if cfg.ckpt_every else None
  state = None
  if resume and ckpt is not None:
    restored = ckpt.restore_latest(target=jax.eval_shape(lambda: to_tree(init())))
    if restored is not None:
      t = restored.state
      state = state_lib.TrainState(t["params"], t["opt"], t["step"], jax.random.PRNGKey(0))
  state = init() if state is None else state
  mdm_loss = losses.mdm_loss_fn(mc)
  step = step_lib.jit_train_step(step_lib.make_train_step(lambda p, b, rng: mdm_loss(p, b, b["key"]), tx))

  plen = np.full(cfg.batch_size, 2 * cfg.digits + 2, np.int32)
  log = open(os.path.join(out_dir, "metrics.jsonl"), "a")
  t0, start = time.time(), int(state.step)
  for s in range(start, cfg.train_steps):
    prompts, answers = train_batch(cfg, s)
    tokens = np.concatenate([prompts, answers], axis=1)
    batch = {"tokens": tokens, "prompt_len": plen, "key": jax.random.fold_in(jax.random.key(cfg.seed + 1), s)}
    state, m = step(state, batch)
    if (s + 1) % cfg.log_every == 0 or s + 1 == cfg.train_steps:
      log.write(metrics_lib.json_line({"step": s + 1, "loss": float(m["loss"]),
                                       "elapsed_s": round(time.time() - t0, 2)}))
      log.flush()
    if ckpt is not None and (s + 1) % cfg.ckpt_every == 0:
      ckpt.save(s + 1, to_tree(state))
  log.close()
  if ckpt is not None:
    if cfg.train_steps and ckpt.latest_step() != cfg.train_steps:
      ckpt.save(cfg.train_steps, to_tree(state))
    ckpt.close()
  return state.params, time.time() - t0


SWEPT = ("fast_dllm", "speculative", "fast_dllm_dual_cache", "speculative_dual_cache")  # methods the sweep reruns
# (method, its baseline): tokens per step and wall-clock speed-up of each speculative decoder over its target
PAIRS = (("speculative_dual_cache", "fast_dllm_dual_cache"), ("speculative", "fast_dllm"),
         ("speculative_vanilla", "vanilla"))


def decode_settings(method: str, cfg: Config, threshold: float) -> tuple[str, dict]:
  """How `method` decodes: ("diffusion" or "speculative", the keyword arguments of that module's `generate` besides
  params, config, prompt and prompt_mask)."""
  kw = dict(steps=cfg.steps or cfg.gen_length, gen_length=cfg.gen_length, block_length=cfg.block_length)
  if method == "vanilla":
    return "diffusion", kw
  if method in ("fast_dllm", "fast_dllm_dual_cache"):
    return "diffusion", dict(kw, threshold=threshold, cache="dual" if method == "fast_dllm_dual_cache" else None)
  if method == "speculative_vanilla":
    return "speculative", dict(kw, strata=(0.0,) * cfg.vanilla_depth, acceptance="exact", lookahead=cfg.lookahead,
                               attention=cfg.verify_attention)
  return "speculative", dict(kw, threshold=threshold, strata=cfg.strata,
                             acceptance="exact" if method == "speculative_exact" else "confident",
                             accept_threshold=cfg.accept_threshold, lookahead=cfg.lookahead,
                             cache="dual" if method == "speculative_dual_cache" else None,
                             attention=cfg.verify_attention)


def decode(method: str, params, mc: mdm.Config, prompts, cfg: Config, threshold: float, prompt_mask=None):
  kind, kw = decode_settings(method, cfg, threshold)
  return (diffusion if kind == "diffusion" else speculative).generate(params, mc, prompts, prompt_mask=prompt_mask,
                                                                       **kw)


def evaluate(method, params, mc, batches, cfg: Config, threshold: float, score):
  """Runs `method` over [(prompts, prompt_mask, refs)]; the first batch is run twice (compile excluded); seconds is
  the decoding wall time alone (scoring excluded); "correct" and "nfes" hold each problem's 0/1 and NFE (per
  problem, paired across methods)."""
  decode(method, params, mc, batches[0][0], cfg, threshold, batches[0][1]).tokens.block_until_ready()
  correct, nfe, secs = [], [], 0.0
  for prompts, pm, refs in batches:
    t0 = time.perf_counter()
    out = decode(method, params, mc, prompts, cfg, threshold, pm)
    gen = np.asarray(out.tokens)[:, prompts.shape[1]:]
    secs += time.perf_counter() - t0
    correct.append(score(gen, refs))
    nfe.append(out.nfe)
  correct, nfe = np.concatenate(correct), np.concatenate(nfe)
  return {"accuracy": float(correct.mean()), "nfe": float(nfe.mean()),
          "tokens_per_step": float(cfg.gen_length * len(nfe) / nfe.sum()), "seconds": round(secs, 3),
          "correct": correct.astype(np.float64).tolist(), "nfes": nfe.astype(np.float64).tolist()}


def _load_jsonl(path: str, n: int) -> list[dict]:
  with open(path) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return rows[:n]


def _gsm8k_number(text: str) -> str | None:
  nums = re.findall(r"-?\d[\d,]*\.?\d*", text.split("####")[-1] if "####" in text else text)
  return nums[-1].replace(",", "").rstrip(".") if nums else None


def _humaneval_pass(program: str, timeout: float = 10.0, memory_mb: int = 1024) -> bool:
  """Whether a model-written HumanEval program (completion, tests, check call) exits 0 within `timeout` seconds.

  It runs as `python3 program.py` in `jaxlab.evals.sandbox` (no network, `memory_mb` of address space), in a
  fresh directory of its own, the only place it can write."""
  workdir = tempfile.mkdtemp(prefix="spec-dllm-humaneval-")
  try:
    with open(os.path.join(workdir, "program.py"), "w") as f:
      f.write(program)
    r = sandbox.run(["python3", "program.py"], workdir=workdir, timeout_s=timeout, memory_mb=memory_mb)
    return r.returncode == 0 and not r.timed_out
  finally:
    shutil.rmtree(workdir, ignore_errors=True)


def benchmark_batches(cfg: Config, mc: mdm.Config, out_dir: str):
  """Tokenized prompts (left-padded batches) and a scorer for GSM8K / HumanEval JSONL files; records the evaluated
  problems as the run's only split (nothing is trained)."""
  from transformers import AutoTokenizer
  tok = AutoTokenizer.from_pretrained(cfg.model_path)
  rows = _load_jsonl(cfg.data_path, cfg.eval_examples)
  if cfg.benchmark == "gsm8k":
    texts = [r["question"] for r in rows]
    refs = [_gsm8k_number(r["answer"]) for r in rows]
  else:
    texts = [r["prompt"] for r in rows]
    refs = rows
  splits.record(out_dir, "spec_dllm", {"test": {"problems": texts}})
  if tok.chat_template and cfg.benchmark == "gsm8k":
    texts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
             for t in texts]
  ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]

  def score(gen, refs_b):
    out = []
    for g, ref in zip(gen, refs_b):
      g = [int(t) for t in g if t != mc.mask_token_id]
      text = tok.decode(g, skip_special_tokens=True)
      if cfg.benchmark == "gsm8k":
        out.append(_gsm8k_number(text) == ref)
      else:
        body = ref["prompt"] + text
        out.append(_humaneval_pass(f"{body}\n\n{ref['test']}\n\ncheck({ref['entry_point']})\n"))
    return np.array(out)

  batches = []
  for i in range(0, len(ids), cfg.eval_batch):
    chunk = ids[i:i + cfg.eval_batch]
    width = -(-max(len(c) for c in chunk) // 64) * 64  # left-pad to a multiple of 64: few compiled shapes
    prompts = np.array([[mc.eos_id] * (width - len(c)) + c for c in chunk], np.int32)
    pm = np.array([[0] * (width - len(c)) + [1] * len(c) for c in chunk], np.int32)
    batches.append((prompts, pm, refs[i:i + cfg.eval_batch]))
  return batches, score


# Prompt width `plan` assumes at the full preset (the tokenizer is not read): a GSM8K question under LLaDA's chat
# template, left-padded to a multiple of 64 as `benchmark_batches` pads it.
PLAN_PROMPT_LEN = 128
# Denoising steps per forward where the count depends on the model's confidences: the paper's tokens per step,
# Fast-dLLM's threshold decoding (the baseline, 2.6) and the speculative decoders (4.3), on HumanEval.
PLAN_TOKENS_PER_STEP = {"diffusion": 2.6, "speculative": 4.3}


def _forward_flops(mc: mdm.Config, queries: int, keys: int) -> float:
  """2·N·tokens of an MDM forward over `queries` tokens attending to `keys` (projections, MLP, LM head, scores)."""
  d, k, h, g, f, n = mc.d_model, mc.kdim, mc.n_heads, mc.kv_heads, mc.d_ff, mc.n_layers
  per_token = n * (2 * d * h * k + 2 * d * g * k + 3 * d * f) + d * mc.vocab_size
  return 2.0 * queries * per_token + 4.0 * n * h * k * queries * keys


def workloads(cfg: Config, mesh) -> list[plan_lib.Workload]:
  """Each method's jitted block decoder (`diffusion.decode_block`, `speculative.decode_block`: a block's
  denoising forwards, or its draft-tree verifications, in one while loop), once per distinct static plan, with
  abstract arguments (`experiments plan`): weights sharded as the run shards them (`tp` over `mesh`), prompts of
  `PLAN_PROMPT_LEN` tokens, `eval_batch` rows. `steps` counts block calls (every batch and the compile-excluding
  first one, each threshold of the sweep); `loop_trips` the forwards after a block's first: exact for vanilla (one
  token a step), else from `PLAN_TOKENS_PER_STEP`. Only a checkpoint (`model_path`) is planned: the arithmetic
  presets train a small model for seconds."""
  if cfg.model_path is None:
    return []
  mc = hub.config(cfg.model_path, dtype="bfloat16").replace(dtype="bfloat16")
  shapes = jax.eval_shape(lambda: mdm.init(mc, jax.random.key(0)))
  shardings = shd.param_shardings(shapes, mesh, "tp", axes=mdm.AXES)
  params = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)
  b, p, g, lb = cfg.eval_batch, PLAN_PROMPT_LEN, cfg.gen_length, cfg.block_length
  length, blocks = p + g, g // lb
  rows = shd.abstract_rows({"x": ((b, length), "int32"), "valid": ((b, length), "bool"),
                            "pos": ((b, length), "int32"), "have": ((b,), "bool"), "at": ((b,), "int32"),
                            "step": ((b,), "int32"),
                            "tok": ((b, g), "int32"), "conf": ((b, g), "float32")}, mesh)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  scalar = lambda dtype: jax.ShapeDtypeStruct((), dtype, sharding=replicated)
  on_cpu = mesh.devices.flat[0].platform == "cpu"
  calls = (math.ceil(cfg.eval_examples / b) + 1) * (1 + len(cfg.sweep))
  out = []
  for method in cfg.methods:
    kind, kw = decode_settings(method, cfg, cfg.threshold)
    steps = kw["steps"] // blocks
    if kind == "diffusion":
      plans = [diffusion.make_plan(mc, length, p + i * lb, lb, steps, kw.get("threshold"), kw.get("cache"),
                                   "low_confidence", 0.0) for i in range(blocks)]
      fn = lambda plan: jax.jit(functools.partial(diffusion.decode_block, cfg=mc, plan=plan))
      args = (params, rows["x"], rows["valid"], rows["pos"], scalar(jnp.int32), scalar(jax.random.key(0).dtype))
    else:
      kernel = kw["attention"] == "kernel" or (kw["attention"] == "auto" and not on_cpu)
      plans = speculative.block_plans(mc, p, kernel=kernel, inter_block_gate=None, **{
          k: kw.get(k) for k in ("steps", "gen_length", "block_length", "threshold", "cache", "strata", "acceptance",
                                 "accept_threshold", "lookahead")})
      fn = lambda sp: jax.jit(functools.partial(speculative.decode_block, cfg=mc, sp=sp))
      hand = tuple(rows[k] for k in ("have", "at", "step", "tok", "conf"))
      args = (params, rows["x"], rows["valid"], rows["pos"], scalar(jnp.int32), scalar(jnp.int32), hand)
    per_step = 1 if kw.get("threshold") is None and kind == "diffusion" else PLAN_TOKENS_PER_STEP[kind]
    trips = math.ceil(lb / per_step) - 1
    counts = collections.Counter(plans)
    for j, (plan, n) in enumerate(counts.items()):
      base = plan if kind == "diffusion" else plan.base
      copies = 1 if kind == "diffusion" else 1 + plan.window * len(plan.strata)
      region = base.region_len
      first = _forward_flops(mc, b * length, length)
      later = _forward_flops(mc, b * copies * region, length + copies * region)
      name = f"{method}.decode_block" + (f".{j}" if len(counts) > 1 else "")
      out.append(plan_lib.Workload(name, "generate", fn(plan), args, n * calls, first + trips * later,
                                   loop_trips=trips))
  return out


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  results = {}
  if cfg.model_path is None:
    splits.record(out_dir, "spec_dllm", arithmetic_splits(cfg))
    params, train_s = train(cfg, out_dir, resume)
    mc = cfg.model
    results["train_seconds"] = round(train_s, 1)
    prompts, answers = eval_problems(cfg)
    batches = [(prompts[i:i + cfg.eval_batch], None, answers[i:i + cfg.eval_batch])
               for i in range(0, cfg.eval_examples, cfg.eval_batch)]
    score = arithmetic_correct
  else:
    mc, params = hf.load(cfg.model_path, dtype=jnp.bfloat16)
    mc = mc.replace(dtype="bfloat16")
    if cfg.mesh is not None:  # weights split over the mesh (`tp`: heads, MLP and vocabulary over "tensor")
      params = shd.shard_params(params, shd.make_mesh(cfg.mesh), "tp", axes=mdm.AXES)
    batches, score = benchmark_batches(cfg, mc, out_dir)
  curves = {}
  for m in cfg.methods:
    r = evaluate(m, params, mc, batches, cfg, cfg.threshold, score)
    results.setdefault("per_item", {}).update({f"accuracy.{m}": r.pop("correct"), f"nfe.{m}": r.pop("nfes")})
    for k, v in r.items():
      results[f"{k}.{m}"] = v
    curves.setdefault(m, []).append((r["nfe"], r["accuracy"]))
    print(f"spec_dllm {m}: {r}", flush=True)
  for thr in cfg.sweep:
    for m in SWEPT:
      if m in cfg.methods:
        r = evaluate(m, params, mc, batches, cfg, thr, score)
        results[f"sweep.{m}.{thr}.accuracy"], results[f"sweep.{m}.{thr}.nfe"] = r["accuracy"], r["nfe"]
        curves[m].append((r["nfe"], r["accuracy"]))
  if "fast_dllm" in cfg.methods and "vanilla" in cfg.methods:
    results["nfe_ratio.vanilla_over_fast_dllm"] = results["nfe.vanilla"] / results["nfe.fast_dllm"]
  for m, base in PAIRS:
    if base in cfg.methods and m in cfg.methods:
      results[f"tps_ratio.{m}_over_{base}"] = results[f"tokens_per_step.{m}"] / results[f"tokens_per_step.{base}"]
      results[f"speedup.{m}_over_{base}"] = results[f"seconds.{base}"] / max(results[f"seconds.{m}"], 1e-9)
  series = {m: ([p[0] for p in sorted(v)], [p[1] for p in sorted(v)]) for m, v in curves.items()}
  registry.plot_curves(os.path.join(out_dir, "accuracy_vs_nfe.png"), series, xlabel="NFE per example",
                       ylabel="accuracy", title=f"spec_dllm: {cfg.benchmark}")
  return results
