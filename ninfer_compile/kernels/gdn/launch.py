"""Launchers of the Gated DeltaNet family (preallocated outputs, no allocation, return None).

gdn_gating                a[T,Hv], b[T,Hv], a_log[Hv], dt_bias[Hv] -> g[T,Hv] f32, beta[T,Hv] f32.
gdn_gating_proj           x[T,K], a_weight/b_weight bf16[Hv,K], a_log[Hv], dt_bias[Hv] -> g, beta
                          (the a/b projections + gating in one launch); T <= GATING_PROJ_MAX_T.
gated_delta_rule_decode   recurrent step; every column its own slot (C concurrent sequences);
                          T <= DECODE_MAX_T.
gated_delta_rule_verify   verify rows: C rows of W consecutive columns of one slot each (T = C*W, W
                          = state_columns.shape[1] + 1); also writes state_columns [C, W-1, Hv, Dk,
                          Dv] f32 (the state after each of a row's first W-1 columns).
gated_delta_rule_chunked  chunked prefill of ONE sequence: all T columns belong to slot slots[0]
                          with consecutive positions from positions[0]; any T. Needs a float32
                          workspace of chunked_workspace_numel(T, Hv, Dk, Dv) elements.
A sequence whose first column has position 0 starts from a zero state.
"""

from __future__ import annotations

import math

import torch
import triton
from triton.runtime.errors import OutOfResources

from ninfer_compile.errors import RouteError

from .kernels import (gdn_chunk_prep_kernel, gdn_chunk_state_kernel, gdn_decode_kernel, gdn_gating_kernel,
                      gdn_gating_proj_kernel, gdn_verify_kernel)
from ..pdl import pdl_launch
from .routes import chunked_workspace_numel  # noqa: F401  (the route's sizing; the launcher checks it)

DECODE_MAX_T = 64
GATING_PROJ_MAX_T = 128  # no kernel limit (grid over column blocks); a verify extent has up to 8 x 9 columns
CHUNK = 64
L2_EPS = 1e-6


def _precision() -> str:
    return "tf32"


def gdn_gating(a, b, a_log, dt_bias, g, beta) -> None:
    """g[T,Hv] = -exp(a_log) * softplus(a + dt_bias); beta[T,Hv] = sigmoid(b) (both float32)."""
    T, Hv = a.shape
    if b.shape != (T, Hv) or g.shape != (T, Hv) or beta.shape != (T, Hv) or a_log.shape != (Hv,) \
            or dt_bias.shape != (Hv,):
        raise RouteError(f"gdn_gating: shapes a{tuple(a.shape)} b{tuple(b.shape)} g{tuple(g.shape)}")
    if g.dtype != torch.float32 or beta.dtype != torch.float32 or not (g.is_contiguous() and beta.is_contiguous()):
        raise RouteError("gdn_gating: g and beta must be contiguous float32")
    if a.stride(1) != 1 or b.stride(1) != 1:
        raise RouteError("gdn_gating: a and b must have a contiguous last axis")
    n = T * Hv
    block = 256
    gdn_gating_kernel[(triton.cdiv(n, block),)](
        a, b, a_log, dt_bias, g, beta, n, Hv, a.stride(0), b.stride(0), BLOCK=block, num_warps=2,
        **pdl_launch(gdn_gating_kernel),
    )


