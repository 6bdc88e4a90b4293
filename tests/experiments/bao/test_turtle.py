"""Turtle gym: the scripted user answers from the puzzle's facts, answers are scored by its weighted criteria
with UserRL's gain reward, a scripted solver finishes every puzzle, and an LM user's replies are read."""
import json

import numpy as np
import pytest

from jaxlab.envs import base
from experiments.bao import turtle


def _first_alternatives(groups):
  return " ".join(g.split("|")[0] for g in groups)


@pytest.mark.parametrize("puzzle", turtle.PUZZLES, ids=lambda p: p.title)
def test_scripted_user_answers_from_the_facts(puzzle):
  for fact in puzzle.facts:  # a question naming exactly one fact's words gets that fact's truth
    q = f"Is it about {_first_alternatives(fact.groups)}?"
    specific = [f for f in puzzle.facts if all(turtle.matches(g, q) for g in f.groups)]
    want = max(specific, key=lambda f: len(f.groups)).truth
    assert turtle.scripted_reply(puzzle, q) == ("Yes" if want else "No")
  assert turtle.scripted_reply(puzzle, "Is the moon made of green cheese?") == "Maybe"


def test_examples_of_replies():
  lift, punch = turtle.PUZZLES[0], turtle.PUZZLES[1]
  assert [turtle.scripted_reply(lift, q) for q in ["Is he short?", "Is he tall?", "Does he do it for exercise?",
                                                   "Does the umbrella matter?", "Does he like cats?"]] == \
      ["Yes", "No", "No", "Yes", "Maybe"]
  assert turtle.scripted_reply(punch, "Was the poison in the ice?") == "Yes"
  assert turtle.scripted_reply(punch, "Was the punch poisoned?") == "No"  # the more specific fact wins


@pytest.mark.parametrize("puzzle", turtle.PUZZLES, ids=lambda p: p.title)
def test_the_bottom_covers_every_criterion_and_parts_score_their_weights(puzzle):
  env = turtle.TurtleGym([puzzle])
  assert env.reset(0).startswith(puzzle.title)
  marks, score = env.score(puzzle.bottom)
  assert marks == [1.0] * len(puzzle.criteria) and score == pytest.approx(1.0)
  assert env.score("I have no idea at all.") == ([0.0] * len(puzzle.criteria), 0.0)
  for c in puzzle.criteria:  # every group of one criterion, nothing else: that criterion's weight
    others = [d for d in puzzle.criteria if d is not c]
    text = _first_alternatives(c.groups)
    got = sum(d.weight * turtle.judge(d, text) for d in others)
    assert env.score(text)[1] == pytest.approx(c.weight + got)
    n, half = len(c.groups), -(-len(c.groups) // 2)
    if n >= 2:  # at least half of its groups: 0.5, fewer: 0
      assert turtle.judge(c, _first_alternatives(c.groups[:half])) == 0.5
      assert turtle.judge(c, _first_alternatives(c.groups[:half - 1])) == 0.0


def test_reward_is_the_gain_over_the_best_score_and_ends_at_the_threshold():
  lift = turtle.PUZZLES[0]
  env = turtle.TurtleGym([lift], step_penalty=0.0)
  env.reset(3)
  part = "He is too short to reach the button."
  got = [env.interact("action", "Is he short?"), env.interact("answer", part), env.interact("answer", part),
         env.interact("answer", "He uses an umbrella"), env.interact("answer", lift.bottom)]
  w = [c.weight for c in lift.criteria]
  first = w[0] + 0.5 * w[1]  # all of criterion 1; "reach" is half of criterion 2
  assert got[1].info["score"] == pytest.approx(first)
  assert [t.reward for t in got] == pytest.approx([0.0, first, 0.0, 0.0, 1.0 - first])
  assert [t.done for t in got] == [False, False, False, False, True]
  assert got[3].info["score"] == pytest.approx(0.5 * w[1]) and got[4].info["correct"]
  env = turtle.TurtleGym([lift], step_penalty=0.1)
  env.reset(0)
  env.interact("action", "Is he short?")
  assert env.interact("answer", lift.bottom).reward == pytest.approx(1.0 - 0.2)


def test_scripted_solver_finishes_every_puzzle_within_the_turn_limit():
  by_surface = {p.surface: p for p in turtle.PUZZLES}

  def solver(histories):  # asks about the first fact, then tells the story it was given
    out = []
    for h in histories:
      p = next(v for k, v in by_surface.items() if k in h[0]["content"])
      out.append(f"[action] Is it about {_first_alternatives(p.facts[0].groups)}?" if len(h) == 1
                 else f"[answer] {p.bottom}")
    return out

  episodes = base.run(lambda: turtle.TurtleGym(), solver, range(40))
  assert all(e.score == pytest.approx(1.0) and len(e.turns) == 2 for e in episodes)
  assert {e.history[0]["content"].split(":")[0] for e in episodes} == {p.title for p in turtle.PUZZLES}
  again = base.run(lambda: turtle.TurtleGym(), solver, range(40))
  assert [e.history for e in again] == [e.history for e in episodes]


def test_lm_user_answers_questions_and_judges_stories():
  match = turtle.PUZZLES[2]
  replies = iter(["Yes, it does.",
                  '```json\n' + json.dumps({"scores": [{"point": 1, "score": 1}, {"point": 2, "score": 0.5},
                                                       {"point": 3, "score": 0}]}) + "\n```",
                  '{"scores": [1, 1]}',
                  '{"scores": [1.0, 0.9, 1]}'])
  seen = []

  def generate(messages):
    seen.append(messages)
    return next(replies)

  env = turtle.TurtleGym([match], generate=generate)
  env.reset(0)
  assert env.interact("action", "Was there a balloon?").observation == "Yes"
  first = env.interact("answer", "a balloon and matches")
  w = np.array([c.weight for c in match.criteria])
  assert first.info["score"] == pytest.approx(w @ [1, 0.5, 0]) and first.reward == pytest.approx(w @ [1, 0.5, 0])
  unread = env.interact("answer", "something")
  assert unread.info["judged"] is False and unread.reward == 0.0 and not unread.done
  last = env.interact("answer", "the full story")
  assert last.done and last.reward == pytest.approx(1.0 - w @ [1, 0.5, 0])
  assert all(match.bottom in m[0]["content"] for m in seen)
  assert all(c.statement in seen[1][0]["content"] for c in match.criteria)
  assert [m[1]["content"] for m in seen] == ["Was there a balloon?", "a balloon and matches", "something",
                                             "the full story"]


def test_bad_puzzles_are_refused():
  lift = turtle.PUZZLES[0]
  bad = lift._replace(criteria=lift.criteria[:1])
  with pytest.raises(ValueError, match="criteria weights must sum to 1, found 0.6"):
    turtle.TurtleGym([bad])
  with pytest.raises(ValueError, match="at least one Puzzle"):
    turtle.TurtleGym([])
  assert turtle.read_scores('{"scores": [1, 0]}', 3) is None and turtle.read_scores("no json", 1) is None
