"""Federated Sketching LoRA (FSLoRA, arXiv:2501.19389) against FedLoRA and HetLoRA-style zero padding: accuracy
against cumulative uploaded bytes, and the effect of the sketch ratio.

The base model and task come from `experiments._shared.adapters.Setup`, as in experiments/cdka.py (smoke / cpu: a
byte-level LM pretrained here on equations, fine-tuned on held-out arithmetic word problems; full: a LLaMA
checkpoint and JSONL data by path).
The training examples are split over N clients by a Dirichlet(alpha) draw per class (`fslora.dirichlet_split`;
the class is the operation, or with setup.label_by=digits the answer's digit count; JSONL data uses the
answer's length). Every method sees the same clients, minibatches and rounds (`fslora.plan_round` keys do not
depend on the method). FedLoRA: every client trains and uploads all r components; HetLoRA: client i trains its
first k_i = ratio_i * r components, aggregated with zero padding; FSLoRA: client i trains a random k_i-subset
with the (r/k_i) sketch scaling, and the server takes the plain mean of the deltas (`reweighted` adds the row
fslora_reweighted, where the server averages each component over the clients that trained it:
`fslora.Config.reweight`). HetLoRA and FSLoRA upload the same bytes. The sweep runs FSLoRA with one homogeneous
ratio for every client (ratio 1 is FedLoRA exactly).
`lr_decay` cosine-decays the clients' learning rate over the rounds (the cpu preset uses it: with a constant rate
the non-IID rounds move the global model enough that accuracy jumps by several points between rounds).

  python -m experiments run fslora --preset cpu
  python -m experiments run fslora --preset full --set setup.model_path=/ckpt/Llama-3.2-3B \\
      --set setup.train_path=/data/commonsense_170k.jsonl --set setup.train_format=commonsense \\
      --set setup.test_path=/data/boolq_test.jsonl --set setup.test_format=commonsense

results.json: accuracy.<m>, upload_bytes.<m> (cumulative over all rounds and clients), bytes_ratio.<m> (to
FedLoRA), test_loss.<m> for m in fedlora, hetlora, fslora, fslora_reweighted and fslora_q<ratio> (the sweep).
Writes metrics.jsonl (one record per round and method), completions.jsonl (final test completions per method),
accuracy_vs_bytes.png, test_loss_vs_bytes.png, sketch_ratio.png, train_loss.png and table.md.
"""
from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

from experiments._shared import adapters as common
from experiments import registry
from experiments.runner.claims import Claim
from jaxlab.adapters import fslora, lora

METHODS = fslora.METHODS


