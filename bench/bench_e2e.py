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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from limits import (decode_extent, floors_by_kernel, launch_floor_bytes, route_kernel_names,  # noqa: E402
                    step_floor_bytes, streaming_read_gbs)


def read_bandwidth_gbs(torch, n: int = 34816, k: int = 5120, copies: int = 8) -> float:
    """The cuBLAS GEMV read figure (`limits.cublas_gemv_gbs`), GB/s: kept under this name for bench_peers."""
    from limits import cublas_gemv_gbs

    return cublas_gemv_gbs(torch, n, k, copies)


def decode_weight_bytes(plan: dict, artifact: Path) -> int:
    """Bytes of weights one decode step of the plan's first plain decode extent reads: every weight
    object its launches reference once (fused parents whole), the embedding one row per column, an
    expert bank the experts a step is expected to hit (`limits.step_floor_bytes`)."""
    ext = next(e for name, e in plan["extents"].items() if e["phase"] == "decode" and not name.startswith("mtp"))
    return step_floor_bytes(plan, ext, _entry_bytes(artifact), context=0)["weights"]


def _entry_bytes(artifact: Path):
    """name -> stored bytes of that artifact object (from its directory; no payload read)."""
    from ninfer_runtime.artifact_view import ArtifactView

    with ArtifactView.open(artifact) as art:
        sizes = {name: e.bytes for name, e in art.objects.items()}
    return sizes.__getitem__


def kernel_breakdown(kernels: list[tuple[str, float]], steps: int, step_us: float, top: int = 30,
                     floors: dict[str, int] | None = None, stream_gbs: float | None = None) -> dict:
    """Aggregate (kernel name, device µs) over `steps` decode steps: per name, launches and µs per
    step and % of the step's wall time `step_us`; the rest (wall - kernel time) is idle GPU time.
    With `floors` (kernel name -> byte floor per step, `limits.floors_by_kernel`) and the streaming
    read rate, each row also gets its floor µs (bytes / streaming rate) and the % of it reached."""
    agg: dict[str, list] = {}
    for name, us in kernels:
        a = agg.setdefault(_short(name), [0, 0.0])
        a[0] += 1
        a[1] += float(us)
    per_step = sum(a[1] for a in agg.values()) / steps
    rows = [{"kernel": k, "launches_per_step": n / steps, "us_per_step": t / steps, "mean_us": t / n,
             "pct_of_step": 100.0 * t / steps / step_us} for k, (n, t) in agg.items()]
    if floors is not None and stream_gbs:
        short_floors: dict[str, int] = {}
        for k, v in floors.items():
            short_floors[_short(k)] = short_floors.get(_short(k), 0) + v
        for r in rows:
            fb = short_floors.get(r["kernel"])
            r["floor_bytes"] = fb
            r["floor_us"] = None if fb is None else fb / (stream_gbs * 1e3)
            r["pct_of_floor"] = (100.0 * r["floor_us"] / r["us_per_step"]
                                 if fb and r["us_per_step"] > 0 else None)
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


def critical_path(events: list[tuple[str, float, float]]) -> tuple[list[tuple[str, float]], float, float]:
    """(name, start µs, end µs) device events of one stream -> ([(name, µs on the critical path)],
    idle µs, busy µs). Under programmatic dependent launch a kernel starts before its predecessor
    ends and waits inside (its duration overlaps the predecessor's), so durations overstate the
    cost: each kernel is charged only the time from the later of its start and the previous end to
    its own end. Charged + idle = the span from the first start to the last end."""
    out, idle, busy, prev_end = [], 0.0, 0.0, None
    for name, s0, e0 in sorted(events, key=lambda r: (r[1], r[2])):
        busy += e0 - s0
        if prev_end is None:
            out.append((name, e0 - s0))
            prev_end = e0
            continue
        if s0 > prev_end:
            idle += s0 - prev_end
        out.append((name, max(0.0, e0 - max(s0, prev_end))))
        prev_end = max(prev_end, e0)
    return out, idle, busy


