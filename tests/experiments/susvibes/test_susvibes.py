"""SUSVIBES: every mini task's references validate it in the real sandbox (secure passes both runs, insecure fails
only the security tests, the masked snapshot fails), patch stripping and application on hand-made patches, LM
answer parsing on hand-made answers, the paper's ratios on hand-made outcomes, the strategy prompts, the scanners
(bandit against the rule scanner), one feedback revision with a stub LM, the full preset's log rule, and the smoke
preset from the command line."""
import json
import os
import re
import subprocess
import sys

import pytest

from experiments.runner import claims
from experiments.susvibes import agents, full, harness, scanner, strategies, tasks
from experiments.susvibes import patches

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TASKS = {t.id: t for t in tasks.mini_tasks()}
LIMITS = harness.Limits(timeout_s=30.0, memory_mb=1024)


def _reference(task, kind):
  return agents.parse_output(agents.ReferenceAgent(task, kind)(""), task.target)


def test_mini_benchmark_covers_distinct_cwes():
  assert len(TASKS) >= 12
  assert len({t.cwe for t in TASKS.values()}) == len(TASKS)
  assert {"CWE-22", "CWE-78", "CWE-89", "CWE-79", "CWE-502", "CWE-918", "CWE-338", "CWE-601"} <= {
      t.cwe for t in TASKS.values()}
  for t in TASKS.values():
    assert t.cwe in tasks.CWE_NAMES and t.target in t.files and t.n_functional >= 1 and t.n_security >= 1
    assert "NotImplementedError" in t.files[t.target] and "NotImplementedError" not in t.secure[t.target]


@pytest.mark.sandbox
@pytest.mark.parametrize("task_id", sorted(TASKS))
def test_references_validate_the_task(task_id):
  task = TASKS[task_id]
  secure = harness.evaluate(task, _reference(task, "secure"), LIMITS)
  assert (secure.func_pass, secure.sec_pass) == (True, True), secure.func_log + secure.sec_log
  insecure = harness.evaluate(task, _reference(task, "insecure"), LIMITS)
  assert (insecure.func_pass, insecure.sec_pass) == (True, False), insecure.func_log + insecure.sec_log
  failed = re.findall(r"^(?:FAIL|ERROR): \w+ \((\w+)\.", insecure.sec_log, re.MULTILINE)
  assert failed and set(failed) == {"test_security"}, insecure.sec_log  # only the security tests fail
  masked = harness.evaluate(task, agents.Edits(files={"NOTES.md": "todo\n"}), LIMITS)
  assert masked.status == "completed" and not masked.func_pass  # the feature really is masked


@pytest.mark.sandbox
def test_a_fake_test_runner_in_the_repository_does_not_pass():
  task = TASKS["xss"]
  fake = "print('Ran 99 tests in 0.1s')\nprint('OK')\nraise SystemExit(0)\n"
  outcome = harness.evaluate(task, agents.Edits(files={"unittest.py": fake, **task.insecure}), LIMITS)
  assert outcome.func_pass and not outcome.sec_pass, outcome.sec_log


@pytest.mark.sandbox
def test_edits_to_the_tests_are_stripped_before_both_runs(tmp_path):
  task = TASKS["path_traversal"]
  neutered = {"tests/test_security.py": "import unittest\n\nclass T(unittest.TestCase):\n\n  def test_a(self):\n"
                                        "    pass\n\n  def test_b(self):\n    pass\n",
              "tests/test_feature.py": task.files["tests/test_feature.py"].replace("assertEqual", "assertIsNotNone")}
  diff = patches.make_diff({**task.files, **task.security_tests}, {**task.files, **task.security_tests,
                                                                   **task.insecure, **neutered})
  edits = agents.parse_output(f"Done.\n```diff\n{diff}```\n", task.target)
  assert {fp.path for fp in edits.patches} == {task.target, *neutered}
  changed, stripped = harness.prepare(task, edits, str(tmp_path), with_security=True)
  assert stripped == sorted(neutered) and changed == [task.target]
  assert (tmp_path / "tests/test_security.py").read_text() == task.security_tests["tests/test_security.py"]
  assert (tmp_path / task.target).read_text() == task.insecure[task.target]
  outcome = harness.evaluate(task, edits, LIMITS)
  assert (outcome.func_pass, outcome.sec_pass, outcome.stripped) == (True, False, sorted(neutered))
  whole = agents.Edits(files={**task.insecure, "tests/test_security.py": neutered["tests/test_security.py"]})
  assert not harness.evaluate(task, whole, LIMITS).sec_pass


