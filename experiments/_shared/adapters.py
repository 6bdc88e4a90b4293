"""What experiments/cdka.py and experiments/fslora.py share: the base model and the task.

`Setup` says where the base comes from (pretrained here on arithmetic equations, or a transformers checkpoint by
path) and which task it is fine-tuned on (synthetic word problems from `jaxlab.data.tasks.arithmetic`, or MetaMathQA
/ GSM8K / commonsense JSONL by path); `check_paths` fails before any computation when a needed path is missing;
`prepare` returns a `Context` (params, tokenizer, examples, encoded arrays) whose `evaluate` scores greedy completions
by exact match of the final answer and `test_loss` gives the teacher-forced NLL of the solutions.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os

import jax
import numpy as np

from experiments._shared.data import load_corpus
from experiments._shared.recipes import byte_model, fit, optimizer
from experiments.runner.overrides import Hub, Required
from jaxlab import data as data_lib
from jaxlab import hf, losses
from jaxlab import sharding as shd
from jaxlab.data.tasks import arithmetic
from jaxlab.evals import answers
from jaxlab.generate import sampling
from jaxlab.models import transformer as tfm
from jaxlab.nn import layers
from jaxlab.train import metrics as metrics_lib
from jaxlab.train import schedules
from jaxlab.train import state as state_lib

@dataclasses.dataclass(frozen=True)
class Setup:
  """The base model and the task (shared with experiments/fslora.py).

  Base: with model_path None, `model` (byte-level) is pretrained here for pretrain_steps on pretrain_docs
  documents of equation chains and problem statements of training problems (`arithmetic.pretrain_texts`; plus
  `pretrain_mix`, a corpus spec as in lm_pretrain, e.g. "stdlib", if given) and saved to out_dir/base; else the
  transformers checkpoint at model_path is loaded (`jaxlab.hf.load`; a saved base works too, with tokenizer
  "byte"). Task: with train_path None, synthetic arithmetic word problems (digits, steps, ops, label_by); else
  JSONL files (train_format / test_format as in `jaxlab.data.tasks.arithmetic.load_jsonl`).
  """
  model: tfm.Config = byte_model(32, 1, 2, 64)
  model_path: str | None = None
  tokenizer: str = "byte"  # "byte", a tokenizer.json file or directory; "" = the model_path directory
  dtype: layers.DType | None = None  # a loaded checkpoint's param and compute dtype (e.g. "bfloat16")
  remat: bool = False  # a loaded checkpoint's layers rematerialized in the backward pass
  pretrain_steps: int = 8
  pretrain_batch: int = 8
  pretrain_seq_len: int = 64
  pretrain_lr: float = 3e-3
  pretrain_docs: int = 50
  pretrain_statements: int = 1  # problem statements (no solutions) per pretraining document of 4 chains
  pretrain_mix: str | None = None
  digits: int = 1
  steps: int = 2
  ops: tuple[arithmetic.Op, ...] = ("add", "sub")
  label_by: arithmetic.Label = "op"
  train_examples: int = 64  # synthetic: drawn; JSONL: a cap (0 = all)
  test_examples: int = 16  # JSONL: a cap (0 = all)
  train_path: str | None = None
  train_format: arithmetic.Format = "metamathqa"
  test_path: str | None = None
  test_format: arithmetic.Format = "gsm8k"
  seq_len: int = 96  # a cap: training rows are as long as the longest example (rounded up to 8)
  max_new_tokens: int = 16
  eval_batch: int = 64
  plan_prompt_len: int = 256  # the prompt positions `experiments plan` assumes (a run pads to its longest prompt)

  def __post_init__(self):
    if not isinstance(self.ops, tuple):
      object.__setattr__(self, "ops", (self.ops,) if isinstance(self.ops, str) else tuple(self.ops))
    for name in ("pretrain_batch", "pretrain_seq_len", "pretrain_docs", "seq_len", "max_new_tokens", "eval_batch",
                 "plan_prompt_len"):
      if getattr(self, name) < 1:
        raise ValueError(f"setup.{name} must be >= 1, found {getattr(self, name)}")
    for name in ("pretrain_steps", "train_examples", "test_examples"):
      if getattr(self, name) < 0:
        raise ValueError(f"setup.{name} must be >= 0, found {getattr(self, name)}")
    for name, fmt in (("train_format", self.train_format), ("test_format", self.test_format)):
      if fmt not in arithmetic.FORMATS:
        raise ValueError(f"setup.{name} must be one of {arithmetic.FORMATS}, found {fmt!r}")
    if (self.train_path is None) != (self.test_path is None):
      raise ValueError(f"setup.train_path and setup.test_path go together, found {self.train_path!r} and "
                       f"{self.test_path!r}")
    longest = max(self.pretrain_seq_len, self.seq_len)
    if self.model_path is None and longest > self.model.max_position_embeddings:
      raise ValueError(f"setup.pretrain_seq_len ({self.pretrain_seq_len}) and seq_len ({self.seq_len}) must be <= "
                       f"model.max_position_embeddings ({self.model.max_position_embeddings})")
    if self.train_path is None:
      self.arithmetic()

  def arithmetic(self) -> arithmetic.Arithmetic:
    return arithmetic.Arithmetic(ops=self.ops, steps=self.steps, digits=self.digits, label_by=self.label_by)

  @classmethod
  def cpu(cls, **kw) -> "Setup":
    return dataclasses.replace(cls(model=byte_model(128, 4, 4, 384), pretrain_steps=300, pretrain_batch=32,
                                   pretrain_seq_len=64, pretrain_lr=3e-3, pretrain_docs=4000,
                                   train_examples=4000, test_examples=250), **kw)

  @classmethod
  def full(cls, model_path: str, **kw) -> "Setup":
    """The paper's scale: the checkpoint `model_path` (a repo id, made a `registry.Hub`, or a directory) in bf16 with
    rematerialized layers, MetaMathQA -> GSM8K JSONL (each a `Required` naming where the data comes from), rows of
    512 positions."""
    from jaxlab.hf import hub
    model_path = Hub(model_path) if hub.is_repo_id(model_path) else model_path
    return dataclasses.replace(cls(model_path=model_path, tokenizer="", dtype="bfloat16", remat=True,
                                   pretrain_steps=0, train_path=Required(METAMATHQA), test_path=Required(GSM8K_TEST),
                                   train_examples=0, test_examples=0, seq_len=512, max_new_tokens=256,
                                   eval_batch=64), **kw)


METAMATHQA = ("--set setup.train_path=FILE.jsonl: MetaMathQA, one record a line (hf download meta-math/MetaMathQA "
              "--repo-type dataset --local-dir data/MetaMathQA; its MetaMathQA-395K.json array written as JSONL)")
GSM8K_TEST = ("--set setup.test_path=FILE.jsonl: GSM8K test, one record a line (hf download openai/gsm8k --repo-type "
              "dataset --local-dir data/gsm8k; its main/test-*.parquet rows written as JSONL)")


def check_paths(setup: Setup) -> None:
  """Fails before any work when a path the setup needs is missing (FileNotFoundError), naming every such setting
  at once."""
  need = [("setup.model_path", setup.model_path), ("setup.train_path", setup.train_path),
          ("setup.test_path", setup.test_path)]
  if setup.model_path is not None and setup.tokenizer not in ("", "byte"):
    need.append(("setup.tokenizer", setup.tokenizer))
  missing = [f"{name}: expected an existing path, found nothing at {path!r}" for name, path in need
             if path is not None and not os.path.exists(path) and not any(c in path for c in "*?[")]
  if missing:
    raise FileNotFoundError("; ".join(missing))
  if setup.model_path is None:
    return
  if not os.path.isfile(os.path.join(setup.model_path, "config.json")):
    found = sorted(os.listdir(setup.model_path))[:10] if os.path.isdir(setup.model_path) else "a file"
    raise FileNotFoundError(f"setup.model_path: expected a transformers directory with config.json, found "
                            f"{found} at {setup.model_path!r}")
  if not setup.tokenizer and not os.path.isfile(os.path.join(setup.model_path, "tokenizer.json")):
    raise FileNotFoundError(f"setup.tokenizer: {setup.model_path!r} has no tokenizer.json; pass "
                            f"--set setup.tokenizer=PATH")


def mesh_of(spec: str | None):
  return None if spec is None else shd.make_mesh(spec)


def shard_fn(mesh):
  return None if mesh is None else functools.partial(shd.shard_batch, mesh=mesh)


def sft_loss_fn(model_cfg: tfm.Config):
  """(params, batch, rng) -> (summed NLL on the answer tokens, their count, {})."""
  def loss_fn(params, batch, rng):
    del rng
    logits = tfm.forward(params, batch["inputs"], model_cfg).logits
    return (*losses.next_token_nll(logits, batch["targets"], batch["loss_mask"]), {})
  return loss_fn


def sft_batches(arrays: dict, batch_size: int, seed: int):
  """Endless minibatches of rows of `arrays`, a fresh permutation per epoch."""
  n = len(next(iter(arrays.values())))
  rng = np.random.default_rng(seed)
  while True:
    perm = rng.permutation(n)
    for i in range(0, n - batch_size + 1, batch_size):
      yield {k: v[perm[i:i + batch_size]] for k, v in arrays.items()}


class Writer(metrics_lib.MetricsWriter):
  """metrics.jsonl, written by process 0 only."""

  def __init__(self, path: str):
    super().__init__(path if jax.process_index() == 0 else None)


@dataclasses.dataclass
class Context:
  """A prepared base model and task: model config, params, tokenizer, examples and encoded training arrays."""
  setup: Setup
  model: tfm.Config
  params: dict
  tok: object
  train: list
  test: list
  train_arrays: dict
  test_arrays: dict
  _nll: object = None

  def test_loss(self, params) -> float:
    """Teacher-forced mean NLL of the test solutions' tokens: a less noisy companion of the accuracy."""
    if self._nll is None:
      self._nll = nll_step(self.model)
    n, b = len(self.test_arrays["inputs"]), min(self.setup.eval_batch, len(self.test_arrays["inputs"]))
    total = count = 0.0
    for s in range(0, n, b):
      chunk = {k: v[s:s + b] for k, v in self.test_arrays.items()}
      if len(chunk["inputs"]) < b:  # pad with masked-out rows: one compiled shape
        chunk = {k: np.concatenate([v, np.zeros((b - len(v),) + v.shape[1:], v.dtype)]) for k, v in chunk.items()}
      nll, w, _ = self._nll(params, chunk, None)
      total, count = total + float(nll), count + float(w)
    return total / max(count, 1.0)

  def evaluate(self, params, examples=None) -> tuple[float, list[str]]:
    """(exact-match accuracy, completions) of greedy decoding on `examples` (default: the test set)."""
    t = max(len(r) for r in arithmetic.prompt_tokens(self.test, self.tok))
    return evaluate(params, self.model, self.tok, self.test if examples is None else examples,
                    self.setup.max_new_tokens, self.setup.eval_batch, t)


