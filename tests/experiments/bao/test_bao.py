"""experiments/bao: the scripted experts solve every episode within the turn limit, the calculator equals the
rules, SFT rows hold the reasoning and mask exactly the policy's replies, the loss batch carries UserRL's
per-token advantages of the penalized rewards, a BAO update on a tiny model moves probability toward the
trajectory with fewer user turns (and plain GRPO does not move), the metrics on hand-made episodes, config
errors, registration and claims, and (slow) the smoke preset through the CLI."""
import dataclasses
import json
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments import bao as exp
from experiments import registry
from experiments.bao import agent, train
from experiments.bao import run as bao_run
from experiments.bao import turtle as tt_gym
from experiments.runner import splits
from experiments.runner import claims as claims_lib
from jaxlab import losses
from experiments.bao import function as fn_gym
from jaxlab.models import transformer as tfm
from experiments.bao import objective as bao_lib
from jaxlab.rl import grpo as grpo_lib
from experiments.bao import turns
from jaxlab.train import rl_loop, state as state_lib
from experiments._shared import recipes

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
LIMITS = {"function": 15, "telepathy": 12, "turtle": 15}  # the paper: 15 Function, 15 Turtle, 12 Telepathy


def _make(gym):
  return lambda: agent.make_env(gym, LIMITS[gym])


@pytest.mark.parametrize("gym", agent.GYMS)
def test_experts_solve_every_episode_within_the_turn_limit(gym):
  for seed in range(120):
    for enhanced in (False, True):
      ep = agent.expert_episode(_make(gym), gym, seed, enhanced)
      assert ep.turns[-1].info.get("correct") and ep.turns[-1].done, (gym, seed)
      assert len(ep.turns) <= LIMITS[gym] and not any(t.info.get("truncated") for t in ep.turns)
      replies = [m["content"] for m in ep.history if m["role"] == "assistant"]
      if enhanced:  # retrospective reasoning, then the plan, then the call
        assert all(r.startswith("recall : ") and r.index(" plan : ") < r.index("[") for r in replies)
      else:
        assert all(r.startswith("[") for r in replies)
  if gym == "function":  # the first probe leaves at most two rules; the second always separates them
    assert all(len(g) == 2 for g in agent.SECOND_PROBES)


def test_calculator_equals_every_rule_and_rejects_non_arithmetic():
  rng = np.random.default_rng(0)
  for rule in fn_gym.RULES:
    for nums in rng.integers(1, 10, size=(20, 4)):
      want = fn_gym.evaluate(rule, nums)
      got = agent.calc(agent.rule_text(rule, nums))
      assert (math.isnan(want) and math.isnan(got)) or got == pytest.approx(want, rel=1e-12)
  for bad in ("__import__('os')", "2 ^ 99", "1 / 0", "calc"):
    assert math.isnan(agent.calc(bad))
  assert agent.resolve("think [answer] calc ( 2 + 3 ) * 4") == "[answer] 20"
  # a, b, c, d: the test case of the last search in the history; unbound before any search
  history = [{"role": "user", "content": "test case: 1 1 1 1"}, {"role": "assistant", "content": "[search] test"},
             {"role": "user", "content": "test case: 3 5 2 7"}]
  assert agent.resolve("[answer] calc a * ( b + c ) / d", history) == "[answer] 3"
  assert agent.resolve("[answer] calc a * ( b + c ) / d", []) == "[answer] invalid"
  assert agent.resolve("[action] is it calc ?") == "[action] is it calc ?"


def _codec():
  eps = [agent.expert_episode(_make(g), g, s, e) for g in agent.GYMS for s in range(20) for e in (False, True)]
  eps += [agent.random_episode(_make(g), g, s) for g in agent.GYMS for s in range(20)]
  return agent.WordCodec([m["content"] for e in eps for m in e.history])


def test_sft_rows_hold_the_reasoning_and_mask_only_the_replies():
  codec = _codec()
  for gym in agent.GYMS:
    ep = agent.expert_episode(_make(gym), gym, 3, True)
    (ids, mask), = agent.sft_rows(codec, ep.history)
    assert ids == codec.prompt(ep.history[:-1])[:-1]  # the row is the whole conversation
    spans, cur = [], []
    for i, m in zip(ids, mask):
      if m:
        cur.append(i)
      elif cur:
        spans, cur = spans + [cur], []
    spans += [cur] if cur else []
    replies = [m["content"] for m in ep.history if m["role"] == "assistant"]
    assert [codec.decode(s) for s in spans] == [" ".join(agent.words(r)) for r in replies]
    assert all(s[-1] == agent.EOS for s in spans)
    masked_out = codec.decode([i for i, m in zip(ids, mask) if not m])
    assert "recall" not in masked_out and all("recall :" in codec.decode(s) for s in spans)


