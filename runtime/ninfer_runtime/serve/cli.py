"""`ninfer-serve PLAN --artifact A [--host 127.0.0.1] [--port 8000] [--model-name NAME] [--max-queue N]
[--api-key KEY] [--prefix-cache-gib G] [--spec mtp|ngram|none] ...`: serve a compiled plan over an
OpenAI-compatible API.

Errors before serving are one line `error: ...` (exit 2). SIGTERM / SIGINT drain (running requests
get `--drain-s` seconds, default 8, then are aborted) and exit 0. One JSON line per request on
stderr (or `--log-file`).
"""

from __future__ import annotations

import argparse
import math
import os
import sys


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        print(f"error: {message} (see ninfer-serve --help)", file=sys.stderr)
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    p = _OneLineParser(prog="ninfer-serve", description="Serve a compiled ninfer plan over an OpenAI-compatible "
                       "HTTP API (/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics).")
    p.add_argument("plan", help="plan directory written by ninfer-compile")
    p.add_argument("--artifact", required=True, help="the .ninfer artifact the plan was compiled for")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 = any free port)")
    p.add_argument("--model-name", default=None, help="the model id clients send (default: the plan's model id)")
    p.add_argument("--max-queue", type=int, default=64, metavar="N",
                   help="requests allowed to wait for a slot (default 64); beyond: 429 with Retry-After")
    p.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1/* "
                   "(default: $NINFER_API_KEY when set, else no key)")
    p.add_argument("--prefix-cache-gib", type=float, default=2.0, metavar="G",
                   help="device memory for prefix-cache state snapshots (default 2; 0 = no prefix reuse)")
    p.add_argument("--prefix-cache-host-gib", type=float, default=0.0, metavar="G",
                   help="host memory for snapshots evicted from the device (default 0 = no spill)")
    p.add_argument("--snapshot-interval", type=int, default=None, metavar="TOKENS",
                   help="also snapshot a prompt's state every TOKENS prefilled tokens (rounded up to the prefill "
                        "chunk; default max(chunk, 2048)); prompt and generation ends are always snapshotted")
    p.add_argument("--prefill-budget", type=int, default=None, metavar="TOKENS",
                   help="prefill tokens per engine step between decode steps (default: one prefill chunk)")
    p.add_argument("--drain-s", type=float, default=8.0, help="on SIGTERM, seconds running requests get to finish "
                   "(default 8)")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--kernels", default=None, choices=("torch", "interpret"),
                   help="on the CPU: torch (default: the plan's torch implementations) or interpret (its Triton "
                        "kernels under the interpreter, slow); a GPU always runs the Triton kernels")
    p.add_argument("--no-graphs", action="store_true", help="launch decode steps eagerly (no CUDA graph replay)")
    p.add_argument("--spec", choices=("mtp", "ngram", "none"), default=None,
                   help="speculative decoding on a plan compiled with --draft-tokens K: mtp (the artifact's MTP head), "
                        "ngram (prompt lookup) or none (plain steps); default: mtp when the plan has MTP draft "
                        "extents, else none")
    p.add_argument("--log-file", default=None, help="append the per-request JSON lines here instead of stderr")
    p.add_argument("--access-log", action="store_true", help="uvicorn's access log too")
    return p


def _check(args) -> None:
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    if args.max_queue < 0:
        raise ValueError(f"--max-queue must be >= 0, got {args.max_queue}")
    for flag, v in (("--prefix-cache-gib", args.prefix_cache_gib), ("--prefix-cache-host-gib",
                                                                    args.prefix_cache_host_gib)):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{flag} must be a finite number >= 0, got {v}")
    if args.snapshot_interval is not None and args.snapshot_interval < 1:
        raise ValueError(f"--snapshot-interval must be >= 1, got {args.snapshot_interval}")
    if args.prefill_budget is not None and args.prefill_budget < 1:
        raise ValueError(f"--prefill-budget must be >= 1, got {args.prefill_budget}")
    if not math.isfinite(args.drain_s) or not 0 <= args.drain_s <= 60:
        raise ValueError(f"--drain-s must be in [0, 60], got {args.drain_s}")
    if args.api_key is not None and not args.api_key.strip():
        raise ValueError("--api-key is empty")
    _check_bind(args.host, args.port)
    _check_spec(args.plan, args.spec)


def _check_spec(plan: str, spec: str | None) -> None:
    """Refuse --spec mtp / ngram on a plan that cannot run it before loading the model (the engine
    adapter checks again against the loaded plan)."""
    if spec in (None, "none"):
        return
    import json
    from pathlib import Path

    try:
        body = json.loads((Path(plan) / "plan.json").read_text())
    except (OSError, ValueError):
        return  # the loader reports an unreadable plan in its own words
    k = int((body.get("options") or {}).get("draft_tokens", 0) or 0)
    if k == 0:
        raise ValueError(f"--spec {spec} needs a plan compiled with --draft-tokens K (this plan has no draft "
                         f"window; use --spec none)")
    if spec == "mtp" and not any(str(e.get("graph", "text")) == "mtp" for e in (body.get("extents") or {}).values()):
        raise ValueError("--spec mtp needs MTP draft extents: the plan has none (the artifact has no MTP part, or it "
                         "was compiled without it); use --spec ngram or none")


def _check_bind(host: str, port: int) -> None:
    """Refuse a taken port / unknown host now, in one line, not after loading the model."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ValueError(f"--host {host}: {exc.strerror or exc}") from None
    fam, _, _, _, addr = infos[0]
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _spec_note(adapter) -> str:
    if adapter.spec_mode == "none":
        return f"; spec none (K={adapter.draft_tokens})" if adapter.draft_tokens else ""
    return f"; spec {adapter.spec_mode} K={adapter.draft_tokens}"


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    log = None
    try:
        _check(args)
        if args.kernels is None:  # a GPU run: the weights stream to it while torch is being imported
            from ..weight_stream import prestart

            prestart(args.plan, args.artifact, args.device)
        from ..tensor_parallel import serve_ranks

        rc = serve_ranks(args, sys.argv[1:] if argv is None else argv)  # a --tp N plan: N rank processes
        if rc is not None:
            return rc
        try:
            from .server import Server
        except ImportError as exc:
            raise ValueError(f"ninfer-serve needs the serve extra (pip install 'ninfer-compile[serve]'): {exc}") \
                from None
        from ..errors import NinferRuntimeError
        from .engine_adapter import EngineAdapter, open_engine

        log = open(args.log_file, "a", encoding="utf-8", buffering=1) if args.log_file else sys.stderr
        try:
            engine = open_engine(args.plan, args.artifact, device=args.device, kernels=args.kernels)
        except NinferRuntimeError as exc:
            raise ValueError(str(exc).splitlines()[0]) from None
        try:
            adapter = EngineAdapter(engine, use_graphs=not args.no_graphs, spec=args.spec)
        except ValueError:
            engine.close()
            raise
        key = args.api_key if args.api_key is not None else (os.environ.get("NINFER_API_KEY") or None)
        server = Server(adapter, model_name=args.model_name, host=args.host, port=args.port, max_queue=args.max_queue,
                        api_key=key, cache_bytes=int(args.prefix_cache_gib * 2**30),
                        host_cache_bytes=int(args.prefix_cache_host_gib * 2**30),
                        prefill_budget=args.prefill_budget, snapshot_interval=args.snapshot_interval,
                        drain_s=args.drain_s, log=log, access_log=args.access_log)
    except (ValueError, OSError) as exc:
        print(f"error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return 2
    print(f"ninfer-serve: {args.plan} as '{server.config.model_name}' on {server.url} ({adapter.slots} slots, max "
          f"context {adapter.max_context}, {engine.device_note}{_spec_note(adapter)})", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    finally:
        adapter.close()
        if log is not None and log is not sys.stderr:
            log.close()
    print("ninfer-serve: stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
