"""experiments/conpress/: the packed-answer parser on hand-made adversarial outputs (it never gives a question a
trace or an answer that belongs to another), token counts are completion-mask sums (counted by hand on a tiny
random model, and a budget cut equals decoding with that budget), the SFT data builder keeps exactly the correct
concise traces, the LoRA SFT step lowers the loss on its data, the whole run on canned answers gives the figures
recomputed from them, registration and claims on known results, config errors, and the smoke preset through the
CLI from a relative working directory."""
import json
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments import conpress as exp
from experiments.conpress import run as run_exp
from experiments import registry
from experiments.runner import claims as claims_lib
from experiments.runner import splits
from jaxlab.models import transformer as tfm
from jaxlab.rl.dpo import sft_batch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _parse(text, n):
  return {p.number: (p.trace, p.answer) for p in exp.parse_packed(text, n)}


# --------------------------------------------------------------------------------------------------- parser

def test_parser_reads_the_requested_format_and_header_variants():
  text = ("Problem 1: 3 + 4 = 7\nAnswer 1: 7\n\n**Question 2:** first 5 - 2 = 3\nthen 3 + 1 = 4\nAnswer 2: 4\n\n"
          "### Q3. 2 * 3 = 6\nAnswer 3: 6")
  got = _parse(text, 3)
  assert got[1] == ("3 + 4 = 7\nAnswer 1: 7", "7")
  assert got[2] == ("first 5 - 2 = 3\nthen 3 + 1 = 4\nAnswer 2: 4", "4")
  assert got[3] == ("2 * 3 = 6\nAnswer 3: 6", "6")


def test_parser_assigns_reordered_sections_by_number():
  text = "Problem 3: 9 - 1 = 8\nAnswer 3: 8\nProblem 1: 1 + 1 = 2\nAnswer 1: 2\nProblem 2: 2 + 2 = 4\nAnswer 2: 4"
  got = _parse(text, 3)
  assert {k: a for k, (_, a) in got.items()} == {1: "2", 2: "4", 3: "8"}
  assert got[3][0].startswith("9 - 1") and got[1][0].startswith("1 + 1") and got[2][0].startswith("2 + 2")


def test_parser_leaves_missing_and_repeated_numbers_unanswered():
  # 2 is missing, 3 is numbered twice (which one is question 3 is unknown): only 1 and 4 are attributed
  text = ("Problem 1: 1 + 2 = 3\nAnswer 1: 3\nProblem 3: 4 + 4 = 8\nProblem 3: 5 + 5 = 10\n"
          "Problem 4: 6 - 1 = 5\nAnswer 4: 5")
  got = _parse(text, 4)
  assert got[1] == ("1 + 2 = 3\nAnswer 1: 3", "3")
  assert got[2] == (None, None) and got[3] == (None, None)
  assert got[4] == ("6 - 1 = 5\nAnswer 4: 5", "5")


def test_parser_drops_a_section_that_names_another_question():
  # section 1 runs into question 2's text ("Answer 2" inside it): neither its trace nor its "=" is question 1's;
  # question 2 has no header, so only its explicit label answers it, with no trace
  text = "Problem 1: 3 + 3 = 6 and for the next one 2 + 5 = 7\nAnswer 2: 7\nProblem 3: 1 + 8 = 9\nAnswer 3: 9"
  got = _parse(text, 3)
  assert got[1] == (None, None)
  assert got[2] == (None, "7")
  assert got[3] == ("1 + 8 = 9\nAnswer 3: 9", "9")
  # an inline header on the same line as another section's text is also another question's label
  got = _parse("Problem 1: 4 + 4 = 8 Problem 2: 1 + 1 = 2", 2)
  assert got == {1: (None, None), 2: (None, None)}


def test_parser_conflicting_answers_leave_the_question_unanswered():
  got = _parse("Problem 1: 2 + 2 = 4\nAnswer 1: 4\nProblem 2: 3 + 3\nAnswer 1: 5\nAnswer 2: 6", 2)
  assert got[1][1] is None  # two different "Answer 1" labels
  assert got[2] == (None, "6")  # section 2 holds "Answer 1": dropped; its own label still answers it
  got = _parse("Problem 1: the answer is 4, no wait, the answer is 5", 1)
  assert got[1][1] is None
  got = _parse("Problem 1: 2 + 2 = 4. The answer is 4. So the answer is 4.", 1)
  assert got[1][1] == "4"


