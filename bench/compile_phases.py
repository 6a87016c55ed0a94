"""Compile phases: where a cold `ninfer-compile` with kernel binaries spends its time (no GPU needed).

    python bench/compile_phases.py ARTIFACT [--sm 90] [--jobs N] [--runs 1] [--keep DIR] [compile options]

Each run is a fresh child process: an empty binary cache (a new --cache-dir) and an empty Triton
cache (a new TRITON_CACHE_DIR), and instrumentation installed before the compile starts:
- our phases (contract and lowering, passes, emission, the launch capture, the compile pool, the
  authoritative pass, harvest, cache publish, plan writing): wall and CPU seconds of this process;
- every Triton compile, wherever it runs (parent or pool worker): the front end (Python AST ->
  ttir), each backend stage (ttir, ttgir, llir, ptx: in process; cubin: ptxas, a child process,
  counted as the compiling process's child CPU) and the cache writes;
- the process's whole wall, its own CPU and its children's (the pool workers and their ptxas).
Prints one table per run (`uptime`'s load average beside it: other jobs share the cores; CPU
seconds are the robust figure) and a JSON line with its rows; --keep DIR keeps every record
(DIR/runN/records.jsonl: one line per timed call, with the sha256 prefix of each Triton stage's output).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, resource, sys, time
T0 = time.perf_counter()
RECORDS = os.environ["PHASES_RECORDS"]

def cpu_self():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

def cpu_children():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime

def emit(rec):
    with open(RECORDS, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), **rec}) + "\n")

def timed(owner, name, label, stage=False):
    fn = getattr(owner, name)
    def wrapper(*a, **k):
        w, c, cc = time.perf_counter(), cpu_self(), cpu_children()
        try:
            return fn(*a, **k)
        finally:
            emit({"phase": label, "wall": time.perf_counter() - w, "cpu": cpu_self() - c,
                  "child_cpu": cpu_children() - cc, "stage": stage})
    setattr(owner, name, wrapper)

import ninfer_compile.compile_cli as cc
import ninfer_compile.codegen.aot as aot
import ninfer_compile.codegen.aot_binaries as ab
import ninfer_compile.codegen.emit as em
import ninfer_compile.plan.writer as pw
emit({"phase": "imports (ours)", "wall": time.perf_counter() - T0, "cpu": cpu_self(), "child_cpu": 0})
timed(cc, "lower_all", "lowering")
timed(cc, "run_pipeline", "passes")
timed(cc, "memory_report", "memory report")
timed(cc, "build_manifest", "manifest")
timed(em, "kernel_files", "emission")
timed(aot, "result_key", "result key (hashing)")
timed(aot, "reproduce_launches", "launch capture")
timed(aot, "aot_engine", "engine over the fake device")
timed(aot, "compile_captures", "compile (pool + authoritative pass)")
timed(ab, "warm_scratch_in_parallel", "pool (workers)")
timed(aot, "harvest", "harvest")
timed(aot, "publish", "cache publish")
timed(aot, "bin_manifest", "bin manifest")
timed(cc, "write_plan", "plan writing")
timed(aot.shutil, "rmtree", "scratch removal")
timed(aot, "toolchain_problem", "toolchain check (imports torch)")
timed(aot, "precompile", "binaries (all)")
timed(cc, "compile_artifact", "compile_artifact (all)")

import triton.compiler.compiler as tcc
from triton.backends.nvidia.compiler import CUDABackend
t1 = time.perf_counter(); c1 = cpu_self()
import triton.runtime.jit
emit({"phase": "imports (triton)", "wall": time.perf_counter() - t1, "cpu": cpu_self() - c1, "child_cpu": 0})
timed(tcc.ASTSource, "make_ir", "triton: front end (AST -> ttir)", stage=True)
timed(triton.runtime.jit.JITFunction, "preload", "triton: preload (whole)", stage=True)
add = CUDABackend.add_stages
def add_stages(self, stages, options, language):
    add(self, stages, options, language)
    for ext in list(stages):
        stages[ext] = staged(stages[ext], ext)
def digest(x):
    import hashlib
    return hashlib.sha256(x if isinstance(x, bytes) else str(x).encode()).hexdigest()[:16]
def staged(fn, ext):
    def run(src, metadata):
        w, c, cc = time.perf_counter(), cpu_self(), cpu_children()
        out = None
        try:
            out = fn(src, metadata)
            return out
        finally:
            emit({"phase": f"triton: {ext}" + (" (ptxas)" if ext == "cubin" else ""),
                  "wall": time.perf_counter() - w, "cpu": cpu_self() - c, "child_cpu": cpu_children() - cc,
                  "stage": True, "kernel": metadata.get("name"), "out": digest(out)})
    return run
from triton._C.libtriton import llvm as _llvm
timed(_llvm, "link_extern_libs", "triton: llir / libdevice link", stage=True)
timed(_llvm, "optimize_module", "triton: llir / LLVM O3", stage=True)
CUDABackend.add_stages = add_stages

from ninfer_compile.cli import main
rc = main(sys.argv[1:])
emit({"phase": "process (all)", "wall": time.perf_counter() - T0, "cpu": cpu_self(), "child_cpu": cpu_children()})
sys.exit(rc)
"""

