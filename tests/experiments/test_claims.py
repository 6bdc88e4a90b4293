"""The claims report: verdicts computed from results.json, seeds, resumable reproduce, the README table;
measurability (floor, ceiling, chance), bootstrap intervals over per-item scores, harness checks kept apart, runs
read back only from the same code, and `judge`."""
import dataclasses
import json
import os
import re

import numpy as np
import pytest

from experiments import __main__ as cli
from experiments._shared import records
from experiments import registry
from experiments.runner import claims as claims_lib
from experiments.runner import provenance, splits
from experiments.runner import readme as readme_lib
from experiments.runner import report as report_lib
from experiments.runner import reproduce as reproduce_lib


@dataclasses.dataclass(frozen=True)
class Cfg:
  seed: int = 0
  gain: float = 1.0


RUNS = []


def _run(cfg, out_dir, resume):
  RUNS.append((cfg.seed, out_dir))
  if out_dir:
    splits.record(out_dir, "toy_a", {"test": {"items": ["one"]}})
  # loss rises with the seed: the "beats" claim holds for seeds 0 and 1 only
  return {"loss.ours": 1.0 + 0.3 * cfg.seed, "loss.base": 1.5, "bytes.ours": 40.0 * cfg.gain, "bytes.base": 100.0}


CLAIMS = (
    claims_lib.Claim("beats", "ours reaches a lower loss than the baseline", "1.0 vs 1.5",
                     "{loss.ours} < {loss.base}"),
    claims_lib.Claim("cheap", "ours uses at most a third of the bytes", "33%",
                     "{bytes.ours} / {bytes.base} <= 1 / 3"),
    claims_lib.Claim("full_only", "holds at paper scale", "x", "{loss.ours} > 0", presets=("full",)),
)


@pytest.fixture
def toy(monkeypatch):
  presets = {p: Cfg() for p in registry.PRESETS}
  exps = {"toy_a": registry.Experiment("toy_a", Cfg, presets, _run, "a", paper="scale", claims=CLAIMS,
                                       results=("loss.<who>", "bytes.<who>")),
          "toy_b": registry.Experiment("toy_b", Cfg, presets, _run, "b")}
  monkeypatch.setattr(registry, "experiments", lambda: exps)
  monkeypatch.setattr(registry, "import_errors", lambda: {})
  monkeypatch.setattr(provenance, "current", lambda: dict(CODE))  # a clean checkout, whatever this one is
  RUNS.clear()
  return exps


CODE = {"git_commit": "c0ffee" * 6 + "c0ff", "git_dirty": False}


def test_checks_are_arithmetic_and_comparisons_only():
  c = claims_lib.Claim("x", "t", "p", "abs({a.b} - {c}) <= 0.01 * max({c}, 1) and not {a.b} < 0")
  assert c.keys == ("a.b", "c")
  assert claims_lib.holds(c, {"a.b": 2.0, "c": 2.005}) is True
  assert claims_lib.holds(c, {"a.b": 2.0, "c": 3.0}) is False
  assert claims_lib.holds(c, {"a.b": float("nan"), "c": 3.0}) is None and claims_lib.holds(c, {"c": 1}) is None
  for bad in ["__import__('os').system('true') or {k}", "{k}.real > 0", "[{k}][0] > 0", "{k} if 1 else 0"]:
    with pytest.raises(ValueError, match="checks may not|does not parse"):
      claims_lib.Claim("bad", "t", "p", bad)
  with pytest.raises(ValueError, match="names no"):
    claims_lib.Claim("bad", "t", "p", "1 < 2")


def test_verdicts_per_claim_and_over_seeds():
  c = CLAIMS[0]
  one = [_run(Cfg(seed=0), "", False)]
  assert claims_lib.verdict(c, one, "cpu")["verdict"] == "reproduced"
  assert claims_lib.verdict(CLAIMS[1], [_run(Cfg(gain=2.0), "", False)], "cpu")["verdict"] == "not reproduced"
  assert claims_lib.verdict(CLAIMS[2], one, "cpu")["verdict"] == "not measurable at this preset"
  three = [_run(Cfg(seed=s), "", False) for s in range(3)]  # loss.ours 1.0, 1.3, 1.6 against 1.5
  v = claims_lib.verdict(c, three, "cpu")
  assert v["verdict"] == "unstable (2 of 3 seeds hold)" and v["ours"]["loss.ours"] == "1.3 (1 to 1.6)"