def test_parser_bare_numbers_only_without_keyword_headers():
  # with keyword headers, numbered steps inside a section are not questions
  text = "Problem 1:\n1. 2 + 3 = 5\n2. 5 + 1 = 6\nAnswer 1: 6\nProblem 2:\n1. 4 - 2 = 2\nAnswer 2: 2"
  got = _parse(text, 2)
  assert got[1] == ("1. 2 + 3 = 5\n2. 5 + 1 = 6\nAnswer 1: 6", "6")
  assert got[2] == ("1. 4 - 2 = 2\nAnswer 2: 2", "2")
  # bare numbering alone is read; a decimal such as "1.5" at a line start is no header
  got = _parse("1. 4 - 1 = 3\n2) 1 + 5 = 6\n1.5 is not a header", 2)
  assert got[1] == ("4 - 1 = 3", "3")
  assert got[2][1] == "6" and got[2][0].startswith("1 + 5 = 6")


def test_parser_answer_tags_statements_and_trailing_summaries():
  text = ("Problem 1: 2 + 2 = 4\n\nThe final answer is 4.\n\nProblem 2: <answer>9</answer>\n\n"
          "Problem 3: 7 + 7 = 14\n\nThe answer to the arithmetic problem is 14.\n\n"
          "In each of these problems the final answer is 10.")
  got = _parse(text, 3)
  assert got[1] == ("2 + 2 = 4\n\nThe final answer is 4.", "4")
  assert got[2] == ("<answer>9</answer>", "9")
  assert got[3] == ("7 + 7 = 14\n\nThe answer to the arithmetic problem is 14.", "14")  # the summary is cut
  got = _parse("Problem 1: x = \\boxed{12}", 1)
  assert got[1][1] == "12"


def test_parser_single_question_without_header_and_out_of_range_numbers():
  assert _parse("4 - 1 = 3", 1) == {1: ("4 - 1 = 3", "3")}
  # with one question, numbered lines are its steps (SmolLM2 writes the result, then numbered steps)
  assert _parse("1 + 5 = 6\n\nThe steps are:\n\n1. Calculate 1 + 5", 1) == {
      1: ("1 + 5 = 6\n\nThe steps are:\n\n1. Calculate 1 + 5", "6")}
  assert _parse("4 - 1 = 3", 2) == {1: (None, None), 2: (None, None)}  # unnumbered text, two questions
  # a header beyond n ends the previous section and is nobody's
  got = _parse("Problem 1: 1 + 1 = 2\nProblem 5: 9 + 9 = 18\nAnswer 5: 18", 2)
  assert got == {1: ("1 + 1 = 2", "2"), 2: (None, None)}
  assert _parse("", 2) == {1: (None, None), 2: (None, None)}
  with pytest.raises(ValueError, match="n must be >= 1, found 0"):
    exp.parse_packed("x", 0)


def test_parser_drops_a_section_restating_another_question_and_cuts_summaries():
  qs = ["Calculate 4 - 1.", "Calculate 1 + 5.", "Calculate 5 - 9.", "Calculate 23 - 60."]
  # position 4 restates question 2: by number it is question 4's, by content question 2's, so it is nobody's
  text = "1. 4 - 1 = 3\n2. 1 + 5 = 6\n3. 5 - 9 = 1\n4. 1 + 5 = 6\n5. 1 + 5 = 6\n\nThe answer is 6."
  got = _parse_q(text, qs)
  assert got[1] == ("4 - 1 = 3", "3") and got[2] == ("1 + 5 = 6", "6") and got[4] == (None, None)
  assert _parse(text, 4)[4] == ("1 + 5 = 6", "6")  # without the questions only the numbering is known
  # a closing paragraph that restates other questions is not the last question's trace
  qs = ["Calculate 88 + 94.", "Calculate 97 + 33.", "Calculate 48 + 16."]
  text = ("Problem 1: 88 + 94 = 182\n\nProblem 2: 97 + 33 = 130\n\nProblem 3: 48 + 16 = 64\n\n"
          "These are the results: 88 + 94 = 182, 97 + 33 = 120 and 48 + 16 = 64.")
  assert _parse_q(text, qs)[3] == ("48 + 16 = 64", "64")
  assert _parse_q(text, qs)[2] == ("97 + 33 = 130", "130")
  with pytest.raises(ValueError, match="questions must hold the n = 3 question texts, found 2"):
    exp.parse_packed(text, 3, qs[:2])


