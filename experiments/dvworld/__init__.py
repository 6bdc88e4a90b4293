"""DV-World (experiments/dvworld/README.md; code DA-Open/DV-World): data-visualization agents scored on a mini task set.

Three domains over tables that ship with installed packages (`tasks`):
- DV-Evol: the agent's program draws the chart and writes the plotted table (result.csv); it runs in the sandbox
  beside `experiments.dvworld.charts`' probe, which reads every series back. Score = 0.5 visual + 0.5 table, the table
  half `charts.table_alignment` against the reference solution's table, the visual half a rubric judge
  (`rubric`: the rule rubric over the extracted data at the cpu preset, an MLLM judge by path at the full one).
- DV-Sheet (`sheet`): native .xlsx charts with openpyxl, creation and repair, series references resolved to cells.
- DV-Interact (`interact`): an under-specified request and a scripted user holding the hidden intent.
Agents (`agents`): the reference programs (the oracle; they validate the harness), one per broken kind (wrong
aggregation, wrong column, missing filter, wrong chart type), a guesser that never asks (DV-Interact only), and
SmolLM2-135M-Instruct writing its own code (cpu preset; a real but weak agent). The full preset scores DV-World's own
DV-Evol cases: the gold directory (dv-evol-*/ with gold.png or result.png, gold.csv or result.csv), one agent's
outputs in the same layout (result.png, result.csv), and the MLLM judge by path; given `sheet_gold_dir` (DV-World's
dv-sheet gold folder: dvsheet-create-*/ with the gold workbook, dvsheet-fix-*/ with the gold and its broken start
workbook) also its DV-Sheet cases, each agent workbook (sheet_results_dir, default results_dir, same case folders)
scored by `sheet.creation_score` or `sheet.workbook_repair_score`; without it DV-Sheet is skipped with a note.

  python -m experiments run dvworld --preset cpu
  python -m experiments run dvworld --preset full --set gold_dir=DV-World/dv-evolution/gold \
      --set results_dir=runs/my_agent --set judge_path=/opt/judge/run --set sheet_gold_dir=DV-World/dv-sheet/gold

Paper: arXiv 2604.25914. Code read beside it: DA-Open/DV-World @ dd518d387601. Method, claims, presets and
departures from the paper: experiments/dvworld/README.md.
"""
from __future__ import annotations

import dataclasses
from typing import Literal

from experiments import registry
from experiments.dvworld import tasks
from experiments.runner.claims import Check, Claim
from jaxlab import choices


PROGRAM_AGENTS = ("reference",) + tasks.BROKEN
LM_AGENTS = ("smollm2",)
Agent = Literal["reference", "wrong_aggregation", "wrong_column", "missing_filter", "wrong_chart_type", "smollm2"]
choices.same(PROGRAM_AGENTS + LM_AGENTS, Agent)


@dataclasses.dataclass(frozen=True)
class Config:
  """dvworld settings. `tasks` / `sheet_tasks`: task ids (None: all); `agents`: of PROGRAM_AGENTS and LM_AGENTS;
  `sheet_combine`: DV-Sheet creation's visual score times table coverage ("product") or weighted by `vis_weight`;
  `sheet_gold_dir` / `sheet_results_dir` (with `gold_dir`): DV-World's dv-sheet gold folder and the agent's DV-Sheet
  outputs (None: `results_dir`), scored beside DV-Evol; without `sheet_gold_dir` DV-Sheet is skipped at full;
  `slots`: the LM agent's answers decoded that many rows at a time (`chat_models.answer`: continuous batching for
  long answers)."""
  tasks: tuple[str, ...] | None = None
  sheet_tasks: tuple[str, ...] | None = None
  agents: tuple[Agent, ...] = PROGRAM_AGENTS + LM_AGENTS
  model: str = "smollm2-135m-instruct"
  max_new_tokens: int = 384
  interact_new_tokens: int = 96
  slots: int = 8
  max_turns: int = 4
  judge: Literal["rule", "mllm"] = "rule"
  judge_path: str | None = None
  job_timeout_s: int = 60
  memory_mb: int = 2048
  gold_dir: str | None = None
  results_dir: str | None = None
  sheet_gold_dir: str | None = None
  sheet_results_dir: str | None = None
  agent_name: str = "candidate"
  vis_weight: float = 0.5
  sheet_combine: Literal["product", "weighted"] = "product"

  def __post_init__(self):
    unknown = [a for a in self.agents if a not in PROGRAM_AGENTS + LM_AGENTS]
    if unknown or not self.agents:
      raise ValueError(f"agents must be a non-empty subset of {PROGRAM_AGENTS + LM_AGENTS}, found {self.agents}")
    if self.gold_dir is None and "reference" not in self.agents:
      raise ValueError("agents must include 'reference' (its runs validate the harness)")
    if self.judge not in ("rule", "mllm"):
      raise ValueError(f"judge must be 'rule' or 'mllm', found {self.judge!r}")
    if self.gold_dir is not None and self.judge != "mllm":
      raise ValueError("scoring DV-World's own cases (gold_dir) needs judge='mllm': they come as images, not code")
    if (self.sheet_gold_dir is not None or self.sheet_results_dir is not None) and self.gold_dir is None:
      raise ValueError("sheet_gold_dir / sheet_results_dir score DV-World's own DV-Sheet cases beside its DV-Evol "
                       "ones: set gold_dir too (the full preset)")
    if self.sheet_results_dir is not None and self.sheet_gold_dir is None:
      raise ValueError(f"sheet_results_dir {self.sheet_results_dir!r} needs sheet_gold_dir (DV-World's dv-sheet gold "
                       f"folder), found none")
    if self.max_turns < 2 or self.job_timeout_s < 1 or self.memory_mb < 256 or self.slots < 1:
      raise ValueError(f"need max_turns >= 2, job_timeout_s >= 1, memory_mb >= 256, slots >= 1; found "
                       f"{self.max_turns}, {self.job_timeout_s}, {self.memory_mb}, {self.slots}")
    if self.sheet_combine not in ("product", "weighted"):
      raise ValueError(f"sheet_combine must be 'product' or 'weighted', found {self.sheet_combine!r}")
    if not 0.0 <= self.vis_weight <= 1.0:
      raise ValueError(f"vis_weight must be in [0, 1], found {self.vis_weight}")
    tasks.select(self.tasks)
    tasks.select(self.sheet_tasks)


