"""Linear-family route registrations (data only: no torch / triton import here).

Per weight format four schedules (bf16: two), each with its own declared domain:
- `<f>_gemv`          decode GEMV, T in [1, 4]: CUDA-core fp32 FMAs, magic-number unpack,
                      optional deterministic split-K (two-phase, workspace).
- `<f>_small_t_mma`   T in [1, 64]: tl.dot on dequantized bf16 tiles, BLOCK_T 16/32/64,
                      optional split-K; `USE_ASM` packed bf16x2 lop3/prmt dequant (Q4, sm_90).
- `<f>_wide_mma`      T >= 1 (prefill chunks, no upper bound: the grid tiles T), BLOCK_T 64..256,
                      pipelined (num_stages).
- `<f>_dequant_gemm`   T >= 1 (prefill; quantized formats only): a Triton kernel expands the planes
                      once into a bf16 W_hat in the caller's workspace, then a cuBLAS GEMM
                      (`torch.mm` / `addmm` into the preallocated out) + swiglu epilogue kernel.
                      Launchers: `ninfer_compile.kernels.linear.dequant_gemm:<route name>`; workspace
                      `dequant_gemm.linear_workspace_numel(route, T, N, K, epilogue)` float32 elems.
`<f>` in q4, q5, q6, w8 (row-split planes read in place) and bf16 (`bf16_gemv`, `bf16_tiled`:
GDN a/b projections and bf16-recipe artifacts). Every route supports the epilogues none /
swiglu / residual. Launchers: `ninfer_compile.kernels.linear.launch:<route name>`.
The decode GEMVs with their own kernel modules (selected by the shipped tables, e.g. routes/sm90.yaml):
- `q4_gemv_lowreg`, `q5_gemv_lowreg`, `q6_gemv_lowreg` (gemv_lowreg.py), T in [1, 4]: a 16-byte
  chunk per (row, thread), packed bf16x2 prmt/lop3 dequant + bf16x2 dot, one scale per chunk,
  [BLOCK_N, KC] fp32 accumulators (one register per row and column per thread); Q5 / Q6 merge the
  high-bit plane into the nibble bytes before the magic-number conversion.
- `q4_gemv_tc`, `q5_gemv_tc`, `q6_gemv_tc` (gemv_tc.py) and `w8_gemv_tc` (gemv_tc_w8.py), T in
  [1, 32] (one pass per 16 columns): one warp per 16 weight rows; each lane dequantizes its two rows'
  16-byte chunks in registers straight into `mma.sync.m16n8k16` A fragments, with a K permutation
  shared by the A and B fragments so that every operand is one 16-byte load (W8: two chunks per row
  and lane per 128-lane K step, one G32 scale per chunk).
The tuner measures every one of them (`ninfer-compile tune`, dropping a candidate that fails its
reference check).
"""

from __future__ import annotations

from ...errors import RouteError
from ..registry import ParamSpec, Route, RouteDomain, default_registry

EPILOGUES = ("none", "swiglu", "residual")
FORMATS = {"q4": "Q4G64_F16S", "q5": "Q5G64_F16S", "q6": "Q6G64_F16S", "w8": "W8G32_F16S",
           "bf16": "BF16"}
REFERENCE = "ninfer_compile.kernels.linear.reference:linear"
_MOD = "ninfer_compile.kernels.linear"


def _p(name, choices, default, doc=""):
    return ParamSpec(name, tuple(choices), default, doc)


def _gemv_params():
    return {
        "BLOCK_N": _p("BLOCK_N", (1, 2, 4, 8, 16, 32, 64), 8, "output rows per program"),
        "BLOCK_K": _p("BLOCK_K", (64, 128, 256, 512, 1024), 256, "K lanes per loop step"),
        "SPLIT_K": _p("SPLIT_K", (1, 2, 4, 8, 16), 1, "K ranges (deterministic two-phase reduce; needs a workspace)"),
        "num_warps": _p("num_warps", (1, 2, 4, 8), 4),
        "num_stages": _p("num_stages", (1, 2, 3, 4), 2),
        "USE_ASM": _p("USE_ASM", ("auto", False, True), "auto",
                      "packed bf16x2 prmt/lop3 dequant + bf16x2 FMA per word (Q4 only; auto = on for "
                      "sm_90+ outside the interpreter when K % 8 == 0 and x rows are 16-byte aligned)"),
    }