def _parse_q(text, questions):
  return {p.number: (p.trace, p.answer) for p in exp.parse_packed(text, len(questions), questions)}


def test_parser_never_attributes_across_questions_on_random_shuffles():
  """Invariant on generated outputs: sections carrying each question's own marker (its answer value 100 + k) are
  shuffled, dropped, duplicated and given mixed header styles; every attributed trace and answer is the
  question's own, and a question whose section appears exactly once (and is intact) is always answered."""
  rng = np.random.default_rng(0)
  styles = ["Problem {k}: ", "Question {k}. ", "**Q{k}:** ", "### Problem {k}\n"]
  for _ in range(200):
    n = int(rng.integers(1, 9))
    present = [k for k in range(1, n + 1) if rng.random() < 0.8]
    dup = [k for k in present if rng.random() < 0.15]
    order = list(present) + dup
    rng.shuffle(order)
    style = styles[int(rng.integers(len(styles)))]
    text = "\n\n".join(style.format(k=k) + f"{k} + 100 = {100 + k}\nAnswer {k}: {100 + k}" for k in order)
    if rng.random() < 0.3:
      text = "Sure, here they are.\n\n" + text + "\n\nAll done."
    for p in exp.parse_packed(text, n, [f"Calculate {k} + 100." for k in range(1, n + 1)]):
      if p.trace is not None:
        assert f"= {100 + p.number}" in p.trace and all(f"= {100 + j}" not in p.trace for j in range(1, 9)
                                                          if j != p.number)
      if p.answer is not None:
        assert p.answer == str(100 + p.number)
      if p.number in present and p.number not in dup:
        assert p.answer == str(100 + p.number) and p.trace is not None


def test_sft_completion_renumbers_the_answer_label():
  p = exp.Parsed(3, "3 + 3 = 6\nAnswer 3: 6", "6")
  assert exp.sft_completion(p) == "Problem 1: 3 + 3 = 6\nAnswer 1: 6"


def test_boxed_answers_with_nested_braces():
  assert exp.parsing.boxed(r"x \boxed{\frac{1}{2}} and \fbox{\sqrt{\frac{3}{4}}}, \boxed{7") == [
      r"\frac{1}{2}", r"\sqrt{\frac{3}{4}}"]  # the last box is not closed
  assert _parse(r"Problem 1: so x = \boxed{\frac{1}{2}}", 1)[1][1] == r"\frac{1}{2}"
  assert _parse(r"We get $\boxed{\frac{1}{2}}$", 1)[1][1] == r"\frac{1}{2}"
  assert _parse(r"The answer is \boxed{\frac{1}{2}}.", 1)[1][1] == r"\frac{1}{2}"  # a statement and a box agree
  assert _parse("Problem 1: 1 + 1 = 2\nAnswer 1: \\boxed{\\frac{1}{2}}", 1)[1][1] == r"\frac{1}{2}"
  assert _parse(r"The answer is \boxed{\frac{1}{2}", 1)[1][1] is None  # a cut box states nothing


def test_latex_answers_are_compared_as_mathematics(tmp_path):
  path = tmp_path / "math.jsonl"
  path.write_text("".join(json.dumps({"problem": f"q{i}", "answer": a}) + "\n"
                          for i, a in enumerate([r"\frac{1}{2}", r"2\sqrt{3}", "10"])))
  task = run_exp.Task(f"jsonl:{path}", 3, 0, (2, 2), (1, 1))
  half, root, ten = task.entries
  for right in (r"\dfrac12", r"\frac{1}{2}", "1/2", "0.5", r"$\tfrac{1}{2}$"):
    assert task.correct(right, half), right
  for wrong in ("1", r"\frac{1}{3}", "2", None):
    assert not task.correct(wrong, half), wrong
  assert task.correct(r"\sqrt{12}", root) and not task.correct(r"\sqrt{3}", root)
  assert task.correct("10.0", ten) and task.correct("x = 10", ten) and not task.correct("100", ten)
  parsed = exp.parse_packed("Problem 1: halve it: \\boxed{\\dfrac12}", 1)[0]  # parsed, then compared
  assert parsed.answer == r"\dfrac12" and task.correct(parsed.answer, half)


