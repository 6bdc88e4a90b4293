"""Distribution-calibrated aggregation of sampled judge verdicts (BTD, arXiv 2512.03019) with a real judge.

Items are answer pairs with a known verdict, built from reasoning-gym problems with exact answers: one correct
and one wrong answer (A or B better, y = 1 or 0), or the correct answer written two equivalent ways (a tie,
y = 0.5). The judge is SmolLM2-135M-Instruct: the chat-formatted question and both answers, the assistant turn
opened with "Verdict:", and its next token sampled at `temperature` from the whole vocabulary (" A" / " B" /
" Both" or " Tie"; anything else is an unparsed sample, scored as a tie). Verdicts hang on that one token, so
n samples per item are n draws from its temperature-scaled distribution after one forward pass, the same
samples n one-token generations would give. Self-aggregation shows the judge its own first n verdicts and takes
its greedy final verdict. `experiments.btd.aggregation.evaluate` then scores majority vote, soft self-consistency,
self-aggregation and calibrated BTD (calibrated on the held-out half) by MAE and pairwise accuracy for every n.

cpu preset: the 135M judge is weak (expect verdicts near chance), so the figures test the harness and the
aggregation on a real, noisy judge rather than reproduce the paper's judges. full preset: sampled verdicts and
labels by path (`samples_path`, JSONL of {"verdicts": ["A", "B", "tie", ...], "y": float, "self_aggregation":
{"<n>": verdict}}), any judge: self-aggregation's final verdicts come with the file, one per n of `ns`.

  python -m experiments run btd --preset cpu
  python -m experiments run btd --preset full --set samples_path=/data/judge_samples.jsonl

Paper: arXiv 2512.03019. Code read beside it: none public. Method, claims, presets and departures from the paper:
experiments/btd/README.md.
"""
from __future__ import annotations

import dataclasses

from experiments import registry
from experiments.runner.claims import Claim
from experiments.btd import aggregation as btd


VERDICT_TOKENS = {btd.A: (" A", "A"), btd.B: (" B", "B"), btd.TIE: (" Both", " both", "Both", " Tie", " tie")}
NAMES = {"a": btd.A, "b": btd.B, "tie": btd.TIE, "both": btd.TIE}
PROMPT = ("Question: {q}\nAnswer A: {a}\nAnswer B: {b}\nWhich answer is correct? Reply with A, B, or Both if "
          "both are correct.")


@dataclasses.dataclass(frozen=True)
class Config:
  """btd settings. `items` answer pairs (the first half calibrates, the second is evaluated), `samples` verdicts
  each."""
  judge: str = "smollm2-135m-instruct"
  dataset: str = "basic_arithmetic"
  items: int = 32
  samples: int = 8
  ns: tuple[int, ...] = (1, 2, 4, 8)
  tie_share: float = 0.2
  temperature: float = 1.0
  prior: float = 0.5
  samples_path: str | None = None
  seed: int = 0

  def __post_init__(self):
    if self.items < 4 or self.items % 2:
      raise ValueError(f"items must be an even number >= 4 (half calibrate), found {self.items}")
    if not self.ns or any(n < 1 or n > self.samples for n in self.ns) or list(self.ns) != sorted(set(self.ns)):
      raise ValueError(f"ns must be increasing sample counts in [1, samples={self.samples}], found {self.ns}")
    if not 0.0 <= self.tie_share < 1.0:
      raise ValueError(f"tie_share must be in [0, 1), found {self.tie_share}")
    if not self.temperature > 0:
      raise ValueError(f"temperature must be > 0 (sampled verdicts), found {self.temperature}")


PRESETS = {
    "smoke": Config(items=8, samples=4, ns=(1, 4)),
    "cpu": Config(items=96, samples=16, ns=(1, 2, 4, 8, 16)),
    "full": Config(samples_path=registry.Required(
        "--set samples_path=FILE.jsonl: the sampled verdicts of a judge, one item a line, {\"verdicts\": [\"A\", "
        "\"B\", \"tie\", ...], \"y\": 1|0|0.5, \"self_aggregation\": {\"<n>\": verdict}}; no public file (the paper's "
        "code is unreleased): sample them with any judge over a pairwise benchmark with known labels"),
                   samples=32, ns=(1, 2, 4, 8, 16, 32)),
}


registry.register(registry.Experiment(
    name="btd", config_cls=Config, presets=PRESETS, run=registry.run_of("experiments.btd.run"),
    description="BTD vs majority / soft self-consistency / self-aggregation of sampled SmolLM2 verdicts",
    results=("mae.<method>", "pairwise_acc.<method>", "mae.btd.n<n>", "unparsed_share", "verdict_share.a",
             "verdict_share.b", "verdict_share.tie", "judge_accuracy_single", "items", "n_max"),
    paper="btd", claims=(
        Claim("mae", "calibrated BTD has a lower MAE than majority vote, soft self-consistency and self-aggregation",
              "lower MAE than every baseline on every benchmark",
              "{mae.btd} < min({mae.majority}, {mae.soft_sc}, {mae.self_agg})",
              diff=tuple((f"mae.{b}", "mae.btd") for b in ("majority", "soft_sc", "self_agg")),  # lower is better
              measurable="{judge_accuracy_single} > 0.4 and {items} >= 200",
              why="the judge's single verdicts are at chance (0.4: always A or always B, at the presets' tie share "
                  "0.2) or fewer than 100 items are held out, where the methods' differences are noise"),
        Claim("acc", "calibrated BTD's pairwise accuracy is at least the three baselines' (majority vote, soft "
              "self-consistency, self-aggregation)", "higher pairwise accuracy than the baselines",
              "{pairwise_acc.btd} >= max({pairwise_acc.majority}, {pairwise_acc.soft_sc}, {pairwise_acc.self_agg})",
              diff=tuple(("pairwise_acc.btd", f"pairwise_acc.{b}") for b in ("majority", "soft_sc", "self_agg")),
              measurable="{judge_accuracy_single} > 0.4 and {items} >= 200",
              why="the judge's single verdicts are at chance (0.4: always A or always B, at the presets' tie share "
                  "0.2) or fewer than 100 items are held out, where the methods' differences are noise"),
    )))
