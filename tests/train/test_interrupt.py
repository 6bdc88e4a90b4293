"""Ctrl-C at safe points: deferred until `check()` or a block's end, raised in own code only, never lost."""
import contextlib
import os
import signal
import sys
import threading

import pytest

from jaxlab.train import interrupt


@pytest.fixture(autouse=True)
def default_sigint():
  """Python's own SIGINT handler for the test (a test runner's worker may ignore SIGINT or handle it itself)."""
  if threading.current_thread() is not threading.main_thread():
    pytest.skip("signal handlers are installed only in the main thread")
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  hook = sys.unraisablehook
  yield
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and sys.unraisablehook is hook
  signal.signal(signal.SIGINT, previous)


def _press():
  os.kill(os.getpid(), signal.SIGINT)  # its handler runs before os.kill returns


def test_deferred_waits_for_check_and_a_second_press_stops_at_once(capfd):
  with interrupt.deferred():
    _press()
    assert interrupt.requested()
    with pytest.raises(KeyboardInterrupt):
      interrupt.check()
    assert not interrupt.requested()
  with pytest.raises(KeyboardInterrupt):  # the first press, still pending, at the block's end
    with interrupt.deferred():
      _press()
      with pytest.raises(KeyboardInterrupt):
        _press()
  assert capfd.readouterr().err.count("Ctrl-C: stopping at the next safe point") == 2


def test_a_pending_press_is_raised_where_deferring_ends():
  reached = []
  with pytest.raises(KeyboardInterrupt):
    with interrupt.deferred():
      with interrupt.deferred():  # e.g. a checkpointer call inside a training loop
        _press()
      reached.append("outer block")  # still deferred: the outer block's end raises
  assert reached == ["outer block"]
  with pytest.raises(KeyboardInterrupt):
    with interrupt.handled():
      with interrupt.deferred():
        _press()
        reached.append("deferred")
      reached.append("not reached")
  assert reached == ["outer block", "deferred"]


def test_handled_raises_in_own_code_not_in_library_code():
  with pytest.raises(KeyboardInterrupt) as err:
    with interrupt.handled():
      _press()  # own code: at once
  assert "_press" in [e.frame.code.name for e in err.traceback]
  if sys.gettrace() is not None:
    pytest.skip("under a trace function (debugger, coverage) Ctrl-C is raised at once, also in library code")
  reached = []
  with pytest.raises(KeyboardInterrupt) as err:
    with interrupt.handled():
      with contextlib.ExitStack() as stack:
        stack.callback(os.kill, os.getpid(), signal.SIGINT)  # pressed while contextlib's code runs
        reached.append("inside")
      reached.append("not reached")  # the next line of own code
  assert reached == ["inside"] and sys.gettrace() is None
  here = [e for e in err.traceback if e.frame.code.name == "test_handled_raises_in_own_code_not_in_library_code"]
  assert "not reached" in str(here[0].statement)


def test_a_press_swallowed_by_a_finalizer_is_raised_again(capfd):
  class Finalized:
    def __del__(self):
      _press()

  reached = []
  with pytest.raises(KeyboardInterrupt):
    with interrupt.handled():
      Finalized()  # collected at once: __del__ swallows the KeyboardInterrupt raised in it
      reached.append("not reached")
  assert reached == [] and "Exception ignored" not in capfd.readouterr().err