def per_op(charged: list[tuple[str, float]], launches: list[dict], kernels_of_route: dict[str, list[str]],
           floor_of, steps: int, step_us: float, stream_gbs: float | None) -> list[dict]:
    """The waterfall by plan op: walk the charged kernels in order beside the extent's launches
    (a launch = its route's main kernel, then any of its helper kernels); an op's row sums its
    launches over the layers (`l12.mlp.gate_up` -> `mlp.gate_up`). Kernels that match no launch
    (runtime copies, host-to-device copies) are rows of their own, by kernel name."""
    import re

    rows: dict[str, dict] = {}

    def row(key, route):
        return rows.setdefault(key, {"op": key, "route": route, "launches": 0, "us": 0.0, "floor_bytes": 0})

    mains = [(kernels_of_route.get(L.get("route", ""), [None]) or [None])[0] for L in launches]
    i, cur = 0, None
    for name, us in charged:
        short = _short(name)
        if cur is not None and short in kernels_of_route.get(launches[cur].get("route", ""), [])[1:]:
            row(re.sub(r"^l\d+\.", "", launches[cur]["op"]), launches[cur]["route"])["us"] += us
            continue
        j = None
        for d in range(len(launches)):
            jj = (i + d) % len(launches)
            if mains[jj] is not None and mains[jj] == short:
                j = jj
                break
        if j is None:
            row(f"({short})", "-")["us"] += us
            cur = None
            continue
        L = launches[j]
        r = row(re.sub(r"^l\d+\.", "", L["op"]), L["route"])
        r["us"] += us
        r["launches"] += 1
        r["floor_bytes"] += floor_of(L)
        cur, i = j, j + 1
    out = []
    for r in rows.values():
        us_step = r["us"] / steps
        fl = r["floor_bytes"] / steps / (stream_gbs * 1e3) if stream_gbs else None
        out.append({"op": r["op"], "route": r["route"], "launches_per_step": r["launches"] / steps,
                    "us_per_step": us_step, "pct_of_step": 100.0 * us_step / step_us,
                    "floor_us": fl, "pct_of_floor": (100.0 * fl / us_step if fl and us_step > 0 else None)})
    out.sort(key=lambda r: (-r["us_per_step"], r["op"]))
    return out


def profile_decode(torch, eng, c: int, context: int, steps: int, prompt, floors=None, stream_gbs=None,
                   launches=None, kernels_of_route=None, floor_of=None) -> dict:
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
    events = [(e.name, float(e.time_range.start), float(e.time_range.end)) for e in prof.events()
              if e.device_type == DeviceType.CUDA]
    charged, idle, busy = critical_path(events)
    b = kernel_breakdown(charged, steps, wall_us, floors=floors, stream_gbs=stream_gbs)
    b["device_idle_us_per_step"] = idle / steps  # gaps between kernels inside the profiled steps
    b["busy_us_per_step"] = busy / steps  # summed kernel durations (overlapping under PDL)
    if launches is not None:
        b["ops"] = per_op(charged, launches, kernels_of_route or {}, floor_of or (lambda L: 0), steps, wall_us,
                          stream_gbs)
    return b