def test_reproduce_report_with_claims_seeds_and_resume(toy, tmp_path, capsys):
  root = str(tmp_path / "runs")
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--seeds", "3"]) == 0
  assert sorted(RUNS) == sorted([(0, f"{root}/toy_a"), (1, f"{root}/toy_a.seed1"), (2, f"{root}/toy_a.seed2"),
                                 (0, f"{root}/toy_b"), (1, f"{root}/toy_b.seed1"), (2, f"{root}/toy_b.seed2")])
  out = capsys.readouterr().out
  assert "=== toy_a (cpu) [--------------------] 1/6, elapsed" in out and "=== toy_b seed +2 (cpu) [" in out
  assert "5/6, elapsed" in out and "left" in out
  report = json.load(open(os.path.join(root, "claims.json")))
  verdicts = {c["id"]: c["verdict"] for c in report["papers"]["scale"]["claims"]}
  assert verdicts == {"beats": "unstable (2 of 3 seeds hold)", "cheap": "not reproduced",
                      "full_only": "not measurable at this preset"}
  assert len(report["papers"]) == 19 and report["papers"]["gig"]["experiments"] == []
  md = open(os.path.join(root, "report.md")).read()
  assert ("| scale | SCALE: column-normalized SGD with last-layer momentum | toy_a | 1 unstable, 1 not reproduced, "
          "1 not measurable at this preset |") in md
  assert "| gig | Graph-in-Graph planning | - | not yet implemented |" in md and "## toy_b" in md
  walls = {n: sum(r["wall_s"] for r in e["results_per_seed"]) for n, e in report["experiments"].items()}
  assert f"| toy_a | 3 | {report_lib.duration(walls['toy_a'])} |" in md and "| total | 6 |" in md
  before = reproduce_lib.previous_times(root, "cpu")
  assert sorted(before) == sorted((n, k) for n in ("toy_a", "toy_b") for k in range(3))
  assert reproduce_lib.previous_times(root, "full") == {}  # another preset's times say nothing of this one
  assert reproduce_lib.progress(3, 4, 61, 90, width=8) == "[####----] 3/4, elapsed 1m01s, about 1m30s left"

  RUNS.clear()  # again: everything is read back, nothing reruns
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--seeds", "3", "--only", "toy_a", "toy_b"]) == 0
  assert RUNS == [] and "not rerun" in capsys.readouterr().out
  assert json.load(open(os.path.join(root, "claims.json")))["papers"]["scale"]["claims"][0]["verdict"].startswith(
      "unstable")
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--only", "toy_b", "--force"]) == 0
  assert RUNS == [(0, f"{root}/toy_b-2")] and os.path.exists(f"{root}/toy_b/results.json")  # the old run kept


@dataclasses.dataclass(frozen=True)
class Inner:
  seed: int = 10


@dataclasses.dataclass(frozen=True)
class Nested:
  seed: int = 0
  train: Inner = Inner()


def test_seeds_move_every_seed_key_together_nested_ones_included(toy, tmp_path, monkeypatch):
  seen = []
  presets = {p: Nested() for p in registry.PRESETS}
  exp = registry.Experiment("toy_n", Nested, presets, lambda c, o, r: seen.append((c.seed, c.train.seed)) or {},
                            seed_key=("seed", "train.seed"))
  monkeypatch.setitem(toy, "toy_n", exp)
  assert cli.main(["reproduce", "--preset", "cpu", "--root", str(tmp_path), "--only", "toy_n", "--seeds", "3"]) == 0
  assert seen == [(0, 10), (1, 11), (2, 12)]
  assert registry.Experiment("toy_s", Nested, presets, _run, seed_key="train.seed").seed_key == ("train.seed",)
  with pytest.raises(ValueError, match=r"seed_key names \['model.seed'\], not fields of Nested"):
    registry.Experiment("toy_x", Nested, presets, _run, seed_key=("seed", "model.seed"))


def test_readme_table_is_generated_from_the_report(toy, tmp_path):
  root = str(tmp_path / "runs")
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--only", "toy_a"]) == 0
  readme = tmp_path / "README.md"
  readme.write_text(f"# x\n\n{readme_lib.BEGIN}\nold table\n{readme_lib.END}\n\nmore\n")
  assert cli.main(["readme", "--claims", f"{root}/claims.json", "--readme", str(readme), "--plan", f"{root}/none"]) == 0
  text = readme.read_text()
  assert "old table" not in text and text.endswith(f"{readme_lib.END}\n\nmore\n")
  row = next(line for line in text.splitlines() if line.startswith("| scale |"))
  assert "ours reaches a lower loss than the baseline: **reproduced** (loss.ours 1, loss.base 1.5)" in row
  assert "| polar | Program-of-Layers | - | not yet implemented |" in text
  assert not readme_lib.update(str(readme), json.load(open(f"{root}/claims.json")))  # idempotent
  # --publish keeps the report beside the code: its links resolve from there, the run's plots are named only
  open(os.path.join(root, "toy_a", "curve.png"), "wb").close()
  keep = tmp_path / "repo" / "reports"
  assert cli.main(["readme", "--claims", f"{root}/claims.json", "--readme", str(readme), "--plan", f"{root}/none",
                   "--publish", str(keep / "cpu-x")]) == 0
  assert json.load(open(keep / "cpu-x-claims.json")) == json.load(open(f"{root}/claims.json"))
  page = (keep / "cpu-x-report.md").read_text()
  assert "Plots in the run directory: `curve.png`." in page and "![" not in page
  links = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", page)]
  assert links and all(os.path.exists(keep / t) for t in links), links