def _episode(codec, gym, seed, replies, rewards, users):
  recs = [train.TurnRecord(codec.prompt([{"role": "user", "content": f"task {seed}"}]), codec.reply(r),
                           [0.0] * len(codec.reply(r)), float(w), bool(u), w > 0)
          for r, w, u in zip(replies, rewards, users)]
  return train.Played(gym, seed, recs, [])


def test_loss_batch_carries_userrl_advantages_of_the_penalized_rewards():
  codec = _codec()
  rng = np.random.default_rng(1)
  calls = ["[search] test", "[action] 1 2 3 4", "[answer] calc 1 + 2", "[action] is it animal ?"]
  eps = []
  for b in range(6):
    n = int(rng.integers(1, 5))
    eps.append(_episode(codec, "function", b // 3, [calls[k] for k in rng.integers(0, 4, size=n)],
                        rng.choice([0.0, 1.0], size=n), rng.random(n) < 0.5))
  reg = bao_lib.Regularizers(0.1, 0.2, 8, 0.5)
  credit = turns.TurnCredit(credit="R2G", score="R2G")
  advs = train.episode_advantages(eps, [0, 0, 0, 1, 1, 1], reg, credit)
  batch = train.grpo_batch(eps, advs, 16, 32, 64, 400)
  # the oracle: turns.turn_advantages on the penalties added by hand, tokens laid out turn after turn
  hand = []
  for e in eps:
    r, u = [t.reward for t in e.turns], [t.user for t in e.turns]
    f = [x > 0 for x in r]
    p = [r[k] - 0.1 * u[k] - 0.2 * (k > 0 and u[k] and u[k - 1] and not f[k] and not f[k - 1]) for k in range(len(r))]
    p[-1] -= 0.5 * max(0, sum(len(t.reply) for t in e.turns) - 8) / 8
    hand.append(p)
  lens = [[len(t.reply) for t in e.turns] for e in eps]
  width = max(sum(x) for x in lens)
  idx = np.full((6, width), -1, np.int32)
  for b, ls in enumerate(lens):
    idx[b, :sum(ls)] = np.repeat(np.arange(len(ls)), ls)
  want = np.asarray(turns.turn_advantages(*turns.pad_rewards(hand), idx, (idx >= 0).astype(np.int32),
                                          np.array([0, 0, 0, 1, 1, 1]), credit))
  row = 0
  for b, e in enumerate(eps):
    for t, turn in enumerate(e.turns):
      np.testing.assert_allclose(want[b][idx[b] == t], batch["advantages"][row], atol=1e-6)
      n = len(turn.reply)
      assert batch["tokens"][row, :n].tolist() == turn.reply and batch["completion_mask"][row].sum() == n
      assert batch["prompt"][row][batch["prompt_mask"][row] == 1].tolist() == turn.prompt
      row += 1
  assert batch["advantages"].shape[0] % 32 == 0 and not batch["completion_mask"][row:].any()
  # minibatches: every turn exactly once, each batch exactly `size` rows
  mbs = train.minibatches(eps, advs, 4, 16, 64, 400, np.random.default_rng(0))
  assert all(m["tokens"].shape[0] == 4 for m in mbs)
  seen = sorted((tuple(m["tokens"][i]), float(m["advantages"][i])) for m in mbs for i in range(4)
                if m["completion_mask"][i].any())
  assert seen == sorted((tuple(batch["tokens"][i]), float(batch["advantages"][i])) for i in range(row))