def render_md(res: dict) -> str:
    prov, wbytes, read_gbs = res["provenance"], res["weights_bytes_per_step"], res["read_bandwidth_gbs"]
    stream = res.get("streaming_read") or {}
    sg = stream.get("gbs")
    lines = [f"# End to end, {res['label']}: {prov['gpu']}, {prov['date']}", "",
             f"driver {prov['driver']}, torch {prov['torch']}, triton {prov['triton']}; limits measured in this "
             f"run: streaming read {_num(sg, '.0f')} GB/s (read-only kernel over rotated cold buffers, "
             f"{stream.get('config', '?')}), bf16 cuBLAS GEMV {read_gbs:.0f} GB/s (cold); weights read per "
             f"decode step {wbytes / 1e9:.2f} GB -> {wbytes / (read_gbs * 1e9) * 1e3:.2f} ms at the cuBLAS rate"
             + (f", {wbytes / (sg * 1e9) * 1e3:.2f} ms at the streaming rate" if sg else ""), "",
             f"options: {json.dumps(res.get('options'))}", "",
             f"load: {json.dumps({k: round(v, 2) for k, v in res['load_times_s'].items()})}; "
             f"load-to-first-token {res['load_to_first_token_s']:.1f} s; kernels: {res.get('kernels')}", "",
             "| prefill T | tok/s |", "|---|---|"]
    lines += [f"| {n} | {v['tok_s']:.0f} |" for n, v in res["prefill"].items()]
    ctx = res.get("context", "?")
    lines += ["", f"Byte floor of a step = weights once + GDN state read and written per slot + KV read at "
              f"context {ctx} per slot, at the streaming rate.", "",
              "| C | decode tok/s | step ms | byte floor ms (weights / state / KV GB) | % of floor | "
              "weights at cuBLAS rate ms | % of it |", "|---|---|---|---|---|---|---|"]
    roof_ms = wbytes / (read_gbs * 1e9) * 1e3
    for c, v in res["decode"].items():
        fb = v.get("floor_bytes") or {}
        split = (f" ({fb['weights'] / 1e9:.2f} / {fb['state'] / 1e9:.2f} / {fb['kv'] / 1e9:.2f})" if fb else "")
        fl = v.get("floor_step_ms")
        lines.append(f"| {c} | {v['tok_s']:.1f} | {v['step_ms']:.2f} | {_num(fl, '.2f')}{split} | "
                     f"{_num(None if fl is None else 100 * fl / v['step_ms'], '.0f')}% | {roof_ms:.2f} | "
                     f"{100 * roof_ms / v['step_ms']:.0f}% |")
    for c, b in (res.get("decode_profile") or {}).items():
        lines += ["", f"Decode step at C={c}, {b['steps']} steps under torch.profiler: wall {b['step_us']:.0f} µs/step "
                  f"(measured without the profiler), kernels on the critical path {b['kernel_us_per_step']:.0f} µs in "
                  f"{b['launches_per_step']:.0f} launches, GPU idle {b['idle_us_per_step']:.0f} µs (between kernels "
                  f"under the profiler {_num(b.get('device_idle_us_per_step'), '.0f')} µs; summed kernel durations, "
                  f"overlapping under PDL, {_num(b.get('busy_us_per_step'), '.0f')} µs)", "",
                  "| kernel | launches/step | µs/step | mean µs | % of step | byte floor µs | % of floor |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['kernel']} | {r['launches_per_step']:.0f} | {r['us_per_step']:.1f} | {r['mean_us']:.2f} | "
                  f"{_floor_cells(r)} |" for r in b["rows"]]
        if b["other_kernels"]:
            lines.append(f"| ({b['other_kernels']} more kernel names) | | | | | | |")
        if b.get("ops"):
            lines += ["", f"Waterfall by op at C={c} (µs on the critical path per step; an op's launches summed over "
                      f"the layers; byte floor at the streaming rate)", "",
                      "| op | route | launches/step | µs/step | % of step | byte floor µs | % of floor |",
                      "|---|---|---|---|---|---|---|"]
            lines += [f"| {r['op']} | {r['route']} | {r['launches_per_step']:.0f} | {r['us_per_step']:.1f} | "
                      f"{_floor_cells(r)} |" for r in b["ops"]]
    return "\n".join(lines) + "\n"


def _num(v, fmt: str) -> str:
    return "—" if v is None else format(v, fmt)