def gdn_gating_proj(x, a_weight, b_weight, a_log, dt_bias, g, beta, BLOCK_H: int = 1, BLOCK_T: int = 1, BLOCK_K: int = 2048, num_warps: int = 8) -> None:
    """g, beta [T,Hv] f32 = gdn_gating(x @ a_weight^T, x @ b_weight^T, a_log, dt_bias), one launch.

    x: [T, K] (contiguous last axis); a_weight, b_weight: bf16 [Hv, K] (contiguous last axis);
    a_log, dt_bias: [Hv] f32; g, beta: contiguous [T, Hv] f32. a / b stay fp32 (never rounded).
    Grid (cdiv(Hv, BLOCK_H), cdiv(T, BLOCK_T)); every program reduces all of K in registers.
    """
    name = "gdn_gating_proj"
    if x.dim() != 2 or a_weight.dim() != 2:
        raise RouteError(f"{name}: x{tuple(x.shape)} and a_weight{tuple(a_weight.shape)} must be 2-D")
    T, K = x.shape
    Hv = a_weight.shape[0]
    if not 1 <= T <= GATING_PROJ_MAX_T:
        raise RouteError(f"{name}: T={T} outside the route domain [1, {GATING_PROJ_MAX_T}]")
    if a_weight.shape != (Hv, K) or b_weight.shape != (Hv, K) or a_log.shape != (Hv,) \
            or dt_bias.shape != (Hv,) or g.shape != (T, Hv) or beta.shape != (T, Hv) or K < 1:
        raise RouteError(f"{name}: shapes x{tuple(x.shape)} a_weight{tuple(a_weight.shape)} "
                         f"b_weight{tuple(b_weight.shape)} a_log{tuple(a_log.shape)} dt_bias{tuple(dt_bias.shape)} "
                         f"g{tuple(g.shape)} beta{tuple(beta.shape)}")
    if a_weight.dtype != torch.bfloat16 or b_weight.dtype != torch.bfloat16:
        raise RouteError(f"{name}: a_weight / b_weight must be bf16, got {a_weight.dtype} / {b_weight.dtype}")
    if g.dtype != torch.float32 or beta.dtype != torch.float32 or not (g.is_contiguous() and beta.is_contiguous()):
        raise RouteError(f"{name}: g and beta must be contiguous float32")
    if x.stride(1) != 1 or a_weight.stride(1) != 1 or b_weight.stride(1) != 1:
        raise RouteError(f"{name}: x, a_weight and b_weight must have a contiguous last axis")
    if not (a_log.is_contiguous() and dt_bias.is_contiguous()):
        raise RouteError(f"{name}: a_log and dt_bias must be contiguous")
    grid = (triton.cdiv(Hv, BLOCK_H), triton.cdiv(T, BLOCK_T))
    gdn_gating_proj_kernel[grid](
        x, a_weight, b_weight, a_log, dt_bias, g, beta, T, Hv, K,
        x.stride(0), a_weight.stride(0), b_weight.stride(0),
        BLOCK_T=BLOCK_T, BLOCK_H=BLOCK_H, BLOCK_K=BLOCK_K, num_warps=num_warps,
        **pdl_launch(gdn_gating_proj_kernel),
    )


def check_scale_eps(name: str, Dk: int, scale, l2_eps) -> tuple[float, float]:
    """The launcher's `scale` (None = 1/sqrt(Dk)) and `l2_eps` as the kernels take them; a value
    the kernels cannot honour (not a finite number, scale <= 0, eps < 0) is a RouteError."""
    s = 1.0 / math.sqrt(Dk) if scale is None else scale
    for n_, v_ in (("scale", s), ("l2_eps", l2_eps)):
        if isinstance(v_, bool) or not isinstance(v_, (int, float)) or not math.isfinite(v_):
            raise RouteError(f"{name}: {n_}={v_!r} must be a finite number")
    if s <= 0 or l2_eps < 0:
        raise RouteError(f"{name}: scale={s!r} must be > 0 and l2_eps={l2_eps!r} >= 0")
    return float(s), float(l2_eps)


def _check_core(name, q, k, v, g, beta, state, positions, slots, out):
    T, Hk, Dk = q.shape
    Hv, Dv = v.shape[1], v.shape[2]
    if k.shape != q.shape or v.shape[0] != T or Hv % Hk:
        raise RouteError(f"{name}: shapes q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)} (Hv must be a multiple of Hk)")
    if g.shape != (T, Hv) or beta.shape != (T, Hv) or not (g.is_contiguous() and beta.is_contiguous()):
        raise RouteError(f"{name}: g and beta must be contiguous [T={T}, Hv={Hv}] float32")
    if state.dim() != 4 or state.shape[1:] != (Hv, Dk, Dv) or state.dtype != torch.float32 \
            or state.stride(3) != 1 or state.stride(2) != Dv:
        raise RouteError(f"{name}: state must be float32 [slots, {Hv}, {Dk}, {Dv}] with contiguous [Dk, Dv] blocks")
    if out.shape != (T, Hv, Dv) or positions.shape != (T,) or slots.shape != (T,):
        raise RouteError(f"{name}: out must be [T, Hv, Dv] and positions/slots [T] int32")
    for n_, t_ in (("q", q), ("k", k), ("v", v), ("out", out)):
        if t_.stride(2) != 1:
            raise RouteError(f"{name}: operand {n_} must have a contiguous last axis")
    if not (16 <= Dk <= 256 and 1 <= Dv <= 256):
        raise RouteError(f"{name}: head dims Dk={Dk} Dv={Dv} outside [16, 256]")
    return T, Hk, Dk, Hv, Dv