def test_readme_merge_replaces_only_the_rows_of_papers_the_report_ran(toy, tmp_path):
  old = {"preset": "cpu", "seeds": 2, "generated": "2026-12-01 00:00:00", "experiments": {},
         "machine": {"processor": "x86_64", "cpus": 2, "jax": "0"},
         "papers": {s: {"title": t, "experiments": [f"x_{s}"], "claims": [{"claim": "c", "verdict": "old",
                                                                            "ours": {"k": 1}}]}
                    for s, t in claims_lib.PAPERS.items()}}
  readme = tmp_path / "README.md"
  readme.write_text(f"# x\n\n{readme_lib.BEGIN}\n{readme_lib.table(old)}\n{readme_lib.END}\n")
  before = readme.read_text().splitlines()
  root = str(tmp_path / "runs")
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--only", "toy_a"]) == 0
  assert cli.main(["readme", "--claims", f"{root}/claims.json", "--readme", str(readme), "--merge", "--plan",
                   f"{root}/none"]) == 0
  after = readme.read_text().splitlines()
  changed = [line for line in after if line not in before]
  assert len(changed) == 2 and changed[0].startswith("Rows for scale: claims checked by `python -m experiments "
                                                     "reproduce --preset cpu --seeds 1 --only toy_a` at commit "
                                                     "c0ffeec0ffee on ")
  assert changed[1].startswith("| scale |") and "**reproduced** (loss.ours 1, loss.base 1.5)" in changed[1]
  assert [line for line in before if line not in after] == [next(x for x in before if x.startswith("| scale |"))]
  assert after[after.index(readme_lib.BEGIN) + 1] == before[before.index(readme_lib.BEGIN) + 1]  # other rows' source
  assert not readme_lib.update(str(readme), json.load(open(f"{root}/claims.json")), merge=True)  # idempotent
  report = json.load(open(f"{root}/claims.json"))
  with pytest.raises(ValueError, match="not for the report's preset 'full'"):
    readme_lib.update(str(readme), dict(report, preset="full"), merge=True)


def test_readme_table_names_experiments_run_on_fewer_seeds():
  machine = {"processor": "x86_64", "cpus": 2, "jax": "0"}
  report = {"preset": "cpu", "seeds": 2, "generated": "2026-12-02 00:00:00", "machine": machine, "papers": {},
            "experiments": {"a": {"results_per_seed": [{}, {}]}, "b": {"results_per_seed": [{}]},
                            "c": {"error": "x"}}}
  assert readme_lib.table(report).splitlines()[0].endswith("jax 0; seeds per experiment where fewer: b (1)):")
  report["experiments"]["b"]["results_per_seed"].append({})
  assert readme_lib.table(report).splitlines()[0].endswith("jax 0):")


def test_the_projects_readme_carries_a_generated_table():
  text = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")).read()
  assert readme_lib.BEGIN in text and readme_lib.END in text
  lines = text.split(readme_lib.BEGIN)[1].split(readme_lib.END)[0].splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith("| short name | paper |"))
  end = start + 2 + len(claims_lib.PAPERS)
  assert [line.split("|")[1].strip() for line in lines[start + 2:end]] == list(claims_lib.PAPERS)
  assert not lines[end:end + 1] or not lines[end].startswith("| ")  # a harness-checks table may follow, apart


def test_experiments_left_out_or_failing_are_reported_as_such(toy, tmp_path, monkeypatch):
  root = str(tmp_path / "runs")
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--only", "toy_b"]) == 0
  claims = json.load(open(os.path.join(root, "claims.json")))["papers"]["scale"]
  assert claims["experiments"] == ["toy_a"] and {c["verdict"] for c in claims["claims"]} == {"not run in this report"}
  monkeypatch.setitem(toy, "toy_a", dataclasses.replace(toy["toy_a"], run=lambda *a: 1 / 0))
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--only", "toy_a"]) == 1
  claims = json.load(open(os.path.join(root, "claims.json")))["papers"]["scale"]
  assert {c["verdict"] for c in claims["claims"]} == {"experiment failed"}


# ----------------------------------------------------------------------------- measurability and intervals

BEATS = claims_lib.Claim("beats", "A answers more items right than B", "A above B", "{acc.a} > {acc.b}",
                         measurable="max({acc.a}, {acc.b}) > 0 and min({acc.a}, {acc.b}) < 1 and {acc.base} > 0.5",
                         why="both at 0 (the floor) or 1 (the ceiling), or the base model at chance (0.5)",
                         diff=("acc.a", "acc.b"))


def _figures(a, b, base=0.75) -> dict:
  return {"acc.a": float(np.mean(a)), "acc.b": float(np.mean(b)), "acc.base": base}


@pytest.mark.parametrize("results,figures", [
    ({"acc.a": 0.0, "acc.b": 0.0, "acc.base": 0.75}, "acc.base=0.75"),  # the floor
    ({"acc.a": 1.0, "acc.b": 1.0, "acc.base": 0.75}, "acc.base=0.75"),  # the ceiling
    ({"acc.a": 0.7, "acc.b": 0.5, "acc.base": 0.5}, "acc.base=0.5"),  # chance
])
def test_floor_ceiling_and_chance_are_not_measurable_with_the_why_and_the_figures(results, figures):
  v = claims_lib.verdict(BEATS, [results], "cpu")
  a, b = (f"{results[k]:.4g}" for k in ("acc.a", "acc.b"))
  assert v["verdict"] == (f"not measurable at this preset: both at 0 (the floor) or 1 (the ceiling), or the base "
                          f"model at chance (0.5) (acc.a={a}, acc.b={b}, {figures})")
  assert claims_lib.kind(v["verdict"]) == claims_lib.NOT_MEASURABLE and v["ours"]["acc.base"] == figures[9:]
  # over seeds: one seed at the floor is enough
  two = claims_lib.verdict(BEATS, [results, {"acc.a": 0.7, "acc.b": 0.4, "acc.base": 0.75}], "cpu")
  assert two["verdict"].startswith("not measurable at this preset: both at 0")
  lacking = claims_lib.verdict(BEATS, [{"acc.a": 0.7, "acc.b": 0.4}], "cpu")["verdict"]
  assert lacking == "not measurable at this preset: no finite value of acc.base in the results"