@dataclasses.dataclass(frozen=True)
class Config:
  """fslora settings; the federation fields mirror `jaxlab.adapters.fslora.Config`."""
  setup: common.Setup = common.Setup()
  methods: tuple[fslora.Method, ...] = ("fedlora", "hetlora", "fslora")
  rank: int = 4
  alpha: float = 16.0
  targets: tuple[str, ...] = lora.ALL_LINEAR
  n_clients: int = 3
  clients_per_round: int = 3
  local_steps: int = 2
  local_batch: int = 4
  local_lr: float = 3e-3
  lr_decay: bool = False  # cosine decay of the clients' lr over the rounds, to 0.1x
  local_opt: fslora.LocalOpt = "adamw"
  server_lr: float = 1.0
  server_opt: fslora.ServerOpt = "sgd"
  reweighted: bool = False  # also run FSLoRA with fslora.Config.reweight (row fslora_reweighted)
  rounds: int = 2
  ratios: tuple[float, ...] = (0.25, 0.5, 0.75)
  sweep_ratios: tuple[float, ...] = (0.5,)
  dirichlet_alpha: float = 0.5
  eval_every: int = 0
  seed: int = 0

  def __post_init__(self):
    for name in ("methods", "targets", "ratios", "sweep_ratios"):
      v = getattr(self, name)
      if not isinstance(v, tuple):
        object.__setattr__(self, name, (v,) if isinstance(v, (str, int, float)) else tuple(v))
    bad = [m for m in self.methods if m not in METHODS]
    if not self.methods or bad:
      raise ValueError(f"methods must be a non-empty subset of {METHODS}, found {self.methods}")
    if self.rounds < 1 or self.eval_every < 0:
      raise ValueError(f"rounds must be >= 1 and eval_every >= 0, found {self.rounds}, {self.eval_every}")
    if self.dirichlet_alpha <= 0:
      raise ValueError(f"dirichlet_alpha must be positive, found {self.dirichlet_alpha}")
    if any(not 0 < q <= 1 for q in self.sweep_ratios):
      raise ValueError(f"sweep_ratios must lie in (0, 1], found {self.sweep_ratios}")
    self.federation("fslora")

  def federation(self, method: str, ratios: tuple[float, ...] | None = None, reweight: bool = False) -> fslora.Config:
    return fslora.Config(method=method, rank=self.rank, alpha=self.alpha, targets=self.targets,
                         n_clients=self.n_clients, clients_per_round=self.clients_per_round,
                         local_steps=self.local_steps, batch_size=self.local_batch, local_lr=self.local_lr,
                         decay_rounds=self.rounds if self.lr_decay else 0,
                         local_opt=self.local_opt, server_lr=self.server_lr, server_opt=self.server_opt,
                         ratios=ratios or self.ratios, reweight=reweight)


PRESETS = {
    "smoke": Config(lr_decay=True, reweighted=True),
    "cpu": Config(setup=common.Setup.cpu(test_examples=1000), rank=64, n_clients=20, clients_per_round=4,
                  local_steps=5, local_batch=8, local_lr=2.5e-3, lr_decay=True, rounds=80,
                  ratios=(0.25, 0.5, 0.75), sweep_ratios=(0.25,), dirichlet_alpha=0.3, eval_every=20),
    "full": Config(setup=common.Setup.full(train_format="commonsense", test_format="commonsense",
                                         train_path=registry.Required("--set setup.train_path=commonsense_170k.jsonl"),
                                         test_path=registry.Required("--set setup.test_path=TEST.jsonl"),
                                         max_new_tokens=32),
                   rank=64, alpha=128.0, n_clients=50, clients_per_round=10, local_steps=20, local_batch=16,
                   local_lr=5e-4, rounds=100, ratios=(0.125, 0.25, 0.5, 1.0), sweep_ratios=(0.125, 0.25, 0.5),
                   dirichlet_alpha=0.1, eval_every=10),
}


def client_labels(examples) -> np.ndarray:
  """Each example's class for the Dirichlet split: its label, or (when all share one) its answer's length."""
  labels = np.asarray([e.label for e in examples])
  if len(np.unique(labels)) > 1:
    return labels
  lengths = np.asarray([len(e.answer) for e in examples])
  return np.unique(np.minimum(lengths, 8), return_inverse=True)[1]


