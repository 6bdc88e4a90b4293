"""Two CPU processes (jax.distributed + gloo, started by tpu_gpu_scripts/launch_local.sh) train like one.

Run as a script (`python test_multiprocess_train.py --worker DIR`) this file is the worker: each process
feeds its half of every global batch, trains on a data x fsdp mesh spanning both processes, checkpoints
with orbax from both processes, and process 0 writes the per-step losses.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS, B, T = 4, 8, 16
MESH, RULES = "data:2,fsdp:2", "fsdp"


def _setup():
  import optax
  from jaxlab.models import transformer as tfm
  cfg = tfm.Config.tiny()
  return cfg, optax.adamw(1e-3, eps=1e-6), (lambda k: tfm.init(cfg, k))


def _global_batch(i, vocab):
  rng = np.random.default_rng(100 + i)
  toks = rng.integers(0, vocab, (B, T + 1)).astype(np.int32)
  mask = (rng.random((B, T)) < 0.9).astype(np.int32)
  return {"inputs": toks[:, :-1], "targets": toks[:, 1:], "loss_mask": mask}


def _train(out_dir, mesh_spec=None, rows=None):
  """Trains STEPS steps; `rows` = (process index, process count) selects this process's rows."""
  from jaxlab import sharding as shd
  from jaxlab.train import loop, state as st, step as sp
  from jaxlab.models import transformer as tfm
  from jaxlab.train.checkpoint import Checkpointer
  cfg, tx, init = _setup()
  mesh = shd.make_mesh(mesh_spec) if mesh_spec else None
  state = st.init_state(init, tx, seed=0, mesh=mesh, rules=RULES, axes=tfm.AXES)
  step = sp.jit_train_step(sp.make_train_step(sp.lm_loss_fn(cfg), tx, mesh=mesh), state, mesh, RULES, axes=tfm.AXES)

  def batches():
    for i in range(STEPS):
      b = _global_batch(i, cfg.vocab_size)
      if rows is not None:
        pid, n = rows
        b = {k: v[pid * B // n:(pid + 1) * B // n] for k, v in b.items()}
      yield b
  ckpt = Checkpointer(os.path.join(out_dir, "ckpt"), keep=1) if out_dir else None
  shard = (lambda b: shd.shard_batch(b, mesh)) if mesh is not None else None
  pid = rows[0] if rows else 0
  res = loop.train_loop(state, step, batches(), STEPS, shard_fn=shard, checkpointer=ckpt,
                        data_state_fn=lambda: {"process": pid, "rows": B // (rows[1] if rows else 1)})
  if ckpt is not None:
    ckpt.close()
  return [r["loss"] for r in res.history], res.state


def _worker(out_dir):
  from jaxlab import sharding
  pid, n = sharding.initialize_distributed()
  import jax
  jax.config.update("jax_default_matmul_precision", "highest")
  assert n == 2 and jax.device_count() == 4 and jax.local_device_count() == 2, (n, jax.devices())
  losses, state = _train(out_dir, MESH, rows=(pid, n))
  q = state.params["layers"]["attn"]["q"]["kernel"]
  assert not q.is_fully_addressable  # the params really span both processes
  if pid == 0:
    with open(os.path.join(out_dir, "losses.json"), "w") as f:
      json.dump({"losses": losses, "processes": n, "devices": jax.device_count()}, f)


@pytest.mark.slow
def test_two_processes_train_like_one(tmp_path, launch_two_workers):
  launch_two_workers(__file__)
  got = json.loads((tmp_path / "losses.json").read_text())
  assert got["processes"] == 2 and got["devices"] == 4

  import jax
  from jaxlab.train.checkpoint import Checkpointer
  want, state = _train(None)  # one process, one device, the full batches
  np.testing.assert_allclose(got["losses"], want, atol=1e-5)
  assert len(set(want)) == STEPS  # the steps really updated the params
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), state)
  restored = Checkpointer(tmp_path / "ckpt").restore(STEPS, target=target)  # written jointly by both processes
  assert restored.data_state == {"per_process": [{"process": 0, "rows": B // 2}, {"process": 1, "rows": B // 2}]}
  assert int(restored.state.step) == STEPS
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5),
               restored.state.params, jax.device_get(state.params))


def test_launch_local_sets_env_and_propagates_failure(tmp_path):
  # Each process records its environment (written whole, then renamed); process 2 fails, but only once the
  # others have written, since the launcher stops the rest as soon as one fails.
  script = """if True:
    import os, sys, time
    e, out = os.environ, sys.argv[1]
    pid = int(e["JAXLAB_PROCESS_ID"])
    with open(os.path.join(out, f"tmp{pid}"), "w") as f:
      f.write(" ".join([e["JAXLAB_COORDINATOR"], e["JAXLAB_NUM_PROCESSES"], e["XLA_FLAGS"]]))
    os.replace(os.path.join(out, f"tmp{pid}"), os.path.join(out, f"p{pid}"))
    if pid == 2:
      deadline = time.time() + 50
      while not all(os.path.exists(os.path.join(out, f"p{i}")) for i in (0, 1)) and time.time() < deadline:
        time.sleep(0.05)
      sys.exit(3)
  """
  launch = os.path.join(REPO, "tpu_gpu_scripts", "launch_local.sh")
  proc = subprocess.run(["bash", launch, "-n", "3", "-d", "4", "--", sys.executable, "-c", script, str(tmp_path)],
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 3 and "process 2 exited with 3" in proc.stderr
  seen = [(tmp_path / f"p{i}").read_text().split() for i in range(3)]
  assert len({s[0] for s in seen}) == 1 and seen[0][0].startswith("127.0.0.1:")
  assert all(s[1] == "3" and s[2] == "--xla_force_host_platform_device_count=4" for s in seen)
  ok = subprocess.run(["bash", launch, "-n", "2", "--", sys.executable, "-c", "print('hello')"], capture_output=True,
                      text=True, timeout=60)
  assert ok.returncode == 0 and "hello" in ok.stdout


if __name__ == "__main__":
  if len(sys.argv) == 3 and sys.argv[1] == "--worker":
    sys.path.insert(0, REPO)
    _worker(sys.argv[2])
  else:
    sys.exit(f"usage: {sys.argv[0]} --worker OUT_DIR")