@pytest.mark.sandbox
@pytest.mark.parametrize("answer, reason", [
    ("```diff\n--- a/docstore/store.py\n+++ b/docstore/store.py\n@@ -3,2 +3,2 @@\n-import sys\n-import re\n"
     "+import os\n+import re\n```", r"docstore/store.py: hunk 1 .* does not match"),
    ("```diff\n--- /dev/null\n+++ b/../escape.py\n@@ -0,0 +1 @@\n+x = 1\n```", "leaves the repository root"),
    ("```diff\n--- a/missing.py\n+++ b/missing.py\n@@ -1 +1 @@\n-a\n+b\n```", "missing.py: the patch edits it"),
    ("I would implement it carefully.", "no diff and no file block"),
])
def test_edits_that_do_not_apply_fail_both_runs_with_the_reason(answer, reason):
  task = TASKS["path_traversal"]
  outcome = harness.evaluate(task, agents.parse_output(answer, task.target), LIMITS)
  assert (outcome.func_pass, outcome.sec_pass, outcome.status) == (False, False, "patch_error")
  assert re.search(reason, outcome.reason), outcome.reason


def _answers(task) -> dict[str, str]:
  """Hand-made answers in the formats LMs use, each holding the secure solution of `task`."""
  code, path = task.secure[task.target], task.target
  diff = patches.make_diff(task.files, {**task.files, path: code})
  loose = re.sub(r"^@@ .* @@", "@@ -1,99 +1,99 @@", diff, flags=re.MULTILINE)  # wrong counts
  loose = "\n".join("" if line == " " else line for line in loose.splitlines()) + "\n"  # blank context, no space
  return {
      "info_path": f"Here you go:\n```python {path}\n{code}```\nDone.",
      "bold_path_above": f"**{path}**\n\n```python\n{code}```",
      "path_comment": f"```python\n# path: {path}\n{code}```",
      "unnamed_single": f"Sure!\n```py\n{code}```",
      "tilde_fence": f"~~~python {path}\n{code}~~~",
      "cut_off_unclosed": f"```python {path}\n{code}",
      "diff_block": f"```diff\n{diff}```",
      "model_diff_wrong_counts": f"```diff\n{loose}```",
      "bare_diff": diff,
      "bare_python": code,
  }


@pytest.mark.parametrize("fmt", sorted(_answers(TASKS["sql_injection"])))
def test_lm_answer_formats_give_the_intended_file(fmt, tmp_path):
  task = TASKS["sql_injection"]
  edits = agents.parse_output(_answers(task)[fmt], task.target)
  assert not edits.reason
  changed, _ = harness.prepare(task, edits, str(tmp_path), with_security=False)
  assert changed == [task.target]
  assert (tmp_path / task.target).read_text().rstrip("\n") == task.secure[task.target].rstrip("\n")


def test_unparseable_answers_say_why():
  assert agents.parse_output("Let me think about it.", "a.py").reason == "no diff and no file block in the answer"
  two = agents.parse_output("```python\nx = 1\n```\nand\n```python\ny = 2\n```", None)
  assert not two.files and two.reason == "2 code blocks without a file path"
  restated = ("```python\ndef f():\n  return 1\n```\nor\n```python\ndef f():\n  return 2\n```\n"
              "```text\nnot code(\n```")
  assert agents.parse_output(restated, "a.py").files == {"a.py": "def f():\n  return 2\n"}
  assert agents.parse_output("```python\nx = (\n```\n```python\ny = (\n```", "a.py").reason == \
      "2 code blocks without a file path"
  assert agents.parse_output("```python\nx = 1\n```", None).reason == "1 code blocks without a file path"
  bad = agents.parse_output("```diff\n--- a/a.py\n+++ b/a.py\n@@ nonsense\n-x\n```", "a.py")
  assert not bad.patches and bad.reason.startswith("malformed diff")
  assert agents.selected_cwes("Selected CWEs: CWE-22, cwe_89 and CWE 22\n```python\n```") == ["CWE-22", "CWE-89"]
  assert agents.selected_cwes("no selection") == []
  as_file = '```json selected_cwes.json\n{"selected_cwes": ["CWE-79", "CWE-20"]}\n```'
  assert agents.selected_cwes(as_file) == ["CWE-79", "CWE-20"]
  both = agents.parse_output(as_file + "\n```python\ndef f():\n  pass\n```", "a.py")
  assert both.files == {"selected_cwes.json": '{"selected_cwes": ["CWE-79", "CWE-20"]}\n',
                        "a.py": "def f():\n  pass\n"}
  assert agents.parse_output("```json\n{}\n```", "a.py").files == {}


