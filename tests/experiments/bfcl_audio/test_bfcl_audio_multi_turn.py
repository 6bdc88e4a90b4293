"""bfcl_audio's multi-turn suite: an oracle LLM that writes each turn's ground-truth calls scores 1.0 on the wheel's
multi_turn_base entries, prose scores 0.0, the step loop's limit and the tool results fed back, text_audio reading the
transcriber's output, and a bad category named in one line before anything runs. No real LLM and no speech."""
import ast
import inspect
import json
import os
import subprocess
import sys

import pytest

from experiments import bfcl_audio as exp
from experiments.bfcl_audio import run as run_exp
from experiments.bfcl_audio import multi_turn as mt
from experiments.bfcl_audio import bfcl, bfcl_multi_turn

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture(scope="module")
def entries():
  return mt.load_multi_turn(("multi_turn_base",), 6)


def keyword_call(src: str, methods) -> str:
  """A ground-truth call with its positional arguments named (the decoder keeps keyword arguments only)."""
  node = ast.parse(src, mode="eval").body
  args = [ast.literal_eval(a) for a in node.args]
  kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
  bound = inspect.signature(methods[node.func.id]).bind(*args, **kwargs).arguments
  return f"{node.func.id}({', '.join(f'{k}={v!r}' for k, v in bound.items())})"


def oracle(entries):
  """Answers a turn's first step with its ground-truth calls, every later step (after tool results) in prose; the
  entry is told by its first user message, the turn by the number of user messages."""
  by_first = {e["texts"][0]: e for e in entries}
  methods = {e["id"]: bfcl_multi_turn.public_methods(bfcl_multi_turn.api_instances(e)) for e in entries}

  def generate_chat(chats):
    out = []
    for msgs in chats:
      users = [m["content"] for m in msgs if m["role"] == "user"]
      e = by_first[users[0]]
      truth = e["ground_truth"][len(users) - 1]
      first_step = msgs[-1]["role"] == "user"
      out.append("[" + ", ".join(keyword_call(c, methods[e["id"]]) for c in truth) + "]" if first_step and truth
                 else "All done.")
    return out

  return generate_chat


def test_oracle_scores_one_and_prose_scores_zero(entries):
  assert [e["id"] for e in entries] == [f"multi_turn_base_{i}" for i in range(6)]
  texts = [e["texts"] for e in entries]
  scored = mt.score_multi_turn(entries, mt.run_entries(entries, oracle(entries), texts, 4))
  assert [s["error_type"] for s in scored] == [""] * 6 and all(s["valid"] for s in scored)
  assert not any(s["forced_quit"] for s in scored)
  assert any("sort(file_name='final_report.pdf')" in step["calls"] for t in scored[0]["turns"] for step in t["steps"])
  one = mt.run_entry(entries[1], oracle(entries), texts[1], 4)
  assert one[0] == mt.run_entries(entries, oracle(entries), texts, 4)[1][0]
  prose = mt.score_multi_turn(entries, mt.run_entries(entries, lambda chats: ["I would list the files."] * len(chats),
                                                      texts, 4))
  assert [(s["valid"], s["error_type"]) for s in prose] == [(False, "multi_turn:empty_turn_model_response")] * 6
  assert all(len(s["turns"]) == len(e["texts"]) and all(len(t["steps"]) == 1 for t in s["turns"])
             for s, e in zip(prose, entries))


def test_step_limit_and_tool_results_reach_the_next_prompt(entries):
  e = entries[1]  # GorillaFileSystem only
  seen = []

  def calls_forever(chats):
    seen.extend(chats)
    return ["[pwd()]"] * len(chats)

  model_turns, record = mt.run_entry(e, calls_forever, e["texts"], max_steps=2)
  assert len(seen) == 3 and record["forced_quit"]  # two steps allowed, the third still calls: forced to quit
  assert model_turns == [[["pwd()"]] * 3] and len(record["turns"]) == 1 < len(e["texts"])
  assert [m["role"] for m in seen[0]] == ["system", "user"] and seen[0][1]["content"] == e["texts"][0]
  assert [m["role"] for m in seen[2]] == ["system", "user"] + ["assistant", "tool"] * 2
  tool = seen[1][-1]
  assert tool["name"] == "pwd()" and json.loads(tool["content"]) == {"current_working_directory": "/alex"}
  assert seen[1][-2] == {"role": "assistant", "content": "[pwd()]"}
  verdict = bfcl_multi_turn.check(model_turns, e["ground_truth"], e)
  assert verdict.error_type == "multi_turn:force_terminated"
  assert bfcl.system_prompt(e["functions"]) == seen[0][0]["content"]
  assert {"pwd", "ls", "cd"} <= {f["name"] for f in e["functions"]}


