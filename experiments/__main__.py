"""Command line: `python -m experiments {list, run, bench, reproduce, readme, judge}`.

  python -m experiments list
  python -m experiments run NAME --preset smoke|cpu|full [--set key=value ...] [--out DIR] [--resume]
  python -m experiments bench NAME [--out FILE.json] [bench flags, see `bench NAME --help`]
  python -m experiments reproduce --preset cpu [--root runs] [--only NAME ...] [--seeds N] [--force] [--reuse-any]
  python -m experiments readme [--claims runs/claims.json] [--merge]   (the README's paper table from a claims report)
  python -m experiments judge PATH   (a finished run, its results.json or a reproduce root, judged by today's claims)

`reproduce` reads a finished run back only when the same clean git commit made it (`--reuse-any`: any commit).

A user error (a bad --set, a missing file, a run directory in use, a config an experiment rejects, a tool or
package that is not installed) is one `error:` line and exit code 2; `--debug` (or JAXLAB_DEBUG=1) shows the
traceback instead. `reproduce` reports an experiment whose tool or package is not installed as one `skipped:`
line, lists it in the report, and exits 0 when nothing failed. Ctrl-C stops a run at the next step boundary,
once the checkpoint being written is complete (`jaxlab.train.interrupt`; a second Ctrl-C stops at once), and
exits with code 130; the command that continues it is the last line printed.

Multi-process runs (launch scripts in tpu_gpu_scripts/) start `jax.distributed` from the environment before
anything else touches JAX.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

from experiments import registry
from experiments.runner import readme as readme_lib, reproduce as reproduce_lib

# Exceptions that mean "the input is wrong" (or the machine lacks a tool: jaxlab.errors.MissingDependency is an
# OSError), reported in one line; anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, OSError, KeyError, ImportError, FloatingPointError)


def _debug(args) -> bool:
  return bool(getattr(args, "debug", False) or os.environ.get("JAXLAB_DEBUG"))


def _message(e: BaseException) -> str:
  text = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
  return " ".join(str(text).split()) or type(e).__name__


def _resume_command(args, out_dir: str) -> str:
  sets = " ".join(f"--set {o}" for o in args.overrides)
  return f"python -m experiments run {args.name} --preset {args.preset} {sets} --out {out_dir} --resume".replace(
      "  ", " ")


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m experiments", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--debug", action="store_true", help="show tracebacks for user errors too")
  sub = p.add_subparsers(dest="cmd", required=True)
  sub.add_parser("list", help="registered experiments and benchmarks")
  r = sub.add_parser("run", help="run one experiment (`run NAME --help` lists its config keys)", add_help=False)
  r.add_argument("-h", "--help", action="store_true", help="this help, and NAME's config keys and presets")
  r.add_argument("name", nargs="?")
  r.add_argument("--preset", default="smoke", choices=registry.PRESETS)
  r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                 help="override a config field (dotted keys for nested configs); repeatable")
  r.add_argument("--out", default=None, help="run directory (default runs/NAME, or a fresh runs/NAME-k)")
  r.add_argument("--root", default="runs", help="where default run directories go")
  r.add_argument("--resume", action="store_true",
                 help="continue from the latest complete checkpoint (--set steps=N extends a run where the "
                      "experiment allows it)")
  r.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
  b = sub.add_parser("bench", help="run a benchmark (`bench NAME --help` lists its flags)", add_help=False)
  b.add_argument("name", nargs="?")
  b.add_argument("--out", default=None, help="write the results as JSON here")
  g = sub.add_parser("reproduce", help="run every experiment, then write ROOT/report.md")
  g.add_argument("--preset", default="cpu", choices=registry.PRESETS)
  g.add_argument("--root", default="runs")
  g.add_argument("--only", nargs="*", default=None, help="restrict to these experiment names")
  g.add_argument("--seeds", type=int, default=1, help="run each experiment that has a seed this many times")
  g.add_argument("--force", action="store_true", help="rerun experiments whose results are already there")
  g.add_argument("--reuse-any", action="store_true",
                 help="read back finished runs of the same config whatever commit made them (default: only runs of "
                      "the current commit, made from a clean tree)")
  m = sub.add_parser("readme", help="rewrite the README's paper table from a claims report")
  m.add_argument("--claims", default="runs/claims.json")
  m.add_argument("--readme", default="README.md")
  m.add_argument("--plan", default="runs/plan.json", help="a `plan --all` report for the paper scale table (if it "
                 "exists)")
  m.add_argument("--merge", action="store_true",
                 help="replace only the rows of the papers this report ran, and name the report above the table")
  m.add_argument("--publish", metavar="DIR/STEM", help="also keep the report in the repository: DIR/STEM-claims.json "
                 "and DIR/STEM-report.md, linked from DIR, plots named (e.g. experiments/reports/cpu-2026-12-07)")
  g.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
  j = sub.add_parser("judge", help="judge a finished run's claims again with the claims as declared now")
  j.add_argument("path", help="a run directory, its results.json, or a reproduce root (its claims.json)")
  j.add_argument("--experiment", default=None, help="the experiment, where no config.json sits next to the results")
  j.add_argument("--preset", default=None, choices=registry.PRESETS, help="the preset, likewise")
  n = sub.add_parser("plan", help="compile a preset's workloads ahead of time for a TPU slice (or cpu-N): per-chip "
                                  "bytes, fit, FLOPs, chip-hours")
  n.add_argument("name", nargs="?", default=None)
  n.add_argument("--all", action="store_true", help="every paper's experiment, each on the smallest slice from "
                 "--topology up on which it fits: writes ROOT/plan.md and ROOT/plan.json")
  n.add_argument("--root", default="runs")
  n.add_argument("--only", nargs="+", default=None, help="with --all: these experiments only")
  n.add_argument("--force", action="store_true", help="with --all: plan again what ROOT/plan/ holds for this config")
  n.add_argument("--cached", action="store_true", help="with --all: write the table from what ROOT/plan/ holds, "
                 "planning nothing (the rest is listed as not planned yet)")
  n.add_argument("--preset", default="full", choices=registry.PRESETS)
  n.add_argument("--topology", required=True, help="a Cloud TPU type (v5e-8, v5p-64, v6e-16, ...), cpu-N or local")
  n.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
  n.add_argument("--json", default=None, help="write the plan here as JSON")
  return p


def _distributed() -> None:
  from jaxlab import sharding
  sharding.initialize_distributed()


def _list() -> int:
  print("experiments:")
  for name, exp in registry.experiments().items():
    print(f"  {name:<20} {exp.description}")
  for name, err in registry.import_errors().items():
    print(f"  {name:<20} FAILED TO IMPORT: {err}")
  print("benchmarks (python -m experiments bench NAME):")
  for name, bench in registry.benches().items():
    print(f"  {name:<20} {bench.description}")
  return 0


def _run(args) -> int:
  if args.help or args.name is None:
    _parser()._subparsers._group_actions[0].choices["run"].print_help()
    if args.name is None:
      print(f"\nexperiments: {', '.join(registry.experiments())}")
      return 0 if args.help else 2
    exp = registry.get(args.name)
    print(f"\n{args.name}: {exp.description}\nconfig keys (--set KEY=VALUE) and their value per preset:")
    print(registry.describe_config(exp))
    if exp.resume_may_change:
      print(f"may change on --resume: {', '.join(exp.resume_may_change)}")
    return 0
  registry.config_for(args.name, args.preset, args.overrides)  # fail fast, before JAX starts
  out_dir = registry.resolve_run_dir(args.name, args.out, args.resume, args.root)
  _distributed()
  try:
    out_dir, results = registry.run_experiment(args.name, args.preset, args.overrides, out_dir, args.resume)
  except KeyboardInterrupt:
    print(f"\ninterrupted; checkpoints on disk are complete. Continue with:\n  {_resume_command(args, out_dir)}",
          file=sys.stderr)
    return 130
  print(json.dumps(results, indent=1, default=str))
  print(f"run directory: {out_dir}")
  return 0


def _bench(args, rest) -> int:
  benches = registry.benches()
  if args.name is None:
    print("usage: python -m experiments bench NAME [--out FILE.json] [flags; `bench NAME --help`]\nbenchmarks:")
    for name, bench in benches.items():
      print(f"  {name:<20} {bench.description}")
    return 0 if {"-h", "--help"} & set(rest) else 2
  if args.name not in benches:
    raise KeyError(f"unknown benchmark {args.name!r}; registered: {sorted(benches)}")
  results = benches[args.name].fn(rest)
  text = json.dumps(results, indent=1, default=str)
  print(text)
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      f.write(text + "\n")
  return 0


def _reproduce(args) -> int:
  names = list(registry.experiments())
  if args.only:
    unknown = sorted(set(args.only) - set(names) - set(registry.import_errors()))
    if unknown:
      raise KeyError(f"unknown experiments {unknown}; registered: {names}")
  _distributed()

  def on_error(name, e):
    if _debug(args) or not isinstance(e, USER_ERRORS):
      traceback.print_exc()
    else:
      print(f"error: {name}: {_message(e)}", file=sys.stderr)

  def on_skip(name, e):
    print(f"skipped: {name}: {_message(e)}", file=sys.stderr)

  path, failed, skipped = reproduce_lib.reproduce(args.preset, args.root, args.only, args.seeds, args.force,
                                                  on_error, on_skip, reuse_any=args.reuse_any)
  print(f"report: {path} ({failed} failed" + (f", {skipped} skipped: missing tools)" if skipped else ")"))
  return 1 if failed else 0


def _readme(args) -> int:
  if not os.path.exists(args.claims) and not os.path.exists(args.plan):
    raise FileNotFoundError(f"readme: neither {args.claims} (reproduce writes it) nor {args.plan} (plan --all) exists")
  if os.path.exists(args.claims):
    with open(args.claims) as f:
      report = json.load(f)
    changed = readme_lib.update(args.readme, report, merge=args.merge)
    print(f"{args.readme}: paper table {'rewritten' if changed else 'already current'} from {args.claims}")
    if args.publish:
      from experiments.runner import report as report_lib
      paths = report_lib.publish(report, os.path.dirname(args.publish) or ".", os.path.basename(args.publish))
      print(f"kept as {' and '.join(paths)}")
  elif args.publish:
    raise FileNotFoundError(f"readme --publish: {args.claims} (the report to keep) does not exist")
  if os.path.exists(args.plan):
    with open(args.plan) as f:
      changed = readme_lib.update_scale(args.readme, json.load(f), merge=args.merge)
    print(f"{args.readme}: paper scale table {'rewritten' if changed else 'already current'} from {args.plan}")
  return 0


def _plan(args) -> int:
  import re
  m = re.fullmatch(r"cpu-([1-9]\d*)", args.topology)
  if m and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count="
                               f"{m.group(1)}").strip()  # read when JAX starts its CPU backend, below
  from experiments.runner import plan as plan_lib
  if args.all == (args.name is not None):
    raise ValueError("plan: expected an experiment NAME or --all, not both or neither")
  if args.all:
    report = plan_lib.plan_all(args.topology, args.preset, args.only, lambda m: print(m, flush=True),
                               os.path.join(args.root, "plan"), args.force, args.cached)
    path = plan_lib.write_all(report, args.root)
    print(f"{path}: {len(report['plans'])} experiments planned, {len(report['errors'])} could not be")
    return 1 if report["errors"] or not all(p["fits"] for p in report["plans"]) else 0
  registry.config_for(args.name, args.preset, args.overrides, required=False)  # a bad --set fails before compiling
  p = plan_lib.plan(args.name, args.preset, args.topology, args.overrides)
  print(plan_lib.table(p))
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump(p, f, indent=1)
  line = plan_lib.not_fitting(p)
  if line:
    print(f"error: {line}", file=sys.stderr)
    return 1
  return 0


def _judge(args) -> int:
  from experiments.runner import judge
  print("\n".join(judge.judge(args.path, args.experiment, args.preset)))
  return 0


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  args, rest = _parser().parse_known_args(argv)
  if args.cmd != "bench" and rest:
    _parser().error(f"unrecognized arguments: {' '.join(rest)}")
  try:
    if args.cmd == "list":
      return _list()
    if args.cmd == "run":
      from jaxlab.train import interrupt
      with interrupt.handled():  # Ctrl-C from here on is never lost, nor raised inside JAX or orbax
        return _run(args)
    if args.cmd == "bench":
      return _bench(args, rest)
    if args.cmd == "reproduce":
      return _reproduce(args)
    if args.cmd == "readme":
      return _readme(args)
    if args.cmd == "judge":
      return _judge(args)
    if args.cmd == "plan":
      return _plan(args)
  except USER_ERRORS as e:
    if _debug(args):
      raise
    print(f"error: {_message(e)}  (--debug shows the traceback)", file=sys.stderr)
    return 2
  except KeyboardInterrupt:  # outside a run (a run prints its resume command): nothing to continue
    print("\ninterrupted", file=sys.stderr)
    return 130
  return 2


if __name__ == "__main__":
  sys.exit(main())