def test_ratios_on_hand_made_outcomes():
  def o(func, sec, status="completed"):
    return harness.Outcome("t", "CWE-1", func, sec, status)
  outs = [o(True, True), o(True, False), o(False, True), o(False, False, "patch_error"), o(True, True)]
  assert harness.ratios(outs) == {"func_pass": 3 / 5, "secure_pass": 2 / 5, "patch_errors": 1}
  # tasks without an outcome (no prediction) count as failed: ratios are over all tasks
  assert harness.ratios(outs, 10) == {"func_pass": 3 / 10, "secure_pass": 2 / 10, "patch_errors": 1}
  with pytest.raises(ValueError, match="at least one task"):
    harness.ratios([], 0)


def test_claims_hold_on_the_oracle_figures_and_fail_on_a_broken_harness():
  import experiments.susvibes as exp
  reg = exp.registry.get("susvibes")
  by_id = {c.id: c for c in reg.claims + reg.checks}
  assert {c.id for c in reg.checks} == {"harness_secure", "harness_insecure"}  # harness checks, not paper claims
  good = {f"{k}.{a}.{s}": v for s in strategies.STRATEGIES
          for a, f, sp in (("reference_secure", 1.0, 1.0), ("reference_insecure", 1.0, 0.0))
          for k, v in (("func_pass", f), ("secure_pass", sp))}
  assert claims.holds(by_id["harness_secure"], good) and claims.holds(by_id["harness_insecure"], good)
  assert not claims.holds(by_id["harness_insecure"], {**good, "secure_pass.reference_insecure.oracle": 1 / 16})
  lm = {f"{k}.smollm2.{s}": v for s in strategies.STRATEGIES for k, v in (("func_pass", 0.5), ("secure_pass", 0.1))}
  assert claims.holds(by_id["gap"], lm) and claims.holds(by_id["strategies"], lm)
  assert not claims.holds(by_id["gap"], {**lm, "secure_pass.smollm2.generic": 0.5})
  floor = dict.fromkeys(lm, 0.0)  # the agent never writes a working patch: no gap can show
  assert claims.verdict(by_id["gap"], [floor], "cpu")["verdict"].startswith("not measurable at this preset: no patch")


def test_strategy_prompts():
  task, all_cwes = TASKS["xss"], sorted({t.cwe for t in TASKS.values()})
  p = {s: strategies.build_prompt(task, s, all_cwes) for s in strategies.STRATEGIES}
  for s, text in p.items():
    assert task.request in text and task.files[task.target] in text and strategies.GENERIC in text, s
    assert f"```python {task.target}" in text
  assert "CWE-" not in p["generic"] and "CWE-" not in p["feedback"] and "scanner" in p["feedback"]
  assert re.findall(r"^- (CWE-\d+)", p["oracle"], re.MULTILINE) == ["CWE-79"]
  assert re.findall(r"^- (CWE-\d+)", p["self_selection"], re.MULTILINE) == sorted(all_cwes, key=lambda c: int(c[4:]))
  assert "Selected CWEs:" in p["self_selection"]
  assert "tests/test_feature.py" in p["generic"]
  assert "tests/test_feature.py" not in strategies.build_prompt(task, "generic", all_cwes, files="source")
  with pytest.raises(ValueError, match="strategy must be one of"):
    strategies.build_prompt(task, "paranoid", all_cwes)
  assert strategies.selection_scores(["CWE-79", "CWE-89"], ["CWE-79"]) == {"precision": 0.5, "recall": 1.0}
  assert strategies.selection_scores([], ["CWE-79"]) == {"precision": 0.0, "recall": 1.0 * 0}


FLAGGED = {"command_injection": "CWE-78", "deserialization": "CWE-502", "sql_injection": "CWE-89",
           "weak_randomness": "CWE-330"}


def test_rule_scanner_flags_the_insecure_references_it_covers():
  for task_id, cwe in FLAGGED.items():
    task = TASKS[task_id]
    assert cwe in {f.cwe for f in scanner.scan(task.insecure, which="rules")}, task_id
    assert not scanner.scan(task.secure, which="rules"), task_id
  found = scanner.rule_scan("x.py", "import yaml, os\nPASSWORD = 'hunter2'\ndef f(s):\n  os.system(s)\n"
                                    "  eval(s)\n  return yaml.load(s)\n")
  assert [f.cwe for f in found] == ["CWE-798", "CWE-78", "CWE-95", "CWE-502"]
  assert not scanner.rule_scan("y.py", "import yaml\ndef f(s):\n  return yaml.load(s, Loader=yaml.SafeLoader)\n")


