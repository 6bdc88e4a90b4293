"""Command line: `python -m experiments {list, run, bench, reproduce}`.

  python -m experiments list
  python -m experiments run NAME --preset smoke|cpu|full [--set key=value ...] [--out DIR] [--resume]
  python -m experiments bench NAME [--out FILE.json] [bench flags, see `bench NAME --help`]
  python -m experiments reproduce --preset cpu [--root runs]

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


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m experiments", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = p.add_subparsers(dest="cmd", required=True)
  sub.add_parser("list", help="registered experiments and benchmarks")
  r = sub.add_parser("run", help="run one experiment")
  r.add_argument("name")
  r.add_argument("--preset", default="smoke", choices=registry.PRESETS)
  r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                 help="override a config field (dotted keys for nested configs); repeatable")
  r.add_argument("--out", default=None, help="run directory (default runs/NAME, or a fresh runs/NAME-k)")
  r.add_argument("--root", default="runs", help="where default run directories go")
  r.add_argument("--resume", action="store_true", help="continue from the latest complete checkpoint")
  b = sub.add_parser("bench", help="run a benchmark", add_help=False)
  b.add_argument("name")
  b.add_argument("--out", default=None, help="write the results as JSON here")
  g = sub.add_parser("reproduce", help="run every experiment, then write ROOT/report.md")
  g.add_argument("--preset", default="cpu", choices=registry.PRESETS)
  g.add_argument("--root", default="runs")
  g.add_argument("--only", nargs="*", default=None, help="restrict to these experiment names")
  return p


def _distributed() -> None:
  from jaxlab import sharding
  sharding.initialize_distributed()


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  args, rest = _parser().parse_known_args(argv)
  if args.cmd != "bench" and rest:
    _parser().error(f"unrecognized arguments: {' '.join(rest)}")

  if args.cmd == "list":
    print("experiments:")
    for name, exp in registry.experiments().items():
      print(f"  {name:<20} {exp.description}")
    for name, err in registry.import_errors().items():
      print(f"  {name:<20} FAILED TO IMPORT: {err}")
    print("benchmarks (python -m experiments bench NAME):")
    for name, bench in registry.benches().items():
      print(f"  {name:<20} {bench.description}")
    return 0

  if args.cmd == "run":
    try:
      exp = registry.get(args.name)
    except (KeyError, ImportError) as e:
      print(f"error: {e.args[0]}", file=sys.stderr)
      return 2
    if args.preset not in exp.presets:
      raise SystemExit(f"unknown preset {args.preset!r} for {args.name}")
    try:
      registry.apply_overrides(exp.presets[args.preset], args.overrides)  # fail fast, before JAX starts
      registry.resolve_run_dir(args.name, args.out, args.resume, args.root)
    except (registry.OverrideError, registry.RunDirExists) as e:
      print(f"error: {e}", file=sys.stderr)
      return 2
    _distributed()
    out_dir, results = registry.run_experiment(args.name, args.preset, args.overrides, args.out, args.resume,
                                               args.root)
    print(json.dumps(results, indent=1, default=str))
    print(f"run directory: {out_dir}")
    return 0

  if args.cmd == "bench":
    benches = registry.benches()
    if args.name not in benches:
      print(f"error: unknown benchmark {args.name!r}; registered: {sorted(benches)}", file=sys.stderr)
      return 2
    results = benches[args.name].fn(rest)
    text = json.dumps(results, indent=1, default=str)
    print(text)
    if args.out:
      os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
      with open(args.out, "w") as f:
        f.write(text + "\n")
    return 0

  if args.cmd == "reproduce":
    _distributed()
    names = list(registry.experiments())
    if args.only:
      unknown = sorted(set(args.only) - set(names) - set(registry.import_errors()))
      if unknown:
        print(f"error: unknown experiments {unknown}; registered: {names}", file=sys.stderr)
        return 2
      names = [n for n in names if n in args.only]
    entries, failed = [], 0
    for name, err in registry.import_errors().items():
      if not args.only or name in args.only:
        entries.append({"name": name, "error": f"import failed: {err}"})
        failed += 1
    for name in names:
      print(f"=== {name} ({args.preset})", flush=True)
      try:
        out_dir, results = registry.run_experiment(name, args.preset, (), None, False, args.root)
        entries.append({"name": name, "run_dir": out_dir, "results": results})
      except Exception as e:  # noqa: BLE001  (one failed experiment must not hide the others' results)
        traceback.print_exc()
        entries.append({"name": name, "error": f"{type(e).__name__}: {e}"})
        failed += 1
    path = registry.write_report(args.root, entries, args.preset)
    print(f"report: {path} ({len(entries) - failed} ok, {failed} failed)")
    return 1 if failed else 0
  return 2


if __name__ == "__main__":
  sys.exit(main())