def mean_loss_fn(model_cfg):
  sft = common.sft_loss_fn(model_cfg)

  def loss_fn(params, batch):
    s, w, _ = sft(params, batch, None)
    return s / jnp.maximum(w, 1.0)
  return loss_fn


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  del resume  # a finished run is cheap to repeat; nothing is checkpointed mid-way
  common.check_paths(cfg.setup)
  writer = common.Writer(os.path.join(out_dir, "metrics.jsonl"))
  ctx = common.prepare(cfg.setup, out_dir, writer, cfg.seed)
  labels = client_labels(ctx.train)
  splits = fslora.dirichlet_split(labels, cfg.n_clients, cfg.dirichlet_alpha, seed=cfg.seed)
  data, sizes = fslora.stack_clients(ctx.train_arrays, splits)
  writer.write({"phase": "split", "sizes": sizes.tolist(),
                "classes": [np.bincount(labels[s], minlength=labels.max() + 1).tolist() for s in splits]})
  loss_fn = mean_loss_fn(ctx.model)

  last = {}

  def eval_fn(params):
    acc, last["completions"] = ctx.evaluate(params)
    return {"accuracy": acc, "test_loss": ctx.test_loss(params)}

  runs = [(m, m, None, False) for m in cfg.methods]
  runs += [("fslora_reweighted", "fslora", None, True)] if cfg.reweighted else []
  runs += [(f"fslora_q{q:g}", "fslora", (q,), False) for q in cfg.sweep_ratios if q < 1]
  key = jax.random.PRNGKey(cfg.seed + 3)
  hist, base_acc, base_loss = {}, ctx.evaluate(ctx.params)[0], ctx.test_loss(ctx.params)
  completions_path = common.fresh(os.path.join(out_dir, "completions.jsonl"))
  for name, method, ratios, reweight in runs:
    fcfg = cfg.federation(method, ratios, reweight)
    _, h = fslora.simulate(fcfg, loss_fn, ctx.params, data, sizes, cfg.rounds, key, eval_fn, cfg.eval_every)
    for r in h:
      writer.write({"phase": "federated", "method": name, **r})
    hist[name] = h
    common.write_completions(completions_path, name, ctx.test, last["completions"])
    print(f"fslora: {name} accuracy {h[-1]['accuracy']:.3f} after {h[-1]['upload_bytes'] / 2**20:.2f} MiB "
          "uploaded", flush=True)
  writer.close()

  res: dict = {"accuracy": {"base": base_acc}, "test_loss": {"base": base_loss}, "upload_bytes": {},
               "bytes_ratio": {}, "final_train_loss": {}}
  ref = hist["fedlora"][-1]["upload_bytes"] if "fedlora" in hist else None
  for name, h in hist.items():
    res["accuracy"][name] = h[-1]["accuracy"]
    res["test_loss"][name] = h[-1]["test_loss"]
    res["upload_bytes"][name] = h[-1]["upload_bytes"]
    res["final_train_loss"][name] = h[-1]["train_loss"]
    if ref:
      res["bytes_ratio"][name] = h[-1]["upload_bytes"] / ref
  if "fedlora" in hist and "fslora" in hist:
    res["fslora_minus_fedlora_points"] = 100 * (res["accuracy"]["fslora"] - res["accuracy"]["fedlora"])
  res["client_sizes_min_max"] = f"{int(sizes.min())}-{int(sizes.max())}"
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
                         title=f"rank {cfg.rank}, heterogeneous ratios {cfg.ratios}", logy=key == "test_loss")
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
            f"{' cosine-decayed over the rounds to 0.1x' if cfg.lr_decay else ''}, server {cfg.server_opt} lr "
            f"{cfg.server_lr:g}, rank {cfg.rank}, heterogeneous ratios {cfg.ratios}, Dirichlet alpha "
            f"{cfg.dirichlet_alpha}, client sizes {res['client_sizes_min_max']}."]
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


registry.register(registry.Experiment(
    name="fslora", config_cls=Config, presets=PRESETS, run=run,
    description="FSLoRA vs FedLoRA vs HetLoRA: accuracy against uploaded bytes, sketch-ratio sweep",
    results=("accuracy.<run>", "test_loss.<run>", "upload_bytes.<run>", "final_train_loss.<run>", "bytes_ratio.<run>?",
             "fslora_minus_fedlora_points?", "client_sizes_min_max"),
    paper="fslora", claims=(
        Claim("bytes", "FSLoRA is within 1 point of FedLoRA's accuracy with at most 60% of its uploaded bytes",
              "FedLoRA's accuracy at a fraction of its communication",
              "{accuracy.fslora} >= {accuracy.fedlora} - 0.01 and {bytes_ratio.fslora} <= 0.6"),
        Claim("beats_hetlora", "FSLoRA beats HetLoRA at the same uploaded bytes", "above HetLoRA / zero-padding",
              "{accuracy.fslora} > {accuracy.hetlora}"),
    )))