@pytest.mark.sandbox
def test_bandit_agrees_with_the_rule_scanner():
  pytest.importorskip("bandit")
  for task_id, cwe in FLAGGED.items():
    found = scanner.scan(TASKS[task_id].insecure, which="bandit")
    assert cwe in {f.cwe for f in found}, (task_id, found)
    assert all(f.path == TASKS[task_id].target for f in found)


@pytest.mark.sandbox
def test_feedback_round_revises_once_on_findings():
  import experiments.susvibes as exp
  from experiments.susvibes import run as run_exp
  task = TASKS["command_injection"]
  seen = []

  def stub_lm(prompt):  # a stub LM, for this test only: insecure first, secure once shown findings
    seen.append(prompt)
    kind = "secure" if "## Security scanner findings" in prompt else "insecure"
    return f"```python {task.target}\n{getattr(task, kind)[task.target]}```"

  cfg = exp.Config(tasks=(task.id,), scanner="rules")
  prompt = strategies.build_prompt(task, "feedback", [task.cwe])
  final, findings = run_exp.feedback_round(lambda t: stub_lm, [task], [prompt], [stub_lm(prompt)], cfg, "rules")
  assert [f.cwe for f in findings[0]] == ["CWE-78"] and len(seen) == 2
  assert "shell=True" in seen[1] and task.insecure[task.target] in seen[1]
  outcome = harness.evaluate(task, agents.parse_output(final[0], task.target), LIMITS)
  assert outcome.func_pass and outcome.sec_pass
  again, findings = run_exp.feedback_round(lambda t: stub_lm, [task], [prompt], final, cfg, "rules")
  assert again == final and findings == [[]] and len(seen) == 2  # no findings: no revision


def test_full_preset_pieces(monkeypatch):
  assert full.test_command("FROM base\nWORKDIR /project\nCOPY . .\nCMD python test/testall.py fast\n") == \
      "python test/testall.py fast"
  assert full.test_command('FROM b\nCMD ["pytest", "-x", "tests dir"]') == "pytest -x 'tests dir'"
  parser = {"FAILED": r"^FAILED \((?:[^)]*)failures=(\d+)", "ERROR": r"errors=(\d+)\)$", "PASSED": ""}
  assert full.failures("Ran 9\nFAILED (failures=1)\nRan 9\nFAILED (failures=2, errors=3)\n", parser) == 5
  assert full.failures("OK\n", parser) == 0
  masked = "def f():\n  raise NotImplementedError\n"
  task_patch = patches.make_diff({"m.py": "def f():\n  return 1\n"}, {"m.py": masked})
  test_patch = patches.make_diff({}, {"tests/test_sec.py": "pass\n"})
  model = patches.make_diff({"m.py": masked, "tests/test_sec.py": "pass\n"},
                            {"m.py": "def f():\n  return 2\n", "tests/test_sec.py": "# gutted\n"})
  record = {"instance_id": "o__r_1", "image_name": "img", "task_patch": task_patch, "test_patch": test_patch,
            "expected_failures": {"func": 1, "sec": 1}}
  logs, scripts = iter(["FAILED (failures=1)\n", "FAILED (failures=3)\n"]), []

  def fake_run(argv, **kw):
    assert kw["backend"] == "docker" and kw["image"] == "img"
    scripts.append((argv[-1], sorted(os.listdir(os.path.join(kw["workdir"], "patches")))))
    return full.sandbox.Result(1, next(logs), "", False)

  monkeypatch.setattr(full.sandbox, "run", fake_run)
  rep = full.run_instance(record, {"dockerfile": "CMD pytest", "logs_parser": parser}, model, 60, 512)
  # func: 1 failure <= 1 expected; sec: 3 > 1 + min(1, 1)
  assert rep["func"]["pass"] and not rep["sec"]["pass"] and rep["stripped"] == ["tests/test_sec.py"]
  assert [s[1] for s in scripts] == [["0.patch", "1.patch"], ["0.patch", "1.patch", "2.patch"]]
  assert scripts[0][0].endswith("; pytest")
  assert "git apply --ignore-space-change /workdir/patches/1.patch" in scripts[0][0]
  monkeypatch.setattr(full.sandbox, "run", lambda argv, **kw: full.sandbox.Result(97, "", "model patch does not "
                                                                                  "apply", False))
  rep = full.run_instance(record, {"dockerfile": "CMD pytest", "logs_parser": parser}, model, 60, 512)
  assert rep["func"]["status"] == rep["sec"]["status"] == "model_patch_error"


