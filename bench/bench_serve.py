"""ninfer-serve under load: TTFT and per-token latency at C = 1..8, a long shared prefix cold vs warm,
and a bounded load run (nothing lost or duplicated). Timings are the server's own (its per-request JSON
log lines: queue wait, TTFT from arrival, decode tok/s), as the field reports measure; the client only
counts what came back.

    python3 bench/bench_serve.py --plan P --artifact A --out DIR --label 27b \
        [--concurrency 1,2,4,8] [--prompt-tokens 512] [--max-tokens 64] [--prefix-tokens 16384] \
        [--load-requests 32] [--budget-s 420]

Token-id prompts (`/v1/completions` with a list of ids, `ignore_eos`), so synthetic artifacts without a
tokenizer work. The client is the standard library (urllib + threads): nothing to install on the GPU
machine besides the server's own dependencies. Every wait is bounded (`--budget-s` overall).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, plan: str, artifact: str, log: Path, extra: list[str]):
        self.port = _free_port()
        self.log = log
        env = dict(os.environ)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ninfer_runtime.serve", plan, "--artifact", artifact, "--port", str(self.port),
             "--log-file", str(log), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
        self.output: list[str] = []
        self.model = "model"
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self.output.append(line.rstrip())

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_healthy(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited: " + " | ".join(self.output[-5:]))
            try:
                with urllib.request.urlopen(self.url("/health"), timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError("server not healthy in time: " + " | ".join(self.output[-5:]))

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def records(self) -> list[dict]:
        if not self.log.is_file():
            return []
        return [json.loads(x) for x in self.log.read_text().splitlines() if x.strip().startswith("{")]


def complete(server: Server, ids: list[int], max_tokens: int, timeout: float) -> dict:
    body = json.dumps({"model": server.model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(server.url("/v1/completions"), data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def run_batch(server: Server, prompts: list[list[int]], max_tokens: int, timeout: float) -> list[dict | str]:
    out: list[dict | str] = [""] * len(prompts)

    def one(i: int) -> None:
        try:
            out[i] = complete(server, prompts[i], max_tokens, timeout)
        except Exception as exc:  # noqa: BLE001 - recorded, counted as lost
            out[i] = f"{type(exc).__name__}: {exc}"

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout + 5)
    return out


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{1000 * x:.1f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", required=True)
    ap.add_argument("--artifact", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="serve")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prefix-tokens", type=int, default=16384)
    ap.add_argument("--load-requests", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=240000, help="token ids are drawn below this")
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--server-args", default="", help="extra ninfer-serve flags, e.g. '--prefix-cache-gib 24'")
    a = ap.parse_args(argv)
    t_end = time.monotonic() + a.budget_s
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"serve_{a.label}_requests.jsonl"
    log.unlink(missing_ok=True)
    rng = random.Random(0)
    ids = lambda n: [rng.randrange(1, a.vocab) for _ in range(n)]  # noqa: E731
    srv = Server(a.plan, a.artifact, log, a.server_args.split())
    lines = [f"# ninfer-serve, {a.label}: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             f"plan {a.plan}; server flags {a.server_args or '(defaults)'}; prompts {a.prompt_tokens} token ids, {a.max_tokens} tokens each (ignore_eos, greedy); "
             f"server-side timings from its request log", ""]
    result: dict = {"label": a.label, "runs": []}
    try:
        t0 = time.monotonic()
        srv.wait_healthy(min(t_end, t0 + 240))
        result["startup_s"] = round(time.monotonic() - t0, 2)
        with urllib.request.urlopen(srv.url("/v1/models"), timeout=5) as m:
            srv.model = json.loads(m.read())["data"][0]["id"]
        lines.append(f"startup to healthy: {result['startup_s']} s")
        lines += ["", "| C | requests ok | TTFT median ms | TTFT max ms | per-token ms (median) | aggregate tok/s |",
                  "|---|---|---|---|---|---|"]
        complete(srv, ids(16), 4, 120)  # warm-up (first use of each extent)
        for c in [int(x) for x in a.concurrency.split(",")]:
            if time.monotonic() > t_end - 60:
                lines.append(f"| {c} | not run (budget) | | | | |")
                continue
            n0 = len(srv.records())
            t1 = time.monotonic()
            res = run_batch(srv, [ids(a.prompt_tokens) for _ in range(c)], a.max_tokens, max(30.0, t_end - time.monotonic()))
            wall = time.monotonic() - t1
            recs = srv.records()[n0:]
            ok = [r for r in res if isinstance(r, dict)]
            ttft = [r["ttft_s"] for r in recs if r.get("ttft_s") is not None]
            tps = [r["decode_tok_s"] for r in recs if r.get("decode_tok_s")]
            toks = sum(r["usage"]["completion_tokens"] for r in ok)
            row = {"c": c, "ok": len(ok), "ttft_median_s": statistics.median(ttft) if ttft else None,
                   "ttft_max_s": max(ttft) if ttft else None,
                   "per_token_s": statistics.median([1 / x for x in tps]) if tps else None,
                   "aggregate_tok_s": toks / wall if wall > 0 else None, "errors": [r for r in res if isinstance(r, str)]}
            result["runs"].append(row)
            lines.append(f"| {c} | {len(ok)}/{c} | {_ms(row['ttft_median_s'])} | {_ms(row['ttft_max_s'])} | "
                         f"{_ms(row['per_token_s'])} | {row['aggregate_tok_s']:.1f} |")
        # a long shared prefix: cold, then warm (restored from the prefix cache)
        if a.prefix_tokens and time.monotonic() < t_end - 90:
            prefix = ids(a.prefix_tokens)
            lines += ["", f"shared prefix of {a.prefix_tokens} tokens (+ 32 own tokens per request):", ""]
            for tag in ("cold", "warm"):
                n0 = len(srv.records())
                r = run_batch(srv, [prefix + ids(32)], 8, max(30.0, t_end - time.monotonic()))[0]
                rec = (srv.records()[n0:] or [{}])[0]
                cached = r["usage"].get("prompt_tokens_details", {}).get("cached_tokens") if isinstance(r, dict) else None
                result[f"prefix_{tag}"] = {"ttft_s": rec.get("ttft_s"), "cached_tokens": cached,
                                           "error": r if isinstance(r, str) else None}
                lines.append(f"- {tag}: TTFT {_ms(rec.get('ttft_s'))} ms, cached_tokens {cached}")
        # bounded load run: every request answered exactly once
        if a.load_requests and time.monotonic() < t_end - 60:
            n0 = len(srv.records())
            res = run_batch(srv, [ids(64) for _ in range(a.load_requests)], 8, max(30.0, t_end - time.monotonic()))
            recs = srv.records()[n0:]
            ok = [r for r in res if isinstance(r, dict)]
            ids_seen = [r["id"] for r in ok]
            result["load"] = {"requests": a.load_requests, "ok": len(ok), "logged": len(recs),
                              "duplicates": len(ids_seen) - len(set(ids_seen)),
                              "errors": sorted({r for r in res if isinstance(r, str)})[:5]}
            with urllib.request.urlopen(srv.url("/health"), timeout=5) as h:
                result["load"]["healthy_after"] = h.status == 200
            lines += ["", f"load: {a.load_requests} requests at once, {len(ok)} answered, {len(recs)} logged, "
                          f"{result['load']['duplicates']} duplicate ids, healthy after: {result['load']['healthy_after']}"]
    except Exception as exc:  # noqa: BLE001 - the report says what failed; nothing is invented
        lines.append(f"\nerror: {type(exc).__name__}: {exc}")
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        result["exit_code"] = srv.stop()
        lines.append(f"\nserver exit code after SIGTERM: {result['exit_code']}")
        result["server_output_tail"] = srv.output[-20:]
    (out / f"serve_{a.label}.md").write_text("\n".join(lines) + "\n")
    (out / f"serve_{a.label}.json").write_text(json.dumps(result, indent=1) + "\n")
    print("\n".join(lines))
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