def refuse_columns(name: str, columns, operand: str = "state_columns") -> None:
    """A plain (window 0) route writes no per-column states: the optional verify output must be absent."""
    if columns is not None:
        raise RouteError(f"{name}: writes no {operand} (a verify op, window >= 2, takes route gdn_recurrent_verify)")


def gated_delta_rule_decode(q, k, v, g, beta, state, positions, slots, out, scale: float | None = None,
                            l2_eps: float = L2_EPS, block_v: int | None = None, num_warps: int = 4,
                            state_columns=None) -> None:
    """One recurrent step per column; columns must use distinct slots.

    q, k: [T, Hk, Dk] (raw conv outputs; L2 norm fused), v: [T, Hv, Dv], g, beta: [T, Hv] f32,
    state: [slots, Hv, Dk, Dv] f32 (updated in place), out: [T, Hv, Dv]; q is scaled by `scale`
    (None = 1/sqrt(Dk)) after its L2 norm, q and k are L2-normalised with epsilon `l2_eps`.
    """
    refuse_columns("gated_delta_rule_decode", state_columns)
    T, Hk, Dk, Hv, Dv = _check_core("gated_delta_rule_decode", q, k, v, g, beta, state, positions, slots, out)
    scale, l2_eps = check_scale_eps("gated_delta_rule_decode", Dk, scale, l2_eps)
    if not 1 <= T <= DECODE_MAX_T:
        raise RouteError(f"gated_delta_rule_decode: T={T} outside the route domain [1, {DECODE_MAX_T}]")
    bk = max(16, triton.next_power_of_2(Dk))
    bv = block_v or min(32, triton.next_power_of_2(Dv))
    grid = (T, Hv, triton.cdiv(Dv, bv))
    gdn_decode_kernel[grid](
        q, k, v, g, beta, state, out, positions, slots,
        Hv, Hv // Hk, Dk, Dv, scale, l2_eps,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        state.stride(0), state.stride(1), out.stride(0), out.stride(1),
        BK=bk, BV=bv, num_warps=num_warps,
        **pdl_launch(gdn_decode_kernel),
    )


def gated_delta_rule_verify(q, k, v, g, beta, state, positions, slots, out, state_columns=None,
                            scale: float | None = None, l2_eps: float = L2_EPS, block_v: int | None = None,
                            num_warps: int = 4) -> None:
    """Verify rows: row r = columns r*W .. r*W + W-1 (slot slots[r*W], consecutive positions).

    Operands as gated_delta_rule_decode, plus state_columns: float32 [C, W-1, Hv, Dk, Dv] (T = C*W)
    with contiguous [Dk, Dv] blocks; entry [r, j] = the row's state after its column j. `state`
    ends as each row's state after its last column. Rows must use distinct slots. T may cover fewer
    rows than state_columns holds (T // W rows run; the rest of the buffer is left as it is).
    """
    name = "gated_delta_rule_verify"
    T, Hk, Dk, Hv, Dv = _check_core(name, q, k, v, g, beta, state, positions, slots, out)
    scale, l2_eps = check_scale_eps(name, Dk, scale, l2_eps)
    cols = state_columns
    if cols is None or cols.dim() != 5:
        raise RouteError(f"{name}: needs state_columns [C, W-1, {Hv}, {Dk}, {Dv}] float32 (a verify op, window >= 2)")
    W = cols.shape[1] + 1
    C = T // W  # rows run (the runtime may narrow the columns to the first rows; the buffer keeps its C)
    if W < 2 or C * W != T or C > cols.shape[0] or cols.shape[2:] != (Hv, Dk, Dv) or cols.dtype != torch.float32 \
            or cols.stride(4) != 1 or cols.stride(3) != Dv:
        raise RouteError(f"{name}: state_columns{tuple(cols.shape)} must be float32 [C, W-1, {Hv}, {Dk}, {Dv}] "
                         f"with T={T} = C*W (or fewer whole rows) and contiguous [Dk, Dv] blocks")
    bk = max(16, triton.next_power_of_2(Dk))
    bv = block_v or min(32, triton.next_power_of_2(Dv))
    grid = (C, Hv, triton.cdiv(Dv, bv))
    gdn_verify_kernel[grid](
        q, k, v, g, beta, state, out, positions, slots, cols,
        Hv, Hv // Hk, Dk, Dv, scale, l2_eps,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        state.stride(0), state.stride(1), out.stride(0), out.stride(1),
        cols.stride(0), cols.stride(1), cols.stride(2),
        W=W, WP=triton.next_power_of_2(W), BK=bk, BV=bv, num_warps=num_warps,
        **pdl_launch(gdn_verify_kernel),
    )