def _mma_params(wide: bool):
    asm = _p("USE_ASM", ("auto", False, True), "auto",
             "packed bf16x2 lop3/prmt dequant (Q4 only; auto = on for sm_90+ outside the interpreter)")
    if wide:
        return {
            "BLOCK_N": _p("BLOCK_N", (32, 64, 128, 256), 128, "weight rows per program"),
            "BLOCK_K": _p("BLOCK_K", (32, 64, 128), 64),
            "BLOCK_T": _p("BLOCK_T", (32, 64, 128, 256), 128, "token columns per program"),
            "SPLIT_K": _p("SPLIT_K", (1,), 1),
            "num_warps": _p("num_warps", (4, 8), 8),
            "num_stages": _p("num_stages", (1, 2, 3, 4), 3),
            "USE_ASM": asm,
        }
    return {
        "BLOCK_N": _p("BLOCK_N", (16, 32, 64, 128), 64, "weight rows per program"),
        "BLOCK_K": _p("BLOCK_K", (32, 64, 128, 256), 128),
        "BLOCK_T": _p("BLOCK_T", (16, 32, 64), 16, "token columns per program (MMA N dimension)"),
        "SPLIT_K": _p("SPLIT_K", (1, 2, 4, 8), 1, "K ranges (deterministic two-phase reduce; needs a workspace)"),
        "num_warps": _p("num_warps", (2, 4, 8), 4),
        "num_stages": _p("num_stages", (1, 2, 3, 4), 2),
        "USE_ASM": asm,
    }


def _dequant_gemm_params():
    return {
        "BLOCK_N": _p("BLOCK_N", (16, 32, 64, 128), 64, "weight rows per dequant program"),
        "BLOCK_K": _p("BLOCK_K", (64, 128, 256, 512), 256, "K lanes per dequant program"),
        "num_warps": _p("num_warps", (2, 4, 8), 4, "warps of the dequant kernel"),
    }


# min_t 1, not 16: the runtime narrows a prefill extent's launches to a short tail chunk (any
# n <= T columns) without re-selecting routes, so a prefill route must accept every T >= 1. It
# is slow (not wrong) at small T; the tuner only picks it where it wins.
DEQUANT_GEMM_MIN_T = 1


# the route workspace hooks (`Route.workspace`, defined below): split-K partials / dequant W_hat
SPLITK_WORKSPACE = f"{_MOD}.routes:splitk_workspace"
DEQUANT_GEMM_WORKSPACE = f"{_MOD}.routes:dequant_gemm_workspace"


def _route(name, fmt, kernel, domain, params, doc, launcher_mod="launch"):
    return Route(
        name=name, family="linear", domain=domain, params=params, reference=REFERENCE,
        launcher=f"{_MOD}.{launcher_mod}:{name}", kernels=(f"{_MOD}.{kernel}",), doc=doc,
        workspace=DEQUANT_GEMM_WORKSPACE if launcher_mod == "dequant_gemm" else SPLITK_WORKSPACE,
    )


