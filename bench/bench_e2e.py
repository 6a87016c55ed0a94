"""End-to-end speed of a compiled plan on one GPU (issue: runtime speed on the H200).

Measures, in one run, against limits measured in the same run:
- HBM read bandwidth (bf16 cuBLAS GEMV over rotated 34816x5120 weights: bytes read / time);
- load time (upload / kernel load / CUDA-graph capture) and load-to-first-token;
- prefill tok/s at each requested prompt length;
- decode tok/s at each concurrency C with a `--context`-token prompt per sequence, and its
  fraction of the weight-read roofline (plan weight bytes read per decode step / read bandwidth).

    python bench/bench_e2e.py --plan P.plan --artifact A.ninfer --out DIR [--label bf16-kv]
        [--prefill 1024,4096] [--context 4096] [--concurrency 1,2,4,8] [--decode-tokens 32]

Writes DIR/e2e_<label>.json and .md with provenance (GPU, driver, torch, triton, date).

`--profile C[,C]`: for each listed concurrency, a decode-step breakdown after the timed runs: the
context prefilled into C slots, a few untimed steps, then `--profile-steps` steps under
torch.profiler (CUDA activity: the kernels of the replayed CUDA graphs): per kernel name, launches
and device µs per step, next to the step's wall time measured without the profiler; the
difference is time the GPU ran no kernel of ours (launch gaps, host work).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path


def read_bandwidth_gbs(torch, n: int = 34816, k: int = 5120, copies: int = 8) -> float:
    """Practical HBM read bandwidth: bf16 cuBLAS GEMV over `copies` rotated weight matrices (cold:
    together they are far larger than L2), bytes of W read / median time (GB/s). This is the
    read roofline the decode step is compared with (a copy's read+write rate overstates it)."""
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    x = torch.randn(k, device="cuda", dtype=torch.bfloat16)
    for w in ws:
        torch.mv(w, x)
    torch.cuda.synchronize()
    times = []
    for rep in range(5):
        for w in ws:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            torch.mv(w, x)
            e1.record()
            torch.cuda.synchronize()
            times.append(e0.elapsed_time(e1) / 1e3)
    times.sort()
    del ws
    torch.cuda.empty_cache()
    return n * k * 2 / times[len(times) // 2] / 1e9


def decode_weight_bytes(plan: dict, artifact: Path) -> int:
    """Bytes of weights one C=1 decode step reads: every weight object its launches reference
    (fused parents whole), except the embedding table (one row per token)."""
    from ninfer_runtime.artifact_view import ArtifactView

    ext = next(e for name, e in plan["extents"].items() if e["phase"] == "decode" and not name.startswith("mtp"))
    names = {v["weight"] for L in ext["launches"] if L["kind"] != "embedding"
             for v in L["args"].values() if isinstance(v, dict) and "weight" in v}
    with ArtifactView.open(artifact) as art:
        return sum(art.entry(n).bytes for n in names)


def kernel_breakdown(kernels: list[tuple[str, float]], steps: int, step_us: float, top: int = 30) -> dict:
    """Aggregate (kernel name, device µs) over `steps` decode steps: per name, launches and µs per
    step and % of the step's wall time `step_us`; the rest (wall - kernel time) is idle GPU time."""
    agg: dict[str, list] = {}
    for name, us in kernels:
        a = agg.setdefault(_short(name), [0, 0.0])
        a[0] += 1
        a[1] += float(us)
    per_step = sum(a[1] for a in agg.values()) / steps
    rows = [{"kernel": k, "launches_per_step": n / steps, "us_per_step": t / steps, "mean_us": t / n,
             "pct_of_step": 100.0 * t / steps / step_us} for k, (n, t) in agg.items()]
    rows.sort(key=lambda r: (-r["us_per_step"], r["kernel"]))
    return {"steps": steps, "step_us": step_us, "kernel_us_per_step": per_step,
            "launches_per_step": sum(a[0] for a in agg.values()) / steps,
            "idle_us_per_step": step_us - per_step, "rows": rows[:top], "other_kernels": max(0, len(rows) - top)}


def _short(name: str) -> str:
    """A kernel name without template arguments / parameter lists (torch's kernels are long)."""
    for cut in ("<", "("):
        if cut in name:
            name = name.split(cut, 1)[0]
    return name.strip()[:80] or "?"


def profile_decode(torch, eng, c: int, context: int, steps: int, prompt) -> dict:
    """Decode-step breakdown at concurrency c (see the module docstring)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from ninfer_runtime.generate import decode_step, prefill

    for s in range(c):
        prefill(eng, prompt(context), s)

    def step(i):
        decode_step(eng, [(7, context + i, s) for s in range(c)])

    for i in range(4):  # warm (graphs already captured at load)
        step(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        step(4 + i)
    torch.cuda.synchronize()
    wall_us = (time.perf_counter() - t0) / steps * 1e6
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            step(4 + steps + i)
        torch.cuda.synchronize()
    kernels = [(e.name, e.time_range.elapsed_us()) for e in prof.events() if e.device_type == DeviceType.CUDA]
    return kernel_breakdown(kernels, steps, wall_us)


def render_md(res: dict) -> str:
    prov, wbytes, read_gbs = res["provenance"], res["weights_bytes_per_step"], res["read_bandwidth_gbs"]
    lines = [f"# End to end, {res['label']}: {prov['gpu']}, {prov['date']}", "",
             f"driver {prov['driver']}, torch {prov['torch']}, triton {prov['triton']}; read bandwidth "
             f"{read_gbs:.0f} GB/s (bf16 cuBLAS GEMV, cold, same run); weights read per decode step "
             f"{wbytes / 1e9:.2f} GB -> roofline {wbytes / (read_gbs * 1e9) * 1e3:.2f} ms/step "
             f"({read_gbs * 1e9 / wbytes:.0f} tok/s at C=1)", "",
             f"options: {json.dumps(res.get('options'))}", "",
             f"load: {json.dumps({k: round(v, 2) for k, v in res['load_times_s'].items()})}; "
             f"load-to-first-token {res['load_to_first_token_s']:.1f} s; kernels: {res.get('kernels')}", "",
             "| prefill T | tok/s |", "|---|---|"]
    lines += [f"| {n} | {v['tok_s']:.0f} |" for n, v in res["prefill"].items()]
    lines += ["", "| C | decode tok/s | step ms | roofline step ms | % of roofline |", "|---|---|---|---|---|"]
    roof_ms = wbytes / (read_gbs * 1e9) * 1e3
    lines += [f"| {c} | {v['tok_s']:.1f} | {v['step_ms']:.2f} | {roof_ms:.2f} | {100 * roof_ms / v['step_ms']:.0f}% |"
              for c, v in res["decode"].items()]
    for c, b in (res.get("decode_profile") or {}).items():
        lines += ["", f"Decode step at C={c}, {b['steps']} steps under torch.profiler: wall {b['step_us']:.0f} µs/step "
                  f"(measured without the profiler), our kernels {b['kernel_us_per_step']:.0f} µs in "
                  f"{b['launches_per_step']:.0f} launches, GPU idle {b['idle_us_per_step']:.0f} µs", "",
                  "| kernel | launches/step | µs/step | mean µs | % of step |", "|---|---|---|---|---|"]
        lines += [f"| {r['kernel']} | {r['launches_per_step']:.0f} | {r['us_per_step']:.1f} | {r['mean_us']:.2f} | "
                  f"{r['pct_of_step']:.1f}% |" for r in b["rows"]]
        if b["other_kernels"]:
            lines.append(f"| ({b['other_kernels']} more kernel names) | | | | |")
    return "\n".join(lines) + "\n"


def provenance(torch) -> dict:
    import triton

    drv = "?"
    try:
        drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "gpu": torch.cuda.get_device_name(), "driver": drv, "torch": torch.__version__,
            "triton": triton.__version__, "python": sys.version.split()[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", type=Path, required=True)
    ap.add_argument("--artifact", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--label", default="run")
    ap.add_argument("--prefill", default="1024,4096")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--profile", default="", help="concurrencies to break down per kernel (e.g. 1,8)")
    ap.add_argument("--profile-steps", type=int, default=8)
    args = ap.parse_args(argv)

    import torch

    import ninfer_runtime

    args.out.mkdir(parents=True, exist_ok=True)
    prov = provenance(torch)
    read_gbs = read_bandwidth_gbs(torch)
    t0 = time.perf_counter()
    eng = ninfer_runtime.load(args.plan, args.artifact, progress=False)
    plan = json.loads((args.plan / "plan.json").read_text())
    vocab = 1000  # random token ids below this are valid in any vocabulary we compile
    first = eng.generate([1, 2, 3, 4], max_new_tokens=1, greedy=True, ignore_eos=True)
    torch.cuda.synchronize()
    load_to_first = time.perf_counter() - t0
    res = {"provenance": prov, "label": args.label, "read_bandwidth_gbs": read_gbs,
           "load_times_s": eng.load_times, "load_to_first_token_s": load_to_first,
           "kernels": getattr(eng, "device_note", None),
           "weights_bytes_per_step": decode_weight_bytes(plan, args.artifact), "options": plan.get("options"),
           "prefill": {}, "decode": {}}
    g = torch.Generator().manual_seed(0)

    def prompt(n):
        return torch.randint(5, vocab, (n,), generator=g).tolist()

    for n in [int(x) for x in args.prefill.split(",") if x]:
        eng.generate(prompt(n), max_new_tokens=1, greedy=True, ignore_eos=True)  # warm
        eng.generate(prompt(n), max_new_tokens=1, greedy=True, ignore_eos=True)
        st = eng.last_stats
        res["prefill"][n] = {"tok_s": st["prefill_tokens"] / st["prefill_s"], "s": st["prefill_s"]}
        print(f"prefill {n}: {res['prefill'][n]['tok_s']:.0f} tok/s", flush=True)
    wbytes = res["weights_bytes_per_step"]
    for c in [int(x) for x in args.concurrency.split(",") if x]:
        ps = [prompt(args.context) for _ in range(c)]
        eng.generate(ps, max_new_tokens=4, greedy=True, ignore_eos=True, concurrency=c)  # warm
        eng.generate(ps, max_new_tokens=args.decode_tokens, greedy=True, ignore_eos=True, concurrency=c)
        st = eng.last_stats
        tok_s = st["decode_tokens"] / st["decode_s"]
        step_s = st["decode_s"] / max(1, st["decode_steps"])
        roof = wbytes / (read_gbs * 1e9)  # s per step, weights only
        res["decode"][c] = {"tok_s": tok_s, "step_ms": step_s * 1e3, "roofline_step_ms": roof * 1e3,
                            "fraction_of_roofline": roof / step_s}
        print(f"decode C={c}: {tok_s:.1f} tok/s, step {step_s*1e3:.2f} ms "
              f"(roofline {roof*1e3:.2f} ms, {100*roof/step_s:.0f}%)", flush=True)
    for c in [int(x) for x in args.profile.split(",") if x]:
        try:  # after the timed runs: a profiler failure must not lose them
            b = profile_decode(torch, eng, c, args.context, args.profile_steps, prompt)
        except Exception as exc:  # noqa: BLE001
            res.setdefault("decode_profile_errors", {})[c] = f"{type(exc).__name__}: {exc}"[:300]
            print(f"profile C={c} failed: {exc}", flush=True)
            continue
        res.setdefault("decode_profile", {})[c] = b
        print(f"profile C={c}: wall {b['step_us']:.0f} µs/step, kernels {b['kernel_us_per_step']:.0f} µs in "
              f"{b['launches_per_step']:.0f} launches, idle {b['idle_us_per_step']:.0f} µs", flush=True)
    (args.out / f"e2e_{args.label}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    md = render_md(res)
    (args.out / f"e2e_{args.label}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
