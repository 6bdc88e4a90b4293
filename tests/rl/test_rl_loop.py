"""The GRPO loop: bit-exact resume after the process is killed (SIGKILL), metrics.jsonl, old log-probs kept over
several updates, no reference forward at beta 0, and the sharded update equal to the single-device one.

Run as a script (`python test_rl_loop.py CKPT_DIR`) this file is the worker that the kill test kills."""
import dataclasses
import os
import signal
import subprocess
import sys

import numpy as np
import optax
import pytest

import jax

from jaxlab import sharding as shd
from jaxlab.models import transformer as tfm
from jaxlab.rl import GRPOConfig, PromptCycle, as_batch, group_advantages, sample_rollout
from jaxlab.train import Checkpointer
from jaxlab.train import metrics as metrics_lib
from jaxlab.train import rl_loop
from jaxlab.train import state as st

CFG = tfm.Config.tiny(vocab_size=32, d_model=32, n_heads=2, n_kv_heads=1, d_ff=64, init_std=0.3,
                      eos_token_id=None, pad_token_id=0)
GCFG = GRPOConfig(prompts_per_batch=2, group_size=4, max_new_tokens=6, beta=0.04, clip_low=0.2, clip_high=0.28,
                  aggregation="token_mean", updates_per_batch=2, stop_tokens=(5,))
ITERS, KILL_AT = 6, 5


def reward(texts, examples):
  """Fraction of completion tokens equal to 7 (texts are token lists without a decode)."""
  return np.array([sum(t == 7 for t in toks) / GCFG.max_new_tokens for toks in texts], np.float32)


_STATES, _STEPS = {}, {}


def setup(gcfg=GCFG, spec=None, rules="dp", opt="adam"):
  """A fresh (copied) initial state, its reference copy, the jitted step and the prompts; compiled once per setting."""
  tx = optax.adam(3e-2) if opt == "adam" else optax.sgd(0.05)
  mesh = shd.make_mesh(spec) if spec else None
  if (spec, rules, opt) not in _STATES:
    _STATES[spec, rules, opt] = st.init_state(lambda k: tfm.init(CFG, k), tx, seed=0, mesh=mesh, rules=rules,
                                              axes=tfm.AXES)
  state = jax.tree.map(lambda x: x.copy(), _STATES[spec, rules, opt])
  if (gcfg, spec, rules, opt) not in _STEPS:
    _STEPS[gcfg, spec, rules, opt] = rl_loop.jit_grpo_step(rl_loop.make_grpo_step(CFG, gcfg, tx), state, mesh, rules,
                                                           axes=tfm.AXES)
  ref = jax.tree.map(lambda x: x.copy(), state.params)
  prompts = PromptCycle([{"prompt": [1 + i, 9, 3 + i]} for i in range(5)], gcfg.prompts_per_batch)
  return state, ref, _STEPS[gcfg, spec, rules, opt], prompts


def _worker(ckpt_dir):
  state, ref, step, prompts = setup()
  calls = [0]

  def killing_reward(texts, examples):
    calls[0] += 1
    if calls[0] == KILL_AT:
      os.kill(os.getpid(), signal.SIGKILL)
    return reward(texts, examples)
  rl_loop.rl_loop(state, CFG, GCFG, step, prompts, killing_reward, ITERS, ref_params=ref,
                  checkpointer=Checkpointer(ckpt_dir, keep=None, async_=False), ckpt_every=2,
                  metrics_path=os.path.join(ckpt_dir, "..", "metrics.jsonl"))


