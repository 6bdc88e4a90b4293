"""The claims report: verdicts computed from results.json, seeds, resumable reproduce, the README table."""
import dataclasses
import json
import os

import pytest

from experiments import __main__ as cli
from experiments import registry
from experiments.runner import claims as claims_lib
from experiments.runner import readme as readme_lib


@dataclasses.dataclass(frozen=True)
class Cfg:
  seed: int = 0
  gain: float = 1.0


RUNS = []


def _run(cfg, out_dir, resume):
  RUNS.append((cfg.seed, out_dir))
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
  exps = {"toy_a": registry.Experiment("toy_a", Cfg, presets, _run, "a", paper="scale", claims=CLAIMS),
          "toy_b": registry.Experiment("toy_b", Cfg, presets, _run, "b")}
  monkeypatch.setattr(registry, "experiments", lambda: exps)
  monkeypatch.setattr(registry, "import_errors", lambda: {})
  RUNS.clear()
  return exps


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
  assert "=== [1/6] toy_a (cpu); elapsed" in out and "=== [6/6] toy_b seed +2" in out and "left" in out
  report = json.load(open(os.path.join(root, "claims.json")))
  verdicts = {c["id"]: c["verdict"] for c in report["papers"]["scale"]["claims"]}
  assert verdicts == {"beats": "unstable (2 of 3 seeds hold)", "cheap": "not reproduced",
                      "full_only": "not measurable at this preset"}
  assert len(report["papers"]) == 19 and report["papers"]["gig"]["experiments"] == []
  md = open(os.path.join(root, "report.md")).read()
  assert ("| scale | SCALE: column-normalized SGD with last-layer momentum | toy_a | 1 unstable, 1 not reproduced, "
          "1 not measurable at this preset |") in md
  assert "| gig | Graph-in-Graph planning | - | not yet implemented |" in md and "## toy_b" in md

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
  assert cli.main(["readme", "--claims", f"{root}/claims.json", "--readme", str(readme)]) == 0
  text = readme.read_text()
  assert "old table" not in text and text.endswith(f"{readme_lib.END}\n\nmore\n")
  row = next(line for line in text.splitlines() if line.startswith("| scale |"))
  assert "ours reaches a lower loss than the baseline: **reproduced** (loss.ours 1, loss.base 1.5)" in row
  assert "| polar | Program-of-Layers | - | not yet implemented |" in text
  assert not readme_lib.update(str(readme), json.load(open(f"{root}/claims.json")))  # idempotent


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
  assert cli.main(["readme", "--claims", f"{root}/claims.json", "--readme", str(readme), "--merge"]) == 0
  after = readme.read_text().splitlines()
  changed = [line for line in after if line not in before]
  assert len(changed) == 2 and changed[0].startswith("Rows for scale: claims checked by `python -m experiments "
                                                     "reproduce --preset cpu --seeds 1` on ")
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
  block = text.split(readme_lib.BEGIN)[1].split(readme_lib.END)[0]
  rows = [line.split("|")[1].strip() for line in block.splitlines() if line.startswith("| ") and "---" not in line]
  assert rows[1:] == list(claims_lib.PAPERS)


def test_experiments_left_out_or_failing_are_reported_as_such(toy, tmp_path, monkeypatch):
  root = str(tmp_path / "runs")
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--only", "toy_b"]) == 0
  claims = json.load(open(os.path.join(root, "claims.json")))["papers"]["scale"]
  assert claims["experiments"] == ["toy_a"] and {c["verdict"] for c in claims["claims"]} == {"not run in this report"}
  monkeypatch.setitem(toy, "toy_a", dataclasses.replace(toy["toy_a"], run=lambda *a: 1 / 0))
  assert cli.main(["reproduce", "--preset", "cpu", "--root", root, "--only", "toy_a"]) == 1
  claims = json.load(open(os.path.join(root, "claims.json")))["papers"]["scale"]
  assert {c["verdict"] for c in claims["claims"]} == {"experiment failed"}
