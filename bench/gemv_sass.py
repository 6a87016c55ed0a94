"""Static issue and pipe floors of the decode GEMVs from their SASS (no GPU needed).

    python bench/gemv_sass.py PLAN [--extent decode_c1_k0] [--out FILE.md]
    python bench/gemv_sass.py --artifact A.ninfer --variant ASYNC=3 --variant ASYNC=4 [--out FILE.md]

A plan compiled with binaries (`ninfer-compile ... --sm 90` on any machine: the AOT phase runs on
the CPU) holds the cubins of every launch. For each low-register T=1 GEMV binary of an extent
(routes q4_gemv_lowreg / q5_gemv_lowreg / q6_gemv_lowreg) this reads its SASS (`cuobjdump -sass`),
takes the K loop (the backward branch whose body holds the most bf16x2 FMA-pipe instructions) and
counts what one pass of it issues, per class. At T=1 every weight costs exactly one bf16x2 FMA-class
instruction per lane pair and column plus one for its bias (`gemv_lowreg`: one fma.rn.bf16x2 removes
the bias of a pair, one fma / mul multiplies it with x), so a thread handles `n_hfma` weights per
pass, and

    warp instructions per weight = body / (32 * n_hfma)

Times for an op of N x K weights (132 SMs x 4 schedulers at --clock-ghz):
- issue floor: every instruction takes one of a scheduler's issue slots (1 per clock);
- ALU floor:  integer / logic instructions (LOP3, PRMT, SHF, IADD3, ...) at 16 lanes per clock
  per scheduler (64 INT32 lanes per SM on sm_90), i.e. 2 clocks per warp instruction;
- FMA floor:  FP32 / bf16x2 instructions at 32 lanes per clock, IMAD at 16.
These are lower bounds from one loop pass (prologue, tail, epilogue and split-K not counted), set
beside the streaming floor of the op's bytes (--stream-tbs). They say which resource a perfectly
latency-hidden kernel would hit first; they do not time anything. Beside them: the bodies of the
kernel's other loops (the norm prologue's `row_rstd` re-read of x runs one pass per 1024 of K: as
many passes as the K loop at BLOCK_K=1024) and the registers per thread (occupancy). In a kernel
with the RMSNorm prologue the x pair scalings (`fma x, w, x`) are not counted as weights.

`--artifact` with `--variant KEY=VAL` (repeatable; variants separated by `,` inside one flag go
together, e.g. `--variant ASYNC=4,CHAIN=2`) compiles the artifact twice or more on this machine
(the shipped table, then the table with KEY=VAL on every T=1 low-register row; PREFETCH and
L2_HINT are switched off where ASYNC > 0, as the kernel requires) and reports all side by side.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOWREG_ROUTES = ("q4_gemv_lowreg", "q5_gemv_lowreg", "q6_gemv_lowreg")
SMS, SCHEDULERS = 132, 4  # H200
BITS = {"Q4": 4.25, "Q5": 5.25, "Q6": 6.25}  # bits per weight with the fp16 scale per 64 (the G64 formats)

ALU = ("LOP3", "PRMT", "SHF", "IADD3", "LEA", "ISETP", "SEL", "VIMNMX", "VIADDMNMX", "IMNMX", "MOV", "SHL",
       "SHR", "FSEL", "PLOP3", "IABS", "POPC", "FLO", "BMSK", "SGXT", "LOP", "IADD", "ICMP", "P2R", "R2P")
FMA = ("FFMA", "FADD", "FMUL", "FMNMX", "HFMA2", "HMUL2", "HADD2", "FSETP", "FCHK")
IMAD = ("IMAD",)
MEM = ("LDG", "LDS", "LDGSTS", "STS", "STG", "ATOM", "RED", "SHFL", "LDSM", "LDC", "ULDC", "LDGDEPBAR",
       "DEPBAR", "ARRIVES", "SYNCS", "BAR")
_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRA = re.compile(r"\bBRA\s+(?:`?\(?\.?L?_?x?_?)?(0x[0-9a-f]+)")


def parse_sass(text: str) -> list[tuple[int, str]]:
    """cuobjdump -sass text -> [(address, instruction text without predicate)] of the first function."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            out.append((int(m.group(1), 16), m.group(2)))
    return out


