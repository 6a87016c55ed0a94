"""SIGINT / SIGTERM as a clean unwind, and the few critical sections that must not be cut.

The CLI (`cli.py`) installs `handler` for both signals: the first raises `Interrupted` (a
KeyboardInterrupt, so every `finally` and `except KeyboardInterrupt` runs: workers killed, temp
directories removed) and the CLI exits 128 + signal number; later signals are ignored while
unwinding. Inside `deferred()` (the renames of a plan swap) a signal is only recorded and raised
when the section ends. The signals are also blocked for the calling thread there, so a process
using the library without the CLI's handler gets the same guarantee from the main thread.

A signal mask survives fork and exec, and installing a handler does not unblock a signal: a
process started with SIGINT/SIGTERM blocked (by a harness, a supervisor, or a parent whose mask had
leaked) would hold every signal back until the swap's `deferred()` took it, after the whole plan
was written. `unblocked()` unblocks them for the CLI's run and restores the mask after.
(The runtime has the same helper, `ninfer_runtime.signal_mask`; importing that package from here
would import torch at CLI start.)
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised by `handler` in the main thread."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_state = {"hit": False, "depth": 0, "pending": None}


def reset() -> None:
    _state.update(hit=False, depth=0, pending=None)


def handler(signum, frame) -> None:
    if _state["hit"]:
        return  # unwinding already: bounded cleanup is not cut short
    if _state["depth"]:
        _state["pending"] = signum
        return
    _state["hit"] = True
    raise Interrupted(signum)


def _take_blocked() -> None:
    """Still blocked: take each pending SIGINT/SIGTERM that `handler` would get (sigtimedwait consumes it
    without running a handler) into `_state`. Unblocked, Python would run `handler` at some later bytecode,
    where it could raise inside the caller's cleanup (a swap's removal of the previous plan); taken here,
    it is raised by `deferred` itself, at its end, every time."""
    try:
        waiting = signal.sigpending()
    except (AttributeError, OSError):
        return
    for s in SIGNALS:
        if s in waiting and signal.getsignal(s) is handler:
            signal.sigtimedwait([s], 0)
            if _state["pending"] is None and not _state["hit"]:
                _state["pending"] = s


@contextmanager
def deferred():
    """A section no SIGINT/SIGTERM interrupts: one arriving meanwhile is raised when it ends."""
    # the section counts (depth) before the mask changes: a handler that runs in between (a signal
    # another thread took earlier has its handler run here at any bytecode) only records, and the
    # mask is restored below whatever happens after the block
    _state["depth"] += 1
    old = None
    try:
        try:
            old = signal.pthread_sigmask(signal.SIG_BLOCK, set(SIGNALS))
        except (AttributeError, OSError, ValueError):
            old = None
        yield
    finally:
        # The section still counts (depth) until the mask is back: `handler` can run at any bytecode
        # here (a signal another thread took, or a blocked one at the restore) and then only records.
        # Had it raised, the restore would be skipped and the thread would keep SIGINT/SIGTERM
        # blocked for good, and so would every process it started. Reproduced: the swap test, in a
        # pytest-xdist worker under CPU load (the signal lands on the worker's I/O thread), left
        # them blocked; that worker's later compile children then held their signals until their
        # own swap: the CI box's three signal-test failures.
        try:
            if old is not None:
                try:
                    if _state["depth"] == 1:
                        _take_blocked()
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, old)
        finally:
            _state["depth"] -= 1
        pending = _state["pending"] if _state["depth"] == 0 else None
        if pending is not None:
            _state["pending"] = None
            _state["hit"] = True
            raise Interrupted(pending)


@contextmanager
def unblocked():
    """SIGINT/SIGTERM unblocked for the calling (main) thread while the block runs, whatever mask
    the process inherited; the inherited mask is restored on the way out."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_UNBLOCK, set(SIGNALS))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