def _floor_cells(r: dict) -> str:
    """`% of step | byte floor µs | % of floor` cells of a breakdown row."""
    pf = r.get("pct_of_floor")
    return (f"{r['pct_of_step']:.1f}% | {_num(r.get('floor_us'), '.1f')} | "
            f"{_num(pf, '.0f')}{'%' if pf is not None else ''}")


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
    stream = streaming_read_gbs(torch)
    read_gbs = read_bandwidth_gbs(torch)
    print(f"streaming read {stream['gbs']:.0f} GB/s ({stream['config']}), cuBLAS bf16 GEMV {read_gbs:.0f} GB/s",
          flush=True)
    t0 = time.perf_counter()
    eng = ninfer_runtime.load(args.plan, args.artifact, progress=False)
    plan = json.loads((args.plan / "plan.json").read_text())
    vocab = 1000  # random token ids below this are valid in any vocabulary we compile
    first = eng.generate([1, 2, 3, 4], max_new_tokens=1, greedy=True, ignore_eos=True)
    torch.cuda.synchronize()
    load_to_first = time.perf_counter() - t0
    entry_bytes = _entry_bytes(args.artifact)
    res = {"provenance": prov, "label": args.label, "read_bandwidth_gbs": read_gbs,
           "streaming_read": stream, "load_times_s": eng.load_times, "load_to_first_token_s": load_to_first,
           "kernels": getattr(eng, "device_note", None),
           "weights_bytes_per_step": decode_weight_bytes(plan, args.artifact), "options": plan.get("options"),
           "context": args.context, "prefill": {}, "decode": {}}
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
        # plain steps: a plan with a draft window would otherwise run its default (MTP) rounds
        eng.generate(ps, max_new_tokens=4, greedy=True, ignore_eos=True, concurrency=c, spec="none")  # warm
        eng.generate(ps, max_new_tokens=args.decode_tokens, greedy=True, ignore_eos=True, concurrency=c, spec="none")
        st = eng.last_stats
        tok_s = st["decode_tokens"] / st["decode_s"]
        step_s = st["decode_s"] / max(1, st["decode_steps"])
        roof = wbytes / (read_gbs * 1e9)  # s per step, weights only, at the cuBLAS GEMV rate
        _, ext = decode_extent(plan, c)
        floor = step_floor_bytes(plan, ext, entry_bytes, context=args.context + args.decode_tokens // 2)
        floor_s = floor["total"] / (stream["gbs"] * 1e9)
        res["decode"][c] = {"tok_s": tok_s, "step_ms": step_s * 1e3, "roofline_step_ms": roof * 1e3,
                            "fraction_of_roofline": roof / step_s, "floor_bytes": floor,
                            "floor_step_ms": floor_s * 1e3, "fraction_of_floor": floor_s / step_s}
        if c == 1:  # wall gaps between streamed tokens: a uniform step, or a few slow ones?
            marks = [time.perf_counter() for _ in eng.stream(ps, max_new_tokens=12, greedy=True, ignore_eos=True,
                                                             spec="none")]
            res["decode"][c]["token_gaps_ms"] = [round((b - a) * 1e3, 3) for a, b in zip(marks, marks[1:])]
            print(f"decode C=1 token gaps ms: {res['decode'][c]['token_gaps_ms']}", flush=True)
        print(f"decode C={c}: {tok_s:.1f} tok/s, step {step_s*1e3:.2f} ms (byte floor {floor_s*1e3:.2f} ms at the "
              f"streaming rate: {100*floor_s/step_s:.0f}%; weights at the cuBLAS rate {roof*1e3:.2f} ms, "
              f"{100*roof/step_s:.0f}%)", flush=True)
    kernels_of_route = route_kernel_names(args.plan)
    for c in [int(x) for x in args.profile.split(",") if x]:
        try:  # after the timed runs: a profiler failure must not lose them
            _, ext = decode_extent(plan, c)
            floors = floors_by_kernel(plan, ext, entry_bytes, kernels_of_route, context=args.context)
            b = profile_decode(torch, eng, c, args.context, args.profile_steps, prompt, floors=floors,
                               stream_gbs=stream["gbs"], launches=ext["launches"], kernels_of_route=kernels_of_route,
                               floor_of=lambda L, c=c: launch_floor_bytes(L, plan, entry_bytes, slots=c,
                                                                          context=args.context))
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