def test_intervals_decide_reproduced_not_reproduced_and_inconclusive():
  rng = np.random.default_rng(1)
  strong, weak = (rng.random(200) < 0.8).astype(float), (rng.random(200) < 0.4).astype(float)
  v = claims_lib.verdict(BEATS, [_figures(strong, weak)], "cpu", [{"acc.a": strong, "acc.b": weak}])
  assert v["verdict"] == "reproduced" and 0 < v["interval_bounds"][0][0] < 0.4 < v["interval_bounds"][0][1]
  assert v["interval"].startswith("acc.a - acc.b = 0.") and "(n=200, paired, bootstrap over items)" in v["interval"]
  assert claims_lib.verdict(BEATS, [_figures(strong, weak)], "cpu", [{"acc.a": strong, "acc.b": weak}]) == v
  v = claims_lib.verdict(BEATS, [_figures(weak, strong)], "cpu", [{"acc.a": weak, "acc.b": strong}])
  assert v["verdict"] == "not reproduced" and v["interval_bounds"][0][1] < 0
  same = np.tile([1.0, 0.0], 20)
  v = claims_lib.verdict(BEATS, [_figures(same, same)], "cpu", [{"acc.a": same, "acc.b": same}])
  assert v["verdict"] == "not reproduced" and v["interval_bounds"] == [[0.0, 0.0]]  # excludes any positive difference
  # one item's difference in 20: the rule holds, the interval cannot tell
  a, b = same.copy()[:20], same.copy()[:20]
  a[1] = 1.0
  v = claims_lib.verdict(BEATS, [_figures(a, b)], "cpu", [{"acc.a": a, "acc.b": b}])
  assert claims_lib.holds(BEATS, _figures(a, b)) and v["verdict"] == "inconclusive (n=20)"
  assert v["interval_bounds"][0][0] <= 0 < v["interval_bounds"][0][1]
  # seeds pooled; arrays of other lengths are unpaired; a claimed effect moves the bar
  two = [{"acc.a": strong[:100], "acc.b": weak[:100]}, {"acc.a": strong[100:], "acc.b": weak[100:]}]
  v = claims_lib.verdict(BEATS, [_figures(strong[:100], weak[:100]), _figures(strong[100:], weak[100:])], "cpu", two)
  assert v["verdict"] == "reproduced" and "(n=200, paired, bootstrap over seeds and items)" in v["interval"]
  v = claims_lib.verdict(BEATS, [_figures(strong, weak[:150])], "cpu", [{"acc.a": strong, "acc.b": weak[:150]}])
  assert v["verdict"] == "reproduced" and "(n=200 vs 150, unpaired" in v["interval"]
  big = dataclasses.replace(BEATS, effect=0.6)
  assert claims_lib.verdict(big, [_figures(strong, weak)], "cpu", [{"acc.a": strong, "acc.b": weak}])[
      "verdict"] == "not reproduced"


EACH = claims_lib.Claim("each", "A beats B and C at no more calls", "A above both", "{acc.a} > max({acc.b}, {acc.c}) "
                        "and {calls.a} <= {calls.b}", diff=(("acc.a", "acc.b"), ("acc.a", "acc.c")),
                        given="{calls.a} <= {calls.b}")


def test_beating_each_of_several_needs_every_interval_and_the_given_rule():
  rng = np.random.default_rng(2)
  strong, weak, mid = ((rng.random(300) < p).astype(float) for p in (0.8, 0.3, 0.45))

  def judge(a, b, c, calls=(1.0, 2.0), seeds=1):
    res = {"acc.a": a.mean(), "acc.b": b.mean(), "acc.c": c.mean(), "calls.a": calls[0], "calls.b": calls[1]}
    return claims_lib.verdict(EACH, [res] * seeds, "cpu", [{"acc.a": a, "acc.b": b, "acc.c": c}] * seeds)

  v = judge(strong, weak, mid)
  assert v["verdict"] == "reproduced" and len(v["interval_bounds"]) == 2
  assert v["interval"].startswith("acc.a - acc.b = ") and "; acc.a - acc.c = " in v["interval"]
  assert all(lo > 0 for lo, _ in v["interval_bounds"])
  assert judge(strong, weak, strong)["verdict"] == "not reproduced"  # ties one: that interval is [0, 0]
  assert judge(mid, weak, strong)["verdict"] == "not reproduced"  # beats B, loses to C
  close = strong.copy()
  close[np.flatnonzero(strong == 0)[:1]] = 1.0  # one item better than C: the rule holds, its interval cannot tell
  v = judge(close, weak, strong)
  assert claims_lib.holds(EACH, {"acc.a": close.mean(), "acc.b": weak.mean(), "acc.c": strong.mean(),
                                 "calls.a": 1.0, "calls.b": 2.0})
  assert v["verdict"] == "inconclusive (n=300)"
  # the rest of the compound claim: failing it on every seed is not reproduced, whatever the intervals
  assert judge(strong, weak, mid, calls=(3.0, 2.0))["verdict"] == "not reproduced"
  assert judge(strong, weak, mid, calls=(3.0, 2.0))["given"] == "{calls.a} <= {calls.b}"
  two = claims_lib.verdict(EACH, [{"acc.a": strong.mean(), "acc.b": weak.mean(), "acc.c": mid.mean(), "calls.a": c,
                                   "calls.b": 2.0} for c in (1.0, 3.0)], "cpu",
                           [{"acc.a": strong, "acc.b": weak, "acc.c": mid}] * 2)
  assert two["verdict"] == "unstable (1 of 2 seeds hold {calls.a} <= {calls.b})"
  with pytest.raises(ValueError, match="pairs of them"):
    claims_lib.Claim("x", "t", "p", "{a} > {b}", diff=(("a", "b"), ("a", "a")))
  with pytest.raises(ValueError, match="needs a diff"):
    claims_lib.Claim("x", "t", "p", "{a} > {b}", given="{a} > 0")