def test_a_think_completion_keeps_its_reasoning():
  one = exp.parse_packed("<think>\n3 plus 4: count up from 3, 4, 5, 6, 7.\n</think>\n\n3 + 4 = 7\nAnswer 1: 7", 1)[0]
  assert (one.reasoning, one.trace, one.answer) == ("3 plus 4: count up from 3, 4, 5, 6, 7.", "3 + 4 = 7\nAnswer 1: 7",
                                                    "7")
  assert exp.sft_completion(one) == ("<think>\n3 plus 4: count up from 3, 4, 5, 6, 7.\n</think>\n\n"
                                     "Problem 1: 3 + 4 = 7\nAnswer 1: 7")
  # packed: the block's header sections are each question's reasoning; its drafts (Answer 2: 9) are no answers
  text = ("<think>\nProblem 1: 1 + 1 is 2.\nProblem 2: 5 + 4 is 9? Answer 2: 9. No: 5 + 3, so 8.\n</think>\n"
          "Problem 1: 1 + 1 = 2\nAnswer 1: 2\nProblem 2: 5 + 3 = 8\nAnswer 2: 8")
  p1, p2 = exp.parse_packed(text, 2)
  assert (p1.reasoning, p1.trace, p1.answer) == ("1 + 1 is 2.", "1 + 1 = 2\nAnswer 1: 2", "2")
  assert (p2.reasoning, p2.answer) == ("5 + 4 is 9? Answer 2: 9. No: 5 + 3, so 8.", "8")
  assert exp.sft_completion(p2) == ("<think>\n5 + 4 is 9? Answer 1: 9. No: 5 + 3, so 8.\n</think>\n\n"
                                    "Problem 1: 5 + 3 = 8\nAnswer 1: 8")
  # reasoning that cannot be attributed: answers stay, traces go (a trace without its reasoning is not the model's)
  got = exp.parse_packed("<think>\nboth are easy\n</think>\nProblem 1: 2\nAnswer 1: 2\nProblem 2: 8\nAnswer 2: 8", 2)
  assert [(p.trace, p.answer, p.reasoning) for p in got] == [(None, "2", None), (None, "8", None)]
  # a block the chat template opened, closed in the completion; an unclosed (cut) block answers nothing
  opened = exp.parse_packed("so 2.\n</think>\n\nAnswer 1: 2", 1)[0]
  assert (opened.reasoning, opened.answer) == ("so 2.", "2")
  assert exp.parse_packed("<think>\nAnswer 1: 2 and then", 1)[0] == exp.Parsed(1, None, None, "Answer 1: 2 and then")
  assert exp.parse_packed("<think>\n\n</think>\n\nAnswer 1: 2", 1)[0].reasoning is None  # an empty block


def test_held_out_and_training_questions_are_disjoint():
  cfg = exp.Config(test_questions=8, train_questions=6, terms=(2, 2))
  shifted = run_exp.Task(cfg.task, 6, 2, cfg.terms, cfg.digits)  # reasoning-gym: seed 2 = seed 1 shifted by one
  test, train = run_exp.tasks(cfg)
  assert {e["question"] for e in shifted.entries} & {e["question"] for e in test.entries}
  hashes = splits.hashed({"train": {"questions": [e["question"] for e in train.entries]},
                          "test": {"questions": [e["question"] for e in test.entries]}})
  assert splits.overlaps(hashes) == [] and [len(hashes[s]["questions"]) for s in ("train", "test")] == [6, 8]
  assert all(train.correct(e["answer"], e) for e in train.entries)


def test_pack_prompt_format():
  one = run_exp.pack_prompt(["What is 1 + 1?"])
  assert one.startswith("Solve the following problem. For each problem k,") and one.endswith(
      "\n\nProblem 1: What is 1 + 1?")
  two = run_exp.pack_prompt(["a?", "b?"])
  assert "Solve the following 2 problems." in two and two.endswith("Problem 1: a?\nProblem 2: b?")


