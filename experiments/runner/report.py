"""What runs leave for people to read: `summary.md` per run, the claims report `report.md` over runs, and the
`--help` config table."""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re
import typing
from typing import Any

from experiments.runner import claims as claims_lib, overrides, provenance


def fmt(v) -> str:
  if isinstance(v, float):
    return f"{v:.4g}" if math.isfinite(v) else str(v)
  return str(v)


def results_table(results: dict) -> str:
  lines = ["| key | value |", "|---|---|"]
  lines += [f"| {k} | {fmt(v)} |" for k, v in results.items()]
  return "\n".join(lines)


def plots_in(run_dir: str) -> list[str]:
  return sorted(f for f in os.listdir(run_dir) if f.lower().endswith(".png")) if os.path.isdir(run_dir) else []


def write_summary(run_dir: str, name: str, preset: str, overrides: list, results: dict) -> str:
  path = os.path.join(run_dir, "summary.md")
  lines = [f"# {name} ({preset})", ""]
  if overrides:
    lines += ["Overrides: " + " ".join(f"`{o}`" for o in overrides), ""]
  lines += [results_table(results), ""]
  lines += [f"![{p}]({p})" for p in plots_in(run_dir)]
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
  return path


def _cell(text) -> str:
  return str(text).replace("|", "\\|").replace("\n", " ")


def counts(verdicts: list[dict]) -> str:
  """"2 reproduced, 1 not measurable at this preset": how many verdicts of each kind, in order of appearance."""
  kinds = [claims_lib.kind(c["verdict"]) for c in verdicts]
  return ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds))


DEPARTURES = "Departures from the paper"


def departures(short: str, repo: str) -> dict:
  """{"page": experiments/<short>/README.md relative to the repository, "rows": how many rows its "Departures from
  the paper" table has} (rows None where the page or its table is missing)."""
  page = os.path.join("experiments", short, "README.md")
  try:
    with open(os.path.join(repo, page)) as f:
      text = f.read()
  except FileNotFoundError:
    return {"page": page, "rows": None}
  heading = re.search(rf"^#+ {DEPARTURES}\s*$", text, re.M)
  if heading is None:
    return {"page": page, "rows": None}
  table = itertools.takewhile(lambda line: line.startswith("|"),
                              itertools.dropwhile(lambda line: not line.startswith("|"),
                                                  text[heading.end():].splitlines()))
  return {"page": page, "rows": max(0, len(list(table)) - 2)}  # less the header and its rule


def _departures_cell(p: dict, root: str | None) -> str:
  d = p.get("departures") or {}
  if d.get("rows") is None:
    return "-"
  page = os.path.relpath(os.path.join(provenance.REPO, d["page"]), root) if root else d["page"]
  return f"[{d['rows']} rows]({page}#{DEPARTURES.lower().replace(' ', '-')})"


def papers_table(report: dict, root: str | None = None) -> str:
  """One line per paper: its experiments, how many of its claims reproduced at the report's preset (its harness
  checks after them, counted apart), and its departures table (row count, linked from `root`)."""
  lines = ["| paper | title | experiments | claims at this preset | departures from the paper |",
           "|---|---|---|---|---|"]
  for short, p in report["papers"].items():
    if not p["experiments"]:
      status = "not yet implemented"
    else:
      status = counts(p["claims"]) or "no claims declared"
      if p.get("checks"):
        status += f" (harness checks, not claims: {counts(p['checks'])})"
    lines.append(f"| {short} | {_cell(p['title'])} | {', '.join(p['experiments']) or '-'} | {status} | "
                 f"{_departures_cell(p, root)} |")
  return "\n".join(lines)


def claims_table(claims: list[dict]) -> str:
  """The claims' (or checks') verdicts, with the interval where per-item scores gave one."""
  lines = ["| claim | paper's figure | ours | verdict |", "|---|---|---|---|"]
  for c in claims:
    ours = "; ".join(f"{k} = {v}" for k, v in c["ours"].items())
    verdict = c["verdict"] + (f"; {c['interval']}" if c.get("interval_bounds") else "")
    lines.append(f"| {_cell(c['claim'])} | {_cell(c['paper'])} | {_cell(ours)} | {_cell(verdict)} |")
  return "\n".join(lines)


def skipped_list(report: dict) -> list[str]:
  """Lines naming the experiments skipped for a missing tool or package, and why; none when none was."""
  skipped = [f"- {name}: {e['skipped']}" for name, e in report["experiments"].items() if e.get("skipped")]
  if not skipped:
    return []
  return ["Skipped, for a tool or package that is not installed (install it and rerun them):", ""] + skipped + [""]