def test_a_two_sided_claim_needs_its_interval_inside_the_band():
  kept = claims_lib.Claim("kept", "A changes accuracy by less than 1 point", "< 1%", "abs({acc.a} - {acc.b}) < 0.01",
                          diff=("acc.a", "acc.b"), within=0.01)
  same = np.tile([1.0, 0.0], 500)

  def judge(a, b):
    return claims_lib.verdict(kept, [{"acc.a": a.mean(), "acc.b": b.mean()}], "cpu", [{"acc.a": a, "acc.b": b}])["verdict"]

  assert judge(same, same) == "reproduced"  # identical answers: the interval is [0, 0]
  flipped = same.copy()
  flipped[:200:2] = 0.0  # 100 of 1000 answers turned wrong: 10 points lost
  assert judge(flipped, same) == "not reproduced" and judge(same, flipped) == "not reproduced"
  few = same.copy()
  few[:20:2] = 0.0  # 1 point lost, some items: the interval straddles the band's end
  assert judge(few, same) == "inconclusive (n=1000)"
  with pytest.raises(ValueError, match="within must be a positive number with one diff pair"):
    claims_lib.Claim("x", "t", "p", "{a} > {b}", diff=(("a", "b"), ("a", "c")), within=0.01)


def test_seeds_whose_own_intervals_contradict_each_other_are_unstable():
  rng = np.random.default_rng(4)
  strong, weak = (rng.random(200) < 0.8).astype(float), (rng.random(200) < 0.3).astype(float)
  seeds = [{"acc.a": strong, "acc.b": weak}, {"acc.a": weak, "acc.b": strong * 0 + 0.35}]  # seed 2: A far below
  res = [_figures(x["acc.a"], x["acc.b"]) for x in seeds]
  v = claims_lib.verdict(BEATS, res, "cpu", seeds)
  assert v["verdict"] == "unstable (1 of 2 seeds reproduced, 1 not, each by its own interval)"
  agree = [{"acc.a": strong, "acc.b": weak}, {"acc.a": strong[::-1], "acc.b": weak}]
  assert claims_lib.verdict(BEATS, [_figures(x["acc.a"], x["acc.b"]) for x in agree], "cpu", agree)[
      "verdict"] == "reproduced"


def test_the_interval_over_seeds_resamples_the_seeds_too():
  rng = np.random.default_rng(5)
  strong, weak = (rng.random(300) < 0.8).astype(float), (rng.random(300) < 0.3).astype(float)
  same = (rng.random(300) < 0.5).astype(float)
  seeds = [{"acc.a": strong, "acc.b": weak}, {"acc.a": same, "acc.b": same}]  # one training run worked, one did not
  pooled_items = claims_lib.bootstrap([np.concatenate([strong, same])], [np.concatenate([weak, same])])
  assert pooled_items["low"] > 0.15  # 600 items as if from one run: a clear gain
  iv = claims_lib.bootstrap([strong, same], [weak, same])
  assert iv["low"] <= 0.0 < iv["high"] and iv["mean"] == pytest.approx(pooled_items["mean"])
  v = claims_lib.verdict(BEATS, [_figures(x["acc.a"], x["acc.b"]) for x in seeds], "cpu", seeds)
  assert v["verdict"] == "unstable (1 of 2 seeds reproduced, 1 not, each by its own interval)"
  assert v["interval_bounds"][0][0] <= 0.0  # the pooled interval alone would not tell either


def test_a_ratio_claim_scales_the_arrays():
  half = claims_lib.Claim("half", "A is at most half of B", "x", "{a} <= 0.5 * {b}", diff=("b", "a"), scale=(0.5, 1))
  b = np.tile([1.0, 1.0, 0.0, 0.0], 100)  # 0.5

  def judge(a):
    return claims_lib.verdict(half, [{"a": a.mean(), "b": b.mean()}], "cpu", [{"a": a, "b": b}])

  v = judge(np.zeros(400))
  assert v["verdict"] == "reproduced" and v["interval"].startswith("0.5 b - a = 0.25, ")
  assert judge(b.copy())["verdict"] == "not reproduced"  # not cut at all: 0.5 b - a = -0.25
  one = np.zeros(400)
  one[:100] = 1.0  # 0.25: exactly half; the interval straddles 0
  assert judge(one)["verdict"] == "inconclusive (n=400)"
  with pytest.raises(ValueError, match="scale must be two positive numbers"):
    claims_lib.Claim("x", "t", "p", "{a} > {b}", diff=("a", "b"), scale=(0.0, 1.0))


