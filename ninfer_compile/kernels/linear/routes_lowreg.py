"""Low-register / packed decode-GEMV routes (data only: no torch / triton import here).

- `q4_gemv_lowreg`  Q4 decode GEMV, T in [1, 4]: 16-byte chunk per (row, thread), packed bf16x2
                    prmt/lop3 dequant + bf16x2 dot, one scale per chunk, [BLOCK_N, KC] fp32
                    accumulators (one register per row and column per thread).
- `q5_gemv_packed`, `q6_gemv_packed`: the same schedule for Q5 / Q6 with the high-bit plane merged
                    into the nibble bytes before the magic-number conversion.
All three take the RMSNorm prologue (prologue.py). Kernels and launchers: `ninfer_compile.kernels.linear.gemv_lowreg`. Not referenced by the shipped
route tables; `ninfer-compile tune` measures them (and drops any that fails its reference check).
"""

from __future__ import annotations

from ..registry import ParamSpec, Route, RouteDomain, default_registry

SPLITK_WORKSPACE = "ninfer_compile.kernels.linear.routes:splitk_workspace"  # the split-K partials hook

EPILOGUES = ("none", "swiglu", "residual")
REFERENCE = "ninfer_compile.kernels.linear.reference:linear"
_MOD = "ninfer_compile.kernels.linear.gemv_lowreg"


def _p(name, choices, default, doc=""):
    return ParamSpec(name, tuple(choices), default, doc)


def _params():
    return {
        "BLOCK_N": _p("BLOCK_N", (1, 2, 4, 8, 16, 32, 64), 8, "output rows per program"),
        "BLOCK_K": _p("BLOCK_K", (128, 256, 512, 1024, 2048), 1024,
                      "K lanes per loop step (BLOCK_K / 32 16-byte chunks per row)"),
        "SPLIT_K": _p("SPLIT_K", (1, 2, 4, 8, 16), 1, "K ranges (deterministic reduce, see REDUCE; needs a workspace)"),
        "REDUCE": _p("REDUCE", ("kernel", "fused"), "kernel",
                     "split-K second phase: fused = the last split of each output tile sums the partials in "
                     "split order inside the launch (epilogue.splitk_fixup); kernel = a separate "
                     "splitk_reduce_kernel launch (both deterministic, bit-identical)"),
        "num_warps": _p("num_warps", (1, 2, 4, 8), 4),
        "num_stages": _p("num_stages", (1, 2, 3, 4), 2),
        "CHAIN": _p("CHAIN", (1, 2, 4), 1,
                    "words whose products are accumulated in bf16x2 before widening to fp32 "
                    "(4 * CHAIN products per half; 1 = the precision of q4_gemv's asm path)"),
        "PREFETCH": _p("PREFETCH", (False, True), False,
                       "register double buffer: load the next K step's weight chunks before this step's "
                       "dequant + dot (asm path only)"),
        "L2_HINT": _p("L2_HINT", (False, True), False,
                      "weight loads carry an L2::256B prefetch hint (asm path only)"),
        "ASYNC": _p("ASYNC", (0, 2, 3, 4, 6), 0,
                    "0 = the weight chunks by inline-asm loads; N = plain loads in a loop Triton pipelines into an "
                    "N-stage cp.async ring in shared memory (asm path only; excludes PREFETCH / L2_HINT)"),
        "MAXNREG": _p("MAXNREG", (0, 64, 96, 128, 168), 0,
                      "register cap handed to ptxas (0 = its own choice; a higher cap lets it issue a step's "
                      "loads ahead of the math instead of sinking them to save registers)"),
        "USE_ASM": _p("USE_ASM", ("auto", False, True), "auto",
                      "inline-PTX packed path (auto = on for sm_90+ outside the interpreter when K % 8 == 0 "
                      "and x rows / planes are 16-byte aligned); False = plain-Triton fp32 equivalent"),
    }


def _build() -> dict[str, Route]:
    out = {}
    for name, fmt, doc in (
            ("q4_gemv_lowreg", "Q4G64_F16S", "Q4 decode GEMV (T<=4), 16-byte chunks, packed bf16x2, low-register accumulators"),
            ("q5_gemv_packed", "Q5G64_F16S", "Q5 decode GEMV (T<=4), high bits merged before the packed bf16x2 dequant"),
            ("q6_gemv_packed", "Q6G64_F16S", "Q6 decode GEMV (T<=4), high bits merged before the packed bf16x2 dequant")):
        out[name] = Route(
            name=name, family="linear",
            domain=RouteDomain(formats=(fmt,), min_t=1, max_t=4, epilogues=EPILOGUES,
                               prologues=("none", "rmsnorm")),
            params=_params(), reference=REFERENCE, launcher=f"{_MOD}:{name}",
            workspace=SPLITK_WORKSPACE,
            kernels=(f"{_MOD}:gemv_lowreg_kernel",), doc=doc)
    return out


LOWREG_ROUTES: dict[str, Route] = _build()

for _r in LOWREG_ROUTES.values():
    if default_registry._routes.get(_r.name) is not _r:  # idempotent on re-import
        default_registry.register(_r)