def _build() -> dict[str, Route]:
    routes = {}
    for prefix, fmt in FORMATS.items():
        gemv = _route(
            f"{prefix}_gemv", fmt, "gemv:qlinear_gemv_kernel",
            RouteDomain(formats=(fmt,), min_t=1, max_t=4, epilogues=EPILOGUES), _gemv_params(),
            f"{fmt} decode GEMV (T<=4), CUDA-core fp32 FMA, magic-number unpack, split-K two-phase")
        routes[gemv.name] = gemv
        if prefix == "bf16":
            tiled = _route(
                "bf16_tiled", fmt, "mma:qlinear_mma_kernel",
                RouteDomain(formats=(fmt,), min_t=1, max_t=None, epilogues=EPILOGUES),
                {**_mma_params(False), "BLOCK_T": _p("BLOCK_T", (16, 32, 64, 128, 256), 64),
                 "BLOCK_N": _p("BLOCK_N", (16, 32, 64, 128, 256), 128),
                 "num_warps": _p("num_warps", (2, 4, 8), 8),
                 "num_stages": _p("num_stages", (1, 2, 3, 4), 3)},
                "bf16 weights, tensor-core tiles over any T")
            routes[tiled.name] = tiled
            continue
        small = _route(
            f"{prefix}_small_t_mma", fmt, "mma:qlinear_mma_kernel",
            RouteDomain(formats=(fmt,), min_t=1, max_t=64, epilogues=EPILOGUES), _mma_params(False),
            f"{fmt} small-T tensor-core schedule (dequant to bf16 in registers, tl.dot)")
        wide = _route(
            f"{prefix}_wide_mma", fmt, "mma:qlinear_mma_kernel",
            RouteDomain(formats=(fmt,), min_t=1, max_t=None, epilogues=EPILOGUES), _mma_params(True),
            f"{fmt} wide-T prefill schedule (large BLOCK_T, tl.dot, pipelined)")
        dg = _route(
            f"{prefix}_dequant_gemm", fmt, "dequant_gemm:dequant_weight_kernel",
            RouteDomain(formats=(fmt,), min_t=DEQUANT_GEMM_MIN_T, max_t=None, epilogues=EPILOGUES),
            _dequant_gemm_params(),
            f"{fmt} prefill: dequantize once to a bf16 workspace W_hat [N, K_pad], then cuBLAS GEMM "
            f"(+ swiglu epilogue kernel); float32 workspace linear_workspace_numel(route, T, N, K, epilogue)",
            launcher_mod="dequant_gemm")
        routes[small.name] = small
        routes[wide.name] = wide
        routes[dg.name] = dg
    return routes


LINEAR_ROUTES: dict[str, Route] = _build()

# --------------------------------------------------------------------------------------------
# Workspace sizing (pure arithmetic, importable without torch / triton: the compiler's memory
# report calls it; launch.py and dequant_gemm.py re-export it for the runtime).
# --------------------------------------------------------------------------------------------
ROW_ALIGN = 128   # row-split K padding: a dequantized W_hat row is k_pad = round_up(K, 128) long
WS_ALIGN = 128    # bf16 elements (256 bytes): where the swiglu scratch starts in the workspace


def dequant_gemm_layout(t: int, n: int, k: int, epilogue: str) -> tuple[int, int, int, int]:
    """bf16 layout of a `<f>_dequant_gemm` workspace: (k_pad, y offset, y elements, total elements).
    W_hat [n, k_pad] at 0; the swiglu scratch y [t, n] at the next 256-byte boundary."""
    k_pad = (int(k) + ROW_ALIGN - 1) // ROW_ALIGN * ROW_ALIGN
    w_elems = int(n) * k_pad
    y_off = (w_elems + WS_ALIGN - 1) // WS_ALIGN * WS_ALIGN
    y_elems = int(t) * int(n) if epilogue == "swiglu" else 0
    return k_pad, y_off, y_elems, (y_off + y_elems if y_elems else w_elems)


def linear_workspace_numel(route: str, t: int, n: int, k: int, epilogue: str = "none", params=None) -> int:
    """float32 elements of the workspace linear route `route` needs for x [t, k] and a weight of n
    rows (all rows: 2 x N_out for swiglu), with `params` (defaults overlaid). 0 = none.
    - `<f>_dequant_gemm`: bf16 W_hat [n, k_pad] (+ bf16 y [t, n] for swiglu), see dequant_gemm.py;
    - others: the split-K partials [SPLIT_K, t, N_out (x2 for swiglu)] when SPLIT_K > 1."""
    r = ALL_LINEAR_ROUTES.get(route)
    if r is None:
        raise RouteError(f"unknown linear route {route!r}")
    if route.endswith("_dequant_gemm"):
        total = dequant_gemm_layout(t, n, k, epilogue)[3]
        return (total + 1) // 2
    split = int(r.resolve_params({kk: v for kk, v in dict(params or {}).items() if kk in r.params}).get("SPLIT_K", 1))
    return splitk_numel(t, n, epilogue, split)


def splitk_numel(t: int, n: int, epilogue: str, split: int) -> int:
    """float32 split-K partials [SPLIT_K, t, N_out (x2 for swiglu)] of a weight of n rows; 0 for SPLIT_K 1."""
    if split <= 1:
        return 0
    n_out = int(n) // 2 if epilogue == "swiglu" else int(n)
    return int(split) * int(t) * n_out * (2 if epilogue == "swiglu" else 1)


