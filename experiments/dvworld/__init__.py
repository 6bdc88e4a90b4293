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
outputs in the same layout (result.png, result.csv), and the MLLM judge by path.

  python -m experiments run dvworld --preset cpu
  python -m experiments run dvworld --preset full --set gold_dir=DV-World/dv-evolution/gold \
      --set results_dir=runs/my_agent --set judge_path=/opt/judge/run
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Literal

import numpy as np

from experiments import registry
from experiments.dvworld import agents as agents_lib
from experiments.dvworld import interact, rubric, sheet, tasks
from experiments.runner.claims import Check, Claim
from experiments.dvworld import charts
from jaxlab import choices

PROGRAM_AGENTS = ("reference",) + tasks.BROKEN
LM_AGENTS = ("smollm2",)
Agent = Literal["reference", "wrong_aggregation", "wrong_column", "missing_filter", "wrong_chart_type", "smollm2"]
choices.same(PROGRAM_AGENTS + LM_AGENTS, Agent)


@dataclasses.dataclass(frozen=True)
class Config:
  """dvworld settings. `tasks` / `sheet_tasks`: task ids (None: all); `agents`: of PROGRAM_AGENTS and LM_AGENTS."""
  tasks: tuple[str, ...] | None = None
  sheet_tasks: tuple[str, ...] | None = None
  agents: tuple[Agent, ...] = PROGRAM_AGENTS + LM_AGENTS
  model: str = "smollm2-135m-instruct"
  max_new_tokens: int = 384
  interact_new_tokens: int = 96
  max_turns: int = 4
  judge: Literal["rule", "mllm"] = "rule"
  judge_path: str | None = None
  job_timeout_s: int = 60
  memory_mb: int = 2048
  gold_dir: str | None = None
  results_dir: str | None = None
  agent_name: str = "candidate"
  vis_weight: float = 0.5

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
    if self.max_turns < 2 or self.job_timeout_s < 1 or self.memory_mb < 256:
      raise ValueError(f"need max_turns >= 2, job_timeout_s >= 1, memory_mb >= 256; found {self.max_turns}, "
                       f"{self.job_timeout_s}, {self.memory_mb}")
    if not 0.0 <= self.vis_weight <= 1.0:
      raise ValueError(f"vis_weight must be in [0, 1], found {self.vis_weight}")
    tasks.select(self.tasks)
    tasks.select(self.sheet_tasks)


SMOKE_TASKS = ("tips_bar", "gapminder_line", "cars_scatter")
PRESETS = {
    "smoke": Config(tasks=SMOKE_TASKS, sheet_tasks=SMOKE_TASKS[:2], agents=PROGRAM_AGENTS),
    "cpu": Config(),
    "full": Config(gold_dir=registry.Required("--set gold_dir=PATH: DV-World's dv-evolution/gold"),
                   results_dir=registry.Required("--set results_dir=PATH: an agent's dv-evol-*/result.png, result.csv"),
                   judge="mllm", judge_path=registry.Required("--set judge_path=PATH: an executable MLLM judge"),
                   agents=("reference",)),
}


def _judge(cfg: Config):
  return rubric.RuleRubric() if cfg.judge == "rule" else rubric.CommandJudge(cfg.judge_path)


def _agents(cfg: Config) -> dict:
  out = {a: agents_lib.ProgramAgent(None if a == "reference" else a) for a in cfg.agents if a in PROGRAM_AGENTS}
  if "smollm2" in cfg.agents:
    out["smollm2"] = agents_lib.LMAgent(agents_lib.chat_generate(cfg.model, cfg.max_new_tokens),
                                        interact_tokens=cfg.interact_new_tokens)
  return out


def _execute(cfg: Config, first: list, by_agent: dict, **kw) -> tuple[list, dict]:
  """Runs the `first` jobs (gold, setup) and the program agents' jobs in one sandbox batch (all of it is this
  module's own code), and each LM job in a sandbox call of its own. Returns (first's runs, {agent: runs})."""
  run = lambda js: charts.run_plots(js, job_timeout_s=cfg.job_timeout_s, memory_mb=cfg.memory_mb, **kw)
  trusted = [n for n in by_agent if n not in LM_AGENTS]
  batch = run(first + [j for n in trusted for j in by_agent[n]])
  out, i = {}, len(first)
  for n in trusted:
    out[n], i = batch[i:i + len(by_agent[n])], i + len(by_agent[n])
  for n in by_agent:
    if n in LM_AGENTS:
      out[n] = [r for j in by_agent[n] for r in run([j])]
  return batch[:len(first)], out


def _mean(xs) -> float:
  return float(np.mean(xs)) if len(xs) else 0.0


