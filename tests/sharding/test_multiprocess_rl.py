"""Two CPU processes (jax.distributed + gloo, started by tpu_gpu_scripts/launch_local.sh) run GRPO like one.

Run as a script (`python test_multiprocess_rl.py --worker DIR`) this file is the worker: both processes sample the
same rollouts from a policy sharded over a data x fsdp mesh spanning them, each updates on its half of the rows,
the run checkpoints after every iteration, stops, and resumes from that checkpoint in fresh objects; process 0
writes the records of every iteration.
"""
import json
import os
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIRST, ITERS = 2, 4
MESH, RULES = "data:2,fsdp:2", "fsdp"
KEYS = ("reward", "reward_std", "response_length", "loss", "kl", "clip_frac", "entropy")


def _setup(mesh):
  import jax
  import optax
  from jaxlab.models import transformer as tfm
  from jaxlab.rl import GRPOConfig, PromptCycle
  from jaxlab.train import rl_loop, state as st
  cfg = tfm.Config.tiny(vocab_size=32, d_model=32, n_heads=2, n_kv_heads=1, d_ff=64, init_std=0.3,
                        eos_token_id=None, pad_token_id=0)
  gcfg = GRPOConfig(prompts_per_batch=2, group_size=4, max_new_tokens=6, beta=0.04, clip_low=0.2, clip_high=0.28,
                    aggregation="token_mean", updates_per_batch=2, stop_tokens=(5,))
  tx = optax.sgd(0.5)
  state = st.init_state(lambda k: tfm.init(cfg, k), tx, seed=0, mesh=mesh, rules=RULES, axes=tfm.AXES)
  ref = jax.tree.map(lambda x: x.copy(), state.params)
  step = rl_loop.jit_grpo_step(rl_loop.make_grpo_step(cfg, gcfg, tx), state, mesh, RULES, axes=tfm.AXES)
  prompts = PromptCycle([{"prompt": [1 + i, 9, 3 + i]} for i in range(5)], gcfg.prompts_per_batch)
  return cfg, gcfg, state, ref, step, prompts


def _reward(texts, examples):
  """Share of completion tokens equal to 7 (texts are token lists without a decode)."""
  return np.array([sum(t == 7 for t in toks) / 6 for toks in texts], np.float32)


def _worker(out_dir):
  from jaxlab import sharding
  pid, n = sharding.initialize_distributed()
  import jax
  jax.config.update("jax_default_matmul_precision", "highest")
  from jaxlab.train import rl_loop
  from jaxlab.train.checkpoint import Checkpointer
  assert n == 2 and jax.device_count() == 4 and jax.local_device_count() == 2, (n, jax.devices())
  mesh = sharding.make_mesh(MESH)
  ckpt = Checkpointer(os.path.join(out_dir, "ckpt"), keep=None, async_=False)
  rows = []

  def counted(step):
    def f(state, batch):
      rows.append(batch["tokens"].shape[0])  # the global batch the update sees
      return step(state, batch)
    return f
  cfg, gcfg, state, ref, step, prompts = _setup(mesh)
  first = rl_loop.rl_loop(state, cfg, gcfg, counted(step), prompts, _reward, FIRST, ref_params=ref, mesh=mesh,
                          checkpointer=ckpt, ckpt_every=1)
  cfg, gcfg, state, ref, step, prompts = _setup(mesh)
  second = rl_loop.rl_loop(state, cfg, gcfg, counted(step), prompts, _reward, ITERS, ref_params=ref, mesh=mesh,
                           checkpointer=ckpt, resume=True)
  q = second.state.params["layers"]["attn"]["q"]["kernel"]
  assert not q.is_fully_addressable  # the policy really spans both processes
  ckpt.close()
  if pid == 0:
    with open(os.path.join(out_dir, "history.json"), "w") as f:
      json.dump({"history": first.history + second.history, "processes": n, "rows": rows}, f)


@pytest.mark.slow
def test_two_processes_run_grpo_like_one_and_resume(tmp_path, launch_two_workers):
  launch_two_workers(__file__)
  got = json.loads((tmp_path / "history.json").read_text())
  assert got["processes"] == 2 and [r["step"] for r in got["history"]] == [1, 2, 3, 4]
  assert got["rows"] == [8] * 8  # P * G rows per update, 2 updates per iteration: each process feeds half

  import jax
  from jaxlab.train import rl_loop
  from jaxlab.train.checkpoint import Checkpointer
  cfg, gcfg, state, ref, step, prompts = _setup(None)
  want = rl_loop.rl_loop(state, cfg, gcfg, step, prompts, _reward, ITERS, ref_params=ref)  # one process, one device
  assert len({r["reward"] for r in want.history}) > 1 and want.history[-1]["kl"] > 0  # the policy really moved
  for g, w in zip(got["history"], want.history):
    assert (g["step"], g["updates"]) == (w["step"], w["updates"])
    np.testing.assert_allclose([g[k] for k in KEYS], [w[k] for k in KEYS], rtol=1e-4, atol=1e-6)
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  tree = {"train": want.state, "ref": want.ref_params}
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), tree)
  ckpt = Checkpointer(tmp_path / "ckpt")
  assert ckpt.all_steps() == [1, 2, ITERS]  # every iteration of the first run, the end of the resumed one
  restored = ckpt.restore(ITERS, target=target)  # written jointly by both processes
  assert restored.data_state == {"per_process": [{"pos": 2 * ITERS}, {"pos": 2 * ITERS}]}
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=2e-4),
               restored.state["train"].params, jax.device_get(want.state.params))


if __name__ == "__main__":
  if len(sys.argv) == 3 and sys.argv[1] == "--worker":
    sys.path.insert(0, REPO)
    _worker(sys.argv[2])
  else:
    sys.exit(f"usage: {sys.argv[0]} --worker OUT_DIR")
