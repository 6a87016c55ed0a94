"""Load phases: how long a fresh process takes to its first token, step by step.

    python bench/load_phases.py [--dir D] [--artifact A] [--model qwen3.6-27b] [--sm N] [--runs 2] [--dry-run]
                                [--importtime] [--env KEY=VAL[,KEY=VAL...]]...

1. writes the synthetic artifact once (`ninfer-compile pack --synthetic MODEL --seed 0`: the real
   shapes, formats and frontend resources; ~17.5 GB for the 27B; a sparse artifact has no
   tokenizer, so it cannot load); later runs read it from a warm page cache;
2. compiles it for this GPU's sm with kernel binaries (the binary cache makes a repeat cheap), and
   times that compile;
3. runs `--runs` fresh child processes, each: import ninfer_runtime, load the plan
   (`Engine.load_times` and `Engine.load_phases`: kernel import; the binaries' check / driver /
   hash / preload / module loads, which run in a background thread beside the weight upload and
   are printed as "<phase> (bg)", with "kernels (bg)" (the thread's whole run) and "kernels_wait"
   (the main thread's wait for it); binding, warm-up (0 when skipped: every kernel preloaded),
   graph capture), generate one token; every phase is printed with the time from process start
   (`/proc/self/stat` start time) to the first token. The first child may pay Triton's one-time
   driver-utilities build (user cache); the later ones show the steady state.

--env KEY=VAL[,KEY=VAL...] (repeatable): each occurrence is one child environment (those variables
added to this process's); each of the --runs runs once per --env, alternating, e.g. the upload A/B:
`--env NINFER_PINNED_UPLOAD=0 --env LOAD_PHASES_PRESTART=0 --env LOAD_PHASES_PRESTART=1` (the
pageable copy; the weight stream started by the load; the weight stream started at process start,
before `import torch`, as ninfer-run and ninfer-serve do: the default). The upload is load_times'
"upload" (the main thread's wait for it); "upload (bg)" is the weight stream's own run.
LOAD_PHASES_PROFILE=1 in an --env: that child's first generation runs under cProfile (printed).
LOAD_PHASES_READERS=N: the prestart's `readers`.
--importtime: the children run under `python -X importtime`; each prints the imports that cost most
(`imports ...`: self time and cumulative, ms), e.g. what the torch import is made of.
--dry-run (no GPU): the tiny synthetic model, compiled with binaries, loaded under the Triton
interpreter (no binaries used, no graphs): checks the script end to end on a CPU.
Results: one JSON line per child (`phases ...`, then the child's `note: ` lines) and a table; nothing
is written elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, sys, time
t_wall0 = time.time()
def since_start():
    # seconds since this process started (the kernel's start time), not since the script began
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
t0 = time.perf_counter()
boot = since_start()
plan, art = sys.argv[1], sys.argv[2]
if os.environ.get("LOAD_PHASES_PRESTART", "1") == "1":  # as ninfer-run / ninfer-serve do, before torch
    import ninfer_runtime
    from ninfer_runtime import weight_stream
    ninfer_runtime.prestart(plan, art, readers=int(os.environ.get("LOAD_PHASES_READERS", weight_stream.READERS)))
import torch
t_torch = time.perf_counter() - t0
import ninfer_runtime
t_import = time.perf_counter() - t0
t = time.perf_counter()
eng = ninfer_runtime.load(plan, art, progress=False)
t_load = time.perf_counter() - t
profiler = None
if os.environ.get("LOAD_PHASES_PROFILE") == "1":  # where the first token's one-time work goes
    import cProfile
    profiler = cProfile.Profile()
    profiler.enable()
t = time.perf_counter()
r = eng.generate([1, 2, 3, 4], max_new_tokens=1, greedy=True, ignore_eos=True)
if torch.cuda.is_available():
    torch.cuda.synchronize()
t_first = time.perf_counter() - t
if profiler is not None:
    import io, pstats
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
    print("profile of the first token:\n" + text.getvalue(), file=sys.stderr, flush=True)
t = time.perf_counter()  # the same request again: what of the first one was one-time work
eng.generate([1, 2, 3, 4], max_new_tokens=1, greedy=True, ignore_eos=True)
if torch.cuda.is_available():
    torch.cuda.synchronize()
t_again = time.perf_counter() - t
out = {"python_start_s": boot, "import_torch_s": t_torch, "import_runtime_s": t_import, "load_s": t_load,
       "first_token_s": t_first, "first_token_again_s": t_again, "process_to_first_token_s": since_start() - t_again,
       "load_times": eng.load_times, "load_phases": getattr(eng, "load_phases", {}),
       "kernels": eng.device_note}
print("phases " + json.dumps(out), flush=True)
eng.close()
"""


def _run(cmd, env, what):
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    dt = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"{what} failed (exit {p.returncode}): {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ''}")
    return p, dt


def _env_variant(text: str, ap: argparse.ArgumentParser) -> dict[str, str]:
    """"KEY=VAL,KEY2=VAL2" -> {KEY: VAL, KEY2: VAL2} (a malformed one: the parser's one-line error)."""
    out = {}
    for item in text.split(","):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            ap.error(f"--env {text!r}: expected KEY=VAL[,KEY=VAL...]")
        out[key.strip()] = value
    return out


