"""Ctrl-C that stops a run cleanly: never inside orbax, XLA, tqdm or a data iterator, never lost.

A KeyboardInterrupt raised wherever the main thread happens to be can land inside orbax's asyncio loops and
thread pools (a checkpoint cut off half-written, a background thread posting to a closed loop, tracebacks after
the program's last line), inside an XLA compilation (which polls for signals; the interpreter then crashes at
exit), or inside a gc callback or finalizer, which swallows it (printed as "Exception ignored", and the run
goes on). Two blocks, which nest:

- `deferred()`: Ctrl-C is only recorded, with one line on stderr. The code calls `check()` where stopping is
  clean (the training loops do at each step boundary), which raises KeyboardInterrupt; leaving the block with
  the request still pending raises it there (unless an enclosing `deferred()` block is still open).
- `handled()`: Ctrl-C raises KeyboardInterrupt at once while the main thread runs the project's own code (this
  package, or anything outside the standard library and installed packages). While it runs library code (JAX,
  orbax, tqdm, the standard library) the line is written and the interrupt raised at the next line of own code
  that runs (a trace function, set only until then), so a library call that never returns needs the second
  Ctrl-C. One that a gc callback or finalizer swallows is not printed but raised again in the same way.

The first Ctrl-C puts the previous handler back, so a second one stops at once. Only the outermost block of the
main thread installs the handler, and only over Python's default one (an ignored or custom SIGINT is left
alone); nested blocks switch its mode, and other threads' blocks do nothing.
"""
from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import sysconfig
import threading

MESSAGE = b"\nCtrl-C: stopping at the next safe point, after any checkpoint being written (again: stops at once)\n"

_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_LIBRARY = tuple(sorted({os.path.realpath(sysconfig.get_paths()[k]) + os.sep
                         for k in ("stdlib", "platstdlib", "purelib", "platlib")}))


@functools.lru_cache(maxsize=None)
def _is_own(filename: str) -> bool:
  """Whether code of `filename` is the project's own, where a KeyboardInterrupt may be raised."""
  if filename.startswith("<"):
    return False
  path = os.path.realpath(filename)
  return path.startswith(_OWN) or not path.startswith(_LIBRARY)


def _say():
  try:
    os.write(2, MESSAGE)  # not sys.stderr: a signal handler may run in the middle of a write to it
  except OSError:
    pass


class _Handler:
  """The installed SIGINT handler: whether Ctrl-C was pressed and raised, and how many deferring blocks are open."""

  def __init__(self):
    self.previous = self.previous_hook = None
    self.pressed = self.delivered = False
    self.deferring = 0

  def pending(self) -> bool:
    return self.pressed and not self.delivered

  def deliver(self):
    self.delivered = True
    if sys.gettrace() == self._trace_call:
      sys.settrace(None)
    raise KeyboardInterrupt

  def handle(self, signum, frame):
    self.pressed = True
    signal.signal(signal.SIGINT, self.previous)
    if self.deferring:
      _say()
    else:
      self._raise_in_own_code(frame)

  def unraisable(self, info):
    if self.pressed and issubclass(info.exc_type, KeyboardInterrupt) and _main_thread():
      self.delivered = False  # swallowed by a gc callback or finalizer; raising here would be swallowed too
      self._arm(sys._getframe().f_back)
      return
    self.previous_hook(info)

  def _raise_in_own_code(self, frame):
    tracer = sys.gettrace()
    if (frame is not None and _is_own(frame.f_code.co_filename)) or tracer not in (None, self._trace_call):
      self.deliver()  # (under a debugger or coverage tool, whose trace function must stay, at once as usual)
    _say()
    self._arm(frame)

  def _arm(self, frame):
    """Raises the pending interrupt at the next line of own code that runs outside a deferring block."""
    if sys.gettrace() not in (None, self._trace_call):
      return  # a debugger's or coverage tool's trace function: `check()` or the block's end raises it
    while frame is not None:  # the frames already running see their next line through f_trace
      if _is_own(frame.f_code.co_filename):
        frame.f_trace = self._trace_line
      frame = frame.f_back
    sys.settrace(self._trace_call)

  def _trace_call(self, frame, event, arg):
    return self._trace_line if _is_own(frame.f_code.co_filename) else None

  def _trace_line(self, frame, event, arg):
    if not self.pending():
      return None
    if event == "line" and not self.deferring:
      self.deliver()
    return self._trace_line


_active: _Handler | None = None  # installed by the outermost block


def _main_thread() -> bool:
  return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _block(defer: bool):
  global _active
  if not _main_thread():
    yield
    return
  if _active is not None:
    handler = _active
    handler.deferring += defer
    try:
      yield
    finally:
      handler.deferring -= defer
    if handler.pending() and not handler.deferring:
      handler.deliver()
    return
  if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
    yield
    return
  handler = _active = _Handler()
  handler.deferring = int(defer)
  handler.previous = signal.signal(signal.SIGINT, handler.handle)
  handler.previous_hook, sys.unraisablehook = sys.unraisablehook, handler.unraisable
  try:
    yield
  finally:
    _active = None
    if signal.getsignal(signal.SIGINT) == handler.handle:
      signal.signal(signal.SIGINT, handler.previous)
    if sys.unraisablehook == handler.unraisable:
      sys.unraisablehook = handler.previous_hook
    if sys.gettrace() == handler._trace_call:
      sys.settrace(None)
  if handler.pending():
    handler.deliver()


def deferred():
  """A block (or decorator) in which Ctrl-C waits for `check()` or the block's end; see the module docstring."""
  return _block(True)


def handled():
  """A block (or decorator) in which Ctrl-C is raised in the project's own code, never lost; see the docstring."""
  return _block(False)


def requested() -> bool:
  """Whether a Ctrl-C pressed in the active block is still to be raised."""
  return _active is not None and _active.pending() and _main_thread()


def check() -> None:
  """Raises KeyboardInterrupt when Ctrl-C was pressed in the active block and has not been raised yet."""
  if requested():
    _active.deliver()
