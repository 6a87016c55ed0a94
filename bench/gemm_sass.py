"""Static SASS floors of the tensor-core small-T GEMM (`gemm_tc_kernel`) per K step (no GPU needed).

    python bench/gemm_sass.py [--fmt 4] [--epi none] [--nt 1,2,4,8] [--nw 4] [--prefetch] [--shape 34816x5120]

Compiles the kernel for sm_90 with the installed Triton (the card runs 3.6: put a 3.6 wheel first on
PYTHONPATH to match it), reads its SASS (`cuobjdump -sass`), takes the K loop (gemv_sass.k_loop: the
backward branch with the most bf16x2 FMA-class instructions) and counts what one pass (= one K step
of one warp: 16 rows x 128 K x 8 NT columns) issues. For an N x K op that is N / 16 * K / 128 warp
passes over 132 SMs x 4 schedulers at --clock-ghz:
- issue floor: one warp instruction per scheduler and clock;
- ALU floor:  integer / logic at 2 clocks per warp instruction (16 INT32 lanes per scheduler);
- HMMA floor: mma.sync m16n8k16 bf16 at --hmma-clk clocks per scheduler (4 = the dense bf16 peak,
  989 TFLOP/s on an H100 SXM; mma.sync reaches roughly 2/3 of it, so ~6 is the realistic rate).
Beside them the weight-read floor at --stream-tbs. Lower bounds from one loop pass; nothing is timed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gemv_sass import SCHEDULERS, SMS, cuobjdump, k_loop, parse_sass  # noqa: E402

EPI = {"none": 0, "swiglu": 1, "residual": 2}
BYTES_PER_WEIGHT = {4: 0.5 + 2 / 64, 5: 0.625 + 2 / 64, 6: 0.75 + 2 / 64, 8: 1 + 2 / 32}


def compile_sass(fmt: int, epi: int, nt: int, nw: int, prefetch: bool) -> tuple[str, bytes]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ninfer_compile.kernels.linear.gemm_tc import gemm_tc_kernel as fn

    ptrs = {"x_ptr": "*bf16", "base_ptr": "*i32", "high_ptr": "*i32", "scale_ptr": "*fp16", "out_ptr": "*bf16",
            "res_ptr": "*bf16", "ws_ptr": "*fp32", "cnt_ptr": "*i32"}
    consts = dict(FMT=fmt, EPI=epi, NT=nt, SPLIT_K=1, NW=nw, PREFETCH=prefetch, FUSED_REDUCE=False, FIX_T=64,
                  PDL=False)
    names = fn.arg_names
    sig = {n: ptrs.get(n, "constexpr" if n in consts else "i32") for n in names}
    div16 = list(ptrs) + ["K", "KB_TOTAL", "base_row", "high_row", "scale_row", "sx", "so", "sr", "N_OUT", "up_off"]
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in div16})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": nw, "num_stages": 1})
    return k.asm["ptx"], k.asm["cubin"]


def analyze(cubin: bytes) -> tuple[dict | None, int | None]:
    tool = cuobjdump()
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(cubin)
    sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, timeout=120).stdout
    res = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, timeout=120).stdout
    os.unlink(f.name)
    import re
    m = re.search(r"REG:(\d+)", res)
    return k_loop(parse_sass(sass)), (int(m.group(1)) if m else None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fmt", type=int, default=4, choices=(4, 5, 6, 8))
    ap.add_argument("--epi", default="none", choices=tuple(EPI))
    ap.add_argument("--nt", default="1,2,4,8", help="n8 column tiles per program (T up to 8 NT)")
    ap.add_argument("--nw", type=int, default=4)
    ap.add_argument("--prefetch", action="store_true")
    ap.add_argument("--shape", default="34816x5120", help="N x K of the op (gate_up)")
    ap.add_argument("--clock-ghz", type=float, default=1.755)
    ap.add_argument("--hmma-clk", type=float, default=4.0)
    ap.add_argument("--stream-tbs", type=float, default=3.0)
    args = ap.parse_args(argv)
    n, k = (int(v) for v in args.shape.lower().split("x"))
    passes = n / 16 * k / 128 / (2 if args.epi == "swiglu" else 1)   # swiglu: a pass covers gate and up rows
    slots = SMS * SCHEDULERS * args.clock_ghz * 1e3                   # warp-instruction slots per µs
    floor = n * k * BYTES_PER_WEIGHT[args.fmt] / (args.stream_tbs * 1e6)
    print(f"gemm_tc Q{args.fmt} {args.epi} {n}x{k} nw={args.nw} prefetch={args.prefetch}: weight-read floor "
          f"{floor:.1f} us at {args.stream_tbs} TB/s")
    print("| NT | T max | regs | body | HMMA | ALU | FMA | LDG | issue us | ALU us | HMMA us |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for nt in (int(v) for v in args.nt.split(",")):
        _, cubin = compile_sass(args.fmt, EPI[args.epi], nt, args.nw, args.prefetch)
        loop, regs = analyze(cubin)
        if loop is None:
            print(f"| {nt} | {8 * nt} | {regs} | no K loop found | | | | | | | |")
            continue
        ops = loop["opcodes"]
        hmma = sum(v for op, v in ops.items() if op.startswith("HMMA"))
        ldg = sum(v for op, v in ops.items() if op.startswith("LDG"))
        c = loop["classes"]
        print(f"| {nt} | {8 * nt} | {regs} | {loop['body']} | {hmma} | {c.get('alu', 0)} | {c.get('fma', 0)} | {ldg} | "
              f"{passes * loop['body'] / slots:.1f} | {passes * 2 * c.get('alu', 0) / slots:.1f} | "
              f"{passes * hmma * args.hmma_clk / (SMS * SCHEDULERS * args.clock_ghz * 1e3):.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