def costliest_imports(stderr: str, n: int = 15) -> str:
    """`-X importtime` output -> the n imports with the largest self time, and the top-level
    packages by cumulative time: `name self/cumulative ms, ...`."""
    rows = []
    for ln in stderr.splitlines():
        if not ln.startswith("import time:") or "|" not in ln:
            continue
        self_us, cum_us, name = ln[len("import time:"):].split("|", 2)
        if self_us.strip().isdigit() and cum_us.strip().isdigit():  # name indented 2 per nesting level
            top_level = len(name) - len(name.lstrip()) <= 1
            rows.append((int(self_us), int(cum_us), name.strip(), top_level))
    top = sorted(rows, reverse=True)[:n]
    roots = sorted((r for r in rows if r[3]), key=lambda r: -r[1])[:8]
    fmt = ", ".join(f"{name} {s / 1e3:.0f}/{c / 1e3:.0f}" for s, c, name, _ in top)
    return f"self: {fmt}; top-level: " + ", ".join(f"{name} {c / 1e3:.0f}" for _, c, name, _ in roots)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ninfer-load-phases"))
    ap.add_argument("--model", default="qwen3.6-27b")
    ap.add_argument("--sm", type=int, default=None, help="default: this GPU's")
    ap.add_argument("--artifact", type=Path, default=None, help="an existing artifact (default: pack one in --dir)")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--dry-run", action="store_true", help="no GPU: the tiny model under the interpreter")
    ap.add_argument("--importtime", action="store_true", help="print the costliest imports of each child")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VAL[,KEY=VAL...]",
                    help="one child environment (repeatable: the runs alternate over them)")
    args = ap.parse_args(argv)
    variants = [_env_variant(v, ap) for v in args.env] or [{}]
    args.dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "runtime"),
                                                       os.environ.get("PYTHONPATH", "")])}
    compile_env = {k: v for k, v in env.items() if k != "TRITON_INTERPRET"}
    model = "tiny-qwen3.5" if args.dry_run else args.model
    sm = args.sm
    if sm is None:
        if args.dry_run:
            sm = 90
        else:
            import torch

            major, minor = torch.cuda.get_device_capability()
            sm = major * 10 + minor
    art = args.artifact or args.dir / f"{model}-seed0.ninfer"
    if not art.exists():
        _run([sys.executable, "-m", "ninfer_compile.cli", "pack", "--synthetic", model, "--seed", "0", "-o", str(art)],
             compile_env, "pack")
    plan = args.dir / f"{art.name}.sm{sm}.plan"
    extra = ["--prefill-chunk", "16", "--max-context", "64"] if args.dry_run else []
    _, cold = _run([sys.executable, "-m", "ninfer_compile.cli", "compile", str(art), "--sm", str(sm), "-o", str(plan),
                    "--quiet", *extra], compile_env, "compile")
    _, warm = _run([sys.executable, "-m", "ninfer_compile.cli", "compile", str(art), "--sm", str(sm), "-o", str(plan),
                    "--quiet", *extra], compile_env, "compile (repeat)")
    print(f"compile sm_{sm} {model}: first {cold:.1f}s (binary cache as found), repeat {warm:.1f}s", flush=True)
    child_env = dict(env)
    if args.dry_run:
        child_env["TRITON_INTERPRET"] = "1"
    rows = []
    for i in range(args.runs):
        for variant in variants:
            xopt = ["-X", "importtime"] if args.importtime else []
            label = ",".join(f"{k}={v}" for k, v in variant.items()) or "-"
            p, _ = _run([sys.executable, *xopt, "-c", CHILD, str(plan), str(art)], {**child_env, **variant},
                           f"load run {i + 1} (env {label})")
            line = next(ln for ln in p.stdout.splitlines() if ln.startswith("phases "))
            print(f"env {label} {line}", flush=True)
            for note in (ln for ln in p.stderr.splitlines() if ln.startswith("note: ")):  # e.g. pinning refused
                print(f"env {label} {note}", flush=True)
            if "profile of the first token:" in p.stderr:
                print(p.stderr[p.stderr.index("profile of the first token:"):], flush=True)
            if args.importtime:
                print("imports " + costliest_imports(p.stderr), flush=True)
            rows.append((label, json.loads(line[len("phases "):])))
    print("\nrun | env | process->first token | import torch | import runtime | load | first token (again) | load phases")
    for i, (label, r) in enumerate(rows, start=1):
        ph = ", ".join(f"{k} {v:.2f}" for k, v in r["load_phases"].items())
        print(f"{i} | {label} | {r['process_to_first_token_s']:.2f}s | {r['import_torch_s']:.2f}s | {r['import_runtime_s']:.2f}s "
              f"| {r['load_s']:.2f}s (upload {r['load_times']['upload']:.2f}, kernels {r['load_times']['kernels']:.2f}, "
              f"capture {r['load_times']['capture']:.2f}) | {r['first_token_s']:.2f}s ({r['first_token_again_s']:.2f}s) | {ph}")
    print(f"kernels: {rows[-1][1]['kernels']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