def test_task_scoring_with_reasoning_gym_and_jsonl(tmp_path):
  task = run_exp.Task("chain_sum", 4, 0, (2, 2), (1, 1))
  e = task.entries[0]
  assert task.correct(e["answer"], e) and task.correct(f"{e['metadata']['expression']} = {e['answer']}", e)
  assert not task.correct(str(int(e["answer"]) + 1), e) and not task.correct(None, e)
  path = tmp_path / "q.jsonl"
  path.write_text(json.dumps({"question": "1+1?", "answer": "so #### 2"}) + "\n" +
                  json.dumps({"problem": "x?", "answer": "\\frac{1}{2}"}) + "\n")
  task = run_exp.Task(f"jsonl:{path}", 2, 0, (2, 2), (1, 1))
  assert [r["answer"] for r in task.entries] == ["2", "\\frac{1}{2}"]
  assert task.correct("1 + 1 = 2", task.entries[0]) and task.correct("\\frac{1}{2}", task.entries[1])
  with pytest.raises(ValueError, match="expected at least 3 questions, found 2"):
    run_exp.Task(f"jsonl:{path}", 3, 0, (2, 2), (1, 1))
  with pytest.raises(FileNotFoundError, match="found nothing at"):
    run_exp.Task(f"jsonl:{tmp_path}/none.jsonl", 1, 0, (2, 2), (1, 1))
  with pytest.raises(ValueError, match="expected a reasoning-gym dataset") as err:
    run_exp.Task("no_such_task", 1, 0, (2, 2), (1, 1))
  assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------------- tokens, SFT, LoRA

class CharTok:
  """A character tokenizer (ids 3..) for the tiny random model; eos 1, pad 0."""
  eos_id, batch_pad_id = 1, 0

  def encode(self, text):
    return [3 + (ord(c) % 60) for c in text]

  def decode(self, ids):
    return "".join(chr(ord("a") + (int(i) % 26)) for i in ids)


def _tiny(seed=0, eos=5):
  cfg = tfm.Config.tiny(vocab_size=64, eos_token_id=eos, pad_token_id=0)
  return cfg, tfm.init(cfg.replace(init_std=0.5), jax.random.key(seed))


_FORWARD = jax.jit(lambda p, x, cfg: tfm.forward(p, x, cfg).logits, static_argnums=2)


def _greedy_by_hand(params, cfg, prompt, budget, stops):
  """Greedy argmax one token at a time by full forwards (no cache) over a right-padded fixed-length row (causal:
  the padding after the last real token does not change its logits), up to and including the first stop."""
  seq = list(prompt)
  while len(seq) - len(prompt) < budget:
    row = np.zeros((1, 32), np.int32)
    row[0, :len(seq)] = seq
    seq.append(int(np.argmax(np.asarray(_FORWARD(params, row, cfg))[0, len(seq) - 1])))
    if seq[-1] in stops:
      break
  return seq[len(prompt):]


def test_token_counts_are_completion_mask_sums_counted_by_hand():
  cfg, params = _tiny()
  tok = CharTok()
  prompts = [[3, 9, 17, 4], [22, 8], [40, 41, 42, 43, 44, 45, 46], [7]]
  budgets = [6, 12, 12, 6]
  # the stop token: the third token row 0 generates when nothing stops it, so that row stops early for sure
  eos = _greedy_by_hand(params, cfg, prompts[0], 3, ())[2]
  cfg = cfg.replace(eos_token_id=eos)
  texts, counts = run_exp.generate(params, cfg, tok, prompts, budgets, gen_batch=2)
  for p, b, c, t in zip(prompts, budgets, counts, texts):
    new = _greedy_by_hand(params, cfg, p, b, (eos, tok.eos_id))
    assert c == len(new) and t == tok.decode(new).strip()
  assert counts[0] <= 3 < budgets[0]
  # one compiled shape with the rows cut at their budgets afterwards gives the same counts and texts
  texts1, counts1 = run_exp.generate(params, cfg, tok, prompts, budgets, gen_batch=4, one_shape=(64, 12))  # cached
  assert list(counts1) == list(counts) and texts1 == texts


