"""The run of fslora: what `python -m experiments run fslora` executes (its Config, presets and claims are in
`experiments/fslora/__init__.py`, the paper and its departures in `experiments/fslora/README.md`)."""
from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from experiments._shared import adapters as common, records
from experiments._shared import chat_models
from experiments import registry
from experiments.runner import splits as splits_lib
from jaxlab.adapters import fslora
from jaxlab.data.tasks import arithmetic
from jaxlab.evals import answers
from jaxlab.models import transformer as tfm
from experiments.fslora import Config


def client_labels(examples) -> np.ndarray:
  """Each example's class for the Dirichlet split: its label, or (when all share one) its answer's length."""
  labels = np.asarray([e.label for e in examples])
  if len(np.unique(labels)) > 1:
    return labels
  lengths = np.asarray([len(e.answer) for e in examples])
  return np.unique(np.minimum(lengths, 8), return_inverse=True)[1]


def load_tasks(cfg: Config) -> tuple[list, list]:
  """(training, test) examples of the commonsense tasks under `cfg.tasks_dir`, each labelled with its task's index:
  LLM-Adapters' records (instruction, input, output, answer) as the reference prompts them (Alpaca; an input, when
  there is one, after the instruction), a task's first `task_test_cap` test records."""
  def read(task: str, split: str) -> list:
    path = os.path.join(cfg.tasks_dir, task, f"{split}.json")
    if not os.path.isfile(path):
      raise FileNotFoundError(f"tasks_dir: expected {task}/{split}.json under {cfg.tasks_dir!r}, found no file at "
                              f"{path!r}")
    with open(path) as f:
      text = f.read()
    return json.loads(text) if text.lstrip().startswith("[") else [json.loads(x) for x in text.splitlines() if x.strip()]

  def example(r: dict, label: int) -> arithmetic.Example:
    q = r["instruction"] + (f"\n\n### Input:\n{r['input']}" if r.get("input") else "")
    return arithmetic.Example(arithmetic.ALPACA.format(q=q), str(r["answer"]).strip(), label, r["output"])
  train = [example(r, i) for i, t in enumerate(cfg.tasks) for r in read(t, "train")]
  test = [example(r, i) for i, t in enumerate(cfg.tasks) for r in read(t, "test")[:cfg.task_test_cap]]
  return train, test


def split_items(train, test, shards) -> dict:
  """The run's splits: the questions of every client's shard (`train`) and the test questions."""
  return {"train": {"questions": [train[i].prompt for s in shards for i in s]},
          "test": {"questions": [e.prompt for e in test]}}


def mean_loss_fn(model_cfg):
  sft = common.sft_loss_fn(model_cfg)

  def loss_fn(params, batch):
    s, w, _ = sft(params, batch, None)
    return s / jnp.maximum(w, 1.0)
  return loss_fn


def federated_runs(cfg: Config) -> list[tuple[str, str, tuple[float, ...] | None, bool]]:
  """(row name, method, ratios or None for cfg.ratios, reweight) of every federated simulation a run performs."""
  runs = [(m, m, None, False) for m in cfg.methods]
  runs += [("fslora_reweighted", "fslora", None, True)] if cfg.reweighted else []
  return runs + [(f"fslora_q{q:g}", "fslora", (q,), False) for q in cfg.sweep_ratios if q < 1]


# planning with `tasks_dir`: the tasks' standard training / test split sizes (the files decide at run time); the
# clients' stacked data is sized by the reference split of these (`fslora.task_fill_split`)
PLAN_TASK_TRAIN = {"ARC-Challenge": 1119, "ARC-Easy": 2251, "boolq": 9427, "hellaswag": 39905, "openbookqa": 4957,
                   "piqa": 16113, "social_i_qa": 33410, "winogrande": 40398}
PLAN_TASK_TEST = {"ARC-Challenge": 1172, "ARC-Easy": 2376, "boolq": 3270, "hellaswag": 10042, "openbookqa": 500,
                  "piqa": 1838, "social_i_qa": 1954, "winogrande": 1267}