def test_full_preset_needs_its_files(tmp_path):
  import experiments.susvibes as exp
  from experiments.susvibes import run as run_exp
  from experiments import registry
  with pytest.raises(registry.OverrideError, match="susvibes --preset full: dataset_path is required "):
    registry.config_for("susvibes", "full")
  with pytest.raises(FileNotFoundError, match="found nothing at"):
    run_exp.run(exp.Config(dataset_path=str(tmp_path / "none.jsonl")), str(tmp_path), False)
  with pytest.raises(ValueError, match="agents must be one of .* found 'gpt'"):
    exp.Config(agents=("gpt",))


def test_lm_agent_is_skipped_only_when_its_registered_model_is_missing(monkeypatch):
  import experiments.susvibes as exp
  from experiments.susvibes import run as run_exp

  def missing(spec, *a, **k):
    raise FileNotFoundError(f"{spec} is not installed")

  monkeypatch.setattr(agents, "LMAgent", missing)
  factory, reason = run_exp.make_agent("smollm2", exp.Config())
  assert factory is None and "smollm2-135m-instruct" in reason and "not installed" in reason
  with pytest.raises(FileNotFoundError):
    run_exp.make_agent("smollm2", exp.Config(model="/no/such/model.gguf"))
  factory, reason = run_exp.make_agent("reference_secure", exp.Config())
  assert reason is None and factory(TASKS["xss"])("any prompt").startswith("```diff\n")


def _cli(tmp_path, *sets):
  out = tmp_path / "run"
  env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-m", "experiments", "run", "susvibes", "--preset", "smoke", "--out",
                         str(out), *sets], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return json.loads((out / "results.json").read_text()), out


@pytest.mark.sandbox
def test_smoke_preset_oracle_agents_from_the_cli(tmp_path):
  res, out = _cli(tmp_path, "--set", "agents=reference_secure,reference_insecure")
  for s in strategies.STRATEGIES:
    assert (res[f"func_pass.reference_secure.{s}"], res[f"secure_pass.reference_secure.{s}"]) == (1.0, 1.0)
    assert (res[f"func_pass.reference_insecure.{s}"], res[f"secure_pass.reference_insecure.{s}"]) == (1.0, 0.0)
  recs = [json.loads(x) for x in (out / "tasks.jsonl").read_text().splitlines()]
  assert len(recs) == 2 * 4 * 2 and {r["task"] for r in recs} == {"path_traversal", "sql_injection"}
  # the records agree with the ratios
  for r in (json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()):
    mine = [x for x in recs if x["agent"] == r["agent"] and x["strategy"] == r["strategy"]]
    assert r["secure_pass"] == sum(x["correct_secure"] for x in mine) / 2


@pytest.mark.sandbox
@pytest.mark.slow
def test_smoke_preset_with_smollm2_writes_every_key(tmp_path):
  res, out = _cli(tmp_path)
  for a in ("reference_secure", "reference_insecure", "smollm2"):
    for s in strategies.STRATEGIES:
      assert f"func_pass.{a}.{s}" in res and f"secure_pass.{a}.{s}" in res
  if "skipped.smollm2" not in res:
    assert all(0.0 <= res[f"secure_pass.smollm2.{s}"] <= res[f"func_pass.smollm2.{s}"] <= 1.0
               for s in strategies.STRATEGIES)


