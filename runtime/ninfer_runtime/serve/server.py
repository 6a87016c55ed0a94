"""Assemble adapter + scheduler + metrics + app, and run it under uvicorn with a bounded drain.

`Server(adapter, ...)` is usable in-process (tests start it on a free loopback port in a thread);
`run_cli` (cli.py) builds it from a plan. Shutdown (SIGTERM / SIGINT, or `Server.shutdown()`):
new requests get 503, waiting ones are aborted, running ones get up to `drain_s` to finish and are
then aborted (their streams end with finish_reason "abort"); uvicorn closes the connections, the
engine thread stops, and the whole takes at most `drain_s` + ~1 s (the default 8 s keeps SIGTERM
under 10 s).
"""

from __future__ import annotations

import socket
import sys
import threading
import time

import uvicorn

from ..signal_mask import unblocked
from .app import ServeConfig, build_app
from .metrics import Metrics
from .scheduler import Scheduler


class _Uvicorn(uvicorn.Server):
    def __init__(self, config, owner: "Server"):
        super().__init__(config)
        self._owner = owner

    def handle_exit(self, sig, frame) -> None:  # SIGTERM / SIGINT: drain first
        self._owner.begin_shutdown()


class Server:
    def __init__(self, adapter, *, model_name: str | None = None, host: str = "127.0.0.1", port: int = 8000,
                 max_queue: int = 64, api_key: str | None = None, cache_bytes: int = 2 << 30,
                 host_cache_bytes: int = 0, prefill_budget: int | None = None, snapshot_interval: int | None = None,
                 drain_s: float = 8.0, log=None, access_log: bool = False):
        self.adapter = adapter
        self.log = sys.stderr if log is None else log
        self.metrics = Metrics(adapter.slots, str(getattr(adapter, "spec_mode", "none") or "none"),
                               int(getattr(adapter, "draft_tokens", 0) or 0))
        self.scheduler = Scheduler(adapter, max_queue=max_queue, prefill_budget=prefill_budget,
                                   cache_bytes=cache_bytes, host_cache_bytes=host_cache_bytes,
                                   snapshot_interval=snapshot_interval, metrics=self.metrics, log=self.log)
        self.config = ServeConfig(model_name=model_name or adapter.model_id, api_key=api_key)
        self.app = build_app(adapter, self.scheduler, self.metrics, self.config)
        self.host = host
        if port == 0:
            port = free_port(host)
        self.port = int(port)
        self.drain_s = float(drain_s)
        self._uv = _Uvicorn(uvicorn.Config(self.app, host=host, port=self.port, log_level="warning",
                                           access_log=access_log, lifespan="off",
                                           timeout_graceful_shutdown=1), self)
        self._drainer: threading.Thread | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ------------------------------------------------------------------ run
    def serve_forever(self) -> None:
        """Run in this thread until shut down (installs uvicorn's signal handlers when main)."""
        self.scheduler.start()
        try:
            with unblocked():  # SIGTERM / SIGINT reach uvicorn's handlers whatever mask was inherited
                self._uv.run()
        finally:
            self.scheduler.stop(timeout=2.0)

    def start_in_thread(self, ready_s: float = 30.0) -> "Server":
        self.scheduler.start()
        self._thread = threading.Thread(target=self._uv.run, name="ninfer-http", daemon=True)
        self._thread.start()
        t0 = time.monotonic()
        while not self._uv.started:
            if time.monotonic() - t0 > ready_s or not self._thread.is_alive():
                raise RuntimeError(f"the server did not start on {self.url}")
            time.sleep(0.02)
        return self

    # ------------------------------------------------------------------ shutdown
    def begin_shutdown(self) -> None:
        if self._drainer is not None:
            return
        self.log.write('{"event": "shutdown", "drain_s": %s}\n' % self.drain_s)
        self.scheduler.begin_drain()
        self._drainer = threading.Thread(target=self._drain, name="ninfer-drain", daemon=True)
        self._drainer.start()

    def _drain(self) -> None:
        t0 = time.monotonic()
        while not self.scheduler.idle() and time.monotonic() - t0 < self.drain_s:
            time.sleep(0.05)
        if not self.scheduler.idle():
            self.scheduler.abort_all()
            t1 = time.monotonic()
            while not self.scheduler.idle() and time.monotonic() - t1 < 1.0:
                time.sleep(0.02)
        time.sleep(0.1)  # let the last SSE bytes go out
        self._uv.should_exit = True

    def shutdown(self, timeout: float = 15.0) -> None:
        self.begin_shutdown()
        if self._thread is not None:
            self._thread.join(timeout)
        self.scheduler.stop(timeout=2.0)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
