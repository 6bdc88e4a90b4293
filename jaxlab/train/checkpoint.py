"""Checkpoints of train state and data-iterator state: the one orbax wrapper.

A checkpoint at step S is the directory `<root>/S` holding three orbax items: `state` (any pytree of
arrays: params, optimizer state, step, PRNG keys; each process writes its own shards), `data` (the data
iterator's state as JSON: a dict, bytes, or nothing) and `metadata` (a JSON dict). Orbax writes into
`S.orbax-checkpoint-tmp`, writes its commit marker `commit_success.txt` and renames the directory to `S`,
so a step becomes visible only once complete. A checkpoint is restored onto any mesh: pass a target of
ShapeDtypeStructs carrying the new shardings (e.g. `jaxlab.sharding.sharded_shapes`).

Saving never replaces an existing step (CheckpointExistsError); old steps beyond `keep` are removed by the
retention policy. `restore_latest` (what `--resume` uses) falls back past a newest checkpoint that is
partial, unreadable, non-finite or of another shape/dtype than the model, logging one warning line naming it,
and moves such checkpoints aside to `S.corrupt`.

Ctrl-C during a save, wait, restore or close takes effect once that call returns (`jaxlab.train.interrupt`):
never inside orbax's asyncio loops and thread pools, which would leave a write cut off and tracebacks from
its threads. `close` waits for pending writes, so a program that closes its checkpointer exits with only
complete checkpoints and no orbax thread left running.
"""
from __future__ import annotations

import base64
import contextlib
import gc
import json
import logging
import os
import sys
import tempfile
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from etils import epath

from jaxlab.train import interrupt

log = logging.getLogger(__name__)

COMMIT_MARKER = "commit_success.txt"
_TMP_SUFFIX = ".orbax-checkpoint-tmp"


class CheckpointExistsError(FileExistsError):
  """Saving a step that already has a checkpoint (complete or not)."""


class CheckpointError(ValueError):
  """A checkpoint that cannot be used: it does not match the target, holds non-finite values, or none restores."""


class Restored(NamedTuple):
  step: int
  state: Any
  data_state: dict | bytes | None
  metadata: dict


def _encode_data(data_state) -> dict:
  if data_state is None:
    return {"kind": "none"}
  if isinstance(data_state, (bytes, bytearray)):
    return {"kind": "bytes", "value": base64.b64encode(bytes(data_state)).decode("ascii")}
  if isinstance(data_state, dict):
    try:
      json.dumps(data_state)
    except (TypeError, ValueError) as e:
      raise TypeError(f"data_state dict must be JSON-serializable (or pass bytes): {e}") from None
    return {"kind": "dict", "value": data_state}
  raise TypeError(f"data_state must be a dict, bytes or None, found {type(data_state).__name__}")


def _decode_data(item: dict):
  kind = item.get("kind")
  if kind == "none":
    return None
  if kind == "bytes":
    return base64.b64decode(item["value"])
  if kind == "dict":
    return item["value"]
  raise ValueError(f"unknown data_state kind {kind!r} in checkpoint")


def _one_line(e: Exception, limit: int = 300) -> str:
  text = " ".join(str(e).split())
  return f"{type(e).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def _key_str(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def _check_matches(state_dir, target) -> None:
  """Raises CheckpointError naming the first leaf whose saved shape or dtype differs from `target`'s."""
  saved = ocp.StandardCheckpointHandler().metadata(state_dir)
  saved = dict((_key_str(p), m) for p, m in jax.tree.leaves_with_path(getattr(saved, "tree", saved)))
  want = dict((_key_str(p), t) for p, t in jax.tree.leaves_with_path(target))
  if set(saved) != set(want):
    extra, missing = sorted(set(saved) - set(want)), sorted(set(want) - set(saved))
    raise CheckpointError(f"{state_dir.parent}: saved state has a different tree (only in the checkpoint: "
                          f"{extra[:5]}, only in the model: {missing[:5]})")
  for key, t in want.items():
    m = saved[key]
    shape, dtype = getattr(m, "shape", None), getattr(m, "dtype", None)
    if shape is None or not hasattr(t, "shape") or jax.dtypes.issubdtype(t.dtype, jax.dtypes.prng_key):
      continue
    if tuple(shape) != tuple(t.shape) or jnp.dtype(dtype) != jnp.dtype(t.dtype):
      raise CheckpointError(f"{state_dir.parent}: {key} is saved as {jnp.dtype(dtype).name}"
                            f"{list(shape)}, expected {jnp.dtype(t.dtype).name}{list(t.shape)}")


