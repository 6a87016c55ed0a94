"""Peers of the end-to-end benchmark, measured beside our engine (issue: runtime speed on the H200).

Two peers, each in its own subprocess (GPU memory is freed between them; one failing or timing
out does not lose the other), on the shapes of a contract (qwen3.6-27b by default):

- `hf`: Hugging Face transformers `Qwen3_5ForCausalLM` built from the contract's dimensions with
  random bf16 weights made directly on the device (meta construction + `to_empty` + in-place
  init), eager attention. flash-linear-attention is used when importable (transformers then
  calls its kernels); which GDN path ran is recorded (the resolved functions, and on a GPU the
  kernel names of one profiled decode step).
- `reference`: this project's float32 `ReferenceModel` over an artifact's dequantized weights,
  streamed object by object to the device (grouped payloads are decoded on the device, exactly
  as `artifact.codecs` does on the host). Prefill runs eager; the decode loop runs with each
  decoder layer under `torch.compile` (mode default; compile time recorded apart from the
  steady state; eager with the reason recorded if compiling fails).

Per peer: prefill tok/s for a `--context`-token prompt (per sequence), greedy decode tok/s over
`--decode-tokens` steps with the peer's own KV/recurrent cache (one token per forward), at each
`--concurrency` C (HF only; the reference is single-sequence), and the weight-read roofline as
in bench_e2e.py: bytes of weights read per decode step (every weight but the embedding table:
bf16 parameter bytes for HF, fp32 bytes for the reference) / read bandwidth measured in the same
process (bf16 cuBLAS GEMV, `bench_e2e.read_bandwidth_gbs`).

    python bench/bench_peers.py --out DIR [--label 27b] [--contract qwen3.6-27b] [--artifact A.ninfer]
        [--peers hf,reference] [--context 4096] [--decode-tokens 16] [--concurrency 1]
        [--device cuda] [--compile inductor] [--timeout-hf 240] [--timeout-reference 300] [--budget-s S]

Writes DIR/peers_<label>.json and .md with provenance (GPU, driver, torch/transformers/triton/fla
versions, date). Without `--artifact` the reference peer packs a synthetic artifact of the
contract into a temporary directory first. `--peer hf|reference --result FILE` runs one peer in
this process (what the parent launches).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from peer_common import checkpoint, versions  # noqa: E402  (bench/ is on sys.path now)

PEERS = ("hf", "reference")


# ------------------------------------------------------------------------------ parent / report


def _fmt(v, spec=".1f", none="-"):
    return none if v is None else format(v, spec)


def render_md(res: dict) -> str:
    prov = res.get("provenance") or {}
    lines = [f"# Peers, {res['label']}: {prov.get('gpu') or prov.get('device', '?')}, {prov.get('date', '?')}", "",
             f"driver {prov.get('driver')}, torch {prov.get('torch')}, transformers {prov.get('transformers')}, "
             f"triton {prov.get('triton')}, fla {prov.get('fla')}; contract {res['options']['contract']}, "
             f"context {res['options']['context']} tokens per sequence, {res['options']['decode_tokens']} "
             f"decode steps", "",
             "| peer | path | C | prefill tok/s | decode tok/s | step ms | weights GB/step | read GB/s | "
             "roofline step ms | % of roofline | setup |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for name, p in res["peers"].items():
        if "error" in p:
            notes.append(f"- {name} failed: {p['error'].strip().splitlines()[-1] if p['error'].strip() else '?'}")
            if not p.get("decode"):
                lines.append(f"| {name} | failed | | | | | | | | | |")
                continue
        gb = p["weights_bytes_per_step"] / 1e9
        if name == "hf":
            path = f"HF eager {p['dtype']}, GDN: {'fla' if p.get('fla', {}).get('importable') else 'torch'}"
            setup = f"build {p['build_s']:.1f} s"
        else:
            c = p["compile"]
            path = f"reference fp32, decode {'torch.compile (' + c['compile_backend'] + ')' if c['compiled'] else 'eager'}"
            setup = f"load {p['load_s']:.1f} s" + (f", compile {c['compile_s']:.1f} s" if c["compile_s"] is not None else "")
            if c["compile_error"]:
                notes.append(f"- reference: compile fell back to eager: {c['compile_error'][:200]}")
        for cc, d in p["decode"].items():
            pf = p["prefill"].get(cc) or p["prefill"].get(str(cc)) or {}
            frac = d.get("fraction_of_roofline")
            lines.append(f"| {name} | {path} | {cc} | {_fmt(pf.get('tok_s'), '.0f')} | {d['tok_s']:.2f} | "
                         f"{d['step_ms']:.1f} | {gb:.2f} | {_fmt(p.get('read_bandwidth_gbs'), '.0f')} | "
                         f"{_fmt(d.get('roofline_step_ms'), '.2f')} | {_fmt(None if frac is None else 100 * frac, '.0f')} | "
                         f"{setup} |")
        sg = p.get("streaming_read_gbs")
        if sg:
            per_c = ", ".join(f"C={cc} {100 * gb / sg / d['step_ms']:.0f}%" for cc, d in p["decode"].items())
            notes.append(f"- {name}: streaming read {sg:.0f} GB/s in its process; its weights at that rate "
                         f"{gb / sg * 1e3:.2f} ms/step ({per_c} of a step)")
        if name == "hf":
            notes.append(f"- hf GDN path: {json.dumps(p.get('gdn_path'))}; fla {json.dumps(p.get('fla'))}")
            k = (p.get("profiled_decode_step") or {}).get("gdn_kernels")
            if k is not None:
                notes.append(f"- hf decode-step GDN kernels (profiler): {', '.join(k) or 'none matched'}")
    return "\n".join(lines + [""] + notes) + "\n"


def run_child(args) -> int:
    import torch

    device = torch.device(args.device)
    if args.peer == "hf":
        from peer_hf import run_hf as fn
    else:
        from peer_reference import run_reference as fn
    res = {"peer": args.peer}
    try:
        fn(args, device, res)
    except Exception:  # noqa: BLE001  (what was measured before the failure is kept)
        res["error"] = traceback.format_exc()[-3000:]
        print(res["error"], file=sys.stderr, flush=True)
    checkpoint(args, res)
    return 0 if "error" not in res else 1


def child_argv(args, peer: str, result: Path) -> list[str]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--peer", peer, "--result", str(result),
            "--contract", args.contract, "--context", str(args.context), "--decode-tokens", str(args.decode_tokens),
            "--concurrency", ",".join(map(str, args.concurrency)), "--device", args.device,
            "--compile", args.compile, "--hf-dtype", args.hf_dtype, "--seed", str(args.seed),
            "--warm-steps", str(args.warm_steps), "--out", str(args.out)]
    if args.artifact is not None:
        argv += ["--artifact", str(args.artifact)]
    return argv


def run_with_timeout(argv: list[str], limit: float) -> tuple[int | None, str]:
    """Run `argv` in its own process group (stdout passed through, stderr captured); on timeout
    the whole group (the peer and any compile workers it started) is killed. rc None = timed out."""
    import signal

    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=limit)
        return proc.returncode, err or ""
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, err = proc.communicate()
        return None, err or ""


def run_parent(args) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    res = {"label": args.label, "options": {"contract": args.contract, "context": args.context,
                                            "decode_tokens": args.decode_tokens, "concurrency": args.concurrency,
                                            "device": args.device, "compile": args.compile,
                                            "hf_dtype": args.hf_dtype, "artifact": None if args.artifact is None
                                            else str(args.artifact)},
           "provenance": None, "peers": {}}
    timeouts = {"hf": args.timeout_hf, "reference": args.timeout_reference}
    start = time.perf_counter()
    for i, peer in enumerate(args.peers):
        result = args.out / f".peer_{args.label}_{peer}.json"
        result.unlink(missing_ok=True)
        t0 = time.perf_counter()
        err = None
        limit = timeouts[peer]
        if args.budget_s is not None:  # what is left, less a reserve for each peer still to run
            later = len(args.peers) - 1 - i
            limit = min(limit, args.budget_s - (t0 - start) - args.reserve_s * later)
            if limit < 30:
                res["peers"][peer] = {"peer": peer, "wall_s": 0.0,
                                      "error": f"skipped: {limit:.0f} s left of --budget-s {args.budget_s}"}
                print(f"peer {peer}: skipped (budget)", flush=True)
                continue
        rc, stderr = run_with_timeout(child_argv(args, peer, result), limit)
        if stderr:
            sys.stderr.write(stderr[-4000:])
        if rc is None:
            err = f"timed out after {limit:.0f} s: {stderr[-1500:]}"
        elif rc != 0 and not result.exists():
            err = f"exit {rc}: {stderr[-2000:]}"
        wall = time.perf_counter() - t0
        if result.exists():  # complete, or partial (written as the peer went)
            r = json.loads(result.read_text())
            result.unlink()
            if err and "error" not in r:
                r["error"] = err
        else:
            r = {"peer": peer, "error": err or "no result"}
        r["wall_s"] = wall
        res["peers"][peer] = r
        if res["provenance"] is None and r.get("provenance"):
            res["provenance"] = r["provenance"]
        print(f"peer {peer}: {'error' if 'error' in r else 'ok'} in {wall:.0f} s", flush=True)
    if res["provenance"] is None:
        res["provenance"] = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), **versions()}
    (args.out / f"peers_{args.label}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    md = render_md(res)
    (args.out / f"peers_{args.label}.md").write_text(md)
    print(md)
    return 0 if all("error" not in p for p in res["peers"].values()) else 1


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("out/peers"))
    ap.add_argument("--label", default="run")
    ap.add_argument("--contract", default="qwen3.6-27b", help="model id under graphs/ or a contract YAML")
    ap.add_argument("--artifact", type=Path, default=None,
                    help="reference peer's artifact (default: a synthetic one of the contract, packed first)")
    ap.add_argument("--peers", default="hf,reference")
    ap.add_argument("--peer", choices=PEERS, default=None, help="run one peer in this process (the child)")
    ap.add_argument("--result", type=Path, default=None, help="child: where to write its JSON")
    ap.add_argument("--context", type=int, default=4096, help="prompt tokens per sequence")
    ap.add_argument("--decode-tokens", type=int, default=16, help="timed decode steps")
    ap.add_argument("--concurrency", default="1", help="HF batch sizes C (the reference runs C=1)")
    ap.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    ap.add_argument("--compile", default="inductor", choices=("inductor", "aot_eager", "eager", "none"),
                    help="torch.compile backend of the reference's decode layers ('none': eager)")
    ap.add_argument("--warm-steps", type=int, default=2, help="reference: untimed decode steps (compilation)")
    ap.add_argument("--hf-dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout-hf", type=float, default=240)
    ap.add_argument("--timeout-reference", type=float, default=300)
    ap.add_argument("--budget-s", type=float, default=None,
                    help="parent: wall-clock budget for all peers (each peer's timeout is cut to what is left)")
    ap.add_argument("--reserve-s", type=float, default=150,
                    help="parent, with --budget-s: seconds kept back for each peer still to run")
    args = ap.parse_args(argv)
    args.peers = [p for p in args.peers.split(",") if p]
    bad = [p for p in args.peers if p not in PEERS]
    if bad:
        ap.error(f"unknown peer(s) {bad} (choose from {', '.join(PEERS)})")
    args.concurrency = [int(x) for x in args.concurrency.split(",") if x]
    if args.context < 17:
        ap.error("--context must be at least 17 tokens")
    if args.decode_tokens < 1:
        ap.error("--decode-tokens must be >= 1")
    if args.device is None:
        try:
            import torch

            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            args.device = "cpu"
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return run_child(args) if args.peer else run_parent(args)


if __name__ == "__main__":
    sys.exit(main())
