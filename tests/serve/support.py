"""Shared helpers for the serve tests: a server in a thread on a free loopback port, bounded waits,
`ninfer-run` in-process."""

from __future__ import annotations

import io
import json
import threading
import time
from contextlib import contextmanager, redirect_stderr, redirect_stdout

import httpx

from ninfer_runtime.serve.server import Server


class LockedLog(io.StringIO):
    """The per-request JSON lines (written by the engine thread)."""

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()

    def write(self, s):
        with self._lock:
            return super().write(s)

    def records(self) -> list[dict]:
        with self._lock:
            lines = self.getvalue().splitlines()
        return [json.loads(x) for x in lines if x.startswith("{")]

    def requests(self) -> list[dict]:
        return [r for r in self.records() if r.get("event") == "request"]


@contextmanager
def running(adapter, **kw):
    log = kw.pop("log", None) or LockedLog()
    srv = Server(adapter, host="127.0.0.1", port=0, log=log, **kw).start_in_thread()
    srv.test_log = log
    try:
        yield srv
    finally:
        srv.shutdown(timeout=20)


def wait_until(fn, timeout_s: float = 30.0, every_s: float = 0.05, what: str = "condition"):
    t0 = time.monotonic()
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(every_s)


def health(srv) -> dict:
    return httpx.get(srv.url + "/health", timeout=10).json()


def metric(srv, name: str) -> float:
    """Sum of every sample of a metric family line `name{...} v` / `name v` in /metrics."""
    text = httpx.get(srv.url + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, val = line.rpartition(" ")
        if key == name or key.startswith(name + "{"):
            total += float(val)
    return total


def sse_events(resp) -> list[str]:
    """The `data:` payloads of an SSE response, in order (bounded by the response itself)."""
    out = []
    for line in resp.iter_lines():
        if line.startswith("data: "):
            out.append(line[len("data: "):])
    return out


def ninfer_run(plan, art, *args, quiet: bool = True):
    """`ninfer-run PLAN --artifact ART [--quiet] ARGS` in-process: the generated ids (its last line);
    with quiet=False, (ids, stderr)."""
    from ninfer_runtime.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main([str(plan), "--artifact", str(art), *(["--quiet"] if quiet else []), *args])
    assert rc == 0, err.getvalue()
    last = out.getvalue().strip().splitlines()[-1]
    assert last.startswith("tokens: "), out.getvalue()
    ids = [int(t) for t in last.split()[1:]]
    return ids if quiet else (ids, err.getvalue())