def test_bao_update_moves_probability_to_fewer_user_turns_and_grpo_does_not():
  codec = _codec()
  model = tfm.Config(vocab_size=codec.vocab_size, d_model=32, n_layers=1, n_heads=2, d_ff=64,
                     max_position_embeddings=64, eos_token_id=agent.EOS, pad_token_id=agent.PAD)
  params = tfm.init(model, jax.random.PRNGKey(0))
  ask, look = "[action] 1 2 3 4", "[search] test"
  # one group: both trajectories solve in one turn, one by asking the user, one by searching
  eps = [_episode(codec, "function", 0, [ask], [1.0], [True]), _episode(codec, "function", 0, [look], [1.0], [False])]
  gcfg = grpo_lib.GRPOConfig(prompts_per_batch=1, group_size=2, max_new_tokens=8, aggregation="token_mean")
  tx = recipes.optimizer(1e-2, "adamw", weight_decay=0.0)

  b0 = train.grpo_batch(eps, [[0.0], [0.0]], 8, 2, 16, 64)
  logp = jax.jit(lambda p: losses.completion_logprobs(p, model, b0["prompt"], b0["prompt_mask"], b0["tokens"])[0])

  def gap(p):  # log p(search reply) - log p(ask reply) after the task prompt
    s = np.asarray((logp(p) * b0["completion_mask"]).sum(1))
    return s[1] - s[0]

  step = rl_loop.jit_grpo_step(rl_loop.make_grpo_step(model, gcfg, tx))
  out = {}
  for name, reg in (("grpo", bao_lib.Regularizers()), ("bao", bao_lib.Regularizers(user_weight=0.1))):
    batch = train.grpo_batch(eps, train.episode_advantages(eps, [0, 0], reg, turns.TurnCredit()), 8, 2, 16, 64)
    batch["old_logp"] = np.asarray(logp(params) * b0["completion_mask"])
    state = state_lib.init_state(lambda _: params, tx, 0)
    for _ in range(3):
      state, _ = step(state, batch)
    out[name] = gap(state.params)
  assert out["grpo"] == pytest.approx(gap(params), abs=1e-6)
  assert out["bao"] > gap(params) + 0.1