def evaluate(params, model_cfg, tok, examples, max_new_tokens: int, batch: int,
             min_len: int = 0) -> tuple[float, list[str]]:
  """Greedy completions (`jaxlab.generate.sample`, stopping at eos) scored by `answers.exact_match`.

  Prompts are left-padded to the longest one (at least `min_len`) and run in chunks of `batch` rows (the last
  one padded), so the sampler compiles once per model and prompt length.
  """
  rows = arithmetic.prompt_tokens(examples, tok)
  t = max(min_len, *(len(r) for r in rows))
  pad = tok.batch_pad_id
  ids = np.full((len(rows), t), pad, np.int32)
  mask = np.zeros((len(rows), t), np.int32)
  for i, r in enumerate(rows):
    ids[i, t - len(r):], mask[i, t - len(r):] = r, 1
  b = min(batch, len(rows))
  completions = []
  for s in range(0, len(rows), b):
    chunk_ids, chunk_mask = ids[s:s + b], mask[s:s + b]
    n = len(chunk_ids)
    if n < b:
      chunk_ids = np.concatenate([chunk_ids, np.repeat(chunk_ids[:1], b - n, 0)])
      chunk_mask = np.concatenate([chunk_mask, np.repeat(chunk_mask[:1], b - n, 0)])
    out = greedy_step(model_cfg, max_new_tokens, pad)(params, chunk_ids, chunk_mask)
    toks, lens = np.asarray(out.tokens), np.asarray(out.lengths)
    completions += [tok.decode(toks[i, :lens[i]]) for i in range(n)]
  return answers.accuracy(completions, examples), completions