def run_evol(cfg, specs, frames, agents, judge, out_dir, log) -> dict:
  cache, png_dir = os.path.join(out_dir, "data"), None
  if cfg.judge == "mllm":
    png_dir = os.path.join(out_dir, "charts")
    os.makedirs(png_dir, exist_ok=True)
  files = {s.id: {"data.csv": tasks.data_csv(s.source, cache)} for s in specs}
  jobs = {name: [charts.Job(p, files[s.id], f"{name}.{s.id}")
                 for s, p in zip(specs, agent.evol_programs(specs, frames))] for name, agent in agents.items()}
  gold, runs_by_agent = _execute(cfg, [charts.Job(tasks.program(s), files[s.id], f"gold.{s.id}") for s in specs],
                                 jobs, png_dir=png_dir)
  bad = [(s.id, g.chart.error) for s, g in zip(specs, gold) if g.chart.error or g.chart.table is None]
  if bad:
    raise RuntimeError(f"dvworld: reference programs failed in the sandbox: {bad}")
  res = {}
  for name, runs in runs_by_agent.items():
    rows = []
    for s, g, c in zip(specs, gold, runs):
      table = charts.table_alignment(g.chart.table, c.chart.table) if c.chart.table else 0.0
      verdict = judge(s.instruction(list(frames[s.source].columns)), g, c)
      rows.append({"domain": "evol", "agent": name, "task": s.id, "table": table, "visual": verdict.score,
                   "rubric": verdict.items if cfg.judge == "rule" else None,
                   "score": charts.dv_evol_score(verdict.score, table, cfg.vis_weight), "error": c.chart.error})
      log(rows[-1])
    res[f"table_alignment.{name}"] = _mean([r["table"] for r in rows])
    res[f"visual.{name}"] = _mean([r["visual"] for r in rows])
    res[f"dv_evol.{name}"] = _mean([r["score"] for r in rows])
    res[f"ran.{name}"] = _mean([r["error"] is None for r in rows])
  return res


def run_sheet(cfg, specs, agents, out_dir, log) -> dict:
  root = os.path.join(out_dir, "sheet")
  os.makedirs(os.path.join(root, "start"), exist_ok=True)
  starts = {s.id: sheet.start_workbook(s, os.path.join(root, "start", f"{s.id}.xlsx")) for s in specs}
  items = [(s, "create", None) for s in specs] + [(s, "fix", sheet.fix_break(s, i)) for i, s in enumerate(specs)]
  setup = [charts.Job(sheet.program(s), {"start.xlsx": starts[s.id]}, f"gold.{s.id}") for s in specs]
  setup += [charts.Job(sheet.program(s, break_=b), {"start.xlsx": starts[s.id]}, f"break.{s.id}")
            for s, mode, b in items if mode == "fix"]
  _execute(cfg, setup, {}, keep=["result.xlsx"], keep_dir=root)
  gold = {s.id: sheet.read_charts(os.path.join(root, f"gold.{s.id}", "result.xlsx")) for s in specs}
  broken = {s.id: sheet.read_charts(os.path.join(root, f"break.{s.id}", "result.xlsx")) for s in specs}
  missing = [i for i, c in {**gold, **{f"break.{k}": v for k, v in broken.items()}}.items() if len(c) != 1]
  if missing:
    raise RuntimeError(f"dvworld: the gold and broken start workbooks must hold one chart each; failed: {missing}")
  start = lambda s, mode: starts[s.id] if mode == "create" else os.path.join(root, f"break.{s.id}", "result.xlsx")
  jobs = {name: [charts.Job(p, {"start.xlsx": start(s, mode)}, f"{name}.{mode}.{s.id}")
                 for (s, mode, _), p in zip(items, agent.sheet_programs(items))] for name, agent in agents.items()}
  _, runs = _execute(cfg, [], jobs, keep=["result.xlsx"], keep_dir=os.path.join(root, "agents"))
  res = {}
  for name in agents:
    rows = []
    for (s, mode, brk), job, ran in zip(items, jobs[name], runs[name]):
      cand = sheet.read_charts(os.path.join(root, "agents", job.name, "result.xlsx"))
      if mode == "create":
        score, must = (sheet.chart_similarity(gold[s.id][0], cand[0]) if cand else 0.0), None
      else:
        score, must = sheet.repair_score(gold[s.id][0], broken[s.id][0], cand[0] if cand else None)
      rows.append({"domain": "sheet", "agent": name, "task": s.id, "mode": mode, "break": brk, "must_fix": must,
                   "charts": len(cand), "score": score, "error": ran.chart.error})
      log(rows[-1])
    res[f"sheet.{name}"] = _mean([r["score"] for r in rows])
    res[f"sheet_create.{name}"] = _mean([r["score"] for r in rows if r["mode"] == "create"])
    res[f"sheet_fix.{name}"] = _mean([r["score"] for r in rows if r["mode"] == "fix"])
  return res


def run_interact(cfg, specs, frames, agents, log) -> dict:
  by_request = interact.requests(specs, frames)
  policies = {name: (agent.interact_policy(by_request) if isinstance(agent, agents_lib.ProgramAgent) else
                     agent.interact_policy()) for name, agent in agents.items()}
  policies["guess"] = interact.scripted_policy(by_request, ask=False)
  res = {}
  for name, policy in policies.items():
    rows = interact.episodes(specs, frames, policy, cfg.max_turns)
    for r in rows:
      log({"domain": "interact", "agent": name, **r})
    res[f"interact_isr.{name}"] = _mean([r["success"] for r in rows])
    res[f"interact_adjust.{name}"] = _mean([r["adjustment"] for r in rows])
    res[f"interact_score.{name}"] = _mean([r["success"] * r["adjustment"] for r in rows])
    res[f"interact_asked.{name}"] = _mean([r["asked"] for r in rows])
  return res


