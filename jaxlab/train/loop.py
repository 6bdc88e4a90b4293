"""The training loop: steps, periodic evaluation and checkpoints, metrics.jsonl, progress bar, non-finite stop.

Throughput and MFU (PaLM, arXiv 2204.02311, appendix B) are measured over each logging window, excluding the
first step after a (re)start, which includes compilation. A step whose loss or gradient is not finite raises
`NonFiniteError` naming the step and the first non-finite gradient leaf; the step function has already
discarded that update and nothing is saved, so the last checkpoint on disk stays the last good one.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Callable, Iterable, Iterator

import jax
import numpy as np

from jaxlab.train import interrupt, metrics as metrics_lib
from jaxlab.train.step import leaf_paths
from jaxlab.train.state import TrainState


class NonFiniteError(FloatingPointError):
  """Training produced a non-finite loss or gradient."""

  def __init__(self, message: str, step: int, leaf: str | None):
    super().__init__(message)
    self.step, self.leaf = step, leaf


@dataclasses.dataclass
class LoopResult:
  state: TrainState
  history: list  # the logged records (dicts), also written to metrics.jsonl
  last_eval: dict = dataclasses.field(default_factory=dict)


def gather_data_state(local_state):
  """Every process's data-iterator state, for a checkpoint that process 0 writes.

  With one process this is `local_state` unchanged; with several it is {"per_process": [state_0, ...]}
  (JSON-serializable states are exchanged with an all-gather), read back by `local_data_state`.
  """
  n = jax.process_count()
  if n == 1:
    return local_state
  from jax.experimental import multihost_utils
  blob = np.frombuffer(json.dumps(local_state).encode(), np.uint8)
  lengths = np.asarray(multihost_utils.process_allgather(np.array([blob.size], np.int64))).reshape(-1)
  padded = np.zeros(int(lengths.max()), np.uint8)
  padded[:blob.size] = blob
  blobs = np.asarray(multihost_utils.process_allgather(padded)).reshape(n, -1)
  return {"per_process": [json.loads(bytes(b[:k]).decode()) for b, k in zip(blobs, lengths)]}


def local_data_state(saved):
  """This process's part of a state written by `gather_data_state` (the process count must be unchanged)."""
  if not (isinstance(saved, dict) and set(saved) == {"per_process"}):
    if jax.process_count() > 1:
      raise ValueError(f"the checkpoint's data state was saved by one process; {jax.process_count()} are "
                       "running now (resume with the same process count)")
    return saved
  states = saved["per_process"]
  if len(states) != jax.process_count():
    raise ValueError(f"the checkpoint's data state was saved by {len(states)} processes, "
                     f"{jax.process_count()} are running now (resume with the same process count)")
  return states[jax.process_index()]


def evaluate(eval_step, params, batches: Iterable, shard_fn: Callable | None = None,
             max_batches: int | None = None) -> float:
  """Weighted mean loss over `batches` (sum of loss sums / sum of weights).

  Args:
    eval_step: `(params, batch) -> (loss_sum, weight)`, e.g. from `make_eval_step`.
    params: the params to evaluate.
    batches: an iterable of host batches.
    shard_fn: places a host batch on devices (e.g. `lambda b: sharding.shard_batch(b, mesh)`).
    max_batches: stop after this many batches (every process must see the same number).
  """
  total, weight = 0.0, 0.0
  for i, batch in enumerate(batches):
    if max_batches is not None and i >= max_batches:
      break
    s, w = eval_step(params, shard_fn(batch) if shard_fn else batch)
    total += float(s)
    weight += float(w)
  return total / weight if weight > 0 else float("nan")


def nonfinite_message(step: int, m: dict, paths: list[str], last_ckpt) -> tuple[str, str | None]:
  """(message, first non-finite gradient leaf) for a step whose metrics say it was not finite."""
  bad = [p for p, ok in zip(paths, np.asarray(m["finite_leaves"])) if not ok]
  leaf = bad[0] if bad else None
  loss = float(m["loss"])
  where = (f"first non-finite gradient leaf: {leaf!r} ({len(bad)} of {len(paths)} leaves non-finite)" if bad
           else "all gradient leaves finite")
  saved = f"last good checkpoint: step {last_ckpt}" if last_ckpt is not None else "no checkpoint was saved"
  msg = (f"non-finite {'loss' if not math.isfinite(loss) else 'gradient'} at step {step}: loss={loss}, "
         f"{where}. Stopped without applying or saving this update ({saved}).")
  return msg, leaf