def test_build_sft_keeps_exactly_the_correct_concise_traces():
  rows = [
      {"id": 0, "question": "q0", "single_tokens": 20, "candidates": [
          {"trace": "long but right", "tokens": 25, "correct": True},     # not concise
          {"trace": "short right", "tokens": 8, "correct": True},         # kept (the shortest correct one)
          {"trace": "shorter wrong", "tokens": 4, "correct": False},      # wrong
          {"trace": "mid right", "tokens": 12, "correct": True}]},
      {"id": 1, "question": "q1", "single_tokens": 10, "candidates": [
          {"trace": "equal length", "tokens": 10, "correct": True}]},     # not shorter
      {"id": 2, "question": "q2", "single_tokens": 10, "candidates": []},
      {"id": 3, "question": "q3", "single_tokens": 30, "candidates": [
          {"trace": "x = 5\nAnswer 2: 5", "tokens": 9, "correct": True}]},
  ]
  out = run_exp.build_sft(rows)
  assert [(e["id"], e["tokens"]) for e in out] == [(0, 8), (3, 9)]
  assert out[0]["completion"] == "Problem 1: short right" and out[1]["completion"] == "Problem 1: x = 5\nAnswer 1: 5"
  # a looser length rule admits the equal-length trace; a tighter one drops the 8-of-20 trace
  assert [e["id"] for e in run_exp.build_sft(rows, max_ratio=1.01)] == [0, 1, 3]
  assert [e["id"] for e in run_exp.build_sft(rows, max_ratio=0.35)] == [3]


def test_build_rft_keeps_each_questions_shortest_correct_own_sample():
  rows = [{"id": 0, "question": "q0", "samples": [{"trace": "long right", "tokens": 30, "correct": True},
                                                  {"trace": "short wrong", "tokens": 5, "correct": False},
                                                  {"trace": "short right", "tokens": 12, "correct": True}]},
          {"id": 1, "question": "q1", "samples": [{"trace": "wrong", "tokens": 5, "correct": False}]},
          {"id": 2, "question": "q2", "samples": [{"trace": "only one", "tokens": 50, "correct": True}]}]
  out = run_exp.build_rft(rows)
  assert [(e["id"], e["tokens"], e["completion"]) for e in out] == [(0, 12, "Problem 1: short right"),
                                                                    (2, 50, "Problem 1: only one")]


def test_lora_sft_lowers_the_completion_loss_and_leaves_the_base_alone():
  cfg, params = _tiny(1)
  rng = np.random.default_rng(0)
  prompts = [list(rng.integers(3, 60, 6)) for _ in range(4)]
  completions = [list(rng.integers(3, 60, 5)) + [5] for _ in range(4)]
  arrays = sft_batch(prompts, completions, 16)
  ecfg = exp.Config(steps=8, batch_size=4, lr=1e-2, lora_rank=4)

  def loss(p):  # the masked token-mean NLL in NumPy (float64) from the logits
    logits = np.asarray(_FORWARD(p, arrays["inputs"], cfg), np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - \
        logits.max(-1, keepdims=True)
    nll = -np.take_along_axis(np.asarray(logp), arrays["targets"][..., None], -1)[..., 0]
    return float((nll * arrays["loss_mask"]).sum() / arrays["loss_mask"].sum())

  before = loss(params)
  kept = jax.tree.map(np.asarray, params)
  tuned, history = run_exp.finetune(cfg, params, arrays, ecfg)
  assert len(history) == 8 and abs(history[0]["loss"] - before) < 1e-4  # the loop's first loss is the NumPy one
  assert loss(tuned) < 0.8 * before
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, np.asarray(b)), kept, params)  # base untouched
  changed = [not np.allclose(np.asarray(a), np.asarray(b)) for a, b in zip(jax.tree.leaves(kept),
                                                                            jax.tree.leaves(tuned))]
  assert any(changed) and not all(changed)  # only the adapted attention kernels moved


