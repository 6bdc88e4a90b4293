"""jaxlab.data.tasks.arithmetic and jaxlab.evals.answers: word problems checked by an independent parser of their
text, held-out problems disjoint from training and pretraining text, answer extraction on GSM8K / MetaMathQA /
commonsense forms, SFT masks, and JSONL loading."""
import json
import re

import numpy as np
import pytest

from jaxlab.data.tasks import arithmetic
from jaxlab.data.tokenizers import ByteTokenizer
from jaxlab.evals import answers


def _solve_text(prompt: str) -> int:
  """Oracle: reads the start value and each operation from the words and computes the result."""
  m = re.match(r"Q: \w+ has (\d+) \w+\.(.*) How many now\?\nA: $", prompt)
  assert m, prompt
  cur = int(m.group(1))
  for phrase in re.findall(r"(Gets \d+ more|Gives away \d+|Multiplies them by \d+)\.", m.group(2)):
    n = int(re.search(r"\d+", phrase).group())
    cur = cur + n if phrase.startswith("Gets") else cur - n if phrase.startswith("Gives") else cur * n
  return cur


@pytest.mark.parametrize("spec", [arithmetic.Arithmetic(), arithmetic.Arithmetic(ops=("add", "sub", "mul"), steps=3),
                                  arithmetic.Arithmetic(ops=("sub",), steps=1, digits=2)])
def test_word_problems_are_correct_by_an_independent_reading(spec):
  for e in arithmetic.word_problems(spec, 200, "train", seed=3):
    value = _solve_text(e.prompt)
    assert e.answer == str(value)
    eqs = e.target.split(", ")
    assert len(eqs) == spec.steps
    prev = None
    for eq in eqs:
      lhs, rhs = eq.split("=")
      a, b = map(int, re.split(r"[-+*]", lhs))
      assert eval(lhs) == int(rhs) >= 0  # noqa: S307  (digits and one operator)
      assert prev is None or a == prev  # each step starts from the previous result
      prev = int(rhs)
    assert prev == value
    assert answers.exact_match(e.target, e.answer)


def test_labels_match_the_text():
  spec = arithmetic.Arithmetic(ops=("add", "sub", "mul"))
  for label_by in arithmetic.LABELS:
    s = arithmetic.Arithmetic(ops=spec.ops, label_by=label_by)
    for e in arithmetic.word_problems(s, 100, "train", seed=1):
      ops = ["add" if "+" in q else "sub" if "-" in q else "mul" for q in e.target.split(", ")]
      want = {"op": spec.ops.index(ops[0]), "pattern": s.patterns.index(tuple(ops)),
              "digits": len(e.answer) - 1}[label_by]
      assert e.label == want


def test_test_problems_never_appear_in_training_or_pretraining_text():
  spec = arithmetic.Arithmetic()
  test = arithmetic.problems(spec, 150, "test", seed=0)
  train = arithmetic.problems(spec, 3000, "train", seed=1)
  assert not set(test) & set(train)
  assert all(arithmetic.split_of(spec, p) == "test" for p in test)
  held = {arithmetic.solution(p, "\n") for p in test}
  held_values = {(p.start, p.ops, p.operands) for p in test}
  docs = arithmetic.pretrain_texts(spec, 300, 4, 2, seed=2)
  for d in docs:
    lines = d.split("\n")
    eqs, statements = lines[:4 * spec.steps], lines[4 * spec.steps:]
    chains = {"\n".join(eqs[i:i + spec.steps]) for i in range(0, len(eqs), spec.steps)}
    assert not chains & held and all("=" in q for q in eqs)
    assert len(statements) == 2
    for q in statements:  # statements carry no solution and no held-out problem
      assert "=" not in q
      start = int(re.search(r"has (\d+)", q).group(1))
      ops = tuple("add" if w == "Gets" else "sub" for w in re.findall(r"(Gets|Gives)", q))
      operands = tuple(int(x) for x in re.findall(r"(?:Gets|away) (\d+)", q))
      assert (start, ops, operands) not in held_values
      assert _solve_text(f"Q: {q}\nA: ") >= 0
  # the held-out fraction is the configured one (over fresh random problems, within sampling error)
  rng = np.random.default_rng(0)
  frac = np.mean([arithmetic.split_of(spec, arithmetic._random_problem(spec, rng)) == "test" for _ in range(4000)])
  assert abs(frac - spec.test_fraction) < 0.03


def test_draws_are_deterministic_and_distinct_while_possible():
  spec = arithmetic.Arithmetic()
  a = arithmetic.word_problems(spec, 50, "test", seed=5)
  assert a == arithmetic.word_problems(spec, 50, "test", seed=5)
  assert a != arithmetic.word_problems(spec, 50, "test", seed=6)
  assert len({e.target for e in a}) == 50


def test_equation_problems_are_the_bare_chains():
  spec = arithmetic.Arithmetic()
  for e in arithmetic.equation_problems(spec, 30, "test", seed=0):
    full = e.prompt + e.target
    assert e.prompt.endswith("=") and full.count("\n") == spec.steps - 1
    assert full.rsplit("=", 1)[1] == e.answer
    assert answers.exact_match(e.answer + "\n3+4=7", e.answer)  # the next pretraining-style line is ignored