def _planned_clients(cfg: Config) -> tuple[int, int]:
  """(the largest client's training examples, test examples) the planned run sees."""
  setup = cfg.setup
  if cfg.tasks_dir is None:
    if not setup.train_examples or not setup.test_examples:
      raise ValueError("fslora plan: a run from setup.train_path is planned at setup.train_examples and "
                       f"setup.test_examples, found {setup.train_examples} and {setup.test_examples}")
    n = setup.train_examples
    return min(n, 4 * -(-n // cfg.n_clients)), setup.test_examples
  sizes = [PLAN_TASK_TRAIN.get(t, max(PLAN_TASK_TRAIN.values())) for t in cfg.tasks]
  labels = np.concatenate([np.full(n, i) for i, n in enumerate(sizes)])
  n_max = max(len(s) for s in fslora.task_fill_split(labels, cfg.n_clients, cfg.dirichlet_alpha, 42 + cfg.seed))
  return n_max, sum(min(PLAN_TASK_TEST.get(t, cfg.task_test_cap), cfg.task_test_cap) for t in cfg.tasks)


def workloads(cfg: Config, mesh) -> list:
  """The federated round (`fslora.make_round`: the sampled clients' local steps under vmap and the server step) and
  the steps of every evaluation (greedy generation and test loss of the base and of each run's merged model), at the
  preset's shapes with abstract arguments (`experiments plan`). The clients' stacked data ([clients, n_max, seq_len])
  is sized by `_planned_clients` (cpu: 4 x an equal share of the generated examples)."""
  from experiments.runner import plan as plan_lib
  setup = cfg.setup
  model_cfg = common.model_config(setup)
  base = chat_models.abstract_params(model_cfg, mesh, cfg.strategy)
  fcfg = cfg.federation("fslora")
  rep = NamedSharding(mesh, P())

  def abstract(tree):
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=rep), tree)
  state = abstract(jax.eval_shape(lambda k: fslora.init(fcfg, base, k, cfg.server_tx()), jax.random.PRNGKey(0)))
  sizes = np.ones(cfg.n_clients, np.int32)
  plan = abstract(jax.eval_shape(lambda k: fslora.plan_round(fcfg, k, sizes), jax.random.PRNGKey(0)))
  n_max, tests = _planned_clients(cfg)
  data = {k: jax.ShapeDtypeStruct((cfg.n_clients, n_max, setup.seq_len), np.int32, sharding=rep)
          for k in ("inputs", "targets", "loss_mask")}
  round_fn = fslora.make_round(fcfg, mean_loss_fn(model_cfg), cfg.server_tx())
  runs = len(federated_runs(cfg))
  tokens = cfg.clients_per_round * cfg.local_steps * cfg.local_batch * setup.seq_len
  evals = sum(1 for i in range(cfg.rounds) if (cfg.eval_every and (i + 1) % cfg.eval_every == 0)
              or i == cfg.rounds - 1)
  return [plan_lib.Workload("round", "train", round_fn, (state, base, data, plan), cfg.rounds * runs,
                            tfm.flops_per_token(model_cfg, setup.seq_len) * tokens)] + \
      common.eval_workloads(setup, model_cfg, base, mesh, 1 + runs * evals, tests)


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  del resume  # a finished run is cheap to repeat; nothing is checkpointed mid-way
  common.check_paths(cfg.setup)
  examples = load_tasks(cfg) if cfg.tasks_dir is not None else None
  writer = common.Writer(os.path.join(out_dir, "metrics.jsonl"))
  ctx = common.prepare(cfg.setup, out_dir, writer, cfg.seed, examples=examples)
  mesh = common.mesh_of(cfg.mesh)
  ctx = dataclasses.replace(ctx, params=chat_models.place(ctx.params, mesh, cfg.strategy))
  if examples is not None:
    labels = np.asarray([e.label for e in ctx.train])
    splits = fslora.task_fill_split(labels, cfg.n_clients, cfg.dirichlet_alpha, seed=42 + cfg.seed)
  else:
    labels = client_labels(ctx.train)
    splits = fslora.dirichlet_split(labels, cfg.n_clients, cfg.dirichlet_alpha, seed=cfg.seed)
  splits_lib.record(out_dir, "fslora", split_items(ctx.train, ctx.test, splits))
  data, sizes = fslora.stack_clients(ctx.train_arrays, splits)
  if mesh is not None:
    data = jax.device_put(data, NamedSharding(mesh, P()))
  writer.write({"phase": "split", "sizes": sizes.tolist(),
                "classes": [np.bincount(labels[s], minlength=labels.max() + 1).tolist() for s in splits]})
  loss_fn = mean_loss_fn(ctx.model)

  last = {}

  by_task = {t: [e for e in ctx.test if e.label == i] for i, t in enumerate(cfg.tasks)} if examples else {}

  def eval_fn(params):
    if not by_task:
      acc, last["completions"] = ctx.evaluate(params)
      return {"accuracy": acc, "test_loss": ctx.test_loss(params)}
    scored = {t: ctx.evaluate(params, part) for t, part in by_task.items() if part}
    last["completions"] = [c for t in by_task if t in scored for c in scored[t][1]]
    return {"accuracy": float(np.mean([a for a, _ in scored.values()])), "test_loss": ctx.test_loss(params),
            **{f"accuracy.{t}": a for t, (a, _) in scored.items()}}

  runs, items = federated_runs(cfg), {}
  key = jax.random.PRNGKey(cfg.seed + 3)
  hist, base_acc, base_loss = {}, ctx.evaluate(ctx.params)[0], ctx.test_loss(ctx.params)
  completions_path = common.fresh(os.path.join(out_dir, "completions.jsonl"))
  for name, method, ratios, reweight in runs:
    fcfg = cfg.federation(method, ratios, reweight)
    _, h = fslora.simulate(fcfg, loss_fn, ctx.params, data, sizes, cfg.rounds, key, eval_fn, cfg.eval_every,
                           server_tx=cfg.server_tx())
    for r in h:
      writer.write({"phase": "federated", "method": name, **r})
    hist[name] = h
    tested = [e for part in by_task.values() for e in part] or ctx.test
    common.write_completions(completions_path, name, tested, last["completions"])
    right = [float(answers.exact_match(c, e.answer)) for c, e in zip(last["completions"], tested)]
    # per item, paired across methods; over tasks weighted so that their mean is the macro mean `accuracy`
    items[f"accuracy.{name}"] = records.macro_items(right, [e.label for e in tested]) if by_task else right
    print(f"fslora: {name} accuracy {h[-1]['accuracy']:.3f} after {h[-1]['upload_bytes'] / 2**20:.2f} MiB "
          "uploaded", flush=True)
  writer.close()

  res: dict = {"accuracy": {"base": base_acc}, "test_loss": {"base": base_loss}, "upload_bytes": {},
               "bytes_ratio": {}, "final_train_loss": {}}
  ref = hist["fedlora"][-1]["upload_bytes"] if "fedlora" in hist else None
  for name, h in hist.items():
    res["accuracy"][name] = h[-1]["accuracy"]
    if by_task:
      res.setdefault("task_accuracy", {})[name] = {t: h[-1][f"accuracy.{t}"] for t in by_task if by_task[t]}
    res["test_loss"][name] = h[-1]["test_loss"]
    res["upload_bytes"][name] = h[-1]["upload_bytes"]
    res["final_train_loss"][name] = h[-1]["train_loss"]
    if ref:
      res["bytes_ratio"][name] = h[-1]["upload_bytes"] / ref
  if "fedlora" in hist and "fslora" in hist:
    res["fslora_minus_fedlora_points"] = 100 * (res["accuracy"]["fslora"] - res["accuracy"]["fedlora"])
  res["client_sizes_min_max"] = f"{int(sizes.min())}-{int(sizes.max())}"
  res["per_item"] = items
  if jax.process_index() == 0:
    _plots(out_dir, cfg, hist, base_acc, base_loss)
    _table(os.path.join(out_dir, "table.md"), cfg, res)
  return res