def test_metrics_on_hand_made_episodes():
  codec = _codec()
  eps = [_episode(codec, "function", 0, ["[search] test", "[action] 1 2 3 4", "[answer] 3"], [0, 0, 1], [0, 1, 0]),
         _episode(codec, "function", 1, ["[action] 1", "[action] 2", "[answer] 3"], [0, 0, 1], [1, 1, 0]),
         _episode(codec, "function", 2, ["[action] 1", "[finish]"], [0, 0], [1, 0])]
  m = train.metrics(eps)
  assert m["score"] == pytest.approx(2 / 3) and m["pass_u1"] == pytest.approx(1 / 3)
  assert m["user_rate"] == pytest.approx(4 / 8) and m["solved"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("kw,match", [
    (dict(gyms=("function", "chess")), "bao: gyms must be one of .* found 'chess'"),
    (dict(methods=("bao", "dpo")), "bao: methods must be one of .* found 'dpo'"),
    (dict(max_turns=(15, 15)), "bao: max_turns must be 3 positive turn limits"),
    (dict(credit="Mean"), "bao: credit must be one of .* found 'Mean'"),
    (dict(group=1), "bao: group must be >= 2"),
    (dict(test_share=1.0), "bao: test_share must be in \\(0, 1\\)"),
])
def test_config_errors_are_one_line(kw, match):
  with pytest.raises(ValueError, match=match) as e:
    exp.Config(**kw)
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("preset", ["smoke", "cpu"])
def test_each_gym_gets_the_papers_turn_limit(preset):
  cfg = exp.PRESETS[preset]
  want = LIMITS if preset == "cpu" else dict.fromkeys(agent.GYMS, 4)  # smoke: 4 turns everywhere
  assert dict(zip(agent.GYMS, exp.Config().max_turns)) == LIMITS
  pooled = bao_run.pools(cfg)
  for split in ("train", "test"):
    got = {g: make().max_turns for g, make in bao_run.env_makers(cfg, pooled[split]).items()}
    assert got == want, (split, got)


def _corpus_text(episodes) -> str:
  return " ".join(" ".join(agent.words(m["content"])) for e in episodes for m in e.history)


@pytest.mark.parametrize("seed", [0, 3])
def test_training_and_evaluation_items_are_disjoint_and_training_never_shows_held_out_ones(seed, tmp_path):
  cfg = dataclasses.replace(exp.PRESETS["smoke"], seed=seed)
  pooled = bao_run.pools(cfg)
  full = {"function": fn_gym.RULES, "telepathy": bao_run.entity_pool(cfg), "turtle": tt_gym.PUZZLES}
  for g in agent.GYMS:
    train_, test_ = pooled["train"][g], pooled["test"][g]
    assert not set(train_) & set(test_) and sorted(map(str, train_ + test_)) == sorted(map(str, full[g]))
    assert len(test_) == math.ceil(cfg.test_share * len(full[g]))
  items = bao_run.split_items(pooled)
  assert set(items["train"]) == {"rules", "entities", "puzzles"} and splits.overlaps(splits.hashed(items)) == []
  wrote = splits.record(str(tmp_path), "bao", items)
  assert splits.read(str(tmp_path)) == json.loads(json.dumps(wrote))
  assert wrote["test"]["rules"] == [splits.digest(r) for r in pooled["test"]["function"]]
  leaky = {**items, "test": {**items["test"], "rules": items["test"]["rules"] + items["train"]["rules"][:1]}}
  with pytest.raises(splits.SplitOverlap):
    splits.record(str(tmp_path), "bao", leaky)
  # no pretraining or SFT episode draws or names a held-out rule, entity or puzzle
  makes = bao_run.env_makers(cfg, pooled["train"])
  data = bao_run.corpora(cfg, makes, pooled["train"])
  text = " " + _corpus_text(e for kind in data.values() for e in kind) + " "
  for rule in pooled["test"]["function"]:
    assert f" {agent.rule_text(rule)} " not in text, rule
  for e in pooled["test"]["telepathy"]:
    assert f" {e.name} " not in text, e.name
  for p in pooled["test"]["turtle"]:
    assert " ".join(agent.words(p.surface)) not in text, p.title
  for p in pooled["train"]["turtle"][:1]:  # the check can fail: training surfaces are in the text
    assert " ".join(agent.words(p.surface)) in text


def test_registration_and_claims_on_known_results():
  reg = registry.get("bao")
  assert reg.paper == "bao" and {c.id for c in reg.claims} == {"function", "telepathy"}
  res = {f"{k}.{g}.{m}": 0.5 for k in ("score", "pass_u1", "user_rate") for g in exp.GYMS for m in exp.METHODS}
  res.update({"score.function.bao": 0.9, "score.function.grpo_userrl": 0.8, "user_rate.function.bao": 0.3,
              "user_rate.telepathy.bao": 0.6, "score.telepathy.bao": 0.4})
  got = {c.id: claims_lib.holds(c, res) for c in reg.claims}
  assert got == {"function": True, "telepathy": False}
  assert all(claims_lib.measurable(c, res) for c in reg.claims)
  # both methods at the floor (or both at the ceiling): the score half tells nothing
  tele = next(c for c in reg.claims if c.id == "telepathy")
  for v in (0.0, 1.0):
    assert claims_lib.measurable(tele, {**res, "score.telepathy.bao": v, "score.telepathy.grpo_userrl": v}) is False
  assert claims_lib.measurable(tele, {**res, "score.telepathy.bao": 0.1, "score.telepathy.grpo_userrl": 0.0})


def test_bad_gym_from_the_cli_is_one_line_before_any_work(tmp_path):
  env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-m", "experiments", "run", "bao", "--preset", "smoke", "--set",
                         "gyms=function,chess"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  err = proc.stderr.strip().splitlines()
  assert len(err) == 1 and "gyms must be one of" in err[0] and "'chess'" in err[0], proc.stderr
  assert not (tmp_path / "runs" / "bao" / "results.json").exists()


@pytest.mark.slow
def test_smoke_preset_from_the_cli(tmp_path):
  env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu", "JAXLAB_NO_PROGRESS": "1"}
  proc = subprocess.run([sys.executable, "-m", "experiments", "run", "bao", "--preset", "smoke", "--out", "run"],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  res = json.loads((tmp_path / "run" / "results.json").read_text())
  want = {f"{k}.{g}.{m}" for k in ("score", "pass_u1", "user_rate") for g in exp.GYMS for m in exp.METHODS}
  assert set(res) - set(registry.RUNNER_KEYS) == want
  assert all(0.0 <= res[k] <= 1.0 for k in want)
  rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  assert {r["phase"] for r in rows} >= {"pretrain", "sft", "sft_plain", "grpo_userrl", "bao", "eval"}
  assert (tmp_path / "run" / "rl_score.png").exists() and (tmp_path / "run" / "rl_user_rate.png").exists()
