"""Telepathy gym: the scripted user against the entity traits, scripted optimal policies solving Function and
Telepathy within the turn limit, a random policy's score against its closed form, UserRL's reward, an LM user."""
import math

import numpy as np
import pytest

from jaxlab import errors
from jaxlab.envs import base
from experiments.bao import function
from experiments.bao import telepathy
from experiments.bao import turns


def halving_policy(pool):
  """Keeps the entities consistent with the answers so far; asks the trait that splits them most evenly, or
  answers when one is left. One policy object per episode, keyed by history identity."""
  vocab = sorted(set().union(*(e.traits for e in pool)))
  state = {}

  def policy(histories):
    out = []
    for h in histories:
      cand = state.setdefault(id(h), {"cand": list(pool), "asked": None})
      if cand["asked"] is not None:
        yes = h[-1]["content"] == "Yes"
        cand["cand"] = [e for e in cand["cand"] if (cand["asked"] in e.traits) == yes]
      if len(cand["cand"]) == 1:
        cand["asked"] = None
        out.append(f"[answer] {cand['cand'][0].name}")
      else:
        cand["asked"] = min(vocab, key=lambda v: abs(2 * sum(v in e.traits for e in cand["cand"]) - len(cand["cand"])))
        out.append(f"[action] Is it a {cand['asked']}?")
    return out
  return policy


def test_builtin_entities_are_distinct_and_the_user_answers_from_traits():
  pool = telepathy.BUILTIN
  assert len({e.traits for e in pool}) == len(pool) >= 50
  env = telepathy.TelepathyGym("builtin")
  dog = next(e for e in pool if e.name == "dog")
  env.entity = dog
  for question, want in [("is it an animal?", "Yes"), ("Is it a mammal", "Yes"), ("is it alive?", "Yes"),
                         ("is it a plant?", "No"), ("is it man-made?", "No"), ("is it huge?", "No"),
                         ("is it a cat?", "No"), ("is it a dog?", "Yes"), ("does it like jazz?", "Maybe")]:
    t = env.interact("action", question)
    assert (t.observation, t.reward, t.done, t.info["user"]) == (want, 0.0, False, True), question
  for e in pool:  # every reply is the trait membership, for every entity and every trait
    for trait in env.vocabulary:
      assert telepathy.scripted_reply(e, f"is it a {trait}?", env.vocabulary) == \
          ("Yes" if trait in e.traits or trait in e.names else "No")


def test_halving_policy_solves_every_builtin_entity_within_the_turn_limit():
  pool = telepathy.BUILTIN
  seeds = list(range(200))
  episodes = base.run(lambda: telepathy.TelepathyGym(pool), halving_policy(pool), seeds)
  assert all(e.score == 1.0 and e.turns[-1].info["correct"] for e in episodes)
  assert max(len(e.turns) for e in episodes) <= 15 and len({e.history[-2]["content"] for e in episodes}) > 40
  assert all(sum(t.reward for t in e.turns[:-1]) == 0 for e in episodes)  # only the right answer is rewarded
  assert np.mean([len(e.turns) for e in episodes]) <= math.ceil(math.log2(len(pool))) + 2


@pytest.mark.skipif(not errors.installed("wordnet"), reason="no wordnet-base")
def test_wordnet_entities_follow_hypernyms_and_are_solvable():
  pool = telepathy.wordnet_entities()
  assert len(pool) > 100 and len({e.traits for e in pool}) == len(pool)
  dog = next(e for e in pool if e.name == "dog")
  vocab = frozenset().union(*(e.traits | set(e.names) for e in pool))
  assert [telepathy.scripted_reply(dog, q, vocab) for q in
          ["is it a mammal?", "is it a canine?", "is it a living thing?", "is it a plant?", "is it a qwerty?"]] == \
      ["Yes", "Yes", "Yes", "No", "Maybe"]
  assert "domestic dog" in dog.names and telepathy.load_entities("auto") == pool
  episodes = base.run(lambda: telepathy.TelepathyGym(pool), halving_policy(pool), range(len(pool)))
  assert all(e.score == 1.0 for e in episodes) and max(len(e.turns) for e in episodes) <= 15


def test_identifying_probes_solve_function_within_the_turn_limit():
  probes = [(1.5, 2.5, 3.5, 4.5), (2.5, 0.5, 5.5, 1.5), (4.5, 3.5, 0.5, 2.5)]
  state = {}

  def policy(histories):
    out = []
    for h in histories:
      s = state.setdefault(id(h), {"seen": []})
      n_done = (len(h) - 1) // 2
      if n_done == 0:
        out.append("[search] test")
        continue
      if n_done == 1:
        s["test"] = [int(x) for x in h[-1]["content"].split(":")[1].split()]
      else:
        s["seen"].append((probes[n_done - 2], float(h[-1]["content"])))
      rules = [r for r in function.RULES
               if all(math.isclose(function.evaluate(r, p), v, rel_tol=1e-5) for p, v in s["seen"])]
      if len(rules) == 1:
        out.append(f"[answer] {function.evaluate(rules[0], s['test'])!r}")
      else:
        out.append("[action] " + " ".join(map(str, probes[n_done - 1])))
    return out

  episodes = base.run(lambda: function.FunctionGym(), policy, range(60))
  assert all(e.score == 1.0 for e in episodes) and max(len(e.turns) for e in episodes) <= 15


