"""MIND (arXiv:2512.05530): multi-rationale discriminative reasoning on the scene VLM, against answer-only and
single-rationale SFT at equal steps.

Data: RAD questions over generated scenes (`experiments.mind.rad`: counting, spatial relations, comparisons; up
to `rad.max_positives` correct rationales per question and one negative per named flaw). The VLM is the one of
`experiments._shared.vlm_pipeline` (reused from a `source` run trained with the same `train` config, e.g. the
latentlens run, else trained here), its word vocabulary extended with the RAD words (new embedding rows and
head columns start at the mean of the old ones). Every method fine-tunes the LM and the connector from that VLM,
the ViT frozen, with the same optimizer, rows per step and total steps:
  sft_answer    "<image> question" -> "answer X"
  sft_rationale "<image> question" -> "R answer X" with one fixed rationale R per question
  mind          P2CL phase 1 (`phase1_steps`): "<image> question" -> "R" for one positive R of each question
                drawn each step, plus alpha * MCA (`jaxlab.losses.mind_loss_fn`, per target token: the projected
                embedding of the argmax prediction against `mca_rationales` positives and as many negatives of
                the question drawn each step, the hardest negative's token there pushed `margin` below the
                hardest positive's in cosine);
                phase 2 (`phase2_steps`, from the starting weights, as the reference's second run): "<image>
                question given R verdict" -> "answer X correct" for a positive R, "answer X wrong fix R+" for a
                negative (R+ the positive it was made from), half and half.
At test time mind generates a rationale with the phase-1 model and answers with the phase-2 model given it (as
the reference feeds phase-1 rationales to phase 2). Accuracy is the exact answer word after "answer" in the
greedy output, on held-out scenes without (`accuracy.*`) and with a wrong hint (`accuracy_misleading.*`);
a third of the training questions carry a wrong hint, a third a right one. `correction_rate.mind`: over test questions
given one of their negatives, the share where phase 2 says "wrong" and answers right. `mca_ablation.accuracy`:
mind with alpha 0.

The full preset takes a LLaVA checkpoint (`vlm_path`: llava-hf/llava-1.5-7b-hf, fp32 params with bf16 compute and
remat, the train state sharded over the `mesh`) and a RAD JSON-lines file per split (`train_path`,
`test_path`; rows {"image", "question", "answer", "positives": [str], "negatives": [{"text", "flaw"}],
"hint"?}, images relative to the file).

  python -m experiments run mind --preset cpu   # reuses runs/latentlens's VLM when trained with the same config
  python -m experiments run mind --preset full --set train_path=t.jsonl --set test_path=v.jsonl  # after hf download
  python -m experiments plan mind --preset full --topology v5p-16

Paper: arXiv 2512.05530. Code read beside it: YuChuang1205/MIND @ 9a545072c8bf. Method, claims, presets and
departures from the paper: experiments/mind/README.md.
"""
from __future__ import annotations

import dataclasses

from experiments import registry
from experiments._shared import vlm_pipeline as pipe
from experiments.mind import rad
from experiments.runner.claims import Claim
from jaxlab import sharding as shd


METHODS = ("sft_answer", "sft_rationale", "mind")


@dataclasses.dataclass(frozen=True)
class Config:
  """mind settings. `train` is trained only when no `source` run holds a VLM trained with it."""
  source: str = ""
  train: pipe.TrainConfig = pipe.TRAIN_PRESETS["smoke"]
  pretrained: bool = True  # False: a randomly initialized VLM of the `train` config's shapes (smoke)
  rad: rad.RadConfig = rad.RadConfig()
  n_train_scenes: int = 16
  n_test_scenes: int = 6
  phase1_steps: int = 3
  phase2_steps: int = 2
  questions_per_step: int = 2  # every method and phase trains questions_per_step * max_positives rows a step
  lr: float = 1e-3
  warmup: int = 1
  alpha: float = 1.0
  margin: float = 0.2
  top_k: int = 1
  mca_rationales: int = 5  # positives and negatives sampled per trained rationale each step (reference --per_pos_neg)
  seq_len: int = 160
  trim_rows: bool = True  # rows of each phase padded to their own longest (False: all to seq_len)
  eval_batch: int = 8
  log_every: int = 10
  vlm_path: str | None = None
  train_path: str | None = None
  test_path: str | None = None
  mesh: str | None = None  # a checkpoint's train state laid out on this mesh (`jaxlab.sharding.make_mesh`)
  strategy: shd.Strategy = "dp"  # and by these sharding rules
  seed: int = 0

  def __post_init__(self):
    for name in ("n_train_scenes", "n_test_scenes", "phase1_steps", "phase2_steps", "questions_per_step",
                 "seq_len", "eval_batch", "log_every", "top_k", "mca_rationales"):
      if getattr(self, name) < 1:
        raise ValueError(f"mind.Config: {name} must be >= 1, found {getattr(self, name)}")
    if self.lr <= 0 or self.alpha < 0 or self.margin < 0 or self.warmup < 0:
      raise ValueError(f"mind.Config: expected lr > 0 and alpha, margin, warmup >= 0, found lr={self.lr}, "
                       f"alpha={self.alpha}, margin={self.margin}, warmup={self.warmup}")


