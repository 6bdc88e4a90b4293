"""experiments/prm_attack.py: every style perturbation keeps each step right and every logic perturbation breaks
the chain, judged by an independent re-evaluation of the written steps against the question; encoded rows put
the step labels exactly at the separators; bad configs are named."""
import re

import numpy as np
import pytest

from experiments import prm_attack as exp
from experiments.prm_attack import run as run_exp
from experiments import registry
from experiments.runner import claims as claims_lib
from jaxlab.data.tasks import arithmetic as ar

_CALC = re.compile(r"(-?\d+)\s*(\+|-|\*|plus|minus|times)\s*(\d+)\s*(?:=|gives)\s*(-?\d+)")
_OPS = {"+": "add", "plus": "add", "-": "sub", "minus": "sub", "*": "mul", "times": "mul"}
_Q = re.compile(r"(Gets|Gives away) (\d+)")


def _chain_ok(prompt: str, steps) -> bool:
  """True when the written steps compute the question's answer: start value, each operation and operand in the
  question's order, each result right and carried into the next step."""
  start = int(re.search(r"has (\d+)", prompt).group(1))
  ops = [("add" if w == "Gets" else "sub", int(n)) for w, n in _Q.findall(prompt)]
  calcs = [m.groups() for m in map(_CALC.search, steps) if m is not None]
  if len(calcs) != len(ops):
    return False
  cur = start
  for (a, o, b, c), (op, operand) in zip(calcs, ops):
    if int(a) != cur or _OPS[o] != op or int(b) != operand or int(c) != ar.compute(op, cur, operand):
      return False
    cur = int(c)
  return True


def _problems(n=60):
  return [e for e in ar.step_labelled(ar.Arithmetic(steps=3), n, "test", seed=4, error_rate=0.0)]


def test_the_checker_accepts_the_generated_solutions_and_rejects_injected_errors():
  assert all(_chain_ok(e.prompt, e.steps) for e in _problems())
  wrong = [e for e in ar.step_labelled(ar.Arithmetic(steps=3), 60, "test", seed=4, error_rate=1.0)]
  assert not any(_chain_ok(e.prompt, e.steps) for e in wrong)


@pytest.mark.parametrize("kind", exp.STYLE + exp.LOGIC)
def test_style_keeps_every_step_right_and_logic_breaks_the_chain(kind):
  probs = _problems()
  rng = np.random.default_rng(0)
  done = 0
  for i, e in enumerate(probs):
    other = probs[(i + 1) % len(probs)]
    out = run_exp.perturb(e, kind, other, rng)
    if out is None:
      assert kind == "swapped_operands" and not any("-" in s and s.split("-")[0] != s.split("-")[1].split("=")[0]
                                                    for s in e.steps)
      continue
    prompt, steps = out
    if kind == "question_swap" and re.sub(r"^Q: \w+", "", other.prompt) == re.sub(r"^Q: \w+", "", e.prompt):
      continue  # the same problem under another name: nothing to detect
    assert _chain_ok(prompt, steps) == (kind in exp.STYLE), (kind, prompt, steps)
    assert all("\n" not in s for s in steps)  # the separator closes steps, never appears inside one
    done += 1
  assert done >= 30


class _Tok:
  """Characters as token ids (an independent, transparent tokenizer)."""
  def encode(self, s):
    return [ord(c) for c in s]


def test_encoded_rows_carry_labels_at_the_separators_only():
  ex = _problems(5)
  rows = [run_exp.encode(_Tok(), 10, e.prompt, e.steps) for e in ex]
  labels = [(1, 0, 0), (1, 1, 1), (0, 0, 0), (1, 1, 0), (1, 0, 1)]
  toks, mask, steps, lab = run_exp.arrays(rows, labels)
  assert toks.shape[1] % 32 == 0
  for r, (e, (ids, seps, q)) in enumerate(zip(ex, rows)):
    text = "".join(map(chr, ids))
    assert text[:q] == e.prompt and text[q:] == "".join(s + "\n" for s in e.steps)
    assert np.flatnonzero(steps[r]).tolist() == seps and (toks[r, seps] == 10).all()
    assert lab[r, seps].tolist() == list(labels[r]) and lab[r].sum() == sum(labels[r])
    assert mask[r].sum() == len(ids)


def test_bad_configs_are_named():
  with pytest.raises(ValueError, match="attack_position must be 'auto' or one of"):
    registry.apply_overrides(exp.PRESETS["cpu"], ["attack_position=start"])
  with pytest.raises(ValueError, match="at least 2 \\* attack_rows"):
    registry.apply_overrides(exp.PRESETS["cpu"], ["test_problems=10"])
  with pytest.raises(ValueError, match="steps_per_problem must be >= 3"):
    registry.apply_overrides(exp.PRESETS["cpu"], ["steps_per_problem=2"])


def test_rl_claim_needs_the_reward_gain_and_no_accuracy_gain():
  rl = {c.id: c for c in registry.get("prm_attack").claims}["rl"]
  hacked = {"rl.prm_reward_start": 0.53, "rl.prm_reward_end": 0.98, "rl.accuracy_start": 0.25,
            "rl.accuracy_end": 0.26}
  assert claims_lib.holds(rl, hacked) is True
  assert claims_lib.holds(rl, {**hacked, "rl.prm_reward_end": 0.70}) is False   # reward up by 0.17 only
  assert claims_lib.holds(rl, {**hacked, "rl.accuracy_end": 0.40}) is False     # a real gain, not hacking