def gated_delta_rule_chunked(q, k, v, g, beta, state, positions, slots, out, workspace,
                             scale: float | None = None, l2_eps: float = L2_EPS,
                             block_v: int | None = None, chunk: int = CHUNK, state_columns=None) -> None:
    """Chunked (chunk 64, UT transform) prefill of one sequence (slot slots[0]), any T.

    Operands as gated_delta_rule_decode; workspace: float32 with >= chunked_workspace_numel(...)
    elements (contents are scratch).
    """
    refuse_columns("gated_delta_rule_chunked", state_columns)
    T, Hk, Dk, Hv, Dv = _check_core("gated_delta_rule_chunked", q, k, v, g, beta, state, positions, slots, out)
    scale, l2_eps = check_scale_eps("gated_delta_rule_chunked", Dk, scale, l2_eps)
    need = chunked_workspace_numel(T, Hv, Dk, Dv)
    if workspace.dtype != torch.float32 or workspace.numel() < need or not workspace.is_contiguous():
        raise RouteError(f"gated_delta_rule_chunked: workspace must be contiguous float32 with >= {need} elements")
    flat = workspace.view(-1)
    w_ws = flat[: T * Hv * Dk]
    u_ws = flat[T * Hv * Dk: T * Hv * (Dk + Dv)]
    gc_ws = flat[T * Hv * (Dk + Dv): need]
    bk = max(16, triton.next_power_of_2(Dk))
    bvf = max(16, triton.next_power_of_2(Dv))
    bv = max(16, block_v or min(32, bvf))
    chunk = _CHUNK_FOR.get((Dk, Dv, bv), chunk)
    while True:
        bt = chunk if T > chunk // 2 else max(16, triton.next_power_of_2(T))
        try:
            _chunked_launch(q, k, v, g, beta, state, positions, slots, out, w_ws, u_ws, gc_ws,
                            T, Hk, Dk, Hv, Dv, bt, bk, bvf, bv, scale, l2_eps)
            return
        except OutOfResources:
            # Shared memory of the chunk tiles exceeded on this device: halve the chunk (once per
            # head-dim combination; the state passing is exact for any chunk size).
            if chunk <= 16:
                raise
            chunk //= 2
            _CHUNK_FOR[(Dk, Dv, bv)] = chunk


_CHUNK_FOR: dict[tuple[int, int, int], int] = {}


def _chunked_launch(q, k, v, g, beta, state, positions, slots, o, w_ws, u_ws, gc_ws,
                    T, Hk, Dk, Hv, Dv, bt, bk, bvf, bv, scale, l2_eps) -> None:
    prec = _precision()
    gdn_chunk_prep_kernel[(triton.cdiv(T, bt), Hv)](
        k, v, g, beta, w_ws, u_ws, gc_ws,
        T, Hv, Hv // Hk, Dk, Dv, l2_eps,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        BT=bt, BK=bk, BVF=bvf, PRECISION=prec, num_warps=4, num_stages=1,
        **pdl_launch(gdn_chunk_prep_kernel),
    )
    gdn_chunk_state_kernel[(Hv, triton.cdiv(Dv, bv))](
        q, k, w_ws, u_ws, gc_ws, state, o, positions, slots,
        T, Hv, Hv // Hk, Dk, Dv, scale, l2_eps,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        state.stride(0), state.stride(1), o.stride(0), o.stride(1),
        BT=bt, BK=bk, BV=bv, PRECISION=prec, num_warps=4,
        num_stages=1,  # pipelined [64, Dk] fp32 chunk loads overflow shared memory at Dk = 128
        **pdl_launch(gdn_chunk_state_kernel),
    )
