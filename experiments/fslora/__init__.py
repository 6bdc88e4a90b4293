"""Federated Sketching LoRA (FSLoRA, arXiv:2501.19389) against FedLoRA and HetLoRA-style zero padding: accuracy
against cumulative uploaded bytes, and the effect of the sketch ratio.

The base model and task come from `experiments._shared.adapters.Setup`, as in experiments/cdka.py (smoke / cpu: a
byte-level LM pretrained here on equations, fine-tuned on held-out arithmetic word problems; full:
LLaMA-3.2-3B-Instruct (meta-llama/Llama-3.2-3B-Instruct, fetched with `hf download`) in bf16, its params sharded
over `mesh`, and the eight commonsense tasks' files by directory, `tasks_dir`).
The training examples are split over N clients by a Dirichlet(alpha) draw per class (`fslora.dirichlet_split`;
the class is the operation, or with setup.label_by=digits the answer's digit count; single-file JSONL data uses
the answer's length). With `tasks_dir` (full) the class is the task and the split is the reference's
(`fslora.task_fill_split`: Dirichlet shares of every task but the largest, which then fills each client to an equal
share); accuracy is then the mean over the tasks of each task's test accuracy (its first `task_test_cap` items),
each also reported. Every method sees the same clients, minibatches and rounds (`fslora.plan_round` keys do not
depend on the method). FedLoRA: every client trains and uploads all r components; HetLoRA: client i trains its
first k_i = ratio_i * r components, aggregated with zero padding; FSLoRA: client i trains a random k_i-subset
with the (r/k_i) sketch scaling, and the server takes the plain mean of the deltas (`reweighted` adds the row
fslora_reweighted, where the server averages each component over the clients that trained it:
`fslora.Config.reweight`). HetLoRA and FSLoRA upload the same bytes. The sweep runs FSLoRA with one homogeneous
ratio for every client (ratio 1 is FedLoRA exactly).
`lr_decay` cosine-decays the clients' learning rate over the rounds (the cpu preset uses it: with a constant rate
the non-IID rounds move the global model enough that accuracy jumps by several points between rounds).

  python -m experiments run fslora --preset cpu
  hf download meta-llama/Llama-3.2-3B-Instruct --local-dir models/meta-llama/Llama-3.2-3B-Instruct
  python -m experiments run fslora --preset full --set tasks_dir=LLM-Adapters/dataset

results.json: accuracy.<m> (with tasks_dir the mean of task_accuracy.<m>.<task>), upload_bytes.<m> (cumulative over all rounds and clients), bytes_ratio.<m> (to
FedLoRA), test_loss.<m> for m in fedlora, hetlora, fslora, fslora_reweighted and fslora_q<ratio> (the sweep).
Writes metrics.jsonl (one record per round and method), completions.jsonl (final test completions per method),
accuracy_vs_bytes.png, test_loss_vs_bytes.png, sketch_ratio.png, train_loss.png and table.md.

Paper: arXiv 2501.19389. Code read beside it: wenzhifang/Federated-Sketching-LoRA-Implementation @ ac24177385ea.
Method, claims, presets and departures from the paper: experiments/fslora/README.md.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import optax

from experiments._shared import adapters as common
from experiments import registry
from experiments.runner.claims import Claim
from jaxlab import choices
from jaxlab import sharding as shd
from jaxlab.adapters import fslora, lora


METHODS = fslora.METHODS
# the reference's eight commonsense tasks (`src/utils_data.py:build_datasets`), LLM-Adapters' dataset/<task> names
COMMONSENSE_TASKS = ("ARC-Challenge", "ARC-Easy", "boolq", "hellaswag", "openbookqa", "piqa", "social_i_qa",
                     "winogrande")


def reference_ranks(n: int, lo: int, hi: int, seed: int = 42) -> list[int]:
  """The client ranks of the paper's "normal" setting: n draws of N((lo + hi) / 2, ((hi - lo) / 6)^2) from numpy's
  legacy generator seeded `seed`, clipped to [lo, hi] and rounded (the reference's `generate_ranks`)."""
  draws = np.random.RandomState(seed).normal((lo + hi) / 2, (hi - lo) / 6, n)
  return np.round(np.clip(draws, lo, hi)).astype(int).tolist()


def reference_ratios(n: int, rank: int, lo: int, hi: int, seed: int = 42) -> tuple[float, ...]:
  """`reference_ranks` as sketch ratios k_i / rank (client i takes entry i)."""
  return tuple(k / rank for k in reference_ranks(n, lo, hi, seed))


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
  local_weight_decay: float = 0.0
  server_lr: float = 1.0
  server_opt: fslora.ServerOpt = "sgd"
  server_weight_decay: float = 0.0  # > 0 with server_opt "adam": AdamW (decoupled decay, as torch.optim.AdamW)
  reweighted: bool = False  # also run FSLoRA with fslora.Config.reweight (row fslora_reweighted)
  rounds: int = 2
  ratios: tuple[float, ...] = (0.25, 0.5, 0.75)
  sweep_ratios: tuple[float, ...] = (0.5,)
  dirichlet_alpha: float = 0.5
  eval_every: int = 0
  tasks_dir: str | None = None  # <dir>/<task>/train.json and test.json (JSON arrays of LLM-Adapters' records)
  tasks: tuple[str, ...] = COMMONSENSE_TASKS
  task_test_cap: int = 3000  # test items per task (the reference's cap)
  mesh: str | None = None  # the base params sharded over it by `strategy`, the clients' data replicated
  strategy: shd.Strategy = "dp"
  seed: int = 0

  def __post_init__(self):
    for name in ("methods", "targets", "ratios", "sweep_ratios", "tasks"):
      v = getattr(self, name)
      if not isinstance(v, tuple):
        object.__setattr__(self, name, (v,) if isinstance(v, (str, int, float)) else tuple(v))
    choices.check(self)
    if not self.methods:
      raise ValueError(f"methods must be a non-empty subset of {METHODS}, found ()")
    if self.rounds < 1 or self.eval_every < 0:
      raise ValueError(f"rounds must be >= 1 and eval_every >= 0, found {self.rounds}, {self.eval_every}")
    if self.dirichlet_alpha <= 0:
      raise ValueError(f"dirichlet_alpha must be positive, found {self.dirichlet_alpha}")
    if self.tasks_dir is not None and (not self.tasks or self.task_test_cap < 1 or self.setup.train_path is not None):
      raise ValueError(f"tasks_dir needs tasks, task_test_cap >= 1 and no setup.train_path, found {self.tasks}, "
                       f"{self.task_test_cap}, {self.setup.train_path!r}")
    if any(not 0 < q <= 1 for q in self.sweep_ratios):
      raise ValueError(f"sweep_ratios must lie in (0, 1], found {self.sweep_ratios}")
    if self.server_weight_decay < 0 or (self.server_weight_decay and self.server_opt != "adam"):
      raise ValueError(f"server_weight_decay must be >= 0 and needs server_opt 'adam', found "
                       f"{self.server_weight_decay} with {self.server_opt!r}")
    self.federation("fslora")

  def federation(self, method: str, ratios: tuple[float, ...] | None = None, reweight: bool = False) -> fslora.Config:
    return fslora.Config(method=method, rank=self.rank, alpha=self.alpha, targets=self.targets,
                         n_clients=self.n_clients, clients_per_round=self.clients_per_round,
                         local_steps=self.local_steps, batch_size=self.local_batch, local_lr=self.local_lr,
                         decay_rounds=self.rounds if self.lr_decay else 0, local_weight_decay=self.local_weight_decay,
                         local_opt=self.local_opt, server_lr=self.server_lr, server_opt=self.server_opt,
                         ratios=ratios or self.ratios, reweight=reweight)

  def server_tx(self) -> optax.GradientTransformation | None:
    """The server optimizer when it is not `fslora.Config`'s own (AdamW); None otherwise."""
    if self.server_weight_decay:
      return optax.adamw(self.server_lr, weight_decay=self.server_weight_decay)
    return None


TASKS_DIR = ("--set tasks_dir=DIR: the commonsense tasks as the reference reads them, DIR/<task>/train.json and "
             "test.json for ARC-Challenge, ARC-Easy, boolq, hellaswag, openbookqa, piqa, social_i_qa, winogrande "
             "(LLM-Adapters' dataset/ folder: git clone https://github.com/AGI-Edgerunners/LLM-Adapters; the training "
             "files are in the reference's src/dataset/)")

PRESETS = {
    "smoke": Config(lr_decay=True, reweighted=True),
    "cpu": Config(setup=common.Setup.cpu(test_examples=1000), rank=64, n_clients=20, clients_per_round=4,
                  local_steps=5, local_batch=8, local_lr=2.5e-3, lr_decay=True, rounds=80,
                  ratios=(0.25, 0.5, 0.75), sweep_ratios=(0.25,), dirichlet_alpha=0.3, eval_every=20),
    "full": Config(setup=common.Setup.full("meta-llama/Llama-3.2-3B-Instruct", train_path=None, test_path=None,
                                           max_new_tokens=32),
                   tasks_dir=registry.Required(TASKS_DIR),
                   rank=64, alpha=1.0, n_clients=50, clients_per_round=10, local_steps=20, local_batch=4,
                   local_lr=3e-4, local_weight_decay=0.01, server_opt="adam", server_lr=3e-4, server_weight_decay=0.01,
                   rounds=600, ratios=reference_ratios(50, 64, 1, 32), sweep_ratios=(0.125, 0.25, 0.5),
                   dirichlet_alpha=0.1, eval_every=20, mesh="fsdp:-1", strategy="fsdp",
                   methods=("fedlora", "hetlora", "flexlora", "flora", "fslora")),
}


registry.register(registry.Experiment(
    name="fslora", config_cls=Config, presets=PRESETS, run=registry.run_of("experiments.fslora.run"),
    description="FSLoRA vs FedLoRA vs HetLoRA: accuracy against uploaded bytes, sketch-ratio sweep",
    results=("accuracy.<run>", "task_accuracy.<run>.<task>?", "test_loss.<run>", "upload_bytes.<run>", "final_train_loss.<run>", "bytes_ratio.<run>?",
             "fslora_minus_fedlora_points?", "client_sizes_min_max"),
    paper="fslora", claims=(
        Claim("bytes", "FSLoRA is within 1 point of FedLoRA's accuracy with at most 60% of its uploaded bytes",
              "FedLoRA's accuracy at a fraction of its communication",
              "{accuracy.fslora} >= {accuracy.fedlora} - 0.01 and {bytes_ratio.fslora} <= 0.6",
              diff=("accuracy.fslora", "accuracy.fedlora"), effect=-0.01, given="{bytes_ratio.fslora} <= 0.6"),
        Claim("beats_hetlora", "FSLoRA beats HetLoRA at the same uploaded bytes", "above HetLoRA / zero-padding",
              "{accuracy.fslora} > {accuracy.hetlora}", diff=("accuracy.fslora", "accuracy.hetlora")),
    )))