PRESETS = {
    "smoke": Config(pretrained=False, trim_rows=False),
    # measured at load ~5.5 on 2 cores: 0.23 s per SFT / ablation step, 0.47 per MCA step, 0.37 per phase-2 step,
    # 9 s (phase 1) and 20 s (phase 2) of greedy decoding per 50 questions: ~14 min of training, ~6 of decoding
    "cpu": Config(source="latentlens", train=pipe.TRAIN_PRESETS["cpu"], n_train_scenes=2000, n_test_scenes=150,
                  phase1_steps=400, phase2_steps=300, questions_per_step=4, lr=1e-3, warmup=20, eval_batch=50,
                  log_every=25),
    # LLaVA-1.5-7B in place of the paper's flan-alpaca-base (jaxlab loads LLaVA checkpoints): fp32 master params,
    # bf16 compute, remat, the train state sharded over every chip
    "full": Config(vlm_path=registry.Hub("llava-hf/llava-1.5-7b-hf"),
                   train_path=registry.Required(
                       "--set train_path=FILE: RAD JSON lines {image, question, answer, positives, negatives} built "
                       "from MIND's RAD release (github.com/YuChuang1205/MIND) and the ScienceQA images (hf download "
                       "derek-thomas/ScienceQA --repo-type dataset)"),
                   test_path=registry.Required("--set test_path=FILE: RAD JSON lines of the test split (as "
                                               "train_path)"),
                   phase1_steps=2000, phase2_steps=1000, questions_per_step=8, lr=8e-5, warmup=100, seq_len=1024,
                   eval_batch=8, mesh="fsdp:-1", strategy="fsdp"),
}


registry.register(registry.Experiment(
    name="mind", config_cls=Config, presets=PRESETS, run=registry.run_of("experiments.mind.run"),
    description="MIND: multi-rationale P2CL + MCA on the scene VLM vs answer-only / single-rationale SFT",
    resume_may_change=("eval_batch", "source"), seed_key="seed",
    results=("vlm", "train.questions", "test.questions", "accuracy.<method>",
             "verdict_wrong_share.mind", "mca_ablation.accuracy", "correction_rate.mind",
             "verdict_wrong_share.mind.given_negative", "correction_rate.mind.<flaw>?", "steps",
             # the misleading-cue split: where every test answer is a number, yes or no (the scenes always)
             "accuracy_misleading.<method>?", "verdict_wrong_share_misleading.mind?"),
    paper="mind", claims=(
        Claim("accuracy", "MIND answers more questions right than single-rationale SFT at equal steps",
              "MIND above single-rationale reasoning baselines on ScienceQA, A-OKVQA and M3CoT (main tables)",
              "{accuracy.mind} > {accuracy.sft_rationale}", diff=("accuracy.mind", "accuracy.sft_rationale")),
        Claim("misleading", "MIND stays more accurate than single-rationale SFT under misleading cues",
              "single-rationale MLLMs are 'susceptible to misleading interpretations' (abstract); MIND targets this",
              "{accuracy_misleading.mind} > {accuracy_misleading.sft_rationale}",
              diff=("accuracy_misleading.mind", "accuracy_misleading.sft_rationale")),
    )))
