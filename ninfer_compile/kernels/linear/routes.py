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
swiglu / residual; the `<f>_gemv` routes also the RMSNorm prologue (prologue.py: operand
norm_weight, attribute norm_eps; domain `prologues`). Launchers: `ninfer_compile.kernels.linear.launch:<route name>`.
More decode GEMVs register from their own modules: routes_lowreg.py (`q4_gemv_lowreg`,
`q5/q6_gemv_packed`) and routes_tc.py (`<f>_gemv_tc`, q4/q5/q6).
"""

from __future__ import annotations

from ...errors import RouteError
from ..registry import ParamSpec, Route, RouteDomain, default_registry

EPILOGUES = ("none", "swiglu", "residual")
PROLOGUES = ("none", "rmsnorm")   # the decode GEMVs' RMSNorm prologue (prologue.py); tiled / cuBLAS: none
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
            RouteDomain(formats=(fmt,), min_t=1, max_t=4, epilogues=EPILOGUES, prologues=PROLOGUES), _gemv_params(),
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

for _r in LINEAR_ROUTES.values():
    if default_registry._routes.get(_r.name) is not _r:  # idempotent on re-import
        default_registry.register(_r)

# low-register / packed and tensor-core decode-GEMV routes (own launcher modules gemv_lowreg.py,
# gemv_tc.py); importing them registers them
from .routes_lowreg import LOWREG_ROUTES  # noqa: E402
from .routes_tc import TC_ROUTES  # noqa: E402
from .routes_gemm import GEMM_TC_ROUTES  # noqa: E402

# every linear route by name (the workspace hook serves all of them)
ALL_LINEAR_ROUTES: dict[str, Route] = {**LINEAR_ROUTES, **LOWREG_ROUTES, **TC_ROUTES, **GEMM_TC_ROUTES}