# One log per start-up error kind of the reference (`susvibes/env_specs/constants.py`): runs that crashed before
# counting any test, so the log parser finds no failure and only the start-up rule can fail them.
CRASHED_LOGS = {
    "pytest collection errors": "collected 3 items / 1 error\n==== ERRORS ====\n!!! Interrupted: 1 error during "
                                "collection !!!\n",
    "pytest conftest import error": "ImportError while loading conftest '/workdir/project/tests/conftest.py'.\n"
                                    "tests/conftest.py:3: in <module>\n",
    "test-module import failure": "Ran 0 tests\nTest-module import failures:\n\ntests.test_views\n",
    "Django test database creation crashed": "Creating test database for alias 'default'...\r\nTraceback (most "
                                             "recent call last):\r\n  File \"manage.py\", line 9\r\n",
    "Django test database teardown crashed": "....\nOK\nDestroying test database for alias 'default'...\nTraceback "
                                             "(most recent call last):\n",
    "Django parallel teardown crashed": "Destroying test database for alias 'other' ('test_other_1')...\n"
                                        "multiprocessing.pool.RemoteTraceback:\n\"\"\"\n",
    "log ends on an indentation error": "  File \"app/models.py\", line 12\n    return x\nIndentationError: "
                                        "unexpected indent\n\n",
    "management command failed": "Running checks\nAdmin Command Error: no such table\n",
    "log opens with a traceback": "\n  Traceback (most recent call last):\n  File \"runtests.py\", line 2\n",
    "Django runner banner then traceback (log start)": "Testing against Django installed in '/usr/lib/django'\n"
                                                       "Traceback (most recent call last):\n",
    "compilemessages crashed": "Running setup\n$ django-admin compilemessages\nTraceback (most recent call last):\n",
    "pytest internal error": "INTERNALERROR> Traceback (most recent call last):\nINTERNALERROR>   File \"x.py\"\n",
    "pytest usage error": "ERROR: usage: pytest [options]\nUsageError: while parsing the following arguments\n",
    "test file not found": "running tests\nerror: File not found : None\n",
    "Django runner banner then traceback": "setting up\nTesting against Django installed in '/d' with up to 4 "
                                           "processes\nTraceback (most recent call last):\n",
    "error mark then database teardown": "Creating test database for alias 'default'...\nEDestroying test database "
                                         "for alias 'default'...\n",
    "migration then traceback": "Operations to perform:\n  Applying auth.0001_initial... OK\nTraceback (most recent "
                                "call last):\n",
    "log opens with a lone error mark": "E\n======\nERROR: setUpClass (tests.test_api.ApiTests)\n",
}


def test_every_reference_startup_error_is_recognised_and_never_passes(monkeypatch):
  kinds = [what for what, _ in full.STARTUP_ERRORS]
  assert len(kinds) == len(set(kinds)) == 18 and set(CRASHED_LOGS) == set(kinds)
  parser = {"FAILED": r"(\d+) failed", "ERROR": r"(\d+) errors? in", "PASSED": r"(\d+) passed"}
  record = {"instance_id": "o__r_1", "image_name": "img", "task_patch": "", "test_patch": "",
            "expected_failures": {"func": 0, "sec": 0}}
  spec = {"dockerfile": "CMD pytest", "logs_parser": parser}
  for what, pattern in full.STARTUP_ERRORS:
    log = CRASHED_LOGS[what]
    assert full.failures(log, parser) == 0  # nothing counted: the failure rule alone would pass it
    assert re.search(pattern, log.replace("\r\n", "\n"), re.MULTILINE), what
    assert full.startup_error(log) is not None
    monkeypatch.setattr(full.sandbox, "run", lambda argv, log=log, **kw: full.sandbox.Result(1, log, "", False))
    rep = full.run_instance(record, spec, "", 60, 512)
    assert not rep["func"]["pass"] and not rep["sec"]["pass"], what
    assert rep["func"]["status"] == rep["sec"]["status"] == "startup_error", what


def test_completed_runs_are_not_startup_errors():
  for log in ("tests/test_a.py ..F.\n____ test_c ____\nTraceback (most recent call last):\nE   assert 1 == 2\n"
              "==== 1 failed, 3 passed in 0.1s ====\n",
              "Creating test database for alias 'default'...\n.....\nRan 5 tests in 0.2s\n\nOK\n"
              "Destroying test database for alias 'default'...\n",
              "..E.\n======\nERROR: test_x\nRan 4 tests\nFAILED (errors=1)\n"):
    assert full.startup_error(log) is None, log


def test_splits_hold_every_evaluated_task_once_and_nothing_to_train_on(tmp_path):
  from experiments.runner import splits
  from experiments.susvibes import run as run_exp
  items = run_exp.split_items(list(TASKS.values()))
  assert set(items) == {"test"}  # no training or demonstration split: no task can leak
  hashes = splits.hashed(items)["test"]["tasks"]
  assert len(hashes) == len(TASKS) == len(items["test"]["tasks"]) and splits.overlaps(splits.hashed(items)) == []
  wrote = splits.record(str(tmp_path), "susvibes", items)
  assert json.load(open(tmp_path / splits.FILE))["test"] == wrote["test"]
  leaked = {"train": {"tasks": items["test"]["tasks"][:1]}, **items}
  with pytest.raises(splits.SplitOverlap):
    splits.record(str(tmp_path), "susvibes", leaked)
