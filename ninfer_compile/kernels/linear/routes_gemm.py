"""Route registrations of the tensor-core small-T GEMM (`gemm_tc.py`): `q4_gemm_tc`, `q5_gemm_tc`,
`q6_gemm_tc`, `w8_gemm_tc` (data only: no torch / triton import here).

Domain T = 1..64 in one launch: each program dequantizes its weight tile once per K step for up to
BLOCK_T columns (8..64, n8 tiles of `mma.sync.m16n8k16`); T > BLOCK_T runs as more column blocks of
the same launch (grid axis 0), each re-reading the weights (an L2 hit when they run together). Not
in routes/sm90.yaml until `ninfer-compile tune` measures them (the tuner drops a candidate that
fails its reference check).
"""

from __future__ import annotations

from ..registry import ParamSpec, Route, RouteDomain, default_registry

SPLITK_WORKSPACE = "ninfer_compile.kernels.linear.routes:splitk_workspace"  # the split-K partials hook
EPILOGUES = ("none", "swiglu", "residual")
REFERENCE = "ninfer_compile.kernels.linear.reference:linear"
_MOD = "ninfer_compile.kernels.linear.gemm_tc"
MAX_T = 64
FORMATS = {"q4": "Q4G64_F16S", "q5": "Q5G64_F16S", "q6": "Q6G64_F16S", "w8": "W8G32_F16S"}


def _params(w8: bool) -> dict[str, ParamSpec]:
    return {
        "num_warps": ParamSpec("num_warps", (1, 2, 4, 8), 4, "warps per program; 16 weight rows per warp"),
        "BLOCK_T": ParamSpec("BLOCK_T", (8, 16, 32, 64), 64,
                             "most columns one program serves (n8 tiles: ceil(T / 8) up to BLOCK_T / 8); "
                             "T > BLOCK_T runs as more column blocks of the launch"),
        "SPLIT_K": ParamSpec("SPLIT_K", (1, 2, 4, 8), 1,
                             "K ranges (deterministic two-phase reduce; needs a workspace)"),
        "REDUCE": ParamSpec("REDUCE", ("kernel", "fused"), "kernel",
                            "split-K second phase: fused = the last split of each row block sums the partials "
                            "in split order inside the launch (one column block only; else kernel); kernel = "
                            "a separate splitk_reduce_kernel launch (both deterministic, bit-identical)"),
        "PREFETCH": ParamSpec("PREFETCH", (False, True), False,
                              "register double buffer: the next K step's weight chunks load before this step's math"),
        "MAXNREG": ParamSpec("MAXNREG", (0, 128, 168, 255), 0, "register cap handed to ptxas (0 = its choice)"),
        "USE_ASM": ParamSpec("USE_ASM", ("auto", False, True), "auto",
                             "inline-PTX mma path (auto = on for sm_90+ outside the interpreter when K % 8 == 0 "
                             "and x rows / planes are 16-byte aligned); False = the small_t_mma kernel"),
    }


def _build() -> dict[str, Route]:
    out = {}
    for prefix, fmt in FORMATS.items():
        name = f"{prefix}_gemm_tc"
        out[name] = Route(
            name=name, family="linear",
            domain=RouteDomain(formats=(fmt,), min_t=1, max_t=MAX_T, epilogues=EPILOGUES),
            params=_params(prefix == "w8"), reference=REFERENCE, launcher=f"{_MOD}:{name}",
            workspace=SPLITK_WORKSPACE, kernels=(f"{_MOD}:gemm_tc_kernel",),
            doc=f"{fmt[:2]} small-T GEMM on tensor cores (T<=64 in one launch): each weight tile dequantized "
                "once per K step into mma.sync m16n8k16 A fragments, reused by every n8 column tile")
    return out


GEMM_TC_ROUTES: dict[str, Route] = _build()

for _r in GEMM_TC_ROUTES.values():
    if default_registry._routes.get(_r.name) is not _r:  # idempotent on re-import
        default_registry.register(_r)