SMOKE_TASKS = ("tips_bar", "gapminder_line", "cars_scatter")
PRESETS = {
    "smoke": Config(tasks=SMOKE_TASKS, sheet_tasks=SMOKE_TASKS[:2], agents=PROGRAM_AGENTS),
    "cpu": Config(),
    "full": Config(gold_dir=registry.Required(
                       "--set gold_dir=PATH: DV-World's DV-Evol gold cases, the folder of dv-evol-*/ (hf download "
                       "DV-World/dvworld --repo-type dataset --local-dir data/dvworld, as the reference's README "
                       "places it: its dv-evolution gold folder)"),
                   results_dir=registry.Required(
                       "--set results_dir=PATH: one agent's outputs, dv-evol-*/result.png and result.csv per case "
                       "(DV-World's dv-evolution agent, then its get_results.py)"),
                   judge="mllm", judge_path=registry.Required(
                       "--set judge_path=PATH: an executable MLLM judge, called as PATH GOLD_PNG CAND_PNG with the "
                       "rubric prompt on stdin (the reference's judges are API models)"),
                   agents=("reference",)),
}


def _requires(cfg: Config) -> tuple[str, ...]:
  return () if cfg.gold_dir is not None else ("bwrap",)  # DV-World's own cases are scored without the sandbox


registry.register(registry.Experiment(
    name="dvworld", config_cls=Config, presets=PRESETS, run=registry.run_of("experiments.dvworld.run"),
    requires=_requires,
    description="DV-World: table alignment, chart extraction, DV-Evol / DV-Sheet / DV-Interact on a mini task set",
    results=("table_alignment.<agent>", "visual.<agent>", "dv_evol.<agent>", "ran.<agent>?", "sheet.<agent>?",
             "sheet_create.<agent>?", "sheet_fix.<agent>?", "interact_isr.<agent>?", "interact_adjust.<agent>?",
             "interact_score.<agent>?", "interact_asked.<agent>?", "tasks?", "sheet_tasks?", "cases?", "sheet_cases?",
             "sheet_skipped?"),
    paper="dvworld", seed_key=None, claims=(
        Claim("weak", "a real agent stays below 50% overall", "state-of-the-art models achieve below 50% overall",
              "{dv_evol.smollm2} < 0.5 and {sheet.smollm2} < 0.5", presets=("cpu",),
              measurable="min({dv_evol.smollm2}, {sheet.smollm2}) > 0",
              why="the agent scores 0 (the floor) on a suite, so staying below 50% says nothing of the tasks"),
    ), checks=(
        Check("alignment", "table-value alignment gives the reference 1 and each data error (aggregation, column, "
              "filter) less", "Table-value Alignment for numerical precision",
              "{table_alignment.reference} == 1 and max({table_alignment.wrong_aggregation}, "
              "{table_alignment.wrong_column}, {table_alignment.missing_filter}) < 1", presets=("smoke", "cpu")),
        Check("visual", "the rubric judge marks a wrong chart type down though its table is right",
              "rubric-based MLLM-as-a-Judge for semantic-visual assessment",
              "{dv_evol.wrong_chart_type} < {dv_evol.reference} and {table_alignment.wrong_chart_type} == 1",
              presets=("smoke", "cpu")),
        Check("interact", "asking the simulated user beats guessing the hidden intent",
              "DV-Interact: proactive intent alignment with a user simulator under ambiguous requirements",
              "{interact_isr.reference} > {interact_isr.guess}", presets=("smoke", "cpu")),
    )))
