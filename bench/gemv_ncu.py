"""Hardware counters of the decode GEMVs under Nsight Compute (issue #16; needs a CUDA GPU and ncu).

The gemv probe (`gemv_probe.py`) says how far each route is from a same-size streaming read and
how much of that is its loads; this says why, from the counters: per profiled launch, the pipe
utilisation (ALU / FMA / LSU / tensor), issue-slot use, warp stall reasons, achieved occupancy and
DRAM throughput, plus the static SASS opcode mix of the kernel that ran.

Two modes:
- `--driver`: builds each op's table route (routes/sm90.yaml's selection) at each T, warms it up,
  then launches it once between cudaProfilerStart / Stop (the launch ncu profiles); it also
  writes the kernels' cubins' SASS opcode histograms (cuobjdump) under --out;
- default: runs the driver under `ncu --profile-from-start off` with the sections below and
  writes `ncu_gemv_<label>.txt` (ncu's details page) under --out.

Usage (GPU):  python3 bench/gemv_ncu.py --out OUT [--ops mlp.gate_up,mlp.down_proj] [--t 1,4]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# per-pipe instruction counts and utilisation (the dequant's integer work is on the ALU pipe; the
# bf16x2 FMAs on the FMA pipe; mma.sync on the tensor pipe)
METRICS = ("smsp__inst_executed.sum", "smsp__inst_executed_pipe_alu.sum", "smsp__inst_executed_pipe_fma.sum",
           "smsp__inst_executed_pipe_fmaheavy.sum", "smsp__inst_executed_pipe_lsu.sum",
           "smsp__inst_executed_pipe_uniform.sum", "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",
           "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
           "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
           "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
           "dram__bytes_read.sum", "gpu__time_duration.sum")
SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis", "SchedulerStats",
            "WarpStateStats", "Occupancy", "LaunchStats", "InstructionStats")


def _driver(ops: list[str], ts: list[int], out: Path) -> int:
    import torch
    sys.path.insert(0, str(ROOT / "bench"))
    from gemv_probe import SHAPES, _table_route
    from ninfer_compile.tune import measure as M
    from ninfer_compile.tune.shapes import MatchCase

    if not torch.cuda.is_available():
        print("error: gemv_ncu --driver needs a CUDA GPU")
        return 2
    cache = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))
    cudart = torch.cuda.cudart()
    for op, fmt, n, k, epi in SHAPES:
        if ops and op not in ops:
            continue
        case = MatchCase(family="linear", match={"format": fmt, "n": n, "k": k, "epilogue": epi}, shapes={})
        for t in ts:
            route, params = _table_route(fmt, n, k, epi, t)
            bench = M.build(case, t, copies=2)
            fn = bench.launches(route, params)[0]
            before = set(cache.rglob("*gemv*.cubin"))
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            cudart.cudaProfilerStart()
            fn()
            torch.cuda.synchronize()
            cudart.cudaProfilerStop()
            print(f"ncu target: {op} T={t} {route.name} {params}", flush=True)
            # the cubins compiled for this launch (new in Triton's cache since its warm-up began); a
            # kernel found in the cache already is not identified (no guess from file dates)
            new = sorted(set(cache.rglob("*gemv*.cubin")) - before)
            if not new:
                print(f"sass: {op} T={t}: its kernel came from Triton's cache; opcode mix not identified")
            for cubin in new:
                _opcode_histogram(cubin, out / f"sass_{op}_T{t}_{cubin.stem}.txt")
            del bench
            torch.cuda.empty_cache()
    return 0


def opcode_counts(sass: str) -> collections.Counter:
    """cuobjdump -sass text -> opcode (without modifiers) -> static count; predicated
    instructions count under their opcode."""
    from gemv_sass import opcode, parse_sass

    return collections.Counter(opcode(text).split(".")[0] for _, text in parse_sass(sass))


def _opcode_histogram(cubin: Path, dest: Path) -> None:
    tool = shutil.which("cuobjdump")
    if tool is None:
        dest.write_text("cuobjdump not found\n")
        return
    r = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, timeout=120)
    ops = opcode_counts(r.stdout)
    total = sum(ops.values())
    lines = [f"# static SASS opcodes of {cubin.name} ({total} instructions)", ""]
    lines += [f"{name:12s} {count:6d}  {100 * count / max(total, 1):5.1f}%" for name, count in ops.most_common()]
    dest.write_text("\n".join(lines) + "\n\n" + r.stdout)


# (column, metric line label in ncu's details page); the first match inside a kernel's block wins
SUMMARY = (("µs", "Duration"), ("DRAM %", "DRAM Throughput"), ("issue busy %", "Issue Slots Busy"),
           ("ALU %", "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active"),
           ("FMA %", "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active"),
           ("regs", "Registers Per Thread"), ("occ. theor. %", "Theoretical Occupancy"),
           ("occ. achieved %", "Achieved Occupancy"), ("no eligible %", "No Eligible"),
           ("cycles / issue", "Warp Cycles Per Issued Instruction"))
STALLS = ("Long Scoreboard", "Wait", "Math Pipe Throttle", "Not Selected", "Short Scoreboard", "Dispatch Stall",
          "MIO Throttle", "LG Throttle", "Barrier", "No Instruction")


def summarize(report: str) -> str:
    """ncu's details page (with the driver's `ncu target:` lines, in launch order) -> a markdown
    table: one row per profiled launch, the SUMMARY metrics and the three largest stall reasons
    (cycles per issued instruction)."""
    targets = re.findall(r"^ncu target: (.*)$", report, re.M)
    blocks = re.split(r"^  (gemv\w+) (\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)),.*$", report, flags=re.M)
    rows = []
    for i in range(1, len(blocks) - 2, 3):
        kernel, launch, body = blocks[i], blocks[i + 1], blocks[i + 2]
        vals = []
        for _, label in SUMMARY:
            m = re.search(rf"^\s+{re.escape(label)}\s+(?:[^\s\d]\S*\s+)?([\d,.]+)\s*$", body, re.M)
            vals.append(m.group(1) if m else "-")
        stalls = []
        for name in STALLS:
            m = re.search(rf"^\s+Stall {re.escape(name)}\s+inst\s+([\d.]+)\s*$", body, re.M)
            if m:
                stalls.append((float(m.group(1)), name))
        top = ", ".join(f"{n} {v:.2f}" for v, n in sorted(stalls, reverse=True)[:3])
        target = targets[len(rows)] if len(rows) < len(targets) else "?"
        op_t = " ".join(target.split(" ")[:3])
        rows.append(f"| {op_t} | {kernel} {launch} | " + " | ".join(vals) + f" | {top} |")
    head = ("| op T route | kernel grid x block | " + " | ".join(c for c, _ in SUMMARY) + " | top stalls (cycles per "
            "issued instruction) |")
    return "\n".join([head, "|" + "---|" * (len(SUMMARY) + 3)] + rows) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="27b")
    ap.add_argument("--ops", default="mlp.gate_up,mlp.down_proj")
    ap.add_argument("--t", default="1,4")
    ap.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--summarize", metavar="REPORT", help="only render the table of an earlier ncu_gemv_*.txt")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ops = [s for s in a.ops.split(",") if s]
    try:
        ts = [int(s) for s in a.t.split(",") if s]
    except ValueError:
        print(f"error: --t {a.t!r}: a comma list of integers")
        return 2
    if a.driver:
        return _driver(ops, ts, out)
    if a.summarize:
        print(summarize(Path(a.summarize).read_text()), end="")
        return 0
    ncu = shutil.which("ncu")
    if ncu is None:
        print("error: ncu (Nsight Compute) is not on the PATH")
        return 2
    cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--target-processes", "all",
           "-k", "regex:gemv", "--cache-control", "all"]
    for s in SECTIONS:
        cmd += ["--section", s]
    driver = [sys.executable, str(Path(__file__).resolve()), "--driver", "--out", str(out), "--ops", a.ops, "--t", a.t]
    t0 = time.time()
    # the full request first; an ncu that refuses an option or a metric name gets the next simpler one
    for extra in (["--metrics", ",".join(METRICS), "--print-details", "all"], ["--metrics", ",".join(METRICS)], []):
        r = subprocess.run(cmd + extra + driver, capture_output=True, text=True)
        if r.returncode == 0 or "==PROF==" in r.stdout:
            break
    report = out / f"ncu_gemv_{a.label}.txt"
    report.write_text(f"$ {' '.join(cmd)}\n# rc {r.returncode}, {time.time() - t0:.0f} s\n\n{r.stdout}\n--- stderr\n"
                      f"{r.stderr[-20000:]}")
    print(f"ncu rc {r.returncode} in {time.time() - t0:.0f} s -> {report}")
    (out / f"ncu_gemv_{a.label}.md").write_text(summarize(r.stdout))
    for line in r.stdout.splitlines():
        if re.search(r"ncu target|Duration|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|"
                     r"Executed Ipc Active|No Eligible|pipe_alu.avg|pipe_fma.avg|pipe_lsu.avg|hmma", line):
            print(line.rstrip()[:160])
    return 0 if r.returncode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
