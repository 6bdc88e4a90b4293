"""The run of susvibes: what `python -m experiments run susvibes` executes (its Config, presets and claims are in
`experiments/susvibes/__init__.py`, the paper and its departures in `experiments/susvibes/README.md`)."""
from __future__ import annotations

import dataclasses
import json
import os

from experiments.runner import splits
from experiments.susvibes import agents as agents_lib
from experiments.susvibes import harness, scanner, strategies
from experiments.susvibes.tasks import mini_tasks
from experiments.susvibes import ANSWER_CHARS, Config


def make_agent(name: str, cfg: Config):
  """(task -> prompt -> text, None) for an agent, or (None, reason) when its registered model is not installed."""
  if name in ("reference_secure", "reference_insecure"):
    kind = name.split("_")[1]
    return (lambda task: agents_lib.ReferenceAgent(task, kind)), None
  from jaxlab.models import registry as models
  try:
    lm = agents_lib.LMAgent(cfg.model, cfg.max_new_tokens, cfg.batch_size)
  except FileNotFoundError as e:
    if cfg.model not in models.REAL_MODELS:  # a path given by the user must exist
      raise
    return None, f"model {cfg.model!r} is not installed ({e})"
  return (lambda task: lm), None


def generate(factory, tasks, prompts) -> list[str]:
  """Every task's answer; one batched call when all tasks share an agent with a `batch` method."""
  callables = [factory(t) for t in tasks]
  first = callables[0]
  if hasattr(first, "batch") and all(c is first for c in callables):
    return list(first.batch(prompts))
  return [c(p) for c, p in zip(callables, prompts)]


def edited_files(task, edits: agents_lib.Edits, strip_functional: bool) -> dict:
  """The files an answer changes, as they read after its edits (empty when they do not apply)."""
  import shutil
  import tempfile
  from experiments.susvibes import patches
  workdir = tempfile.mkdtemp(prefix="susvibes-edit-")
  try:
    changed, _ = harness.prepare(task, edits, workdir, with_security=False, strip_functional=strip_functional)
    out = {}
    for p in changed:
      full = os.path.join(workdir, p)
      if os.path.isfile(full):
        with open(full, errors="replace") as f:
          out[p] = f.read()
    return out
  except patches.PatchError:
    return {}
  finally:
    shutil.rmtree(workdir, ignore_errors=True)


def feedback_round(factory, tasks, prompts, answers, cfg: Config, which: str) -> tuple[list[str], list[list]]:
  """The feedback strategy's revision: each answer's edited code is scanned; answers with findings are revised once
  (the revision prompt shows the first answer and the findings). Returns (final answers, findings per task)."""
  findings = []
  for t, a in zip(tasks, answers):
    code = edited_files(t, agents_lib.parse_output(a, t.target), cfg.strip_functional)
    findings.append(scanner.scan(code, which=which, memory_mb=cfg.memory_mb) if code else [])
  todo = [i for i, f in enumerate(findings) if f]
  if todo:
    revised = generate(factory, [tasks[i] for i in todo],
                       [strategies.revision_prompt(prompts[i], answers[i], scanner.findings_text(findings[i]))
                        for i in todo])
    answers = list(answers)
    for i, r in zip(todo, revised):
      answers[i] = r
  return answers, findings


def split_items(tasks) -> dict:
  """The run's splits: every task is evaluated; nothing is trained on or shown as an example."""
  return {"test": {"tasks": [{"id": t.id, "cwe": t.cwe, "request": t.request} for t in tasks]}}


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  del resume  # minutes at the cpu preset; recomputed
  if cfg.dataset_path is not None:
    from experiments.susvibes import full
    return full.run(cfg, out_dir)
  tasks = mini_tasks(cfg.tasks or None)
  splits.record(out_dir, "susvibes", split_items(tasks))
  all_cwes = sorted({t.cwe for t in tasks})
  which = scanner.available() if cfg.scanner == "auto" else cfg.scanner
  limits = harness.Limits(cfg.timeout_s, cfg.memory_mb)
  cache: dict = {}
  res: dict = {"n_tasks": len(tasks), "scanner": which}
  with open(os.path.join(out_dir, "tasks.jsonl"), "w") as rec_f, \
       open(os.path.join(out_dir, "metrics.jsonl"), "w") as met_f:
    for name in cfg.agents:
      factory, skipped = make_agent(name, cfg)
      if factory is None:
        res[f"skipped.{name}"] = skipped
        for s in cfg.strategies:
          res[f"func_pass.{name}.{s}"] = res[f"secure_pass.{name}.{s}"] = None
        continue
      prompts = {s: [strategies.build_prompt(t, s, all_cwes, cfg.prompt_files) for t in tasks]
                 for s in cfg.strategies}
      flat = generate(factory, tasks * len(cfg.strategies), [p for s in cfg.strategies for p in prompts[s]])
      for k, s in enumerate(cfg.strategies):
        first = flat[k * len(tasks):(k + 1) * len(tasks)]
        answers, findings = (feedback_round(factory, tasks, prompts[s], first, cfg, which) if s == "feedback"
                             else (first, [[] for _ in tasks]))
        outcomes, selection = [], []
        for t, a0, a, f in zip(tasks, first, answers, findings):
          key = (t.id, a)
          if key not in cache:  # the evaluation is a function of the task and the answer
            cache[key] = harness.evaluate(t, agents_lib.parse_output(a, t.target), limits, cfg.strip_functional)
          o = cache[key]
          outcomes.append(o)
          rec = {"agent": name, "strategy": s, **dataclasses.asdict(o), "correct_secure": o.correct_secure,
                 "answer": a[:ANSWER_CHARS]}
          if s == "feedback":
            rec.update(first_answer=a0[:ANSWER_CHARS], findings=[str(x) for x in f], revised=bool(f))
          if s == "self_selection":
            chosen = agents_lib.selected_cwes(a)
            selection.append(strategies.selection_scores(chosen, [t.cwe]))
            rec["selected_cwes"] = chosen
          rec_f.write(json.dumps(rec) + "\n")
        r = harness.ratios(outcomes, len(tasks))
        met_f.write(json.dumps({"agent": name, "strategy": s, **r}) + "\n")
        res[f"func_pass.{name}.{s}"], res[f"secure_pass.{name}.{s}"] = r["func_pass"], r["secure_pass"]
        res[f"patch_errors.{name}.{s}"] = r["patch_errors"]
        if s == "feedback":
          res[f"scanner_flagged.{name}"] = sum(bool(f) for f in findings) / len(tasks)
        if s == "self_selection":
          for m in ("precision", "recall"):
            res[f"cwe_selection.{m}.{name}"] = sum(x[m] for x in selection) / len(tasks)
  return res


def workloads(cfg: Config, mesh) -> list:
  """Nothing for `experiments plan` at the full preset: it scores an agent's patches given by path
  (`predictions_path`) with each task's functional and security tests in the task's Docker image (`full.run`);
  the patches are written elsewhere, so the run does no accelerator compute. (The cpu preset's SmolLM2 agent is
  not a paper-scale workload.)"""
  del cfg, mesh
  return []
