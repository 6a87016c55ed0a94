"""SIGINT / SIGTERM delivered to the command that handles them, whatever mask it inherited.

A signal mask survives fork and exec: a harness, a supervisor or a parent whose mask leaked that
blocks SIGINT/SIGTERM hands that mask to every process it starts. Installing a handler does not
unblock a signal, so such a process would only see the signal when something unblocked it, long
after it was sent (the project's CI box: a compile told to stop at its first pass wrote its whole
plan, then reported the interrupt). `unblocked()` unblocks them for the main thread of
the runtime's entry points (its CLI, the server) and restores the inherited mask on the way out; the
compiler's CLI has its own (`ninfer_compile.interrupts.unblocked`: the runtime never imports it, and
importing this package would load torch when the compiler's CLI starts).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


@contextmanager
def unblocked(signals=SIGNALS):
    """Unblock `signals` for the calling thread while the block runs (a no-op off the main thread,
    which does not run Python signal handlers, or where the platform has no signal masks)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_UNBLOCK, set(signals))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
