"""experiments/prm_attack.py: every style perturbation keeps each step right and every logic perturbation breaks
the chain, judged by an independent re-evaluation of the written steps against the question; encoded rows put
the step labels exactly at the separators; the reward before an attack is read as the attack reads it (one
aggregation per head); the attacked and transfer problems are not training problems; bad configs are named."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import prm_attack as exp
from experiments.prm_attack import reward_attack as ra
from experiments.prm_attack import run as run_exp
from experiments.runner import splits
from experiments import registry
from experiments.runner import claims as claims_lib
from jaxlab.data.tasks import arithmetic as ar
from jaxlab.models import heads, transformer as tfm

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


def test_attack_claim_is_the_paired_interval_of_the_reward_gain_against_0_3():
  attack = {c.id: c for c in registry.get("prm_attack").claims}["attack"]
  before = np.linspace(0.1, 0.3, 32)
  res = {"attack.reward_before": float(before.mean())}
  gain = lambda g: [{"attack.reward_before": before.tolist(), "attack.discrete_reward_after": (before + g).tolist()}]
  v = claims_lib.verdict(attack, [{**res, "attack.discrete_reward_after": float(before.mean() + 0.5)}], "cpu",
                         gain(0.5))
  assert v["verdict"] == "reproduced" and "paired" in v["interval"]
  v = claims_lib.verdict(attack, [{**res, "attack.discrete_reward_after": float(before.mean() + 0.2)}], "cpu",
                         gain(0.2))
  assert v["verdict"] == "not reproduced"
  noisy = gain(np.where(np.arange(32) < 16, 0.0, 0.7))  # mean gain 0.35, half the rows not moved at all
  v = claims_lib.verdict(attack, [{**res, "attack.discrete_reward_after": float(before.mean() + 0.35)}], "cpu", noisy)
  assert v["verdict"].startswith("inconclusive")


@pytest.mark.parametrize("kind", heads.KINDS)
def test_before_reward_uses_the_attacks_aggregation(kind):
  """The run's solution reward of a token row equals the attack's reward of the same tokens spliced (after), and is
  the minimum step reward for a step head, the last step's value for a value head (oracle written out)."""
  sep, q = 7, np.array([3, 2, 4])
  rng = np.random.default_rng(1)
  lengths = np.array([10, 7, 12])
  toks = rng.integers(10, 60, size=(3, 12))
  for r in range(3):
    toks[r, q[r] + 1::2] = sep
    toks[r, lengths[r]:] = 0
  mask = (np.arange(12)[None] < lengths[:, None]).astype(np.int32)
  lm_cfg = tfm.Config.tiny()
  lm = tfm.init(lm_cfg, jax.random.key(0))
  hcfg = heads.Config(kind=kind, d_model=lm_cfg.d_model, init_std=0.3)
  head = heads.init(hcfg, jax.random.key(1))
  adv = np.array([61, 62])
  after = np.asarray(ra.discrete_rewards(lm, lm_cfg, head, hcfg, toks, mask, q, adv, sep, "end"))
  # the spliced rows written out as plain token rows, scored the way the run scores a solution before the attack
  rows = [(list(toks[r, :lengths[r]]) + list(adv) + [sep], [], int(q[r])) for r in range(3)]
  t, m, _, _ = run_exp.arrays(rows)
  steps = np.asarray(heads.separator_mask(t, sep, m)) * (np.arange(t.shape[1])[None] >= q[:, None])
  r_BT = np.asarray(heads.position_rewards(head, hcfg, heads.hidden_states(lm, lm_cfg, jnp.asarray(t),
                                                                           jnp.asarray(m))))
  before_read = run_exp.solution_rewards(r_BT, steps, kind)
  np.testing.assert_allclose(before_read, after, rtol=1e-5, atol=1e-6)
  at = [np.flatnonzero(steps[r]) for r in range(3)]
  oracle = np.array([r_BT[r, at[r]].min() if kind == "step" else r_BT[r, at[r][-1]] for r in range(3)])
  np.testing.assert_allclose(before_read, oracle, rtol=1e-6)
  if kind == "value":  # the minimum would read something else: the test tells the two aggregations apart
    assert any(r_BT[r, at[r]].min() < r_BT[r, at[r][-1]] - 1e-4 for r in range(3))


def test_attacked_and_transfer_problems_are_not_training_problems():
  spec = ar.Arithmetic(steps=3)
  train, test = ar.step_labelled(spec, 200, "train", 0), ar.step_labelled(spec, 60, "test", 1)
  fit, held = run_exp.attack_split(test, 8)
  assert len(fit) == 8 and not set(fit) & set(held) and all(min(test[i].labels) == 0 for i in [*fit, *held])
  policy = ([ar.Example("Q: a policy problem\nA: ", "1", 0, "1+0=1")], [ar.Example("Q: held out\nA: ", "2", 0, "")])
  items = run_exp.split_items(train, test, fit, held, policy)
  hashed = splits.hashed(items)
  assert splits.overlaps(hashed) == []
  assert len(hashed["attacked"]["problems"]) == 8 and len(hashed["train"]["trajectories"]) == 8
  assert not {e.prompt for e in train} & {test[i].prompt for i in [*fit, *held]}
  # a PRM trained on an attacked problem is an overlap the recorder refuses
  leaky = run_exp.split_items(train + [test[fit[0]]], test, fit, held)
  assert ("attacked", "problems", 1) in splits.overlaps(splits.hashed(leaky))
  with pytest.raises(splits.SplitOverlap, match="share 1 of their problems"):
    splits.check(splits.hashed(leaky), {})
