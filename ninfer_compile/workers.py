"""Worker processes that are safe to interrupt (the AOT binary phase, the tuner's precompile).

`run_forked(task, count, workers)` runs `task(i)` for i in range(count) in forked processes:

- each worker is forked with SIGINT/SIGTERM blocked, then ignores SIGINT (the terminal's Ctrl-C
  goes to the parent, which decides), takes the default SIGTERM action, moves into its own
  process group (so the terminal's signals reach only the parent) and asks the kernel to SIGKILL
  it if the parent dies (PR_SET_PDEATHSIG, Linux);
- work is handed out through a pipe (4-byte indices), completions come back through another, so
  no lock or queue thread can be left half-held by a killed worker;
- whatever ends the parent's wait — completion, an exception, KeyboardInterrupt (SIGINT, or the
  CLI's SIGTERM handler) — the `finally` SIGKILLs every worker's process group (the worker and
  any compiler child it started) and reaps it. Nothing is left running.

`stop_executor(pool)` does the same for a concurrent.futures.ProcessPoolExecutor that must not
be waited for (pending futures cancelled, its processes killed and reaped).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import tempfile
import time
from collections.abc import Callable

_SIGNALS = {signal.SIGINT, signal.SIGTERM}
_PR_SET_PDEATHSIG = 1


def _child_setup(parent: int, tmpdir: str | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before PDEATHSIG was armed
        os._exit(1)
    if tmpdir is not None:  # a SIGKILLed compiler leaves its temp files where the parent cleans up
        os.environ["TMPDIR"] = tmpdir
        tempfile.tempdir = tmpdir
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)


def _child_loop(task: Callable[[int], None], work_fd: int, done_fd: int) -> None:
    while True:
        b = os.read(work_fd, 4)
        if len(b) < 4:
            return
        try:
            task(int.from_bytes(b, "little"))
        except Exception:  # noqa: BLE001 - the caller's own pass records failures
            pass
        os.write(done_fd, b"\x01")


def _kill_group(pid: int) -> None:
    for fn in (os.killpg, os.kill):
        try:
            fn(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue


def run_forked(task: Callable[[int], None], count: int, workers: int, *,
               on_done: Callable[[int, int], None] | None = None, tmpdir: str | None = None) -> int:
    """Run task(0..count-1) in `workers` forked processes (they inherit the parent's memory).
    `on_done(finished, count)` is called in the parent as completions arrive. `tmpdir`: the workers'
    TMPDIR. Returns how many tasks finished (a worker that crashed loses its current task; the
    caller's own pass covers it). Raises whatever interrupts the parent, after killing the workers."""
    if count <= 0:
        return 0
    work_r, work_w = os.pipe()
    done_r, done_w = os.pipe()
    pids: list[int] = []
    parent = os.getpid()
    finished = 0
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            for _ in range(max(1, workers)):
                pid = os.fork()
                if pid == 0:  # child: never returns into the caller's code
                    code = 1
                    try:
                        os.close(work_w)
                        os.close(done_r)
                        _child_setup(parent, tmpdir)
                        _child_loop(task, work_r, done_w)
                        code = 0
                    except BaseException:  # noqa: BLE001
                        pass
                    finally:
                        os._exit(code)
                pids.append(pid)
                try:
                    os.setpgid(pid, pid)
                except OSError:  # the child did it first (or already exited)
                    pass
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        os.close(work_r)
        work_r = -1
        os.close(done_w)
        done_w = -1
        for i in range(count):  # the pipe holds 16k indices; a full pipe blocks until workers read
            os.write(work_w, i.to_bytes(4, "little"))
        os.close(work_w)
        work_w = -1
        while finished < count:
            ready, _, _ = select.select([done_r], [], [], 0.5)
            if ready:
                got = os.read(done_r, 4096)
                if not got:  # every worker has exited
                    break
                finished += len(got)
                if on_done is not None:
                    on_done(finished, count)
        return finished
    finally:
        for pid in pids:
            _kill_group(pid)
        for pid in pids:
            _reap(pid)
        for fd in (work_r, work_w, done_r, done_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass


def _reap(pid: int, timeout: float = 10.0) -> None:
    """waitpid after SIGKILL (bounded: a process stuck in the kernel is given up on)."""
    end = time.monotonic() + timeout
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        if time.monotonic() > end:
            return
        time.sleep(0.01)


def stop_executor(pool) -> None:
    """Cancel a ProcessPoolExecutor's pending work and kill its processes without waiting for
    running tasks (for an interrupted caller)."""
    procs = list(getattr(pool, "_processes", {}) .values())
    try:
        pool.shutdown(wait=False, cancel_futures=True)
    except Exception:  # noqa: BLE001
        pass
    for p in procs:
        try:
            p.kill()
        except Exception:  # noqa: BLE001
            pass
    for p in procs:
        try:
            p.join(10)
        except Exception:  # noqa: BLE001
            pass


def ignore_sigint() -> None:
    """For a pool's worker initializer: Ctrl-C is the parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