def _check_finite(path, state) -> None:
  for p, x in jax.tree.leaves_with_path(state):
    if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact):
      if not bool(jnp.isfinite(x).all()):
        raise CheckpointError(f"{path}: {_key_str(p)} holds non-finite values")


@contextlib.contextmanager
def _quiet_orbax(settle_s: float = 0.3):
  """Silences orbax/absl logging and the tracebacks its I/O threads print to fd 2 after a failed read.

  On success whatever was captured is written back to stderr; on failure it is dropped (the caller
  reports the error in one line). Late messages from cancelled reads arrive within `settle_s`.
  """
  loggers = [logging.getLogger(n) for n in ("absl", "orbax")]
  levels = [lg.level for lg in loggers]
  sys.stderr.flush()
  saved_fd = os.dup(2)
  with tempfile.TemporaryFile() as sink:
    os.dup2(sink.fileno(), 2)
    failed = True
    try:
      for lg in loggers:
        lg.setLevel(logging.CRITICAL)
      yield
      failed = False
    finally:
      if failed:
        time.sleep(settle_s)
        gc.collect()  # un-awaited read coroutines of the failed restore report themselves when collected
      sys.stderr.flush()
      os.dup2(saved_fd, 2)
      os.close(saved_fd)
      for lg, lv in zip(loggers, levels):
        lg.setLevel(lv)
      if not failed:
        sink.seek(0)
        sys.stderr.write(sink.read().decode(errors="replace"))


def _abstract(x):
  if isinstance(x, jax.Array):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
  return x