@functools.lru_cache(maxsize=16)
def greedy_step(model_cfg: tfm.Config, max_new_tokens: int, pad_id: int):
  """The jitted generation `evaluate` runs on each chunk: (params, ids [b, t], mask [b, t]) -> the `SampleOutput` of
  greedy `sampling.sample` (stopping at eos) with `max_new_tokens` new tokens."""
  def gen(params, ids, mask):
    return sampling.sample(params, model_cfg, ids, max_new_tokens, prompt_mask=mask, pad_id=pad_id)
  return jax.jit(gen)


@functools.lru_cache(maxsize=16)
def nll_step(model_cfg: tfm.Config):
  """The jitted `sft_loss_fn` `Context.test_loss` runs on each chunk of test rows."""
  return jax.jit(sft_loss_fn(model_cfg))


def load_examples(setup: Setup, seed: int) -> tuple[list, list]:
  """(training, test) examples of `setup`: its JSONL files, else its generated word problems (seeds seed + 11, + 12)."""
  if setup.train_path is not None:
    train = arithmetic.load_jsonl(setup.train_path, setup.train_format, setup.train_examples or None)
    test = arithmetic.load_jsonl(setup.test_path, setup.test_format, setup.test_examples or None)
    return train, test
  spec = setup.arithmetic()
  return (arithmetic.word_problems(spec, setup.train_examples, "train", seed + 11),
          arithmetic.word_problems(spec, setup.test_examples, "test", seed + 12))


