"""Training loop, schedules, metrics: closed forms, non-finite stop, checkpoint/resume, metrics.jsonl."""
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlab.train import loop as loop_lib
from jaxlab.train import metrics as metrics_lib
from jaxlab.train import schedules
from jaxlab.train import state as st
from jaxlab.train import step as sp
from jaxlab.train.checkpoint import Checkpointer


def _cosine_closed_form(s, peak, total, warm, floor):
  if s < warm:
    return peak * (s + 1) / warm
  p = min(1.0, (s - warm) / max(1, total - warm))
  return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p)))


@pytest.mark.parametrize("total,warm,floor", [(100, 10, 0.1), (50, 0, 0.0), (7, 7, 0.5)])
def test_warmup_cosine_closed_form(total, warm, floor):
  sched = schedules.warmup_cosine(3e-3, total, warm, floor)
  steps = np.arange(total + 5)
  got = np.asarray(jax.jit(jax.vmap(sched))(steps))
  want = np.array([_cosine_closed_form(int(s), 3e-3, total, warm, floor) for s in steps])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9)
  if warm:
    assert got[warm - 1] == pytest.approx(3e-3) and got[0] == pytest.approx(3e-3 / warm)
  assert got[-1] == pytest.approx(3e-3 * floor, abs=1e-9)  # holds the floor past the end


def test_other_schedules_closed_form():
  lin = schedules.get("linear", 1.0, 20, 4, 0.25)
  const = schedules.get("constant", 2.0, 20, 4)
  for s in range(25):
    p = min(1.0, max(0, s - 4) / 16)
    want_lin = (s + 1) / 4 if s < 4 else 1.0 - 0.75 * p
    assert float(lin(s)) == pytest.approx(want_lin, rel=1e-6)
    assert float(const(s)) == pytest.approx(2.0 * (s + 1) / 4 if s < 4 else 2.0, rel=1e-6)
  with pytest.raises(ValueError, match="warmup_steps"):
    schedules.warmup_cosine(1.0, 10, 11)
  with pytest.raises(ValueError, match="unknown schedule"):
    schedules.get("step", 1.0, 10)


def test_mfu_and_peak_cache(monkeypatch, tmp_path):
  monkeypatch.setattr(metrics_lib, "_CACHE", str(tmp_path / "peak.json"))
  monkeypatch.delenv("JAXLAB_PEAK_FLOPS", raising=False)
  metrics_lib.peak_flops.cache_clear()
  calls = []
  rates = iter([3e10, 5e10])
  monkeypatch.setattr(metrics_lib, "measure_numpy_gemm_flops", lambda: calls.append(1) or next(rates))
  monkeypatch.setattr(metrics_lib, "_load", lambda: 100.0)
  assert metrics_lib.peak_flops() == 3e10
  for _ in range(2):  # later runs, busy or not, share the one measurement
    metrics_lib.peak_flops.cache_clear()
    assert metrics_lib.peak_flops() == 3e10 and len(calls) == 1
  entry = json.loads((tmp_path / "peak.json").read_text())[metrics_lib._key()]
  assert entry["flops"] == 3e10 and entry["load"] == 100.0
  assert entry["measured"] == __import__("datetime").date.today().isoformat()
  assert metrics_lib.remeasure_peak_flops() == 5e10 and metrics_lib.peak_flops() == 5e10 and len(calls) == 2
  assert metrics_lib.mfu(1e6, 2e4, peak=4e10) == pytest.approx(0.5)
  metrics_lib.peak_flops.cache_clear()
  monkeypatch.setenv("JAXLAB_PEAK_FLOPS", "1e12")
  assert metrics_lib.peak_flops() == 1e12
  metrics_lib.peak_flops.cache_clear()