@pytest.mark.slow
def test_resume_after_kill_is_bit_exact(tmp_path):
  env = dict(os.environ, JAXLAB_NO_PROGRESS="1")
  proc = subprocess.run([sys.executable, __file__, str(tmp_path / "ckpt")], env=env, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
  ckpt = Checkpointer(tmp_path / "ckpt", keep=None, async_=False)
  assert ckpt.all_steps() == [2, 4]
  records = metrics_lib.read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert [r["step"] for r in records] == [1, 2, 3, 4]
  for key in ("reward", "kl", "clip_frac", "entropy", "response_length", "loss", "updates"):
    assert all(np.isfinite(r[key]) for r in records), key
  assert records[-1]["updates"] == 8 and records[-1]["kl"] > 0

  state, ref, step, prompts = setup()
  full = rl_loop.rl_loop(state, CFG, GCFG, step, prompts, reward, ITERS, ref_params=ref)
  state, ref, step, prompts = setup()
  resumed = rl_loop.rl_loop(state, CFG, GCFG, step, prompts, reward, ITERS, ref_params=ref, checkpointer=ckpt,
                            resume=True, metrics_path=str(tmp_path / "metrics.jsonl"))
  assert [r["step"] for r in resumed.history] == [5, 6]
  for a, b in zip(jax.tree.leaves((resumed.state, resumed.ref_params)), jax.tree.leaves((full.state, full.ref_params))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  for got, want in zip(resumed.history, full.history[4:]):
    assert {k: v for k, v in got.items() if k != "time_s"} == {k: v for k, v in want.items() if k != "time_s"}
  assert ckpt.all_steps() == [2, 4, 6] and prompts.get_state() == {"pos": 12}


BETA0 = GRPOConfig(prompts_per_batch=2, group_size=4, max_new_tokens=6, beta=0.0, updates_per_batch=3,
                   clip_low=0.1, clip_high=0.1, stop_tokens=(5,))


def test_old_logprobs_are_kept_over_updates_and_beta_zero_skips_the_reference(monkeypatch):
  state, _, step, prompts = setup(BETA0)
  ro = sample_rollout(state.params, CFG, prompts.prompts(next(prompts)), [{}] * 2, group_size=4, max_new_tokens=6,
                      key=jax.random.key(0), stop_tokens=(5,))
  batch = as_batch(ro, group_advantages(np.arange(8.0) % 3, 4))
  ratios, clips = [], []
  for _ in range(3):
    state, m = step(state, batch)
    ratios.append(float(m["ratio"]))
    clips.append(float(m["clip_frac"]))
  assert abs(ratios[0] - 1) < 1e-5 and clips[0] == 0 and abs(ratios[2] - 1) > 1e-3 and clips[2] > 0

  def no_reference(*a, **k):
    raise AssertionError("beta = 0 must not run the reference")
  monkeypatch.setattr(rl_loop, "_reference_logp", no_reference)
  state, _, step, prompts = setup(BETA0)
  out = rl_loop.rl_loop(state, CFG, BETA0, step, prompts, reward, 2)
  assert out.ref_params is None and [r["kl"] for r in out.history] == [0.0, 0.0]
  assert [r["updates"] for r in out.history] == [3, 6]
  # continuous-batching rollouts (3 slots for 8 rows): their old log-probs are the policy's own (first ratio 1)
  slotted = dataclasses.replace(BETA0, updates_per_batch=1, rollout_slots=3)
  state, _, step, prompts = setup(slotted)
  out = rl_loop.rl_loop(state, CFG, slotted, step, prompts, reward, 1)
  assert abs(out.history[0]["ratio"] - 1) < 1e-5 and out.history[0]["clip_frac"] == 0


def test_sharded_update_equals_single_device():
  state, ref, _, prompts = setup(opt="sgd")
  ro = sample_rollout(state.params, CFG, prompts.prompts(next(prompts)), [{}] * 2, group_size=4, max_new_tokens=6,
                      key=jax.random.key(3), stop_tokens=(5,))
  ref = jax.tree.map(lambda x: x + 0.01, ref)
  ref_logp = rl_loop._reference_logp(ref, ro.prompt, ro.prompt_mask, ro.tokens, CFG, 1.0)
  batch = as_batch(ro, group_advantages(np.arange(8.0) % 3, 4), np.asarray(ref_logp) * ro.completion_mask)
  results = []
  for spec, rules in [(None, "dp"), ("data:2,fsdp:2,tensor:2", "fsdp_tp")]:
    state, _, step, _ = setup(spec=spec, rules=rules, opt="sgd")
    b = shd.shard_batch(batch, shd.make_mesh(spec)) if spec else batch
    for _ in range(2):
      state, m = step(state, b)
    if spec:
      assert any(s is not None for s in state.params["layers"]["mlp"]["up"]["kernel"].sharding.spec)
    results.append((jax.device_get(state.params), float(m["loss"]), float(m["kl"])))
  (p0, loss0, kl0), (p1, loss1, kl1) = results
  assert kl0 > 0
  np.testing.assert_allclose(loss1, loss0, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(kl1, kl0, rtol=1e-4, atol=1e-8)
  for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p0)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  # The whole loop on the mesh: rollouts from sharded params, the batch sharded over rows.
  spec = "data:2,fsdp:2,tensor:2"
  state, ref, step, prompts = setup(spec=spec, rules="fsdp_tp", opt="sgd")
  want = state.params["layers"]["mlp"]["up"]["kernel"].sharding
  out = rl_loop.rl_loop(state, CFG, GCFG, step, prompts, reward, 1, ref_params=ref, mesh=shd.make_mesh(spec))
  assert out.history[0]["updates"] == 2 and np.isfinite(out.history[0]["loss"])
  assert out.state.params["layers"]["mlp"]["up"]["kernel"].sharding == want


if __name__ == "__main__":
  os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  jax.config.update("jax_default_matmul_precision", "highest")
  _worker(sys.argv[1])