def _tnk(view) -> tuple[int, int, int, str]:
    n, k = view.shape("weight")[:2]
    return view.shape("x")[0], n, k, view.attr("epilogue", "none")


def splitk_workspace(view, params) -> int:
    """Route workspace hook of the split-K routes (`Route.workspace`): x [T, K], weight [N, K]."""
    t, n, _k, epi = _tnk(view)
    return splitk_numel(t, n, epi, int(params.get("SPLIT_K", 1)))


def dequant_gemm_workspace(view, params) -> int:
    """Route workspace hook of the `<f>_dequant_gemm` routes: W_hat (+ the swiglu scratch)."""
    t, n, k, epi = _tnk(view)
    return (dequant_gemm_layout(t, n, k, epi)[3] + 1) // 2

# ---------------------------------------------------------------------------------------------
# the low-register decode GEMVs (gemv_lowreg.py)
# ---------------------------------------------------------------------------------------------
_LOWREG = f"{_MOD}.gemv_lowreg"


def _lowreg_params():
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


def _build_lowreg() -> dict[str, Route]:
    out = {}
    for name, fmt, doc in (
            ("q4_gemv_lowreg", "Q4G64_F16S", "Q4 decode GEMV (T<=4), 16-byte chunks, packed bf16x2, low-register accumulators"),
            ("q5_gemv_lowreg", "Q5G64_F16S", "Q5 decode GEMV (T<=4), high bits merged before the packed bf16x2 dequant"),
            ("q6_gemv_lowreg", "Q6G64_F16S", "Q6 decode GEMV (T<=4), high bits merged before the packed bf16x2 dequant")):
        out[name] = Route(
            name=name, family="linear",
            domain=RouteDomain(formats=(fmt,), min_t=1, max_t=4, epilogues=EPILOGUES),
            params=_lowreg_params(), reference=REFERENCE, launcher=f"{_LOWREG}:{name}",
            workspace=SPLITK_WORKSPACE,
            kernels=(f"{_LOWREG}:gemv_lowreg_kernel",), doc=doc)
    return out


LOWREG_ROUTES: dict[str, Route] = _build_lowreg()


# ---------------------------------------------------------------------------------------------
# the tensor-core decode GEMVs (gemv_tc.py, gemv_tc_w8.py)
# ---------------------------------------------------------------------------------------------
_TC = f"{_MOD}.gemv_tc"
_TC_W8 = f"{_MOD}.gemv_tc_w8"


def _tc_params(w8: bool):
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


def _build_tc() -> dict[str, Route]:
    out = {}
    for name, fmt, mod, kernel in (("q4_gemv_tc", "Q4G64_F16S", _TC, "gemv_tc_kernel"),
                                   ("q5_gemv_tc", "Q5G64_F16S", _TC, "gemv_tc_kernel"),
                                   ("q6_gemv_tc", "Q6G64_F16S", _TC, "gemv_tc_kernel"),
                                   ("w8_gemv_tc", "W8G32_F16S", _TC_W8, "gemv_tc_w8_kernel")):
        out[name] = Route(
            name=name, family="linear",
            domain=RouteDomain(formats=(fmt,), min_t=1, max_t=32, epilogues=EPILOGUES),
            params=_tc_params(name.startswith("w8_")), reference=REFERENCE, launcher=f"{mod}:{name}",
            workspace=SPLITK_WORKSPACE,
            kernels=(f"{mod}:{kernel}",),
            doc=f"{fmt[:2]} decode GEMV on tensor cores (T<=32, 16 columns per pass): register dequant into "
                "mma.sync m16n8k16")
    return out


TC_ROUTES: dict[str, Route] = _build_tc()

# the tensor-core small-T GEMM (one pass to T = 64; gemm_tc.py) registers from its own module
from .routes_gemm import GEMM_TC_ROUTES  # noqa: E402

# every linear route by name (the workspace hook serves all of them)
ALL_LINEAR_ROUTES: dict[str, Route] = {**LINEAR_ROUTES, **LOWREG_ROUTES, **TC_ROUTES, **GEMM_TC_ROUTES}

for _r in ALL_LINEAR_ROUTES.values():
    if default_registry._routes.get(_r.name) is not _r:  # idempotent on re-import
        default_registry.register(_r)