@pytest.mark.parametrize("n_entities,max_turns,q", [(3, 4, 0.5), (2, 3, 0.0)])
def test_random_policy_matches_its_closed_form(n_entities, max_turns, q):
  """A policy asking a random question with probability q, else naming a uniform entity of the pool: each turn
  hits with p = (1 - q) / n, so E[score] = 1 - (1 - p)^T and E[turns] = sum_{k<T} (1 - p)^k."""
  pool = telepathy.BUILTIN[:n_entities]
  vocab = sorted(set().union(*(e.traits for e in pool)))
  rng = np.random.default_rng(n_entities)

  def policy(histories):
    return [f"[action] is it {vocab[rng.integers(len(vocab))]}?" if rng.random() < q
            else f"[answer] {pool[rng.integers(n_entities)].name}" for _ in histories]

  n = 4000
  episodes = base.run(lambda: telepathy.TelepathyGym(pool, max_turns=max_turns), policy, range(n))
  p = (1 - q) / n_entities
  want_score, want_len = 1 - (1 - p) ** max_turns, sum((1 - p) ** k for k in range(max_turns))
  scores, lengths = np.array([e.score for e in episodes]), np.array([len(e.turns) for e in episodes])
  assert abs(scores.mean() - want_score) < 4 * np.sqrt(want_score * (1 - want_score) / n)
  assert abs(lengths.mean() - want_len) < 4 * lengths.std() / np.sqrt(n)
  assert set(np.unique(scores)) == {0.0, 1.0}


def test_reward_is_the_answer_score_gain_minus_the_step_penalty_clipped():
  pool = telepathy.BUILTIN
  env = telepathy.TelepathyGym(pool, step_penalty=0.1)
  env.reset(5)
  wrong = next(e.name for e in pool if e is not env.entity)
  got = [env.interact("action", "is it alive?"), env.interact("answer", wrong), env.interact("search", "x"),
         env.interact("answer", env.entity.name.upper())]
  assert [t.reward for t in got] == [0.0, 0.0, 0.0, pytest.approx(1.0 - 0.4)]
  assert [t.done for t in got] == [False, False, False, True] and got[2].info["valid"] is False
  env.reset(5)
  assert env.interact("finish", "").done and env.step_count == 1


def test_lm_user_gets_the_entity_and_question_and_its_reply_is_read():
  seen, replies = [], iter(['```json\n{"thought": "no, not a plant", "response": "No"}\n```', "Yes.", "hmm"])

  def generate(messages):
    seen.append(messages)
    return next(replies)

  env = telepathy.TelepathyGym(telepathy.BUILTIN, generate=generate)
  env.reset(0)
  got = [env.interact("action", q).observation for q in ["is it a plant?", "is it alive?", "is it big?"]]
  assert got == ["No", "Yes", "Maybe"]
  assert all(env.entity.name in m[0]["content"] and m[0]["role"] == "system" for m in seen)
  assert [m[1]["content"] for m in seen] == ["is it a plant?", "is it alive?", "is it big?"]
  assert env.interact("answer", env.entity.name).reward == 1.0  # answers are scored by name, not by the LM
  user = base.lm_user(lambda ms: "|".join(m["role"] for m in ms), "sys")
  assert user([{"role": "assistant", "content": "q"}], "hi") == "system|assistant|user"


def test_env_batch_rewards_feed_turn_advantages():
  pool = telepathy.BUILTIN[:4]
  batch = base.EnvBatch(lambda: telepathy.TelepathyGym(pool, max_turns=3), 4)
  tasks = batch.reset([0, 0, 0, 0])
  assert len(set(tasks)) == 1 and len({id(e.entity) for e in batch.envs}) == 1
  target = batch.envs[0].entity.name
  other = next(e.name for e in pool if e.name != target)
  batch.step([f"[answer] {target}", "[action] is it alive?", f"[answer] {other}", "[finish]"])
  assert batch.live == [1, 2]
  batch.step([f"[answer] {target}", f"[answer] {other}"])
  last = batch.step([f"[answer] {other}"])
  assert batch.live == [] and last[0].info["truncated"]
  assert batch.rewards() == [[1.0], [0.0, 1.0], [0.0, 0.0, 0.0], [0.0]]
  rewards, n = turns.pad_rewards(batch.rewards())
  credit, score = turns.turn_credits(rewards, n, turns.TurnCredit(credit="R2G", score="R2G"))
  np.testing.assert_allclose(score, [1.0, 0.8, 0.0, 0.0])
  with pytest.raises(ValueError, match="reset needs one seed per env"):
    batch.reset([0])


@pytest.mark.parametrize("text,want", [("Yes", "Yes"), ("no.", "No"), ('{"response": "Maybe"} yes', "Maybe"),
                                       ("I think YES, but no", "Yes"), ("not sure", "Maybe")])
def test_verdict(text, want):
  assert base.verdict(text) == want


def test_bad_pools_are_refused():
  with pytest.raises(ValueError, match="entity source must be"):
    telepathy.TelepathyGym("imagenet")
  with pytest.raises(ValueError, match="at least one Entity"):
    telepathy.TelepathyGym([])
  with pytest.raises(errors.MissingDependency, match="needs wordnet-base .*apt-get install -y wordnet-base"):
    telepathy.wordnet_entities("/nonexistent")


def test_wnsearchdir_moves_wordnet_and_auto_falls_back_to_builtin(tmp_path, monkeypatch):
  monkeypatch.setenv("WNSEARCHDIR", str(tmp_path))
  assert not errors.installed("wordnet") and telepathy.load_entities("auto") == telepathy.BUILTIN
  with pytest.raises(errors.MissingDependency, match=f"no data.noun in {tmp_path}"):
    telepathy.load_entities("wordnet")