def opcode(ins: str) -> str:
    """'@!P1 HFMA2.MMA.BF16_V2 R1, ...' -> 'HFMA2.MMA.BF16_V2'."""
    return re.sub(r"^@!?U?P[T\d]+\s+", "", ins).split()[0]


def classify(op: str) -> str:
    base = op.split(".")[0]
    for name, group in (("alu", ALU), ("fma", FMA), ("imad", IMAD), ("mem", MEM)):
        if base in group:
            return name
    return "other"


def loops(ins: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """(start, end) addresses of every backward branch's body."""
    found = []
    for addr, text in ins:
        m = _BRA.search(text)
        if m and int(m.group(1), 16) <= addr:
            found.append((int(m.group(1), 16), addr))
    return found


def _registers(ins: str) -> list[str]:
    """Operands of an instruction as bare register names ('R12.reuse.H0_H0' -> 'R12'; others kept)."""
    text = re.sub(r"^@!?U?P[T\d]+\s+", "", ins)
    parts = text.split(None, 1)
    ops = [o.strip() for o in parts[1].split(",")] if len(parts) > 1 else []
    return [re.sub(r"^(-?\|?R\d+|RZ)\b.*$", r"\1", o) for o in ops]


def is_norm_scale(ins: str) -> bool:
    """The RMSNorm prologue's x * (1 + w) pair, `fma.rn.bf16x2 x, w, x`: an HFMA2 of three registers
    whose addend is its first factor (a dot product accumulates into its addend; a bias removal adds
    an immediate)."""
    if not opcode(ins).startswith("HFMA2"):
        return False
    ops = _registers(ins)
    return len(ops) == 4 and all(re.fullmatch(r"R\d+", o) for o in ops[1:]) and ops[1] == ops[3]


def k_loop(ins: list[tuple[int, str]]) -> dict | None:
    """The body with the most bf16x2 FMA-class instructions: its opcode counts, per class, and
    n_hfma (HFMA2 / HMUL2 / HADD2-less: the bias removals and products, one per weight; not the
    `HFMA2 R, -RZ, RZ, imm` moves ptxas uses to set constants), n_scale
    (the norm prologue's x pair scalings, not weights: `is_norm_scale`). None without a loop."""
    best = None
    for start, end in loops(ins):
        texts = [t for a, t in ins if start <= a <= end]
        body = [opcode(t) for t in texts]
        n_scale = sum(1 for t in texts if is_norm_scale(t))
        n_hfma = sum(1 for t, op in zip(texts, body) if op.startswith(("HFMA2", "HMUL2"))
                     and "RZ" not in [o.lstrip("-") for o in _registers(t)[1:3]]) - n_scale  # `HFMA2 R, -RZ, RZ, c` is a move
        if best is None or n_hfma > best["n_hfma"]:
            classes = collections.Counter(classify(op) for op in body)
            best = {"start": start, "end": end, "body": len(body), "n_hfma": n_hfma, "n_scale": n_scale,
                    "classes": dict(classes), "opcodes": dict(collections.Counter(body).most_common())}
    return best if best and best["n_hfma"] else None


def other_loops(ins: list[tuple[int, str]], main: dict) -> list[int]:
    """Instruction counts of the backward-branch bodies besides the K loop with more than one
    instruction (e.g. the norm prologue's `row_rstd` re-read of x, one pass per BLOCK of K)."""
    sizes = [sum(1 for a, _ in ins if s <= a <= e) for s, e in loops(ins) if (s, e) != (main["start"], main["end"])]
    return [n for n in sizes if n > 1]


def registers(tool: str, cubin: Path) -> int | None:
    """Registers per thread of the cubin's kernel (`cuobjdump -res-usage`), None if not printed."""
    r = subprocess.run([tool, "-res-usage", str(cubin)], capture_output=True, text=True, timeout=120)
    m = re.search(r"REG:(\d+)", r.stdout)
    return int(m.group(1)) if m else None


def floors_us(loop: dict, n: int, k: int, clock_ghz: float) -> dict[str, float]:
    """Issue / ALU / FMA floors in µs for N x K weights at T=1 (see the module docstring)."""
    per_weight = 1.0 / (32 * loop["n_hfma"])  # warp instructions per weight, per instruction of the body
    slots = SMS * SCHEDULERS * clock_ghz * 1e3  # warp-instruction slots per µs
    c = loop["classes"]
    w = n * k * per_weight
    return {"issue": w * loop["body"] / slots,
            "alu": w * 2 * c.get("alu", 0) / slots,
            "fma": w * (c.get("fma", 0) + 2 * c.get("imad", 0)) / slots,
            "instr_per_weight": loop["body"] / loop["n_hfma"]}


def cuobjdump() -> str:
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    found = str(tool) if tool.is_file() else shutil.which("cuobjdump")
    if not found:
        raise SystemExit("gemv_sass: cuobjdump not found (neither in Triton's nvidia backend nor on PATH)")
    return found


def _key(launch: dict) -> str:
    m = launch["match"]
    return json.dumps([launch["route"], m["format"], m["epilogue"], launch["params"]], sort_keys=True)


def analyze(plan_dir: Path, extent: str, clock_ghz: float, stream_tbs: float) -> list[dict]:
    """One row per T=1 low-register op group of `extent` (ops sharing route, format, epilogue and
    params run the same binary)."""
    plan_dir = Path(plan_dir)
    pj = json.loads((plan_dir / "plan.json").read_text())
    man_path = plan_dir / "kernels" / "bin" / "manifest.json"
    if not man_path.is_file():
        raise SystemExit(f"gemv_sass: {plan_dir}: no kernels/bin/manifest.json (compile it with binaries, "
                         f"outside TRITON_INTERPRET)")
    man = json.loads(man_path.read_text())
    if extent not in pj["extents"]:
        raise SystemExit(f"gemv_sass: {plan_dir}: no extent {extent!r} (has {', '.join(sorted(pj['extents']))})")
    launches = [L for L in pj["extents"][extent]["launches"] if L.get("route") in LOWREG_ROUTES and L.get("t") == 1]
    by_op = {L["op"]: L for L in launches}
    binary = {}
    for e in man["entries"]:
        ext, _, op = e["first_use"].partition("/")
        if ext == extent and op in by_op and "gemv_lowreg_kernel" in e["kernel"]:
            binary[_key(by_op[op])] = plan_dir / "kernels" / "bin" / e["dir"] / f"{e['name']}.cubin"
    tool = cuobjdump()
    groups: dict[tuple, list[dict]] = collections.defaultdict(list)
    for L in launches:
        m = L["match"]
        groups[(_key(L), m["n"], m["k"], m["format"])].append(L)
    rows = []
    for (key, n, k, fmt), ops in sorted(groups.items(), key=lambda g: -g[0][1] * g[0][2]):
        cubin = binary.get(key)
        if cubin is None:
            raise SystemExit(f"gemv_sass: {plan_dir}: no binary for {ops[0]['op']} (route {ops[0]['route']})")
        sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, timeout=120, check=True)
        ins = parse_sass(sass.stdout)
        loop = k_loop(ins)
        if loop is None:
            raise SystemExit(f"gemv_sass: {cubin}: no K loop with bf16x2 FMAs found in its SASS")
        loop["other_loops"] = other_loops(ins, loop)
        loop["registers"] = registers(tool, cubin)
        f = floors_us(loop, n, k, clock_ghz)
        stream = n * k * BITS[fmt[:2]] / 8 / (stream_tbs * 1e6)
        name = ops[0]["op"].split(".", 1)[1] if "." in ops[0]["op"] else ops[0]["op"]
        rows.append({"op": name, "count": len(ops), "n": n, "k": k, "format": fmt, "route": ops[0]["route"],
                     "params": ops[0]["params"], "loop": loop, "stream_us": stream, **f})
    return rows


