"""CDKA, Component Designed Kronecker Adapters (arXiv:2602.01267), against LoRA (arXiv:2106.09685) and full
fine-tuning at equal trainable-parameter budgets, with the paper's alignment analysis.

smoke / cpu: a byte-level LLaMA-style LM is pretrained here on bare equation chains ("7+5=12\\n12-3=9") and on
problem statements without solutions, then fine-tuned on two-step arithmetic word problems whose solution is the
chain (`jaxlab.data.tasks.arithmetic`); accuracy is the exact match of the final number by greedy decoding on
held-out problems (in no training text). LoRA of rank k on every targeted linear; CDKA's (r, r1, r2) from
`kron.recommend(prefer=cdka_prefer)` at LoRA's per-matrix budget (within `budget_tolerance` of LoRA's total); method
"cdka_alt" is the other preference ("rank": the highest rank bound, r1 = r2 ~ sqrt(d) on square layers; "shape": the
(2, 8) component shape with the budget spent on r), so a run shows both. Every adapter gets the same alpha; learning
rates are per method. Alignment: for every targeted matrix the full fine-tuning update dW is approximated by the
best member of each structure at the same budget (truncated SVD for LoRA, i.e. r1 = r2 = 1; `kron.nearest_kron` for
(r, r1, r2)); the relative Frobenius error, averaged over matrices, says how much of the full update each structure
can express. The trained adapters' cosine with the full update is reported too.
full: LLaMA-2-7B (meta-llama/Llama-2-7b-hf, fetched with `hf download`; another checkpoint with --set
setup.model_path=DIR) in bf16 with rematerialized layers, MetaMathQA (or commonsense_170k) JSONL for training and
GSM8K (or a commonsense test set) JSONL for testing, the paper's official setting (all linears, r1 = r2 = 2, r = 8)
and the reference's recipe (`data="metamath_gsm"`: its GSM-derived first 100k records and "Q: ...\nA: " prompt; any
other file with --set data=file).

  python -m experiments run cdka --preset cpu
  hf download meta-llama/Llama-2-7b-hf --local-dir models/meta-llama/Llama-2-7b-hf
  python -m experiments plan cdka --preset full --topology v5p-16
  python -m experiments run cdka --preset full \\
      --set setup.train_path=/data/MetaMathQA-395K.jsonl --set setup.test_path=/data/gsm8k/test.jsonl

results.json: accuracy.<m>, trainable_params.<m>, test_loss.<m>, final_loss.<m> for m in full, lora, cdka
(and cdka_alt), the CDKA configs, alignment.rel_error.<r_r1_r2> and alignment.cosine.<m>. Each run also writes
metrics.jsonl (pretraining and fine-tuning losses), completions.jsonl (every test completion), loss.png,
alignment.png, table.md and base/ (a pretrained base in transformers format, reusable as setup.model_path).

Paper: arXiv 2602.01267. Code read beside it: rainstonee/CDKA @ c70fe51e199a. Method, claims, presets and departures
from the paper: experiments/cdka/README.md.
"""
from __future__ import annotations

import dataclasses
from typing import Literal

from experiments._shared import adapters as common
from experiments import registry
from experiments.runner.claims import Claim
from jaxlab import choices
from jaxlab import sharding as shd
from jaxlab.adapters import lora


Method = Literal["full", "lora", "cdka", "cdka_alt"]
METHODS = choices.values(Method)
Prefer = Literal["rank", "shape"]  # kron.recommend's preferences
PREFS = choices.values(Prefer)
Data = Literal["file", "metamath_gsm"]  # the training set: every record of setup.train_path, or the reference's
REFERENCE_TEMPLATE = "Q: {q}\nA: "  # the reference's prompt for MetaMathQA and GSM8K (`data.py`)