@pytest.mark.parametrize("completion,gold,ok", [
    ("7+5=12, 12-3=9", "9", True),
    ("7+5=12, 12-3=8", "9", False),
    ("7+5=12, 12-3=9\nQ: more text 5", "9", True),
    ("Natalia sold 48/2 = 24 clips.\n#### 72", "72", True),
    ("so 1,000 in total #### 1,000", "1000", True),
    ("The answer is: 72.", "72", True),
    ("the answer is $18.00", "18", True),
    ("x=-5", "-5", True),
    ("12.50", "12.5", True),
    ("", "3", False),
    ("3", "", False),
    ("the correct answer is option2", "option2", True),
    ("the correct answer is option1", "option2", False),
    ("True", "true", True),
])
def test_exact_match(completion, gold, ok):
  assert answers.exact_match(completion, gold) is ok


def test_sft_arrays_train_only_on_the_solution_and_eos():
  tok = ByteTokenizer()
  exs = arithmetic.word_problems(arithmetic.Arithmetic(), 8, "train", seed=0)
  arr = arithmetic.sft_arrays(exs, tok, 96)
  for i, e in enumerate(exs):
    full = tok.encode(e.prompt, add_bos=True) + tok.encode(e.target, add_eos=True)
    n = len(full) - 1
    np.testing.assert_array_equal(arr["inputs"][i, :n], full[:-1])
    np.testing.assert_array_equal(arr["targets"][i, :n], full[1:])
    m = arr["loss_mask"][i].astype(bool)
    assert tok.decode(arr["targets"][i][m], skip_special=False) == e.target + "<eos>"
    assert not m[n:].any()
  with pytest.raises(ValueError, match="seq_len"):
    arithmetic.sft_arrays(exs, tok, 20)


def test_load_jsonl_formats(tmp_path):
  gsm = tmp_path / "gsm.jsonl"
  gsm.write_text(json.dumps({"question": "2 plus 3?", "answer": "2+3=5\n#### 5"}) + "\n\n"
                 + json.dumps({"question": "Q2", "answer": "It is 1,200.\n#### 1,200"}) + "\n")
  mm = tmp_path / "mm.jsonl"
  mm.write_text(json.dumps({"query": "4 times 2?", "response": "4*2=8. The answer is: 8"}) + "\n")
  cs = tmp_path / "cs.jsonl"
  cs.write_text(json.dumps({"instruction": "Is it? Answer format: true/false", "input": "",
                            "output": "the correct answer is true", "answer": "true"}) + "\n")
  g = arithmetic.load_jsonl(str(gsm), "gsm8k")
  assert [e.answer for e in g] == ["5", "1200"] and g[0].target == "2+3=5\n#### 5"
  assert "2 plus 3?" in g[0].prompt and g[0].prompt.endswith("### Response:\n")
  assert answers.exact_match(g[1].target, g[1].answer)
  assert arithmetic.load_jsonl(str(mm), "metamathqa")[0].answer == "8"
  c = arithmetic.load_jsonl(str(cs), "commonsense")[0]
  assert c.answer == "true" and answers.exact_match(c.target, c.answer)
  assert len(arithmetic.load_jsonl(str(gsm), "gsm8k", limit=1)) == 1
  with pytest.raises(FileNotFoundError, match="no file"):
    arithmetic.load_jsonl(str(tmp_path / "missing.jsonl"), "gsm8k")
  with pytest.raises(ValueError, match="fmt"):
    arithmetic.load_jsonl(str(gsm), "alpaca")
  with pytest.raises(KeyError, match="query"):
    arithmetic.load_jsonl(str(gsm), "metamathqa")


def test_spec_validation():
  with pytest.raises(ValueError, match="ops"):
    arithmetic.Arithmetic(ops=("div",))
  with pytest.raises(ValueError, match="label_by"):
    arithmetic.Arithmetic(label_by="size")
  with pytest.raises(ValueError, match="steps"):
    arithmetic.Arithmetic(steps=0)


def test_step_labels_follow_an_independent_check_of_each_step():
  spec = arithmetic.Arithmetic(ops=("add", "sub", "mul"), steps=3, digits=2)
  data = arithmetic.step_labelled(spec, 200, seed=4, error_rate=0.5)
  wrong = 0
  for ex in data:
    cur = int(re.search(r"has (\d+)", ex.prompt).group(1))
    ok = True
    for step, label in zip(ex.steps, ex.labels):
      a, op, b, c = re.fullmatch(r"(-?\d+)([+*-])(\d+)=(-?\d+)", step).groups()
      true = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
      ok = ok and int(a) == cur and int(c) == true
      assert label == int(ok), (ex, step)
      cur = int(c)
    assert ex.answer == str(cur) and len(ex.steps) == 3
    wrong += not ok
  assert 70 < wrong < 130
  assert all(all(ex.labels) for ex in arithmetic.step_labelled(spec, 20, seed=4, error_rate=0.0))
  with pytest.raises(ValueError, match="error_rate"):
    arithmetic.step_labelled(spec, 2, error_rate=1.5)