def _plots(out_dir: str, cfg: Config, hist: dict, base_acc: float, base_loss: float) -> None:
  for key, base, name, label in (("accuracy", base_acc, "accuracy_vs_bytes.png", "test accuracy (exact match)"),
                                 ("test_loss", base_loss, "test_loss_vs_bytes.png", "test NLL of the solutions")):
    series = {n: ([0] + [r["upload_bytes"] / 2**20 for r in h if key in r], [base] + [r[key] for r in h if key in r])
              for n, h in hist.items()}
    registry.plot_curves(os.path.join(out_dir, name), series, xlabel="cumulative upload (MiB)", ylabel=label,
                         title=f"rank {cfg.rank}, heterogeneous ratios {_ratios(cfg)}", logy=key == "test_loss")
  registry.plot_curves(os.path.join(out_dir, "train_loss.png"),
                       {n: ([r["round"] for r in h], [r["train_loss"] for r in h]) for n, h in hist.items()},
                       xlabel="round", ylabel="client loss (last local step)", logy=True)
  sweep = {1.0: "fedlora", **{q: f"fslora_q{q:g}" for q in cfg.sweep_ratios if q < 1}}
  pts = sorted((q, hist[n][-1]) for q, n in sweep.items() if n in hist)
  if len(pts) > 1:
    registry.plot_curves(os.path.join(out_dir, "sketch_ratio.png"),
                         {"accuracy": ([q for q, _ in pts], [r["accuracy"] for _, r in pts]),
                          "test NLL": ([q for q, _ in pts], [r["test_loss"] for _, r in pts])},
                         xlabel="sketch ratio k/r (every client)", ylabel="test accuracy / test NLL",
                         title=f"FSLoRA, {cfg.rounds} rounds (ratio 1 = FedLoRA)")