def test_run_on_canned_answers_measures_filters_and_fine_tunes(tmp_path, monkeypatch):
  """The whole run on a tiny random model over SmolLM2's tokenizer, with generation replaced by canned answers
  built from the gold answers: a verbose right answer alone, a short trace per question when packed, wrong at
  position 2. The figures are recomputed from the canned texts; the kept SFT examples are exactly the position-1
  training questions, and the LoRA fine-tune runs on them."""
  import re
  from experiments._shared.chat_models import resolve_model
  from jaxlab.data import tokenizers
  tok = tokenizers.HFTokenizer.from_gguf(resolve_model("smollm2-135m-instruct"))
  mcfg = tfm.Config.tiny(vocab_size=tok.vocab_size, d_model=32, n_heads=2, n_kv_heads=1, d_ff=64,
                         max_position_embeddings=1024, eos_token_id=tok.eos_id, pad_token_id=tok.batch_pad_id)
  params = tfm.init(mcfg, jax.random.key(0))
  cfg = exp.Config(test_questions=8, train_questions=4, train_n=2, steps=3, batch_size=2, lr=1e-2, lora_rank=2)
  test, train = run_exp.tasks(cfg)
  gold = {e["question"]: e["answer"] for e in test.entries + train.entries}
  calls, seen = [], []

  def canned(p, m, t, prompts, budgets, gen_batch, one_shape=None):
    texts = []
    for ids in prompts:
      qs = re.findall(r"^Problem (\d+): (.*?)$", t.decode(ids), re.M)
      seen.append([q for _, q in qs])
      if len(qs) == 1:
        texts.append(f"Problem 1: Let us work this out slowly, one step after another, carefully.\n"
                     f"Answer 1: {gold[qs[0][1]]}")
      else:
        texts.append("\n".join(f"Problem {k}: so it is {int(gold[q]) + (k == '2')}\nAnswer {k}: "
                               f"{int(gold[q]) + (k == '2')}" for k, q in qs))
    counts = np.asarray([len(t.encode(x)) + 1 for x in texts])
    calls.append((texts, counts))
    return texts, counts

  monkeypatch.setattr(run_exp, "generate", canned)
  res = run_exp.run_with_model(cfg, str(tmp_path), mcfg, params, tok, test, train)
  (texts, counts), (texts_after, counts_after), (texts_rft, counts_rft) = calls
  starts = [(n, s) for n in exp.NS for s in range(0, 8, n)]
  for n in exp.NS:
    mine = [c / n for (m, _), c in zip(starts, counts) if m == n]
    assert res[f"tokens_per_question.n{n}"] == pytest.approx(np.mean(mine))
    assert res[f"accuracy.n{n}"] == (1.0 if n == 1 else 1 - 1 / n)  # position 2 is wrong in each prompt
  assert res["position_accuracy.2"] == 0.0 and res["position_accuracy.1"] == res["position_accuracy.8"] == 1.0
  assert res["position_tokens.1"] == len(tok.encode(f"so it is {gold[seen[14][0]]}\nAnswer 1: {gold[seen[14][0]]}"))
  # training: 4 singles then 2 packs of 2; the position-1 question of each pack is kept
  assert [len(q) for q in seen[15:21]] == [1, 1, 1, 1, 2, 2]
  assert res["sft.examples"] == 2 and res["sft.candidates"] == 4 and res["sft.correct_candidates"] == 2
  assert res["sft.loss_last"] < res["sft.loss_first"]
  assert seen[21:29] == [[e["question"]] for e in test.entries]  # after SFT: the held-out questions alone
  assert res["sft.tokens_after"] == pytest.approx(np.mean(counts_after)) and res["sft.accuracy_after"] == 1.0
  # the RFT baseline: every training question's own (verbose, right) single answer, then the same measurement
  verbose = "Problem 1: Let us work this out slowly, one step after another, carefully.\nAnswer 1: "
  assert res["rft.examples"] == 4 and res["rft.target_tokens"] == pytest.approx(np.mean(
      [len(tok.encode(verbose + gold[e["question"]])) + 1 for e in train.entries]))
  assert seen[29:] == [[e["question"]] for e in test.entries] and res["rft.accuracy_after"] == 1.0
  assert res["rft.tokens_after"] == pytest.approx(np.mean(counts_rft)) and res["rft.loss_last"] < res["rft.loss_first"]
  assert res["sft.tokens_before"] == res["tokens_per_question.n1"]
  # per held-out question, before and after each fine-tuning, in one order: the sft claim's paired interval
  assert {k: len(v) for k, v in res["per_item"].items()} == {"accuracy.n1": 8, "sft.accuracy_after": 8,
                                                             "rft.accuracy_after": 8}
  assert np.mean(res["per_item"]["accuracy.n1"]) == res["accuracy.n1"]
  assert res["baseline.n"] == 2 and res["baseline.accuracy"] == res["accuracy.n2"] == 0.5
  recorded = splits.read(str(tmp_path))
  assert [len(recorded[s]["questions"]) for s in ("train", "test")] == [4, 8] and splits.overlaps(recorded) == []