def test_macro_items_mean_is_the_macro_mean():
  rng = np.random.default_rng(3)
  groups = rng.choice(["a", "b", "c"], size=50, p=[0.6, 0.3, 0.1])
  values = rng.random(50)
  macro = np.mean([values[groups == g].mean() for g in np.unique(groups)])
  assert np.mean(records.macro_items(values, groups)) == pytest.approx(macro)
  assert records.macro_items([1.0, 0.0], ["x", "y"]) == [1.0, 0.0]  # equal groups: the scores unchanged
  with pytest.raises(ValueError, match="3 values but 2 groups"):
    records.macro_items([1, 0, 1], ["x", "y"])


def test_merge_joins_per_item_scores():
  res = {"a": 1.0, "per_item": {"a": [1.0]}}
  assert records.merge(res, {"b": 2.0, "per_item": {"b": [0.0, 1.0]}}) == {
      "a": 1.0, "b": 2.0, "per_item": {"a": [1.0], "b": [0.0, 1.0]}}
  assert records.merge({"a": 1.0}, {"b": 2.0}) == {"a": 1.0, "b": 2.0}  # no items: none invented


def test_without_per_item_scores_the_rule_decides_and_says_so():
  res = {"acc.a": 0.7, "acc.b": 0.4, "acc.base": 0.75}
  v = claims_lib.verdict(BEATS, [res], "cpu", [{}])
  assert v["verdict"] == "reproduced" and v["interval"] == "(no interval: per-item scores not recorded)"
  assert "interval_bounds" not in v
  assert claims_lib.verdict(CLAIMS[0], [res], "cpu")["interval"] == "(no interval: no per-item difference declared)"
  with pytest.raises(ValueError, match="needs its why"):
    claims_lib.Claim("x", "t", "p", "{a} > {b}", measurable="{a} > 0")
  with pytest.raises(ValueError, match="two different per-item arrays"):
    claims_lib.Claim("x", "t", "p", "{a} > {b}", diff=("a", "a"))


def test_checks_are_worded_apart_and_must_be_declared_as_checks():
  check = claims_lib.Check("refs", "the references pass", "(validation)", "{ref} == 1")
  assert claims_lib.verdict(check, [{"ref": 1.0}], "cpu")["verdict"] == "passed"
  assert claims_lib.verdict(check, [{"ref": 0.5}], "cpu")["verdict"] == "failed"
  presets = {p: Cfg() for p in registry.PRESETS}
  with pytest.raises(TypeError, match="checks= takes Checks"):
    registry.Experiment("toy_c", Cfg, presets, _run, checks=(CLAIMS[0],))
  with pytest.raises(ValueError, match="ids repeat"):
    registry.Experiment("toy_c", Cfg, presets, _run, claims=(CLAIMS[0],),
                        checks=(claims_lib.Check("beats", "t", "p", "{ref} == 1"),))


ITEMS = {"right.ours": [1.0] * 45 + [0.0] * 5, "right.base": [1.0] * 20 + [0.0] * 30}


def _run_items(cfg, out_dir, resume):
  RUNS.append((cfg.seed, out_dir))
  splits.record(out_dir, "toy_i", {"train": {"items": ["a"]}, "test": {"items": ["b"]}})
  return {"acc.ours": 0.9, "acc.base": 0.4, "ref": 1.0, "per_item": ITEMS}


@pytest.fixture
def toy_items(toy, monkeypatch):
  claim = claims_lib.Claim("beats_base", "ours answers more items than the base", "x", "{acc.ours} > {acc.base}",
                           diff=("right.ours", "right.base"))
  check = claims_lib.Check("refs", "the reference scores 1", "(validation)", "{ref} == 1")
  presets = {p: Cfg() for p in registry.PRESETS}
  exp = registry.Experiment("toy_i", Cfg, presets, _run_items, paper="polar", claims=(claim,), checks=(check,),
                            results=("acc.ours", "acc.base", "ref"))
  monkeypatch.setitem(toy, "toy_i", exp)
  return exp


def test_per_item_scores_reach_items_json_and_the_report_with_checks_apart(toy_items, tmp_path):
  root = str(tmp_path / "runs")
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--only", "toy_i"]) == 0
  run = os.path.join(root, "toy_i")
  assert json.load(open(os.path.join(run, "items.json"))) == ITEMS
  results = json.load(open(os.path.join(run, "results.json")))
  assert "per_item" not in results and results["git_commit"] == CODE["git_commit"] and results["git_dirty"] is False
  assert json.load(open(os.path.join(run, "config.json")))["git_commit"] == CODE["git_commit"]
  report = json.load(open(os.path.join(root, "claims.json")))
  assert report["command"] == "python -m experiments reproduce --preset cpu --seeds 1 --only toy_i"
  assert report["commits"] == ["c0ffeec0ffee"]
  polar = report["papers"]["polar"]
  assert [c["id"] for c in polar["claims"]] == ["beats_base"] and [c["id"] for c in polar["checks"]] == ["refs"]
  assert polar["claims"][0]["verdict"] == "reproduced" and "(n=50, paired" in polar["claims"][0]["interval"]
  assert polar["checks"][0]["verdict"] == "passed"
  md = open(os.path.join(root, "report.md")).read()
  assert "| polar | Program-of-Layers | toy_i | 1 reproduced (harness checks, not claims: 1 passed) |" in md
  assert "Harness checks (the benchmark's own references" in md and "runs made at commit(s) c0ffeec0ffee" in md
  table = readme_lib.table(report)
  row = next(line for line in table.splitlines() if line.startswith("| polar |"))
  assert "ours answers more items than the base: **reproduced**" in row and "reference" not in row
  assert "| polar | the reference scores 1: **passed** (ref 1) |" in table.splitlines()[-1]
  assert table.splitlines()[0].startswith("Claims checked by `python -m experiments reproduce --preset cpu --seeds 1 "
                                          "--only toy_i` at commit c0ffeec0ffee on ")
  # a merge keeps the checks table apart from the paper rows, and replaces its rows like theirs
  readme = tmp_path / "README.md"
  readme.write_text(f"{readme_lib.BEGIN}\n{table}\n{readme_lib.END}\n")
  assert readme_lib.update(str(readme), report, merge=True)  # adds the "Rows for polar" line
  block = readme.read_text().split(readme_lib.BEGIN)[1].split(readme_lib.END)[0]
  assert block.count("| polar |") == 2 and block.count("| short name |") == 2 and "Rows for polar: " in block
  assert block.strip().endswith("| polar | the reference scores 1: **passed** (ref 1) |")
  assert not readme_lib.update(str(readme), report, merge=True)  # idempotent