def _find(case: str, names) -> str | None:
  return next((os.path.join(case, n) for n in names if os.path.isfile(os.path.join(case, n))), None)


def run_full(cfg: Config, out_dir: str, log) -> dict:
  """DV-World's own DV-Evol cases: the gold directory against one agent's outputs, the MLLM judge on the images."""
  for field in ("gold_dir", "results_dir"):
    path = getattr(cfg, field)
    if not os.path.isdir(path):
      raise FileNotFoundError(f"{field}: expected a directory of dv-evol-* case folders, found none at {path!r}")
  judge = _judge(cfg)
  cases = sorted(d for d in os.listdir(cfg.gold_dir) if d.startswith("dv-evol"))
  if not cases:
    raise FileNotFoundError(f"gold_dir {cfg.gold_dir!r}: expected dv-evol-* case folders, found none")
  rows = []
  for case in cases:
    g, c = os.path.join(cfg.gold_dir, case), os.path.join(cfg.results_dir, case)
    g_png, g_csv = _find(g, ("gold.png", "result.png")), _find(g, ("gold.csv", "result.csv"))
    c_png, c_csv = (_find(c, ("result.png",)), _find(c, ("result.csv",))) if os.path.isdir(c) else (None, None)
    gold_t, cand_t = (charts.read_table(g_csv) if g_csv else None), (charts.read_table(c_csv) if c_csv else None)
    table = charts.table_alignment(gold_t, cand_t) if gold_t and cand_t else 0.0
    visual = 0.0
    if g_png and c_png:
      visual = judge(f"case_id={case}", charts.PlotRun(charts.Chart(()), None, g_png),
                     charts.PlotRun(charts.Chart(()), None, c_png)).score
    rows.append({"domain": "evol", "agent": cfg.agent_name, "task": case, "table": table, "visual": visual,
                 "score": charts.dv_evol_score(visual, table, cfg.vis_weight)})
    log(rows[-1])
  n = cfg.agent_name
  return {f"table_alignment.{n}": _mean([r["table"] for r in rows]), f"visual.{n}": _mean([r["visual"] for r in rows]),
          f"dv_evol.{n}": _mean([r["score"] for r in rows]), "cases": len(rows)}


def _plot(path: str, res: dict, names) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  keys = [k for k in ("dv_evol", "table_alignment", "sheet", "interact_isr") if any(f"{k}.{n}" in res for n in names)]
  fig, ax = plt.subplots(figsize=(8, 4), dpi=100)
  width = 0.8 / max(len(keys), 1)
  for i, k in enumerate(keys):
    ax.bar(np.arange(len(names)) + i * width, [res.get(f"{k}.{n}", 0.0) for n in names], width, label=k)
  ax.set_xticks(np.arange(len(names)) + width * (len(keys) - 1) / 2, names, rotation=20, fontsize=8)
  ax.set_ylabel("score")
  ax.set_title("dvworld: scores per agent")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  del resume  # minutes at the cpu preset; recomputed
  metrics = open(os.path.join(out_dir, "metrics.jsonl"), "w")
  log = lambda row: metrics.write(json.dumps(row, default=str) + "\n")
  try:
    if cfg.gold_dir is not None:
      return run_full(cfg, out_dir, log)
    judge = _judge(cfg)
    specs, sheet_specs = tasks.select(cfg.tasks), tasks.select(cfg.sheet_tasks)
    frames = {s.source: tasks.load_frame(s.source) for s in specs + sheet_specs}
    agents = _agents(cfg)
    res = run_evol(cfg, specs, frames, agents, judge, out_dir, log)
    res.update(run_sheet(cfg, sheet_specs, agents, out_dir, log))
    res.update(run_interact(cfg, specs, frames, agents, log))
    res["tasks"], res["sheet_tasks"] = len(specs), 2 * len(sheet_specs)
  finally:
    metrics.close()
  _plot(os.path.join(out_dir, "scores.png"), res, list(agents) + ["guess"])
  return res


def _requires(cfg: Config) -> tuple[str, ...]:
  return () if cfg.gold_dir is not None else ("bwrap",)  # DV-World's own cases are scored without the sandbox


registry.register(registry.Experiment(
    name="dvworld", config_cls=Config, presets=PRESETS, run=run, requires=_requires,
    description="DV-World: table alignment, chart extraction, DV-Evol / DV-Sheet / DV-Interact on a mini task set",
    results=("table_alignment.<agent>", "visual.<agent>", "dv_evol.<agent>", "ran.<agent>?", "sheet.<agent>?",
             "sheet_create.<agent>?", "sheet_fix.<agent>?", "interact_isr.<agent>?", "interact_adjust.<agent>?",
             "interact_score.<agent>?", "interact_asked.<agent>?", "tasks?", "sheet_tasks?", "cases?"),
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