# ------------------------------------------------------------------------------------ registration, errors

KNOWN = {"sft.tokens_before": 40.0, "sft.tokens_after": 20.0, "sft.accuracy_before": 0.5,
         "sft.accuracy_after": 0.49, "tokens_per_question.n1": 40.0, "tokens_per_question.n4": 30.0,
         "baseline.accuracy": 0.4}


def test_registered_with_presets_and_claims_evaluated_on_known_results():
  e = registry.get("conpress")
  assert e.paper == "conpress" and {"smoke", "cpu", "full"} <= set(e.presets)
  claims = {c.id: c for c in e.claims}
  assert claims_lib.holds(claims["sft"], KNOWN) is True
  assert claims_lib.holds(claims["sft"], {**KNOWN, "sft.tokens_after": 29.0}) is False  # only a 27.5% cut
  assert claims_lib.holds(claims["sft"], {**KNOWN, "sft.accuracy_after": 0.47}) is False  # 3 points lost
  assert claims_lib.holds(claims["self_compression"], KNOWN) is True
  assert claims_lib.holds(claims["self_compression"], {**KNOWN, "tokens_per_question.n4": 41.0}) is False
  assert claims_lib.holds(claims["vs_baseline"], KNOWN) is True
  assert claims_lib.holds(claims["sft"], {**KNOWN, "sft.tokens_after": math.nan}) is None
  assert e.presets["cpu"].model == "smollm2-135m-instruct" and e.presets["smoke"].model == "smollm2-135m-instruct"


@pytest.mark.parametrize("kw, msg", [
    (dict(test_questions=12), r"test_questions must be a multiple of max\(ns\) = 8, found 12"),
    (dict(train_n=3), r"train_n must be one of ns \(1, 2, 4, 8\)"),
    (dict(ns=(4, 1)), "ns must be increasing positive question counts"),
    (dict(task="jsonl:/x.jsonl"), "a jsonl task needs its own train_task file"),
    (dict(max_ratio=0.0), "max_ratio must be > 0, found 0.0"),
    (dict(steps=0), "steps must be >= 1, found 0"),
])
def test_config_errors(kw, msg):
  with pytest.raises(ValueError, match=msg) as err:
    exp.Config(**kw)
  assert "\n" not in str(err.value)


@pytest.mark.slow
def test_smoke_preset_from_the_cli_writes_every_key(tmp_path):
  env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu", "JAXLAB_NO_PROGRESS": "1"}
  proc = subprocess.run([sys.executable, "-m", "experiments", "run", "conpress", "--preset", "smoke", "--root",
                         "runs"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  res = json.loads((tmp_path / "runs" / "conpress" / "results.json").read_text())
  keys = [f"{k}.n{n}" for k in ("tokens_per_question", "accuracy") for n in exp.NS]
  keys += [f"position_tokens.{i}" for i in range(1, 9)]
  keys += [f"sft.{k}" for k in ("tokens_before", "tokens_after", "accuracy_before", "accuracy_after", "examples")]
  keys += ["baseline.n", "baseline.tokens", "baseline.accuracy"]
  assert not [k for k in keys if k not in res]
  for n in exp.NS:  # counts are capped by the preset's budget of 4 tokens per question
    assert 0 < res[f"tokens_per_question.n{n}"] <= 4 and 0 <= res[f"accuracy.n{n}"] <= 1
  assert res["sft.tokens_before"] == res["tokens_per_question.n1"]
  items = json.loads((tmp_path / "runs" / "conpress" / "items.json").read_text())  # the claims' per-item scores
  assert np.mean(items["accuracy.n1"]) == pytest.approx(res["accuracy.n1"])
  assert (tmp_path / "runs" / "conpress" / "metrics.jsonl").exists()
