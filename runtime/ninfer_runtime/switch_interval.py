"""Python's thread switch interval, shortened while background threads overlap the main thread.

A thread that hands the GIL back around every copy or driver call waits up to the switch interval
(5 ms by default) to get it again behind another thread's Python. The load's overlapping work
(device.py `KernelSetup`, weight_stream.py's readers) asks for a shorter one while it runs.

`ShortSwitchInterval(seconds)`: `acquire()` / `release()` (each idempotent). Holders nest in any
order: while any holds, the interval is the shortest asked for; when the last releases, the
interval from before the first comes back. An interval someone else set meanwhile becomes the
one that comes back (and is shortened only while holders remain).
Standard library only (the weight stream runs before torch is imported).
"""

from __future__ import annotations

import sys
import threading

_lock = threading.Lock()
_asked: list[float] = []  # the intervals current holders asked for
_state = {"before": None, "set": None}  # the interval before the first holder; the one set last


class ShortSwitchInterval:
    def __init__(self, seconds: float):
        self.seconds = float(seconds)
        self._holding = False

    def acquire(self) -> "ShortSwitchInterval":
        with _lock:
            if not self._holding:
                if not _asked:
                    _state["before"] = sys.getswitchinterval()
                _asked.append(self.seconds)
                self._holding = True
                _apply(min(_state["before"], *_asked))
        return self

    def release(self) -> None:
        with _lock:
            if self._holding:
                self._holding = False
                _asked.remove(self.seconds)
                _apply(min(_state["before"], *_asked) if _asked else _state["before"])


def _apply(interval: float) -> None:
    current = sys.getswitchinterval()
    if _state["set"] is not None and current != _state["set"]:  # changed by someone else: theirs
        _state["before"] = current
        interval = min(current, *_asked) if _asked else current
    sys.setswitchinterval(interval)
    _state["set"] = sys.getswitchinterval() if _asked else None