def table(rows: list[dict], label: str) -> str:
    out = [f"**{label}**", "",
           "| op (x launches) | N x K | route, params | body / hfma | instr per weight | ALU / FMA / mem per pass |"
           " other loops | regs | issue floor µs | ALU floor µs | FMA floor µs | stream µs |",
           "|---|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        p = r["params"]
        short = ", ".join(f"{k}={p[k]}" for k in ("BLOCK_N", "BLOCK_K", "num_warps", "CHAIN", "PREFETCH", "ASYNC")
                          if k in p)
        c = r["loop"]["classes"]
        out.append(f"| {r['op']} (x{r['count']}) | {r['n']}x{r['k']} | {r['route']}: {short} | "
                   f"{r['loop']['body']} / {r['loop']['n_hfma']} | {r['instr_per_weight']:.2f} | "
                   f"{c.get('alu', 0)} / {c.get('fma', 0) + c.get('imad', 0)} / {c.get('mem', 0)} | "
                   f"{', '.join(map(str, r['loop'].get('other_loops') or [])) or '-'} | "
                   f"{r['loop'].get('registers') or '?'} | "
                   f"{r['issue']:.1f} | {r['alu']:.1f} | {r['fma']:.1f} | {r['stream_us']:.1f} |")
    return "\n".join(out)


def variant_table(base: Path, settings: dict[str, object], dest: Path) -> None:
    """`base` with `settings` merged into every T=1 low-register row's params."""
    import yaml

    doc = yaml.safe_load(base.read_text())
    hits = 0
    for entry in doc.get("linear") or []:
        for row in entry.get("routes", []):
            if row.get("route") in LOWREG_ROUTES and row.get("t") == [1, 1]:
                row["params"].update(settings)
                if int(row["params"].get("ASYNC", 0) or 0) > 0:
                    row["params"].update(PREFETCH=False, L2_HINT=False)
                hits += 1
    if not hits:
        raise SystemExit(f"gemv_sass: {base}: no T=1 low-register rows to vary")
    dest.write_text(yaml.safe_dump(doc, sort_keys=False))


def _compile(artifact: Path, out: Path, routes: Path | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    argv = [sys.executable, "-m", "ninfer_compile.cli", str(artifact), "--sm", "90", "-o", str(out),
            "--concurrency", "1", "--quiet"] + (["--routes", str(routes)] if routes else [])
    r = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"gemv_sass: compiling {artifact} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")


def _parse_variant(text: str) -> dict[str, object]:
    import yaml

    out = {}
    for part in text.split(","):
        k, sep, v = part.partition("=")
        if not sep or not k.strip():
            raise SystemExit(f"gemv_sass: --variant {text!r}: want KEY=VAL[,KEY=VAL]")
        out[k.strip()] = yaml.safe_load(v)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plan", nargs="?", type=Path, help="a plan compiled with binaries")
    ap.add_argument("--artifact", type=Path, help="compile this artifact for sm 90 here (with --variant)")
    ap.add_argument("--variant", action="append", default=[], help="KEY=VAL[,KEY=VAL] on every T=1 lowreg row")
    ap.add_argument("--routes", type=Path, default=REPO / "routes" / "sm90.yaml")
    ap.add_argument("--extent", default="decode_c1_k0")
    ap.add_argument("--clock-ghz", type=float, default=1.98, help="SM clock (H200 boost: 1.98)")
    ap.add_argument("--stream-tbs", type=float, default=4.08, help="streaming read rate, TB/s (H200: 4.08)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    sections = []
    if a.artifact:
        with tempfile.TemporaryDirectory(prefix="gemv-sass-") as tmp:
            runs = [("shipped table", None)] + [(v, _parse_variant(v)) for v in a.variant]
            for label, settings in runs:
                out = Path(tmp) / f"p{len(sections)}.plan"
                routes = None
                if settings is not None:
                    routes = Path(tmp) / f"routes{len(sections)}.yaml"
                    variant_table(a.routes, settings, routes)
                print(f"gemv_sass: compiling {a.artifact.name} ({label})", file=sys.stderr, flush=True)
                _compile(a.artifact, out, routes or a.routes)
                sections.append(table(analyze(out, a.extent, a.clock_ghz, a.stream_tbs), label))
    elif a.plan:
        sections.append(table(analyze(a.plan, a.extent, a.clock_ghz, a.stream_tbs), str(a.plan)))
    else:
        ap.error("give a PLAN or --artifact")
    text = (f"Static SASS floors, extent {a.extent}, {SMS} SMs x {SCHEDULERS} schedulers at {a.clock_ghz} GHz, "
            f"stream {a.stream_tbs} TB/s (bench/gemv_sass.py)\n\n" + "\n\n".join(sections) + "\n")
    if a.out:
        a.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