def test_metrics_jsonl_is_strict_json(tmp_path):
  path = str(tmp_path / "m.jsonl")
  with metrics_lib.MetricsWriter(path) as w:
    w.write({"step": 1, "loss": float("nan"), "rate": float("inf"), "x": np.float32(2.5)})
  line = open(path).read()
  json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
  assert json.loads(line) == {"step": 1, "loss": None, "rate": None, "x": 2.5}
  back = metrics_lib.read_jsonl(path)[0]
  assert np.isnan(back["loss"]) and np.isnan(back["rate"]) and back["x"] == 2.5


def test_numpy_gemm_peak_is_a_real_rate():
  rate = metrics_lib.measure_numpy_gemm_flops(n=256, repeats=2)
  assert 1e8 < rate < 1e14


def test_evaluate_is_token_weighted():
  batches = [{"s": np.float32(6.0), "w": np.float32(3.0)}, {"s": np.float32(1.0), "w": np.float32(1.0)}]
  got = loop_lib.evaluate(lambda p, b: (b["s"], b["w"]), None, iter(batches))
  assert got == pytest.approx(7.0 / 4.0)  # not the mean of per-batch means (1.5)
  assert loop_lib.evaluate(lambda p, b: (b["s"], b["w"]), None, iter(batches), max_batches=1) == 2.0


# A toy regression whose `z` gradient is NaN exactly on batches with s == 0 (d/dz sqrt(s z) = s / (2 sqrt(s z))).
def _toy_loss(params, batch, rng):
  pred = batch["x"] @ params["w"]
  return jnp.sum((pred - batch["y"]) ** 2) + jnp.sum(jnp.sqrt(batch["s"] * params["z"])), jnp.float32(len(pred)), {}


class _Batches:
  """A deterministic checkpointable iterator; step index `bad` (1-based) yields s = 0."""

  def __init__(self, bad=None):
    self.i, self.bad = 0, bad

  def __next__(self):
    self.i += 1
    rng = np.random.default_rng(self.i)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    return {"x": x, "y": x @ np.array([1.0, -2.0, 0.5], np.float32),
            "s": np.float32(0.0 if self.i == self.bad else 1.0)}

  def get_state(self):
    return {"i": self.i}

  def set_state(self, s):
    self.i = s["i"]


def _toy_state():
  tx = optax.adam(0.05)
  return st.create({"w": jnp.zeros(3), "z": jnp.ones(2)}, tx), tx


def test_nonfinite_gradient_stops_naming_step_and_leaf(tmp_path):
  state, tx = _toy_state()
  step = sp.jit_train_step(sp.make_train_step(_toy_loss, tx))
  ckpt = Checkpointer(tmp_path / "ckpt", keep=5, async_=False)
  with pytest.raises(loop_lib.NonFiniteError) as err:
    loop_lib.train_loop(state, step, _Batches(bad=5), 10, checkpointer=ckpt, ckpt_every=2,
                        metrics_path=str(tmp_path / "metrics.jsonl"))
  msg = str(err.value)
  assert err.value.step == 5 and err.value.leaf == "z"
  assert "step 5" in msg and "'z'" in msg and "last good checkpoint: step 4" in msg
  assert ckpt.all_steps() == [2, 4]  # nothing written for the bad step
  good = ckpt.restore(4).state
  assert int(good["step"]) == 4 and np.all(np.isfinite(good["params"]["z"]))
  records = metrics_lib.read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert records[-1]["event"] == "non_finite" and records[-1]["step"] == 5
  assert [r["step"] for r in records[:-1]] == [1, 2, 3, 4]