def test_runs_of_other_code_are_run_again_unless_reuse_any(toy, tmp_path, monkeypatch, capsys):
  root = str(tmp_path / "runs")
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--only", "toy_b"]) == 0
  assert RUNS == [(0, f"{root}/toy_b")]
  monkeypatch.setattr(provenance, "current", lambda: dict(CODE, git_commit="beef" * 10))  # a later commit
  RUNS.clear()
  capsys.readouterr()
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--only", "toy_b"]) == 0
  assert RUNS == [(0, f"{root}/toy_b-2")] and os.path.exists(f"{root}/toy_b/results.json")  # the old run kept
  assert "made by other or uncommitted code (commit c0ffeec0ffee; now beefbeefbeef)" in capsys.readouterr().out
  RUNS.clear()
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--only", "toy_b"]) == 0
  assert RUNS == []  # the run of this commit is read back
  monkeypatch.setattr(provenance, "current", lambda: dict(CODE, git_commit="f00d" * 10, git_dirty=True))
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--only", "toy_b"]) == 0
  assert RUNS == [(0, f"{root}/toy_b-3")]  # a dirty tree: its own runs are never taken for a commit's
  RUNS.clear()
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--only", "toy_b"]) == 0
  assert RUNS == [(0, f"{root}/toy_b-4")]
  RUNS.clear()
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--only", "toy_b", "--reuse-any"]) == 0
  report = json.load(open(os.path.join(root, "claims.json")))
  assert RUNS == [] and report["commits"] == ["c0ffeec0ffee"] and report["command"].endswith("--reuse-any")


def test_a_run_of_an_earlier_commit_is_read_back_where_its_sources_are_unchanged(toy, tmp_path, monkeypatch):
  root = str(tmp_path / "runs")
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--only", "toy_a"]) == 0
  files = json.load(open(os.path.join(root, "toy_a", provenance.SOURCES_FILE)))
  assert "experiments/runner/registry.py" in files and "pyproject.toml" in files
  assert not set(files) & set(provenance.JUDGING)
  asked = []
  monkeypatch.setattr(provenance, "current", lambda: dict(CODE, git_commit="beef" * 10))  # a later commit
  monkeypatch.setattr(provenance, "unchanged", lambda c, now, fs: asked.append((c, fs)) or True)
  RUNS.clear()
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--only", "toy_a"]) == 0
  assert RUNS == [] and asked == [(CODE["git_commit"], files)]  # read back: its files are as they were
  report = json.load(open(os.path.join(root, "claims.json")))
  assert report["commits"] == ["beefbeefbeef"] and report["experiments"]["toy_a"]["made_at"] == ["c0ffeec0ffee"]
  assert readme_lib._commits(report) == (" at commit beefbeefbeef (runs of toy_a read back from c0ffeec0ffee, where "
                                         "every source file they ran is unchanged)")
  monkeypatch.setattr(provenance, "unchanged", lambda c, now, fs: False)  # a file it ran has changed
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--only", "toy_a"]) == 0
  assert RUNS == [(0, f"{root}/toy_a-2")]


def test_unchanged_compares_the_named_files_between_commits(tmp_path, monkeypatch):
  import subprocess
  repo = tmp_path / "repo"
  repo.mkdir()
  git = lambda *a: subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *a],
                                  check=True, capture_output=True, text=True).stdout.strip()
  git("init", "-q")
  (repo / "a.py").write_text("a = 1\n")
  (repo / "b.py").write_text("b = 1\n")
  git("add", "-A")
  git("commit", "-qm", "one")
  first = git("rev-parse", "HEAD")
  (repo / "b.py").write_text("b = 2\n")
  git("commit", "-qam", "two")
  monkeypatch.setattr(provenance, "REPO", str(repo))
  now = provenance.current()
  assert now["git_dirty"] is False and now["git_commit"] != first
  assert provenance.unchanged(first, now, ["a.py"]) and not provenance.unchanged(first, now, ["a.py", "b.py"])
  saved = {"git_commit": first, "git_dirty": False}
  assert provenance.same_code(saved, now, ["a.py"]) and not provenance.same_code(saved, now)  # no file list
  assert not provenance.same_code(dict(saved, git_dirty=True), now, ["a.py"])
  assert not provenance.unchanged("0" * 40, now, ["a.py"])  # a commit this clone does not have
  (repo / "a.py").write_text("a = 3\n")
  assert not provenance.unchanged(first, provenance.current(), ["a.py"])  # a dirty tree is no commit's code