def _ratios(cfg: Config) -> str:
  q = cfg.ratios
  return str(q) if len(q) <= 4 else f"of {len(q)} clients, {min(q):g}..{max(q):g}, mean {sum(q) / len(q):.3f}"


def _table(path: str, cfg: Config, res: dict) -> None:
  lines = ["| method | accuracy | test loss | uploaded MiB | bytes / FedLoRA | final client loss |",
           "|---|---|---|---|---|---|",
           f"| base (no fine-tuning) | {res['accuracy']['base']:.3f} | {res['test_loss']['base']:.4f} | 0 | 0 | - |"]
  for n in res["upload_bytes"]:
    ratio = res["bytes_ratio"].get(n, float("nan"))
    lines.append(f"| {n} | {res['accuracy'][n]:.3f} | {res['test_loss'][n]:.4f} | "
                 f"{res['upload_bytes'][n] / 2**20:.2f} | {ratio:.3f} | {res['final_train_loss'][n]:.4f} |")
  lines += ["", f"{cfg.n_clients} clients, {cfg.clients_per_round} per round, {cfg.rounds} rounds, H = "
            f"{cfg.local_steps}, client {cfg.local_opt} lr {cfg.local_lr:g}"
            f"{' cosine-decayed over the rounds to 0.1x' if cfg.lr_decay else ''} (weight decay "
            f"{cfg.local_weight_decay:g}), server {'adamw' if cfg.server_weight_decay else cfg.server_opt} lr "
            f"{cfg.server_lr:g} (weight decay {cfg.server_weight_decay:g}), rank {cfg.rank}, heterogeneous ratios "
            f"{_ratios(cfg)}, Dirichlet alpha "
            f"{cfg.dirichlet_alpha}, client sizes {res['client_sizes_min_max']}."]
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
