"""Prefill route `<f>_dequant_gemm` (f in q4, q5, q6, w8): dequantize once, then one cuBLAS GEMM.

The wide-T tensor-core route (`<f>_wide_mma`) re-dequantizes every weight tile once per token
block, so at T=1024 it runs ~3.6x slower than a bf16 cuBLAS GEMM of the same shape
(bench/results/linear_h200_2026-11-29.md). This route pays the dequant exactly once per launch:

1. `dequant_weight_kernel` (memory bound: reads the stored planes, writes 2 B per weight) expands
   the row-split planes of the weight (a row view reads its parent's bytes in place) into a bf16
   `W_hat [N, k_pad]` in the caller's workspace. Values are exactly the tensor-core routes' tiles:
   fp16 scale x code in fp32, rounded once to bf16 (the packed bf16x2 `USE_ASM` path is never
   used here: it rounds the fp16 scale to bf16 first). Columns >= K (row-split padding) are
   written but never read by the GEMM.
2. the GEMM on `W_hat[:, :K]` (cuBLAS on a GPU), fp32 accumulation, then the epilogue:
   - `none`:     `torch.mm(x, W_hat.T, out=out)` (one rounding to bf16);
   - `residual`: `torch.addmm(residual, x, W_hat.T, out=out)` (cuBLAS beta = 1: residual + acc in
                 fp32, one rounding); when `out` is `residual` (same bytes, same strides) the
                 in-place `out.addmm_(x, W_hat.T)` is used; a partial overlap is refused;
   - `swiglu`:   `torch.mm(x, W_hat.T, out=y)` into a bf16 scratch `y [T, N]` in the workspace
                 (gate columns [0, N/2), up columns [N/2, N)), then `splitk_reduce_kernel`
                 (SPLIT_K = 1, EPI = swiglu) writes `out = silu(gate) * up` (fp32 math, one
                 rounding). gate / up are rounded to bf16 once in `y` (the tensor-core routes keep
                 them in fp32; relative error ~2^-9, far inside the linear reference tolerance).

Workspace (one argument, the runtime's per-extent float32 buffer; contiguous, 1-D or any shape):
viewed as bf16, it holds

    [ W_hat: N x k_pad bf16 | pad to 256 B | y: T x N bf16 (swiglu only) ]

`linear_workspace_numel(route, t, n, k, epilogue)` (routes.py, re-exported here: the runtime calls
it on the launcher's module) gives the float32 elements needed (n = weight rows, 2 x N_out for
swiglu). A missing / too small / non-float32 / non-contiguous workspace raises
`RouteError` naming the route and the size. The launcher allocates nothing (CUDA-graph safe):
every tensor it touches is a view of x / weight / out / residual / workspace.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import RouteError
from .dequant import dequant_tile
from .epilogue import EPI_CODES, splitk_reduce_kernel
from .launch import check_call, interpreting, named_launcher
from .routes import LINEAR_ROUTES, dequant_gemm_layout, linear_workspace_numel
from .weights import QuantWeight
from ..pdl import pdl_enter
from ..pdl import pdl_launch

DEQUANT_GEMM_ROUTES = tuple(sorted(n for n, r in LINEAR_ROUTES.items() if n.endswith("_dequant_gemm")))
__all__ = ["linear_workspace_numel", "dequant_weight", "dequant_weight_kernel"] + list(DEQUANT_GEMM_ROUTES)

_FMT_CODE = {"Q4G64_F16S": 4, "Q5G64_F16S": 5, "Q6G64_F16S": 6, "W8G32_F16S": 8}


@triton.jit
def dequant_weight_kernel(base_ptr, high_ptr, scale_ptr, w_ptr, N, K_PAD, KW_TOTAL,
                          base_row, high_row, scale_row, sw,
                          FMT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          INTERP: tl.constexpr, PDL: tl.constexpr = False):
    """W_hat[rows, k0:k0+BLOCK_K] (bf16, scale x code rounded once) into w_ptr (row stride sw)."""
    pdl_enter(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    k0 = pid_k * BLOCK_K
    tile = dequant_tile(base_ptr, high_ptr, scale_ptr, rows, rmask, k0, K_PAD, KW_TOTAL,
                        base_row, high_row, scale_row, FMT, BLOCK_N, BLOCK_K, False, INTERP)
    kk = k0 + tl.arange(0, BLOCK_K)
    m = rmask[:, None] & (kk < K_PAD)[None, :]
    tl.store(w_ptr + rows[:, None].to(tl.int64) * sw + kk[None, :], tile, mask=m)


def dequant_weight(weight: QuantWeight, w_out: torch.Tensor, *, block_n: int = 64, block_k: int = 256,
                   num_warps: int = 4) -> None:
    """Expand `weight` into the bf16 `w_out [n, k_pad]` (unit column stride; no allocation)."""
    code = _FMT_CODE[weight.format]
    lpw = 4 if code == 8 else 8
    grid = (triton.cdiv(weight.n, block_n), triton.cdiv(weight.k_pad, block_k))
    dequant_weight_kernel[grid](
        weight.words(), weight.high_words(), weight.scales(), w_out,
        weight.n, weight.k_pad, weight.k_pad // lpw,
        weight.base_row_bytes // 4, weight.high_row_bytes // 4, weight.groups_per_row, w_out.stride(0),
        FMT=code, BLOCK_N=block_n, BLOCK_K=block_k, INTERP=interpreting(), num_warps=num_warps,
        **pdl_launch(dequant_weight_kernel))


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride() \
        and a.dtype == b.dtype


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    def span(t):
        lo = t.data_ptr()
        hi = lo + ((t.shape[0] - 1) * t.stride(0) + t.shape[1]) * t.element_size()
        return lo, hi
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def launch_dequant_gemm(route_name: str, x, weight, out, *, epilogue: str = "none", residual=None,
                        workspace=None, params=None) -> None:
    route = LINEAR_ROUTES.get(route_name)
    if route is None or route_name not in DEQUANT_GEMM_ROUTES:
        raise RouteError(f"unknown dequant-GEMM linear route {route_name!r}")
    if not isinstance(weight, QuantWeight):
        raise RouteError(f"route {route.name}: weight must be a row-split QuantWeight, got "
                         f"{type(weight).__name__}")
    fmt, n, k, T, n_out, p = check_call(route, x, weight, out, epilogue, residual, params)
    need = linear_workspace_numel(route.name, T, n, k, epilogue)
    if workspace is None or workspace.dtype != torch.float32 or workspace.numel() < need \
            or not workspace.is_contiguous():
        got = "none" if workspace is None else (f"{workspace.dtype} with {workspace.numel()} elements"
                                               f"{'' if workspace.is_contiguous() else ' (not contiguous)'}")
        raise RouteError(f"route {route.name}: needs a contiguous float32 workspace of >= {need} elements "
                         f"(bf16 W_hat [{n}, {weight.k_pad}]"
                         f"{f' + swiglu scratch [{T}, {n}]' if epilogue == 'swiglu' else ''}), got {got}")
    flat = workspace.reshape(-1).view(torch.bfloat16)
    kp = weight.k_pad
    w_hat = flat[: n * kp].view(n, kp)
    dequant_weight(weight, w_hat, block_n=p["BLOCK_N"], block_k=p["BLOCK_K"], num_warps=p["num_warps"])
    wt = w_hat[:, :k].t()  # [K, N], column-major: cuBLAS reads it transposed, no copy
    if epilogue == "none":
        torch.mm(x, wt, out=out)
    elif epilogue == "residual":
        if _same_view(out, residual):
            out.addmm_(x, wt)
        elif _overlaps(out, residual):
            raise RouteError(f"route {route.name}: out partially overlaps residual (it may only alias it "
                             f"exactly)")
        else:
            torch.addmm(residual, x, wt, out=out)
    else:  # swiglu
        _, y_off, y_elems, _ = dequant_gemm_layout(T, n, k, epilogue)
        y = flat[y_off:y_off + y_elems].view(T, n)
        torch.mm(x, wt, out=y)
        block = 1024
        splitk_reduce_kernel[(triton.cdiv(T * n_out, block),)](
            y, out, out, T, n_out, out.stride(0), out.stride(0),
            SPLIT_K=1, EPI=EPI_CODES["swiglu"], BLOCK=block, INTERP=interpreting(), num_warps=4,
            **pdl_launch(splitk_reduce_kernel))
    return None


for _name in DEQUANT_GEMM_ROUTES:
    globals()[_name] = named_launcher(
        launch_dequant_gemm, _name, f"Launch route `{_name}` ({LINEAR_ROUTES[_name].doc}). workspace: float32, >= "
                                    f"linear_workspace_numel({_name!r}, T, N, K, epilogue) elements.")