def test_sources_are_the_loaded_modules_less_judging_and_registration_only_packages(monkeypatch):
  import types
  fake = {}
  for name, rel in (("experiments.toy_only_init", "experiments/toy_only_init/__init__.py"),
                    ("experiments.toy_used", "experiments/toy_used/__init__.py"),
                    ("experiments.toy_used.run", "experiments/toy_used/run.py")):
    m = types.ModuleType(name)
    m.__file__ = os.path.join(provenance.REPO, rel)
    fake[name] = m
  monkeypatch.setattr("sys.modules", {**__import__("sys").modules, **fake})
  files = provenance.sources()
  assert "experiments/toy_used/run.py" in files and "experiments/toy_used/__init__.py" in files
  assert "experiments/toy_only_init/__init__.py" not in files and "experiments/runner/claims.py" not in files
  assert "jaxlab/__init__.py" in files and ".ci/constraints.txt" in files
  outside = types.ModuleType("jaxlab.elsewhere")
  outside.__file__ = "/elsewhere/jaxlab/elsewhere.py"
  monkeypatch.setitem(__import__("sys").modules, "jaxlab.elsewhere", outside)
  assert provenance.sources() is None  # another checkout's module: only the commit can tell


def test_judge_rejudges_a_reproduce_root_with_todays_claims(toy_items, tmp_path, capsys, monkeypatch):
  root = str(tmp_path / "runs")
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--only", "toy_i", "toy_a"]) == 0
  capsys.readouterr()
  assert cli.main(["judge", root]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert "toy_i (cpu): 1 run(s) at commit(s) c0ffeec0ffee" in lines
  assert any(line.startswith("toy_i claim beats_base: reproduced  [right.ours - right.base = 0.5") for line in lines)
  assert "toy_i check refs: passed" in lines and "toy_a claim beats: reproduced" in lines
  assert lines[-1] == "claims: 2 reproduced, 1 not reproduced, 1 not measurable at this preset"
  # a claim declared differently now: judged by the new declaration, nothing rerun
  stricter = dataclasses.replace(toy_items.claims[0], measurable="{acc.base} > 0.5", why="the base is at chance")
  monkeypatch.setitem(registry.experiments(), "toy_i", dataclasses.replace(toy_items, claims=(stricter,)))
  RUNS.clear()
  assert cli.main(["judge", os.path.join(root, "toy_i")]) == 0 and RUNS == []
  assert ("toy_i claim beats_base: not measurable at this preset: the base is at chance (acc.base=0.4)"
          in capsys.readouterr().out.splitlines())


def test_report_links_each_papers_departures_table_with_its_row_count(toy, tmp_path):
  page = tmp_path / "experiments" / "scale" / "README.md"
  page.parent.mkdir(parents=True)
  page.write_text("# SCALE\n\n## Departures from the paper\n\n| aspect | paper | jaxlab | why | effect |\n|---|---|---|---|---|\n"
                  "| a | b | c | d | e |\n| f | g | h | i | j |\n| k | l | m | n | o |\n\n## Next\n\n| x |\n|---|\n| y |\n")
  assert report_lib.departures("scale", str(tmp_path)) == {"page": "experiments/scale/README.md", "rows": 3}
  assert report_lib.departures("cdka", str(tmp_path))["rows"] is None
  root = str(tmp_path / "runs")
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--only", "toy_a"]) == 0
  scale = json.load(open(os.path.join(root, "claims.json")))["papers"]["scale"]["departures"]
  assert scale["page"] == "experiments/scale/README.md" and scale["rows"] >= 1
  row = next(line for line in open(os.path.join(root, "report.md")) if line.startswith("| scale |"))
  link = os.path.relpath(os.path.join(provenance.REPO, "experiments/scale/README.md"), root)
  assert row.rstrip().endswith(f"| [{scale['rows']} rows]({link}#departures-from-the-paper) |")


def test_readme_merge_takes_replaced_papers_off_earlier_row_notes():
  notes = ["Claims checked by x:", "Rows for scale, cdka, mind: claims checked by `a` at commit 1.",
           "Rows for polar: claims checked by `b`."]
  assert readme_lib._notes(notes, ["mind", "polar"]) == ["Claims checked by x:",
                                                         "Rows for scale, cdka: claims checked by `a` at commit 1."]
  # the whole table's line goes once every paper has its own "Rows for" line
  assert readme_lib._without_stale_source(notes, ["scale", "cdka", "mind", "polar"]) == notes[1:]
  assert readme_lib._without_stale_source(notes, ["scale", "cdka", "mind", "polar", "btd"]) == notes


def test_every_relative_link_in_the_committed_markdown_resolves():
  """README.md, the papers' READMEs and the committed claims reports link only to files in the repository."""
  import glob
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  pages = [os.path.join(repo, "README.md"), *glob.glob(os.path.join(repo, "experiments", "*", "README.md")),
           *glob.glob(os.path.join(repo, "experiments", "reports", "*.md"))]
  broken = []
  for page in pages:
    for target in re.findall(r"\]\(([^)\s]+)\)", open(page).read()):
      path = target.split("#")[0]
      if path and "://" not in path and not os.path.exists(os.path.join(os.path.dirname(page), path)):
        broken.append(f"{os.path.relpath(page, repo)} -> {target}")
  assert not broken, broken