def test_resume_from_checkpoint_equals_uninterrupted(tmp_path):
  state, tx = _toy_state()
  step = sp.jit_train_step(sp.make_train_step(_toy_loss, tx, schedule=lambda s: 0.05))
  full = loop_lib.train_loop(state, step, _Batches(), 8, log_every=4)
  ckpt = Checkpointer(tmp_path / "ckpt", keep=2, async_=True)
  state, _ = _toy_state()
  loop_lib.train_loop(state, step, _Batches(), 5, checkpointer=ckpt, ckpt_every=3)
  assert ckpt.all_steps() == [3, 5]
  fresh, _ = _toy_state()
  restored = ckpt.restore(3, target=fresh)
  it = _Batches()
  it.set_state(restored.data_state)
  resumed = loop_lib.train_loop(st.as_train_state(restored.state), step, it, 8, log_every=4)
  for a, b in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(full.state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert int(resumed.state.step) == 8
  assert [r["step"] for r in full.history] == [1, 4, 8] and full.history[0]["lr"] == pytest.approx(0.05)


def test_next_batch_is_read_while_the_step_runs(tmp_path):
  # Batch s + 1 is read before step s's metrics are fetched, so host data work overlaps the device step; a
  # checkpointing step reads it only after saving, so the saved data state resumes at batch s + 1.
  state, tx = _toy_state()
  step = sp.jit_train_step(sp.make_train_step(_toy_loss, tx))
  it, read = _Batches(), []
  ckpt = Checkpointer(tmp_path / "ckpt", keep=5, async_=False)
  loop_lib.train_loop(state, step, it, 6, checkpointer=ckpt, ckpt_every=4, eval_every=1,
                      eval_fn=lambda params: read.append(it.i) or {})
  assert read == [2, 3, 4, 5, 6, 6]  # batches read when step s is evaluated: s + 1, and 6 at the end
  assert [ckpt.restore(s).data_state for s in ckpt.all_steps()] == [{"i": 4}, {"i": 6}]
  with pytest.raises(ValueError, match="ran out after 3 steps"):
    loop_lib.train_loop(_toy_state()[0], step, iter([next(_Batches())] * 3), 5)


def test_metrics_jsonl_roundtrip_skips_truncated_line(tmp_path):
  path = str(tmp_path / "m.jsonl")
  with metrics_lib.MetricsWriter(path) as w:
    w.write({"step": 1, "loss": np.float32(2.5), "tokens_per_s": float("nan")})
  with open(path, "a") as f:
    f.write('{"step": 2, "lo')  # a run killed mid-write
  (record,) = metrics_lib.read_jsonl(path)  # NaN is written as null and read back as NaN
  assert record["step"] == 1 and record["loss"] == 2.5 and math.isnan(record["tokens_per_s"])
  assert os.path.getsize(path) > 0


@pytest.fixture
def default_sigint():
  """Python's own SIGINT handler for the test (a test runner's worker may ignore SIGINT or handle it itself)."""
  import signal
  import threading
  if threading.current_thread() is not threading.main_thread():
    pytest.skip("signal handlers are installed only in the main thread")
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  yield
  signal.signal(signal.SIGINT, previous)


def test_ctrl_c_stops_at_a_step_boundary_with_complete_checkpoints(tmp_path, default_sigint):
  # Ctrl-C arrives during step 4, which saves (async): the step and its save complete, the loop stops before step
  # 5, the checkpointer is closed, and a second Ctrl-C would stop at once (Python's handler is back).
  import signal
  state, tx = _toy_state()
  jitted = sp.jit_train_step(sp.make_train_step(_toy_loss, tx))
  calls, handler_after_press = [], []

  def step(state, batch):
    calls.append(len(calls) + 1)
    if len(calls) == 4:
      os.kill(os.getpid(), signal.SIGINT)
      handler_after_press.append(signal.getsignal(signal.SIGINT))
    return jitted(state, batch)

  ckpt = Checkpointer(tmp_path / "ckpt", keep=None, async_=True)
  with pytest.raises(KeyboardInterrupt):
    loop_lib.train_loop(state, step, _Batches(), 10, checkpointer=ckpt, ckpt_every=2,
                        metrics_path=str(tmp_path / "metrics.jsonl"))
  assert calls == [1, 2, 3, 4] and handler_after_press == [signal.default_int_handler]
  assert ckpt._closed and sorted(os.listdir(tmp_path / "ckpt")) == ["2", "4"]
  assert all(Checkpointer.is_complete(tmp_path / "ckpt" / s) for s in ("2", "4"))
  assert [r["step"] for r in metrics_lib.read_jsonl(str(tmp_path / "metrics.jsonl"))] == [1, 2, 3, 4]
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
