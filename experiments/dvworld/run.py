"""The run of dvworld: what `python -m experiments run dvworld` executes (its Config, presets and claims are in
`experiments/dvworld/__init__.py`, the paper and its departures in `experiments/dvworld/README.md`)."""
from __future__ import annotations

import json
import os

import numpy as np

from experiments.dvworld import agents as agents_lib
from experiments.runner import splits
from experiments.dvworld import interact, rubric, sheet, tasks
from experiments.dvworld import charts
from experiments.dvworld import Config, LM_AGENTS, PROGRAM_AGENTS


def _judge(cfg: Config):
  return rubric.RuleRubric() if cfg.judge == "rule" else rubric.CommandJudge(cfg.judge_path)


def _agents(cfg: Config) -> dict:
  out = {a: agents_lib.ProgramAgent(None if a == "reference" else a) for a in cfg.agents if a in PROGRAM_AGENTS}
  if "smollm2" in cfg.agents:
    out["smollm2"] = agents_lib.LMAgent(agents_lib.chat_generate(cfg.model, cfg.max_new_tokens, cfg.slots),
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
      parts = {}
      if mode == "create":
        parts = sheet.creation_score(os.path.join(root, "agents", job.name, "result.xlsx"),
                                     os.path.join(root, f"gold.{s.id}", "result.xlsx"), cfg.sheet_combine,
                                     cfg.vis_weight)
        score, must = parts.pop("score"), None
      else:
        score, must = sheet.repair_score(gold[s.id][0], broken[s.id][0], cand[0] if cand else None)
      rows.append({"domain": "sheet", "agent": name, "task": s.id, "mode": mode, "break": brk, "must_fix": must,
                   "charts": len(cand), "score": score, **parts, "error": ran.chart.error})
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


SHEET_SUITES = {"create": "dvsheet-create", "fix": "dvsheet-fix"}
SHEET_SKIPPED = "DV-Sheet not scored: no --set sheet_gold_dir=PATH (DV-World's dv-sheet gold folder)"


def _workbooks(case: str) -> list[str]:
  """The case folder's workbooks (.xlsx, .xls) in name order, Excel's lock files (.~*) left out; [] without one."""
  if not os.path.isdir(case):
    return []
  return [os.path.join(case, n) for n in sorted(os.listdir(case)) if n.lower().endswith((".xlsx", ".xls"))
          and not n.startswith(".~") and os.path.isfile(os.path.join(case, n))]


def _is_start(path: str) -> bool:
  stem = os.path.splitext(os.path.basename(path))[0].lower()
  return "start" in stem or "broken" in stem


def sheet_gold(case: str, mode: str) -> tuple[str | None, str | None]:
  """(gold workbook, broken start workbook) of a gold case folder: for creation the first workbook and no start; for
  repair the start is the first named *start* or *broken*, the gold the first named *gold*, else the first other."""
  books = _workbooks(case)
  if mode == "create":
    return (books[0] if books else None), None
  start = next((b for b in books if _is_start(b)), None)
  named = next((b for b in books if "gold" in os.path.splitext(os.path.basename(b))[0].lower()), None)
  return named or next((b for b in books if not _is_start(b)), books[0] if books else None), start


def sheet_cases(cfg: Config) -> list[tuple[str, str, str, str | None]]:
  """(mode, case, gold workbook, start workbook) of each DV-Sheet case in `sheet_gold_dir`, checked: the folders
  exist, there are cases, and each has its gold workbook (.xlsx) and, for repair, its broken start."""
  results = cfg.sheet_results_dir or cfg.results_dir
  for field, path in (("sheet_gold_dir", cfg.sheet_gold_dir), ("sheet_results_dir", results)):
    if not os.path.isdir(path):
      raise FileNotFoundError(f"{field}: expected a directory of dvsheet-create-* / dvsheet-fix-* case folders, "
                              f"found none at {path!r}")
  names = sorted(os.listdir(cfg.sheet_gold_dir))
  out = [(m, d, *sheet_gold(os.path.join(cfg.sheet_gold_dir, d), m)) for d in names for m, p in SHEET_SUITES.items()
         if d.startswith(p) and os.path.isdir(os.path.join(cfg.sheet_gold_dir, d))]
  if not out:
    raise FileNotFoundError(f"sheet_gold_dir {cfg.sheet_gold_dir!r}: expected dvsheet-create-* or dvsheet-fix-* case "
                            f"folders, found none (entries: {names[:5]})")
  no_gold = [c for _, c, g, _ in out if g is None or not g.lower().endswith(".xlsx")]
  no_start = [c for m, c, g, s in out if m == "fix" and (s is None or s == g)]
  if no_gold or no_start:
    raise FileNotFoundError(f"sheet_gold_dir {cfg.sheet_gold_dir!r}: expected a gold .xlsx in every case folder and a "
                            f"broken *start*/*broken* .xlsx beside it in every dvsheet-fix one; found no gold .xlsx in "
                            f"{no_gold[:5]}, no start in {no_start[:5]}")
  return out


def run_full_sheet(cfg: Config, cases: list, log) -> dict:
  """DV-World's own DV-Sheet cases: each case's first workbook in the results folder, creation by
  `sheet.creation_score` against the gold workbook, repair by `sheet.workbook_repair_score`; a case without a
  candidate workbook scores 0."""
  results, rows = cfg.sheet_results_dir or cfg.results_dir, []
  for mode, case, gold, start in cases:
    cand = next(iter(_workbooks(os.path.join(results, case))), None)
    parts, must = {}, None
    if mode == "create":
      parts = sheet.creation_score(cand or "", gold, cfg.sheet_combine, cfg.vis_weight)
      score = parts.pop("score")
    else:
      score, must = sheet.workbook_repair_score(gold, start, cand)
    rows.append({"domain": "sheet", "agent": cfg.agent_name, "task": case, "mode": mode, "candidate": cand,
                 "must_fix": must, "score": score, **parts})
    log(rows[-1])
  n, res = cfg.agent_name, {"sheet_cases": len(rows)}
  res[f"sheet.{n}"] = _mean([r["score"] for r in rows])
  for mode in SHEET_SUITES:
    if any(r["mode"] == mode for r in rows):
      res[f"sheet_{mode}.{n}"] = _mean([r["score"] for r in rows if r["mode"] == mode])
  return res


def run_full(cfg: Config, out_dir: str, log) -> dict:
  """DV-World's own cases: DV-Evol (the gold directory against one agent's outputs, the MLLM judge on the images) and,
  with `sheet_gold_dir`, DV-Sheet creation and repair (`run_full_sheet`); every path is checked before scoring."""
  for field in ("gold_dir", "results_dir"):
    path = getattr(cfg, field)
    if not os.path.isdir(path):
      raise FileNotFoundError(f"{field}: expected a directory of dv-evol-* case folders, found none at {path!r}")
  judge = _judge(cfg)
  cases = sorted(d for d in os.listdir(cfg.gold_dir) if d.startswith("dv-evol"))
  if not cases:
    raise FileNotFoundError(f"gold_dir {cfg.gold_dir!r}: expected dv-evol-* case folders, found none")
  items = {"dv_evol": {"cases": cases}}
  if cfg.sheet_gold_dir is None:
    splits.record(out_dir, "dvworld", items)
    return {"sheet_skipped": SHEET_SKIPPED, **run_full_evol(cfg, cases, judge, log)}
  sheet_items = sheet_cases(cfg)
  splits.record(out_dir, "dvworld", {**items, "dv_sheet": {"cases": [c for _, c, _, _ in sheet_items]}})
  return {**run_full_sheet(cfg, sheet_items, log), **run_full_evol(cfg, cases, judge, log)}


def run_full_evol(cfg: Config, cases: list, judge, log) -> dict:
  """DV-World's own DV-Evol cases: table alignment on the CSVs, the MLLM judge on the PNGs; missing files score 0."""
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


def split_items(specs, sheet_specs, frames) -> dict:
  """The run's splits, one evaluation split per suite (DV-Evol, DV-Sheet creation and repair, DV-Interact), each
  task as the text its agent reads; nothing is trained on or shown as an example."""
  cols = lambda s: list(frames[s.source].columns)
  sheet_items = [{"task": s.id, "mode": "create", "text": sheet.instruction(s, "create")} for s in sheet_specs]
  sheet_items += [{"task": s.id, "mode": "fix", "text": sheet.instruction(s, "fix", sheet.fix_break(s, i))}
                  for i, s in enumerate(sheet_specs)]
  return {"dv_evol": {"tasks": [{"task": s.id, "text": s.instruction(cols(s))} for s in specs]},
          "dv_sheet": {"tasks": sheet_items},
          "dv_interact": {"tasks": [{"task": s.id, "text": r}
                                    for r, (s, _) in interact.requests(specs, frames).items()]}}


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
    splits.record(out_dir, "dvworld", split_items(specs, sheet_specs, frames))
    agents = _agents(cfg)
    res = run_evol(cfg, specs, frames, agents, judge, out_dir, log)
    res.update(run_sheet(cfg, sheet_specs, agents, out_dir, log))
    res.update(run_interact(cfg, specs, frames, agents, log))
    res["tasks"], res["sheet_tasks"] = len(specs), 2 * len(sheet_specs)
  finally:
    metrics.close()
  _plot(os.path.join(out_dir, "scores.png"), res, list(agents) + ["guess"])
  return res


def workloads(cfg: Config, mesh) -> list:
  """Nothing for `experiments plan` at any preset that scores DV-World's own cases (full): the run aligns CSV tables,
  hands each gold / candidate PNG pair to the MLLM judge at `judge_path`, an executable outside jaxlab, and reads
  DV-Sheet workbooks with openpyxl, so no accelerator compute of this run remains to plan. (The cpu preset's SmolLM2
  agent is not a paper-scale workload.)"""
  del cfg, mesh
  return []