def pretrain(setup: Setup, tok, writer, seed: int) -> tuple[dict, list]:
  """A byte-level base pretrained here on equations over training pairs (and `pretrain_mix` text)."""
  texts = arithmetic.pretrain_texts(setup.arithmetic(), setup.pretrain_docs, 4, setup.pretrain_statements, seed)
  if setup.pretrain_mix:
    mix = load_corpus(setup.pretrain_mix, setup.pretrain_docs // 4)
    texts += [mix[i] for i in range(len(mix))]
  it = data_lib.lm_batches(data_lib.from_texts(texts), tok, setup.pretrain_seq_len, setup.pretrain_batch,
                           seed=seed, split=None, add_bos=True)
  steps = setup.pretrain_steps
  schedule = schedules.get("cosine", setup.pretrain_lr, steps, max(1, steps // 10), 0.1)
  tx = optimizer(schedule, "adamw", grad_clip=1.0, b1=0.9, b2=0.95, weight_decay=0.0)
  state = state_lib.init_state(functools.partial(tfm.init, setup.model), tx, seed)
  res, _ = fit(state, losses.lm_loss_fn(setup.model), tx, it, steps, schedule=schedule,
               log_every=max(1, steps // 20), desc="pretrain")
  for r in res.history:
    writer.write({"phase": "pretrain", **r})
  return res.state.params, res.history


def prepare(setup: Setup, out_dir: str, writer, seed: int = 0, examples: tuple[list, list] | None = None) -> Context:
  """Loads or pretrains the base (saving a pretrained one to out_dir/base) and loads the task (`load_examples`), or
  takes its (training, test) `examples`."""
  if setup.model_path is not None:
    tok = data_lib.load_tokenizer(setup.tokenizer or setup.model_path)
    model_cfg, params = hf.load(setup.model_path, dtype=setup.dtype)
    model_cfg = loaded_config(setup, model_cfg)
  else:
    tok = data_lib.load_tokenizer(setup.tokenizer)
    model_cfg = setup.model
    if model_cfg.vocab_size < tok.vocab_size:
      raise ValueError(f"setup.model.vocab_size ({model_cfg.vocab_size}) is smaller than the tokenizer's "
                       f"({tok.vocab_size})")
    params = tfm.init(model_cfg, jax.random.PRNGKey(seed))
    if setup.pretrain_steps:
      params, _ = pretrain(setup, tok, writer, seed)
    if jax.process_index() == 0:
      hf.save(os.path.join(out_dir, "base"), model_cfg, params, overwrite=True)
  train, test = examples or load_examples(setup, seed)
  need = max(len(tok.encode(e.prompt)) + len(tok.encode(e.target)) + 1 for e in train)
  if need > setup.seq_len:
    raise ValueError(f"setup.seq_len ({setup.seq_len}) is shorter than the longest training example "
                     f"({need} positions)")
  arrays = arithmetic.sft_arrays(train, tok, min(-(-need // 8) * 8, setup.seq_len))
  fits = [e for e in test if len(tok.encode(e.prompt)) + len(tok.encode(e.target)) + 1 <= setup.seq_len]
  test_arrays = arithmetic.sft_arrays(fits or test[:1], tok, setup.seq_len)
  return Context(setup, model_cfg, params, tok, train, test, arrays, test_arrays)


def bar_plot(path: str, values: dict, ylabel: str, title: str = "") -> str:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
  ax.bar(range(len(values)), list(values.values()), color="tab:blue")
  ax.set_xticks(range(len(values)), list(values), rotation=30, ha="right", fontsize=8)
  ax.set_ylabel(ylabel)
  ax.set_title(title, fontsize=9)
  ax.grid(alpha=0.3, axis="y")
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return path


def fresh(path: str) -> str:
  """`path`, removed if a previous run left it (files appended to during a run)."""
  if jax.process_index() == 0 and os.path.exists(path):
    os.remove(path)
  return path


def write_completions(path: str, method: str, examples, completions) -> None:
  """Appends one JSON line per test example (method, prompt, answer, completion) for independent re-scoring."""
  if jax.process_index() != 0:
    return
  with open(path, "a") as f:
    for e, c in zip(examples, completions):
      f.write(json.dumps({"method": method, "prompt": e.prompt, "answer": e.answer, "completion": c}) + "\n")


# ----------------------------------------------------------------------------------------- planning

def model_config(setup: Setup) -> tfm.Config:
  """The base model's config without its weights: the checkpoint's architecture (`jaxlab.hf.hub.config`: a directory,
  or a repo id's shipped architecture) with params in `setup.dtype`, as `prepare` loads it; else `setup.model`."""
  if setup.model_path is None:
    return setup.model
  from jaxlab.hf import hub
  return loaded_config(setup, hub.config(setup.model_path, setup.dtype))


def loaded_config(setup: Setup, model_cfg: tfm.Config) -> tfm.Config:
  """A loaded checkpoint's config with the setup's compute dtype and rematerialization."""
  return model_cfg.replace(dtype=setup.dtype or model_cfg.dtype, remat=setup.remat or model_cfg.remat)


def eval_workloads(setup: Setup, model_cfg: tfm.Config, params, mesh, evaluations: int, test_examples: int) -> list:
  """The jitted steps of `evaluations` calls of `Context.evaluate` and `Context.test_loss` on `test_examples` test
  examples (`greedy_step` on chunks of `setup.eval_batch` prompts of `setup.plan_prompt_len` positions, `nll_step` on
  chunks of `setup.seq_len`-position rows), with abstract `params`; returns `experiments.runner.plan.Workload`s."""
  from experiments.runner import plan as plan_lib
  b, t, new = min(setup.eval_batch, test_examples), setup.plan_prompt_len, setup.max_new_tokens
  chunks = evaluations * -(-test_examples // b)
  pad = model_cfg.pad_token_id or 0
  prompts = shd.abstract_rows({"ids": ((b, t), "int32"), "mask": ((b, t), "int32")}, mesh)
  rows = shd.abstract_rows({k: ((b, setup.seq_len), "int32") for k in ("inputs", "targets", "loss_mask")}, mesh)
  gen_flops = tfm.flops_per_token(model_cfg, t + new) / 3 * b * (t + new)
  nll_flops = tfm.flops_per_token(model_cfg, setup.seq_len) / 3 * b * setup.seq_len
  return [plan_lib.Workload("generate", "generate", greedy_step(model_cfg, new, pad),
                            (params, prompts["ids"], prompts["mask"]), chunks, gen_flops, loop_trips=new),
          plan_lib.Workload("test_loss", "forward", nll_step(model_cfg), (params, rows, None), chunks, nll_flops)]
