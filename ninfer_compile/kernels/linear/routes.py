"""Linear-family route registrations (data only: no torch / triton import here).

Per weight format three schedules, each with its own declared domain:
- `<f>_gemv`          decode GEMV, T in [1, 4]: CUDA-core fp32 FMAs, magic-number unpack,
                      optional deterministic split-K (two-phase, workspace).
- `<f>_small_t_mma`   T in [1, 64]: tl.dot on dequantized bf16 tiles, BLOCK_T 16/32/64,
                      optional split-K; `USE_ASM` packed bf16x2 lop3/prmt dequant (Q4, sm_90).
- `<f>_wide_mma`      T >= 1 (prefill chunks, no upper bound: the grid tiles T), BLOCK_T 64..256,
                      pipelined (num_stages).
`<f>` in q4, q5, q6, w8 (row-split planes read in place) and bf16 (`bf16_gemv`, `bf16_tiled`:
GDN a/b projections and bf16-recipe artifacts). Every route supports the epilogues none /
swiglu / residual. Launchers: `ninfer_compile.kernels.linear.launch:<route name>`.
"""

from __future__ import annotations

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


def _route(name, fmt, kernel, domain, params, doc):
    return Route(
        name=name, family="linear", domain=domain, params=params, reference=REFERENCE,
        launcher=f"{_MOD}.launch:{name}", kernels=(f"{_MOD}.{kernel}",), doc=doc,
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
        routes[small.name] = small
        routes[wide.name] = wide
    return routes


LINEAR_ROUTES: dict[str, Route] = _build()

for _r in LINEAR_ROUTES.values():
    if default_registry._routes.get(_r.name) is not _r:  # idempotent on re-import
        default_registry.register(_r)