ORDER = ["imports (ours)", "imports (triton)", "lowering", "passes", "memory report", "manifest", "emission",
         "result key (hashing)", "engine over the fake device", "launch capture",
         "toolchain check (imports torch)", "compile (pool + authoritative pass)", "pool (workers)", "harvest",
         "cache publish", "bin manifest", "scratch removal", "binaries (all)", "plan writing", "compile_artifact (all)", "process (all)"]


def aggregate(records: list[dict], parent: int) -> dict[tuple[str, str], dict]:
    """{(phase, "parent" | "workers"): {n, wall, cpu, child_cpu}} summed over the records."""
    rows: dict[tuple[str, str], dict] = {}
    for r in records:
        where = "parent" if r["pid"] == parent else "workers"
        k = (r["phase"], where)
        s = rows.setdefault(k, {"n": 0, "wall": 0.0, "cpu": 0.0, "child_cpu": 0.0})
        s["n"] += 1
        for f in ("wall", "cpu", "child_cpu"):
            s[f] += r[f]
    return rows


def table(rows: dict[tuple[str, str], dict]) -> list[str]:
    keys = sorted(rows, key=lambda k: (ORDER.index(k[0]) if k[0] in ORDER else 100, k[0], k[1]))
    out = [f"| phase | where | n | wall s | CPU s | child CPU s |", "|---|---|---:|---:|---:|---:|"]
    for k in keys:
        s = rows[k]
        out.append(f"| {k[0]} | {k[1]} | {s['n']} | {s['wall']:.2f} | {s['cpu']:.2f} | {s['child_cpu']:.2f} |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact")
    ap.add_argument("--sm", type=int, default=90)
    ap.add_argument("--jobs", type=int, default=None, help="NINFER_AOT_JOBS for the compile")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--keep", default=None, help="keep the run's files here (default: a removed temp dir)")
    a, extra = ap.parse_known_args(argv)  # the rest: more compile arguments
    for run in range(a.runs):
        with tempfile.TemporaryDirectory(prefix="compile-phases-") as tmp:
            work = Path(a.keep) / f"run{run + 1}" if a.keep else Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            rec = work / "records.jsonl"
            env = {**os.environ, "TRITON_CACHE_DIR": str(work / "triton"), "PHASES_RECORDS": str(rec),
                   "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "runtime"), os.environ.get("PYTHONPATH", "")])}
            if a.jobs is not None:
                env["NINFER_AOT_JOBS"] = str(a.jobs)
            load0 = os.getloadavg()
            cmd = [sys.executable, "-c", CHILD, a.artifact, "--sm", str(a.sm), "-o", str(work / "plan"),
                   "--cache-dir", str(work / "bincache"), "-q", *extra]
            p = subprocess.Popen(cmd, env=env)
            rc = p.wait()
            load1 = os.getloadavg()
            records = [json.loads(line) for line in rec.read_text().splitlines()]
            print(f"run {run + 1}: rc {rc}, jobs {a.jobs or 'default'}, load average before {load0[0]:.2f} "
                  f"{load0[1]:.2f}, after {load1[0]:.2f} {load1[1]:.2f}")
            rows = aggregate(records, p.pid)
            print("\n".join(table(rows)))
            print("json", json.dumps({"load": [load0, load1], "rows": [[*k, v] for k, v in rows.items()]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