@dataclasses.dataclass(frozen=True)
class Config:
  """cdka settings. cdka_r/r1/r2 = 0 picks them with `kron.recommend(prefer=cdka_prefer)` at LoRA's budget.

  cdka_prefer "rank" (default) buys the highest rank bound the budget allows (full rank on the cpu model's layers);
  "shape" stays nearest the second-hand (r1, r2) = (2, 8), which at LoRA rank 4's budget on 128-wide layers
  fits a single component, so it moves to the nearest shape that spends the budget. cdka_alt runs the other one.
  """
  setup: common.Setup = common.Setup()
  methods: tuple[Method, ...] = ("full", "lora", "cdka")
  steps: int = 4
  batch_size: int = 8
  lr_full: float = 1e-3
  lr_lora: float = 3e-3
  lr_cdka: float = 3e-3
  warmup_steps: int = 1
  lr_floor: float = 0.1  # the cosine schedule ends at lr_floor x the peak
  weight_decay: float = 0.0
  grad_clip: float = 1.0
  targets: tuple[str, ...] = lora.ALL_LINEAR
  lora_rank: int = 2
  lora_alpha: float = 16.0
  lora_rslora: bool = True  # scale alpha/sqrt(r): with lora_alpha = cdka_alpha, CDKA's rule at r1 = r2 = 1
  cdka_r: int = 0
  cdka_r1: int = 0
  cdka_r2: int = 0
  cdka_prefer: Prefer = "rank"
  cdka_alpha: float = 16.0
  # "metamath_gsm": the reference's training set: setup.train_path's MetaMathQA records whose type is GSM-derived,
  # prompt `template`, response up to its "The answer is:" line, kept while under setup.seq_len tokens, the first
  # `train_records`; the test file is read with `template` too. "file": every record, arithmetic's Alpaca prompt.
  data: Data = "file"
  train_records: int = 100_000
  template: str = REFERENCE_TEMPLATE
  budget_tolerance: float = 0.05
  analysis: bool = True
  analysis_max_matrices: int = 0  # 0: every targeted matrix (per layer); else an evenly spaced subset
  log_every: int = 2
  mesh: str | None = None
  strategy: shd.Strategy = "dp"
  seed: int = 0

  def __post_init__(self):
    for name in ("methods", "targets"):
      v = getattr(self, name)
      if not isinstance(v, tuple):
        object.__setattr__(self, name, (v,) if isinstance(v, str) else tuple(v))
    choices.check(self)
    if not self.methods:
      raise ValueError(f"methods must be a non-empty subset of {METHODS}, found ()")
    for name in ("steps", "batch_size", "lora_rank", "log_every"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, found {getattr(self, name)}")
    for name in ("cdka_r", "cdka_r1", "cdka_r2", "analysis_max_matrices", "warmup_steps"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name} must be >= 0, found {getattr(self, name)}")
    if len({self.cdka_r > 0, self.cdka_r1 > 0, self.cdka_r2 > 0}) != 1:
      raise ValueError(f"set all of cdka_r, cdka_r1, cdka_r2 or none, found {self.cdka_r}, {self.cdka_r1}, "
                       f"{self.cdka_r2}")
    if not 0 <= self.lr_floor <= 1 or self.train_records < 1 or "{q}" not in self.template:
      raise ValueError(f"lr_floor must be in [0, 1], train_records >= 1 and template must hold {{q}}, found "
                       f"{self.lr_floor}, {self.train_records}, {self.template!r}")
    if self.data == "metamath_gsm" and (self.setup.train_path is None or self.setup.train_format != "metamathqa"):
      raise ValueError("data='metamath_gsm' needs a MetaMathQA setup.train_path (setup.train_format='metamathqa')")
    if not 0 < self.budget_tolerance < 1:
      raise ValueError(f"budget_tolerance must be in (0, 1), found {self.budget_tolerance}")
    lora.compile_targets(self.targets)


PRESETS = {
    "smoke": Config(),
    "cpu": Config(setup=common.Setup.cpu(), methods=METHODS, steps=100, batch_size=32, lr_full=1e-3,
                  lr_lora=1e-2, lr_cdka=1e-2, warmup_steps=10, lora_rank=4, log_every=10),
    # one epoch of the reference's 100k records at batch 32 (3,125 steps), warmup 3% (ceil: 94), cosine to 0
    "full": Config(setup=common.Setup.full("meta-llama/Llama-2-7b-hf", max_new_tokens=512), steps=3125, batch_size=32, lr_full=2e-5,
                   lr_lora=2e-4, lr_cdka=2e-4, warmup_steps=94, lr_floor=0.0, weight_decay=5e-4, lora_rank=8,
                   lora_alpha=64.0, lora_rslora=True, cdka_r=8, cdka_r1=2, cdka_r2=2, cdka_alpha=64.0,
                   data="metamath_gsm", analysis_max_matrices=14, log_every=20, mesh="fsdp:-1", strategy="fsdp"),
}


# ------------------------------------------------------------------------------------------ budgets


# --------------------------------------------------------------------------------------- fine-tuning


# ------------------------------------------------------------------------------------------ analysis


# ------------------------------------------------------------------------------------------------ run


registry.register(registry.Experiment(
    name="cdka", config_cls=Config, presets=PRESETS, run=registry.run_of("experiments.cdka.run"),
    description="CDKA vs LoRA vs full fine-tuning at equal budgets on arithmetic word problems (+ alignment)",
    results=("accuracy.<method>", "trainable_params.<method>", "final_loss.<method>", "test_loss.<method>",
             "base_equation_accuracy?", "cdka_config", "cdka_rank_bound", "cdka_alt_config", "cdka_alt_rank_bound",
             "cdka_prefer", "lora_rank", "alignment.rel_error.<config>?", "alignment.cosine.<method>?"),
    paper="cdka", claims=(
        Claim("beats_lora", "CDKA reaches at least LoRA's accuracy at an equal trainable-parameter budget",
              "above LoRA at equal budget (LLaMA-2-7B, MetaMathQA -> GSM8K)",
              "{accuracy.cdka} >= {accuracy.lora} and {trainable_params.cdka} <= 1.05 * {trainable_params.lora}",
              diff=("accuracy.cdka", "accuracy.lora"), given="{trainable_params.cdka} <= 1.05 * {trainable_params.lora}"),
        Claim("aligns_with_full", "CDKA's trained update is closer in direction to full fine-tuning's than LoRA's",
              "Kronecker structure aligns better with the full update",
              "{alignment.cosine.cdka} > {alignment.cosine.lora}"),
    )))