class Checkpointer:
  """Saves and restores train state + data-iterator state under one directory.

  Args:
    directory: root directory (a local path, relative ones taken from the working directory, or any path
      orbax/epath supports, e.g. gs://).
    keep: how many most recent checkpoints to keep (None: all).
    async_: write in a background thread; `save` returns once arrays are copied to host memory.
  """

  def __init__(self, directory, keep: int | None = 3, async_: bool = True):
    if keep is not None and keep < 1:
      raise ValueError(f"keep must be >= 1 or None, found {keep}")
    if "://" not in str(directory):  # orbax refuses relative local paths
      directory = os.path.abspath(directory)
    self.directory = epath.Path(directory)
    if self.directory.exists():
      leftovers = [p.name for p in self.directory.iterdir() if _TMP_SUFFIX in p.name]
      if leftovers:
        log.warning("removing unfinished checkpoint writes in %s: %s", self.directory, sorted(leftovers))
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_,
                                           cleanup_tmp_directories=True, create=True)
    self._manager = ocp.CheckpointManager(self.directory, options=options)
    self._closed = False

  def step_dir(self, step: int) -> epath.Path:
    return self.directory / str(step)

  def _step_dirs(self) -> dict[int, epath.Path]:
    if not self.directory.exists():
      return {}
    return {int(p.name): p for p in self.directory.iterdir() if p.name.isdigit() and p.is_dir()}

  @staticmethod
  def is_complete(path) -> bool:
    """Whether a step directory carries orbax's commit marker."""
    return (epath.Path(path) / COMMIT_MARKER).exists()

  def all_steps(self) -> list[int]:
    """Steps with a complete checkpoint on disk, ascending (a save still in flight is not listed)."""
    return sorted(s for s, p in self._step_dirs().items() if self.is_complete(p))

  def latest_step(self) -> int | None:
    steps = self.all_steps()
    return steps[-1] if steps else None

  @interrupt.deferred()
  def save(self, step: int, state, data_state: dict | bytes | None = None, metadata: dict | None = None):
    """Starts writing checkpoint `step` (returns before the write finishes when async; see `wait`).

    Args:
      step: the training step (non-negative int); must not have a checkpoint yet.
      state: pytree of arrays (params, optimizer state, step, rng ...).
      data_state: the data iterator's state: a JSON-serializable dict, bytes, or None.
      metadata: a JSON-serializable dict stored alongside (config, metrics ...).
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
      raise ValueError(f"step must be a non-negative int, found {step!r}")
    in_flight = any(p.name.startswith(f"{step}{_TMP_SUFFIX}") for p in self.directory.iterdir())
    if step in self._step_dirs() or in_flight or step in self._manager.all_steps():
      raise CheckpointExistsError(f"a checkpoint for step {step} already exists in {self.directory}; "
                                  "refusing to overwrite it")
    args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                              data=ocp.args.JsonSave(_encode_data(data_state)),
                              metadata=ocp.args.JsonSave(dict(metadata or {})))
    if not self._manager.save(step, args=args, force=True):
      raise RuntimeError(f"orbax declined to save step {step} in {self.directory}")

  @interrupt.deferred()
  def wait(self):
    """Blocks until every pending save is complete on disk."""
    self._manager.wait_until_finished()

  @interrupt.deferred()
  def restore(self, step: int | None = None, target=None) -> Restored:
    """Restores a complete checkpoint (default: the latest).

    Args:
      step: which step; None = `latest_step()`.
      target: pytree like the saved state of ShapeDtypeStructs (or arrays) whose shardings say where to
        place each array, on any mesh. None restores with the saved shardings (same topology only).
    """
    if step is None:
      step = self.latest_step()
      if step is None:
        raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
    path = self.step_dir(step)
    if not path.exists():
      raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}, found {self.all_steps()}")
    if not self.is_complete(path):
      raise ValueError(f"checkpoint {path} is incomplete (no {COMMIT_MARKER})")
    target = None if target is None else jax.tree.map(_abstract, target)
    if target is not None:
      _check_matches(path / "state", target)
    out = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                                             data=ocp.args.JsonRestore(),
                                                             metadata=ocp.args.JsonRestore()))
    _check_finite(path, out["state"])
    return Restored(step, out["state"], _decode_data(out["data"]), out["metadata"] or {})

  @interrupt.deferred()
  def restore_latest(self, target=None, *, set_aside: bool = True) -> Restored | None:
    """`--resume`: the newest checkpoint that restores, or None when the directory has none.

    A newer checkpoint that is partial (no commit marker), does not match `target` (tree, shapes, dtypes),
    holds non-finite values or fails to restore is reported with one logging.warning line and skipped
    (orbax's own error output for it is swallowed). Once an older one restores, the skipped ones are renamed
    to `S.corrupt` (when `set_aside`) so training can save those steps again. If none restores,
    CheckpointError lists every step with its reason and nothing is renamed.

    Args:
      target: as in `restore`.
      set_aside: rename skipped checkpoints out of the way after a successful fallback.
    """
    self.wait()
    skipped, reasons = [], []
    for step, path in sorted(self._step_dirs().items(), reverse=True):
      if not self.is_complete(path):
        reason = f"partial (no {COMMIT_MARKER})"
      else:
        try:
          with _quiet_orbax():
            restored = self.restore(step, target)
        except Exception as e:  # noqa: BLE001  (any failure to read means this checkpoint is unusable)
          reason = _one_line(e)
        else:
          if set_aside and skipped:
            self._set_aside(skipped)
          return restored
      log.warning("checkpoint %s is unusable (%s); falling back to the previous one", path, reason)
      skipped.append(path)
      reasons.append(f"step {step}: {reason}")
    if reasons:
      raise CheckpointError(f"no checkpoint in {self.directory} restores: {'; '.join(reasons)}")
    return None

  def _set_aside(self, paths):
    if jax.process_index() == 0:
      for path in paths:
        dest = path.parent / f"{path.name}.corrupt"
        i = 1
        while dest.exists():
          dest, i = path.parent / f"{path.name}.corrupt{i}", i + 1
        log.warning("moving unusable checkpoint %s to %s", path, dest)
        path.rename(dest)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices("jaxlab_checkpoint_set_aside")
    self._manager.reload()

  @interrupt.deferred()
  def close(self):
    """Waits for pending saves and stops orbax's threads; closing again does nothing."""
    if not self._closed:
      self._manager.wait_until_finished()
      self._manager.close()
      self._closed = True

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