def test_held_out_functions_arrive_at_their_turn():
  e = mt.load_multi_turn(("multi_turn_miss_func",), 1)[0]
  (turn, docs), = e["held_out"].items()
  assert e["texts"][turn] is None and docs and not {d["name"] for d in docs} & {f["name"] for f in e["functions"]}
  seen = []
  mt.run_entry(e, lambda chats: seen.extend(chats) or ["no"] * len(chats), e["texts"], 4)
  assert len(seen) == len(e["texts"])
  assert docs[0]["name"] in seen[turn][-1]["content"] and seen[turn][-1]["role"] == "user"


def test_text_audio_reads_the_transcripts(tmp_path, monkeypatch):
  monkeypatch.setattr(run_exp, "make_clip", lambda item, p, seed, voice: (item["text"], {"perturbation": p, "seed": 7}))
  cfg = exp.Config(suites=("text", "text_audio"), categories=("simple",), n_per_category=1, n_perturb=0,
                   multi_turn_categories=("multi_turn_base", "multi_turn_miss_param"), n_multi_turn=1)
  entries = mt.load_multi_turn(cfg.multi_turn_categories, 1)
  heard = lambda text: f"heard: {text}"
  users = []

  def generate(reqs):
    users.extend([m["content"] for m in r["messages"] if m["role"] == "user"][-1] for r in reqs if "messages" in r)
    return ["Sure." for _ in reqs]

  res = run_exp.run_with(cfg, str(tmp_path), generate, transcribe=heard)
  texts = [t for e in entries for t in e["texts"]]
  assert sorted(users) == sorted(texts + [heard(t) for t in texts])  # text read the entry, text_audio the transcript
  for suite in ("text", "text_audio"):
    for key in ("multi_turn_base", "multi_turn_miss_param", "overall"):
      assert res[f"multi_turn_accuracy.{suite}.{key}"] == 0.0
    assert res[f"multi_turn_failures.{suite}.empty_turn_model_response"] == 2
    assert sum(res[f"multi_turn_failures.{suite}.{k}"] for k in mt.ERRORS) == 2
  assert res["wer.multi_turn"] == pytest.approx(len(texts) / sum(len(run_exp.normalize_words(t)) for t in texts))
  rows = [json.loads(x) for x in (tmp_path / "multi_turn.jsonl").read_text().splitlines()]
  assert [(r["suite"], r["id"]) for r in rows] == [(s, e["id"]) for s in ("text", "text_audio") for e in entries]
  assert [c["transcript"] for c in rows[2]["clips"]] == [t["user"] for t in rows[2]["turns"]]


def test_bad_multi_turn_category_is_a_one_line_error_before_anything_runs(tmp_path):
  with pytest.raises(ValueError, match="multi_turn_categories must be one of .* found 'multi_turn_weather'") as e:
    exp.Config(multi_turn_categories=("multi_turn_base", "multi_turn_weather"))
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match="multi_turn_max_steps must be >= 1, found 0"):
    exp.Config(multi_turn_max_steps=0)
  env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-m", "experiments", "run", "bfcl_audio", "--preset", "smoke", "--set",
                         "multi_turn_categories=multi_turn_base,base", "--root", "runs"], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0
  err = proc.stderr.strip().splitlines()
  assert len(err) == 1 and "multi_turn_categories must be one of" in err[0] and "'base'" in err[0], proc.stderr
  assert not (tmp_path / "runs" / "bfcl_audio" / "results.json").exists()
