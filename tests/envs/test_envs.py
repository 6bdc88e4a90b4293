"""jaxlab.envs: the "[choice] content" parser, the Function gym against closed forms, and batched episodes."""
import math

import pytest

from jaxlab.envs import base
from experiments.bao import function


@pytest.mark.parametrize("text,want", [
    ("[action] 1 2 3 4", ("action", "1 2 3 4")), ("I will probe. [ACTION]  5 6 7 8\nthen", ("action", "5 6 7 8")),
    ("[search] test", ("search", "test")), ("[answer] 7.5", ("answer", "7.5")), ("[finish]", ("finish", "")),
    ("no call here", ("invalid", "no call here"))])
def test_parse_call(text, want):
  assert base.parse_call(text) == want


CLOSED = {"a + b * c - d": lambda a, b, c, d: a + b * c - d,
          "a * (b + c) / d": lambda a, b, c, d: a * (b + c) / d,
          "(a + b) ** 2 - c * d": lambda a, b, c, d: (a + b) * (a + b) - c * d}


@pytest.mark.parametrize("rule", sorted(CLOSED))
def test_probes_and_answer_follow_the_hidden_rule(rule):
  env = function.FunctionGym(rule=rule)
  env.reset(3)
  for nums in [(1, 2, 3, 4), (2, -1, 0.5, 8), (7, 7, 1, 2)]:
    t = env.interact("action", " ".join(map(str, nums)))
    assert math.isclose(float(t.observation), CLOSED[rule](*nums), rel_tol=1e-5) and not t.done and t.info["user"]
  test = [int(x) for x in env.interact("search", "test").observation.split(":")[1].split()]
  refused = env.interact("action", " ".join(map(str, test)))
  assert "test case" in refused.observation and refused.reward == 0
  wrong = env.interact("answer", str(CLOSED[rule](*test) + 1))
  assert (wrong.reward, wrong.done) == (0.0, False)
  right = env.interact("answer", repr(CLOSED[rule](*test)))
  assert (right.reward, right.done, right.info["correct"]) == (1.0, True, True)


def test_reset_is_a_function_of_the_seed():
  a, b = function.FunctionGym(), function.FunctionGym()
  draws = [(a.reset(s), a.rule, a.test) for s in range(20)]
  assert draws == [(b.reset(s), b.rule, b.test) for s in range(20)]
  assert len({d[1] for d in draws}) > 3 and all(math.isfinite(function.evaluate(r, t)) for _, r, t in draws)


def test_bad_calls_are_told_not_scored():
  env = function.FunctionGym()
  env.reset(0)
  for choice, content in [("action", "1 2 3"), ("action", "x y z w"), ("invalid", "hello")]:
    t = env.interact(choice, content)
    assert (t.reward, t.done, t.info["valid"]) == (0.0, False, False)


def test_run_batches_live_episodes_and_truncates_at_max_turns():
  created, owner, calls = [], {}, []

  def make():
    created.append(function.FunctionGym(max_turns=4))
    return created[-1]

  def expert(histories):  # knows each episode's rule: search, then answer right (seed 1: after one probe)
    calls.append(len(histories))
    if not owner:
      owner.update({id(h): env for h, env in zip(histories, created)})
    out = []
    for h in histories:
      env = owner[id(h)]
      if len(h) == 1:
        out.append("[search] test")
      elif env is created[1] and len(h) == 3:
        out.append("[action] 1 2 3 4")
      else:
        out.append(f"[answer] {env.target()!r}")
    return out

  episodes = base.run(make, expert, seeds=[0, 1, 2])
  assert [len(e.turns) for e in episodes] == [2, 3, 2] and [e.score for e in episodes] == [1.0, 1.0, 1.0]
  assert calls == [3, 3, 1]
  assert [m["role"] for m in episodes[0].history] == ["user", "assistant", "user", "assistant", "user"]

  stuck = base.run(lambda: function.FunctionGym(max_turns=4), lambda hs: ["[action] 1 1 1 1"] * len(hs), [0, 1])
  assert [len(e.turns) for e in stuck] == [4, 4] and all(e.turns[-1].info["truncated"] for e in stuck)
  assert all(e.score == 0.0 and e.turns[-1].done for e in stuck)
  with pytest.raises(ValueError, match="policy returned 0 texts for 2"):
    base.run(lambda: function.FunctionGym(), lambda hs: [], [0, 1])