def train_loop(state: TrainState, train_step, batches: Iterator, num_steps: int, *,
               shard_fn: Callable | None = None, checkpointer=None, ckpt_every: int = 0, data_state_fn=None,
               eval_fn: Callable | None = None, eval_every: int = 0, metrics_path: str | None = None,
               log_every: int = 1, flops_per_token: float | None = None, peak_flops: float | None = None,
               metadata: dict | None = None, desc: str = "train") -> LoopResult:
  """Runs `train_step` from `state.step` up to `num_steps` updates.

  Args:
    state: the starting TrainState (fresh or restored; its `step` says where to continue).
    train_step: jitted `(state, batch) -> (state, metrics)` from `jaxlab.train.step`.
    batches: iterator of host batches (already positioned for `state.step` when resuming).
    num_steps: total number of updates to reach.
    shard_fn: places a host batch on devices; None passes it unchanged.
    checkpointer: a `jaxlab.train.checkpoint.Checkpointer`; saves every `ckpt_every` steps and at the end.
    ckpt_every: checkpoint period in steps (0: only at the end).
    data_state_fn: returns this process's data-iterator state to store with each checkpoint (default:
      `batches.get_state` when it exists); states of all processes are gathered (`gather_data_state`).
    eval_fn: `params -> dict of floats` (e.g. {"val_loss": ...}), run every `eval_every` steps and at the end.
    eval_every: evaluation period (0: only at the end).
    metrics_path: metrics.jsonl to append records to.
    log_every: a record every this many steps (and at the last step).
    flops_per_token: training FLOPs per loss token, for MFU; None leaves MFU out.
    peak_flops: denominator of MFU; default `metrics.peak_flops()`.
    metadata: stored with every checkpoint.
    desc: progress-bar label.

  Ctrl-C (`jaxlab.train.interrupt`) takes effect at the next step boundary: the checkpoint being written is
  completed, the progress bar and `checkpointer` are closed, then KeyboardInterrupt propagates, so nothing of the
  loop prints after it and `--resume` continues from the last checkpoint. A second Ctrl-C stops at once.
  """
  with interrupt.deferred():
    try:
      return _train_loop(state, train_step, batches, num_steps, shard_fn, checkpointer, ckpt_every, data_state_fn,
                         eval_fn, eval_every, metrics_path, log_every, flops_per_token, peak_flops, metadata, desc)
    except KeyboardInterrupt:
      if checkpointer is not None:  # finish the save in flight; interpreter shutdown would cut it off
        checkpointer.close()
      raise


def _train_loop(state, train_step, batches, num_steps, shard_fn, checkpointer, ckpt_every, data_state_fn, eval_fn,
                eval_every, metrics_path, log_every, flops_per_token, peak_flops, metadata, desc) -> LoopResult:
  if data_state_fn is None and hasattr(batches, "get_state"):
    data_state_fn = batches.get_state
  start = int(jax.device_get(state.step))
  paths = leaf_paths(state.params)
  peak = peak_flops if peak_flops is not None else (metrics_lib.peak_flops() if flops_per_token else None)
  last_ckpt = checkpointer.latest_step() if checkpointer is not None else None
  history, last_eval = [], {}
  meter = metrics_lib.Throughput()
  window: list[dict] = []
  t_start = time.time()
  bar = metrics_lib.progress(num_steps, start, desc)
  ran_out = object()

  def next_batch():
    return next(batches, ran_out)

  batch = next_batch() if start < num_steps else None
  with metrics_lib.MetricsWriter(metrics_path) as writer, bar:
    for i in range(start, num_steps):
      interrupt.check()
      step = i + 1
      if batch is ran_out:
        bar.close()
        raise ValueError(f"the data iterator ran out after {i} steps; training asked for {num_steps}")
      state, m = train_step(state, shard_fn(batch) if shard_fn else batch)
      last = step == num_steps
      ckpt_due = checkpointer is not None and (ckpt_every and step % ckpt_every == 0 or last)
      if not last and not ckpt_due:  # the host reads the next batch while the device runs this step
        batch = next_batch()
      m = jax.device_get(m)
      if not bool(m["finite"]):
        bar.close()
        msg, leaf = nonfinite_message(step, m, paths, last_ckpt)
        writer.write({"step": step, "event": "non_finite", "message": msg})
        raise NonFiniteError(msg, step, leaf)
      meter.add(float(m["weight"]))
      if i == start:
        meter.reset()  # the first step compiled; measure from here
      window.append(m)
      if ckpt_due:  # the data state saved is the one right after this step's batch
        data_state = gather_data_state(data_state_fn()) if data_state_fn else None
        checkpointer.save(step, state, data_state=data_state, metadata=dict(metadata or {}, step=step))
        last_ckpt = step
        if not last:
          batch = next_batch()
      record = None
      if step % log_every == 0 or last or step == 1:
        rate = meter.rate() if i > start else float("nan")
        record = {"step": step, "loss": float(np.mean([w["loss"] for w in window])),
                  "grad_norm": float(window[-1]["grad_norm"]), "tokens_per_s": rate,
                  "time_s": round(time.time() - t_start, 3)}
        if "lr" in m:
          record["lr"] = float(m["lr"])
        if flops_per_token and math.isfinite(rate):
          record["mfu"] = metrics_lib.mfu(flops_per_token, rate, peak)
        window = []
      if eval_fn is not None and (eval_every and step % eval_every == 0 or last):
        last_eval = {k: float(v) for k, v in eval_fn(state.params).items()}
        record = dict(record or {"step": step}, **last_eval)
        meter.reset()
      if record is not None:
        writer.write(record)
        history.append(record)
        bar.set_postfix({k: f"{v:.4g}" for k, v in record.items() if k in ("loss", "val_loss", "tokens_per_s")},
                        refresh=False)
      if last:
        bar.n = step  # close() draws the final line; update() would draw it once more
      else:
        bar.update(1)
  bar.close()
  if start >= num_steps and eval_fn is not None:  # resumed a finished run: report its evaluation again
    last_eval = {k: float(v) for k, v in eval_fn(state.params).items()}
  if checkpointer is not None:
    checkpointer.wait()
  interrupt.check()
  return LoopResult(state, history, last_eval)
