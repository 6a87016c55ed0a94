"""Launchers of the MoE routes (preallocated operands; nothing allocated; return None).

    moe_router_split(x, weight, expert_ids, expert_weights, shared_gate, top_k, BLOCK_R, BLOCK_K, num_warps,
        workspace)
    moe_experts_gemv / moe_experts_grouped_gemm(x, expert_ids, expert_weights, gate_up, down, shared,
        shared_gate, residual, out, <params>, workspace)

Why the expert routes group the (token, slot) pairs by expert first. At T columns a step touches
up to min(k*T, E) distinct experts, a number known only when the router has run (inside a captured
CUDA graph: after the grid is fixed). A grid over (token, slot) pairs would read an expert's rows
once per token that chose it; a grid over the E experts would launch E programs at T = 1. So the
grid is sized for the worst case of the route's T (`tile_slots`: min(E, P) + P // BLOCK_T tiles for
P = k*T pairs), the grouping kernel writes how many tiles this step really has, and every tile slot
past that exits on its first instructions: the weight bytes read, the dominant decode cost, grow
with the experts actually hit, each hit expert's rows read once per tile of up to BLOCK_T pairs
(decode: BLOCK_T = next_pow2(T) >= the pairs of any expert, since a token picks an expert once, so
exactly one tile per hit expert). The decode route multiplies with broadcast FMAs, the prefill
route (the grouped GEMM) with `tl.dot` on BLOCK_T x BLOCK_N tiles. The per-pair outputs go through
the fp32 workspace and each token's slots are summed in slot order (`moe_combine_kernel`, or with
the decode route's COMBINE fused the last down program to arrive at each h-block): the same bits
every run. Launches per step: group, gate/up, down, combine; the decode route drops the combine
(COMBINE fused) and at T = 1, where a token never picks an expert twice, the grouping (GROUP
false: tile g is pair g).

Workspace (fp32 elements, `moe_experts_workspace`): [offsets E+1 | tile_end E | sorted pairs P]
(int32 views) then act [P, I] and y [P, H] (fp32).
"""

from __future__ import annotations

import torch
import triton

from ...errors import RouteError
from ..interpret import interpreting
from ..linear.weights import QuantWeight, as_linear_weight
from ..pdl import pdl_launch
from ..linear.epilogue import FIXUP_COUNTERS, fixup_counters
from .kernels import (moe_combine_kernel, moe_down_kernel, moe_gate_up_kernel, moe_group_kernel,
                      moe_router_split_kernel)
from .routes import workspace_layout

__all__ = ["moe_router_split", "moe_experts_gemv", "moe_experts_grouped_gemm", "tile_slots"]

_FMT_CODE = {"Q4G64_F16S": 4, "Q5G64_F16S": 5, "Q6G64_F16S": 6, "W8G32_F16S": 8, "BF16": 16}
_GROUP_CHUNK = 64