def times_table(report: dict) -> list[str]:
  """The run time of each experiment (its seeds' `wall_s` summed; runs read back keep their original time) and the
  total, as lines of a markdown table; none when no run recorded one."""
  rows, total = [], 0.0
  for name, e in report["experiments"].items():
    walls = [r["wall_s"] for r in e.get("results_per_seed") or () if isinstance(r.get("wall_s"), (int, float))]
    if walls:
      rows.append(f"| {name} | {len(walls)} | {duration(sum(walls))} |")
      total += sum(walls)
  if not rows:
    return []
  return (["Run times (each run's wall time as its results.json records it):", "", "| experiment | runs | time |",
           "|---|---|---|"] + rows + [f"| total | {sum(int(r.split('|')[2]) for r in rows)} | {duration(total)} |", ""])


def duration(s: float) -> str:
  """`1h02m` or `4m05s`."""
  s = int(round(s))
  return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def write_report(root: str, report: dict, filename: str = "report.md", link_plots: bool = True) -> str:
  """`root/filename` from a claims report (`reproduce.build`): the command and commits, the papers table, the
  experiments skipped for a missing tool or package, then per paper its claims, its harness checks apart, each run's
  results and plots (images linked from `root`, or with `link_plots=False` named as files of the run directory, for
  a copy kept apart from the runs), then the experiments that belong to no paper."""
  path = os.path.join(root, filename)
  m = report["machine"]
  lines = [f"# jaxlab claims report (preset {report['preset']})", "",
           f"Generated {report['generated']} on {m['processor']}"
           + (f", {m['cpu_model']} ({m['simd']})" if m.get("cpu_model") else "")
           + f", {m['cpus']} CPUs, {m['backend']} x "
           f"{m['devices']} (jax {m['jax']}; {m['platform']}); seeds per experiment: {report['seeds']}. "
           "Verdicts are computed from results.json (and items.json's per-item scores) only.", "",
           f"Command: `{report.get('command', '-')}`; runs made at commit(s) "
           f"{', '.join(report.get('commits') or ['-'])}.", "", papers_table(report, root), ""] + skipped_list(report)
  lines += times_table(report)
  done = set()

  def runs(name):
    out = [f"### {name}", ""]
    if name not in report["experiments"]:
      return out + ["Not run in this report.", ""]
    e = report["experiments"][name]
    if e.get("error"):
      return out + [f"**Failed:** `{e['error']}`", ""]
    if e.get("skipped"):
      return out + [f"**Skipped:** {e['skipped']}", ""]
    for run_dir, results in zip(e.get("run_dirs", []), e.get("results_per_seed", [])):
      out += [f"Run directory: `{run_dir}`", "", results_table(results), ""]
      plots = plots_in(run_dir)
      if link_plots:
        out += [f"![{name}: {p}]({os.path.relpath(os.path.join(run_dir, p), root)})" for p in plots]
      elif plots:
        out.append("Plots in the run directory: " + ", ".join(f"`{p}`" for p in plots) + ".")
      out.append("")
    return out

  for short, p in report["papers"].items():
    if not p["experiments"]:
      continue
    lines += [f"## {short}: {p['title']}", "", claims_table(p["claims"]), ""]
    if p.get("checks"):
      lines += ["Harness checks (the benchmark's own references and constructed-wrong agents; not paper claims):", "",
                claims_table(p["checks"]), ""]
    for name in p["experiments"]:
      lines += runs(name)
      done.add(name)
  for name in report["experiments"]:
    if name not in done:
      lines += [f"## {name}", ""] + runs(name)[2:]
  os.makedirs(root, exist_ok=True)
  with open(path, "w") as f:
    f.write("\n".join(lines))
  return path


def read_results(run_dir: str) -> dict:
  with open(os.path.join(run_dir, "results.json")) as f:
    return json.load(f)


def describe_config(exp) -> str:
  """A table of every `--set` key of `exp`: type and value in each preset (nested keys dotted)."""
  hints: dict[str, Any] = {}

  def walk(cls, prefix):
    for f in dataclasses.fields(cls):
      if not f.init:
        continue
      tp = typing.get_type_hints(cls).get(f.name, Any)
      if dataclasses.is_dataclass(tp):
        walk(tp, f"{prefix}{f.name}.")
      else:
        hints[f"{prefix}{f.name}"] = tp

  walk(exp.config_cls, "")
  values = {p: overrides.flatten(overrides.config_dict(c)) for p, c in exp.presets.items()}
  rows = [("key", "type", *values)]
  rows += [(k, overrides.type_name(tp), *(fmt(v.get(k, "-")) for v in values.values())) for k, tp in hints.items()]
  widths = [min(40, max(len(str(r[i])) for r in rows)) for i in range(len(rows[0]))]
  return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def publish(report: dict, directory: str, stem: str) -> tuple[str, str]:
  """(claims, report) written as `directory/stem-claims.json` and `directory/stem-report.md`, the report's links
  relative to `directory` (a folder of the repository that keeps reports beside the code, e.g. experiments/reports)
  and its plots named, not linked (the run directories stay out of the repository)."""
  os.makedirs(directory, exist_ok=True)
  claims = os.path.join(directory, f"{stem}-claims.json")
  with open(claims, "w") as f:
    json.dump(report, f, indent=1, default=str)
  return claims, write_report(directory, report, f"{stem}-report.md", link_plots=False)
