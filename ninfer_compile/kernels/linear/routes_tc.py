"""Tensor-core decode-GEMV routes (data only: no torch / triton import here).

- `q4_gemv_tc`, `q5_gemv_tc`, `q6_gemv_tc`: T in [1, 32] (one pass per 16 columns). One warp per 16 weight rows; each lane
  dequantizes its two rows' 16-byte chunks in registers (the lowreg prmt/lop3 pairs, scaled to
  bf16) straight into `mma.sync.m16n8k16` A fragments, with a K permutation shared by the A and B
  fragments so that every operand is one 16-byte load. One dequant serves up to 16 columns.
- `w8_gemv_tc`: the same schedule for the W8 G32 planes (one byte per lane: two 16-byte chunks per
  row and lane per 128-lane K step, one G32 scale per chunk; sign-split bf16 magic-number dequant).
Kernels and launchers: `ninfer_compile.kernels.linear.gemv_tc` (Q4/Q5/Q6) and
`ninfer_compile.kernels.linear.gemv_tc_w8` (W8). Not referenced by the shipped route
tables until `ninfer-compile tune` measures them (the tuner drops a candidate that fails its
reference check).
"""

from __future__ import annotations

from ..registry import ParamSpec, Route, RouteDomain, default_registry

SPLITK_WORKSPACE = "ninfer_compile.kernels.linear.routes:splitk_workspace"  # the split-K partials hook

EPILOGUES = ("none", "swiglu", "residual")
REFERENCE = "ninfer_compile.kernels.linear.reference:linear"
_MOD = "ninfer_compile.kernels.linear.gemv_tc"
_MOD_W8 = "ninfer_compile.kernels.linear.gemv_tc_w8"


def _params(w8: bool):
    params = {
        "num_warps": ParamSpec("num_warps", (1, 2, 4, 8), 4, "warps per program; 16 weight rows per warp"),
        "SPLIT_K": ParamSpec("SPLIT_K", (1, 2, 4, 8, 16), 1,
                             "K ranges (deterministic two-phase reduce; needs a workspace)"),
        "REDUCE": ParamSpec("REDUCE", ("kernel", "fused"), "kernel",
                            "split-K second phase: fused = the last split of each output tile sums the partials "
                            "in split order inside the launch (epilogue.splitk_fixup); kernel = a separate "
                            "splitk_reduce_kernel launch (both deterministic, bit-identical)"),
        "PREFETCH": ParamSpec("PREFETCH", (False, True), False,
                              "register double buffer: the next K step's weight chunks load before this step's math"),
        "MAXNREG": ParamSpec("MAXNREG", (0, 96, 128, 168, 255), 0, "register cap handed to ptxas (0 = its choice)"),
        "USE_ASM": ParamSpec("USE_ASM", ("auto", False, True), "auto",
                             "inline-PTX mma path (auto = on for sm_90+ outside the interpreter when K % 8 == 0 "
                             "and x rows / planes are 16-byte aligned); False = the small_t_mma kernel"),
    }
    if not w8:  # (W8 has one G32 scale per 16-byte chunk, loaded with it)
        params["SCALES"] = ParamSpec("SCALES", ("lane", "shfl"), "lane",
                                     "group scales: lane = a 2-byte load per row and K step; shfl = one coalesced "
                                     "4-byte load per row and lane per 4 K steps, then a warp shuffle per step")
        params["ASYNC"] = ParamSpec("ASYNC", (0, 2, 3, 4, 6), 0,
                                    "0 = the weight chunks by inline-asm loads; N = plain loads in a loop Triton "
                                    "pipelines into an N-stage cp.async ring in shared memory (excludes PREFETCH "
                                    "and SCALES=shfl)")
    return params


def _build() -> dict[str, Route]:
    out = {}
    for name, fmt, mod, kernel in (("q4_gemv_tc", "Q4G64_F16S", _MOD, "gemv_tc_kernel"),
                                   ("q5_gemv_tc", "Q5G64_F16S", _MOD, "gemv_tc_kernel"),
                                   ("q6_gemv_tc", "Q6G64_F16S", _MOD, "gemv_tc_kernel"),
                                   ("w8_gemv_tc", "W8G32_F16S", _MOD_W8, "gemv_tc_w8_kernel")):
        out[name] = Route(
            name=name, family="linear",
            domain=RouteDomain(formats=(fmt,), min_t=1, max_t=32, epilogues=EPILOGUES),
            params=_params(name.startswith("w8_")), reference=REFERENCE, launcher=f"{mod}:{name}",
            workspace=SPLITK_WORKSPACE,
            kernels=(f"{mod}:{kernel}",),
            doc=f"{fmt[:2]} decode GEMV on tensor cores (T<=32, 16 columns per pass): register dequant into "
                "mma.sync m16n8k16")
    return out


TC_ROUTES: dict[str, Route] = _build()

for _r in TC_ROUTES.values():
    if default_registry._routes.get(_r.name) is not _r:  # idempotent on re-import
        default_registry.register(_r)