def _weight_args(weight):
    """(base, high, scale, base_row, high_row, scale_row, kw_total, k_loop, FMT) of a linear weight."""
    fmt, n, k = as_linear_weight(weight)
    code = _FMT_CODE[fmt]
    if isinstance(weight, QuantWeight):
        lpw = 4 if code == 8 else 8
        return (weight.words(), weight.high_words(), weight.scales(), weight.base_row_bytes // 4,
                weight.high_row_bytes // 4, weight.groups_per_row, weight.k_pad // lpw, weight.k_pad, code)
    return weight, weight, weight, weight.stride(0), 0, 0, triton.cdiv(k, 8), k, code


def _need(name: str, t: torch.Tensor, shape, dtype) -> None:
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype or t.stride(-1) != 1:
        raise RouteError(f"moe: {name} must be {dtype} {list(shape)} with a contiguous last axis, got "
                         f"{t.dtype} {list(t.shape)} strides {list(t.stride())}")


def _router_operands(name, x, weight, expert_ids, expert_weights, shared_gate, top_k):
    """(T, E, H) after checking the router's operands."""
    fmt, n, k = as_linear_weight(weight)
    T, E = x.shape[0], n - 1
    if x.dim() != 2 or x.shape[1] != k or not 1 <= top_k <= E:
        raise RouteError(f"{name}: x {list(x.shape)}, weight [{n}, {k}], top_k {top_k}: need x [T, {k}] "
                         f"and 1 <= top_k <= {E}")
    _need("expert_ids", expert_ids, (T, top_k), torch.int32)
    _need("expert_weights", expert_weights, (T, top_k), torch.float32)
    _need("shared_gate", shared_gate, (T,), torch.float32)
    return T, E, k


def moe_router_split(x, weight, expert_ids, expert_weights, shared_gate, top_k, BLOCK_R=16, BLOCK_K=128,
                     num_warps=4, workspace=None) -> None:
    """Router logits (rows 0..E-1), shared gate (row E), softmax, top-k, renormalise, in one launch
    over (cdiv(E+1, BLOCK_R) row blocks, cdiv(T, 16) token blocks); the last row block to finish a
    token block routes it. Workspace: fp32 logits [T, E+1]."""
    T, E, k = _router_operands("moe_router_split", x, weight, expert_ids, expert_weights, shared_gate, top_k)
    need = T * (E + 1)
    if workspace is None or workspace.dtype != torch.float32 or not workspace.is_contiguous() \
            or workspace.numel() < need:
        got = "none" if workspace is None else f"{workspace.dtype} with {workspace.numel()} elements"
        raise RouteError(f"moe_router_split: needs a contiguous float32 workspace of >= {need} elements, got {got}")
    if T > 1 and BLOCK_R < 16:
        raise RouteError(f"moe_router_split: T={T} multiplies with tl.dot, which needs BLOCK_R >= 16, got {BLOCK_R}")
    block_t = 1 if T == 1 else 16
    token_blocks = triton.cdiv(T, block_t)
    if token_blocks > FIXUP_COUNTERS:
        raise RouteError(f"moe_router_split: T={T} needs {token_blocks} arrival counters, more than {FIXUP_COUNTERS}")
    base, high, scale, br, hr, sr, kw, k_loop, code = _weight_args(weight)
    moe_router_split_kernel[(triton.cdiv(E + 1, BLOCK_R), token_blocks)](
        x, base, high, scale, workspace, fixup_counters(x), expert_ids, expert_weights, shared_gate, T, E, k, kw,
        k_loop, br, hr, sr, x.stride(0), TOP_K=int(top_k), FMT=code, BLOCK_T=block_t, BLOCK_R=BLOCK_R,
        BLOCK_K=BLOCK_K, BLOCK_E=triton.next_power_of_2(E + 1), BLOCK_TOPK=triton.next_power_of_2(int(top_k)),
        DOT_F32=interpreting(), INTERP=interpreting(), num_warps=num_warps, **pdl_launch(moe_router_split_kernel))


def tile_slots(E: int, pairs: int, block_t: int) -> int:
    """Tile slots the expert grids launch: the most tiles P pairs over E experts can make."""
    return min(E, pairs) + pairs // block_t


def _experts(name, x, expert_ids, expert_weights, gate_up, down, shared, shared_gate, residual, out,
             workspace, block_t, block_n, block_k, num_warps, use_dot, grouped=True, fused_combine=False) -> None:
    _, n_gu, H = as_linear_weight(gate_up)
    _, n_d, I = as_linear_weight(down)
    if H < 1 or n_d % H or n_gu % (2 * I) or n_gu // (2 * I) != n_d // H:
        raise RouteError(f"{name}: gate_up [{n_gu}, {H}] and down [{n_d}, {I}] are not E expert banks")
    E = n_d // H
    T, top_k = expert_ids.shape
    for nm, t in (("x", x), ("shared", shared), ("residual", residual), ("out", out)):
        _need(nm, t, (T, H), torch.bfloat16)
    _need("expert_ids", expert_ids, (T, top_k), torch.int32)
    _need("expert_weights", expert_weights, (T, top_k), torch.float32)
    _need("shared_gate", shared_gate, (T,), torch.float32)
    P = T * top_k
    lay = workspace_layout(E, I, H, P)
    if workspace is None or workspace.dtype != torch.float32 or not workspace.is_contiguous() \
            or workspace.numel() < lay["total"]:
        got = "none" if workspace is None else f"{workspace.dtype} with {workspace.numel()} elements"
        raise RouteError(f"{name}: needs a contiguous float32 workspace of >= {lay['total']} elements, got {got}")
    flat = workspace.reshape(-1)
    ints = flat.view(torch.int32)
    offsets = ints[lay["offsets"]:lay["offsets"] + E + 1]
    tile_end = ints[lay["tile_end"]:lay["tile_end"] + E]
    order = ints[lay["sorted"]:lay["sorted"] + P]
    act = flat[lay["act"]:lay["act"] + P * I]
    y = flat[lay["y"]:lay["y"] + P * H]
    block_e = triton.next_power_of_2(E)
    interp = interpreting()
    if grouped:
        moe_group_kernel[(1,)](expert_ids, offsets, tile_end, order, P, E, BLOCK_T=block_t, BLOCK_E=block_e,
                               CHUNK=_GROUP_CHUNK, num_warps=4, **pdl_launch(moe_group_kernel))
        slots = tile_slots(E, P, block_t)
    else:
        block_t, slots = 1, P
    common = dict(FMT=0, BLOCK_T=block_t, BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_E=block_e, USE_DOT=use_dot,
                  DOT_F32=interp, GROUPED=grouped, INTERP=interp, num_warps=num_warps)
    b, hi, s, br, hr, sr, kw, k_loop, code = _weight_args(gate_up)
    moe_gate_up_kernel[(slots, triton.cdiv(I, block_n))](
        x, expert_ids, b, hi, s, act, tile_end, offsets, order, E, P, top_k, I, H, k_loop, kw, br, hr, sr,
        x.stride(0), **{**common, "FMT": code}, **pdl_launch(moe_gate_up_kernel))
    b, hi, s, br, hr, sr, kw, k_loop, code = _weight_args(down)
    h_blocks = triton.cdiv(H, block_n)
    if fused_combine and h_blocks > FIXUP_COUNTERS:
        raise RouteError(f"{name}: COMBINE fused needs {h_blocks} arrival counters, more than {FIXUP_COUNTERS}")
    moe_down_kernel[(slots, h_blocks)](
        act, expert_ids, b, hi, s, y, tile_end, offsets, order, expert_weights, shared, shared_gate, residual, out,
        fixup_counters(x), E, P, T, top_k, I, H, k_loop, kw, br, hr, sr, shared.stride(0), residual.stride(0),
        out.stride(0), **{**common, "FMT": code}, FUSED_COMBINE=fused_combine,
        BLOCK_TT=triton.next_power_of_2(T), BLOCK_TOPK=triton.next_power_of_2(top_k), **pdl_launch(moe_down_kernel))
    if fused_combine:
        return
    block_h = min(1024, triton.next_power_of_2(H))
    moe_combine_kernel[(T, triton.cdiv(H, block_h))](
        y, expert_weights, shared, shared_gate, residual, out, top_k, H, shared.stride(0), residual.stride(0),
        out.stride(0), BLOCK_H=block_h, num_warps=4, **pdl_launch(moe_combine_kernel))


def moe_experts_gemv(x, expert_ids, expert_weights, gate_up, down, shared, shared_gate, residual, out,
                     BLOCK_N=32, BLOCK_K=64, GROUP=True, COMBINE="kernel", num_warps=4, workspace=None) -> None:
    """Decode (T <= 16), broadcast-FMA products. GROUP: one tile per hit expert (BLOCK_T =
    next_pow2(T); a grouping launch first), else one tile per (token, slot) pair with no grouping
    launch (T = 1 has no expert twice). COMBINE "fused": the down launch's last arrivals sum each
    token's slots (no combine launch); "kernel": a combine launch."""
    T = x.shape[0]
    if T > 16:
        raise RouteError(f"moe_experts_gemv: T={T} columns is outside its domain T in [1, 16]")
    if COMBINE not in ("kernel", "fused"):
        raise RouteError(f"moe_experts_gemv: COMBINE must be 'kernel' or 'fused', got {COMBINE!r}")
    _experts("moe_experts_gemv", x, expert_ids, expert_weights, gate_up, down, shared, shared_gate, residual,
             out, workspace, triton.next_power_of_2(T), BLOCK_N, BLOCK_K, num_warps, False, bool(GROUP),
             COMBINE == "fused")


def moe_experts_grouped_gemm(x, expert_ids, expert_weights, gate_up, down, shared, shared_gate, residual, out,
                             BLOCK_T=16, BLOCK_N=64, BLOCK_K=64, num_warps=4, workspace=None) -> None:
    """Prefill: tokens grouped by expert, tiles of BLOCK_T pairs x BLOCK_N rows, tl.dot products."""
    _experts("moe_experts_grouped_gemm", x, expert_ids, expert_weights, gate_up, down, shared, shared_gate,
             residual, out, workspace, BLOCK_T, BLOCK_N, BLOCK_K, num_warps, True)
