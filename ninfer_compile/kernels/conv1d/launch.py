"""Launchers of the conv1d family (preallocated outputs, no allocation, return None).

conv1d_decode: every column is its own slot (C concurrent sequences, one column each); output and
state roll in one kernel. conv1d_prefill: any T; columns of a slot form one contiguous run with
consecutive positions (several sequences may share a launch); two kernels (output, then state).
conv1d_verify: verify rows (T = C*W; row r = columns r*W .. r*W+W-1 of one slot, W =
conv_state_columns.shape[1] + 1); outputs, conv_state_columns [C, W-1, K-1, C_ch] (the row's last
K-1 inputs after each of its first W-1 columns) and the final state in one kernel.
"""

from __future__ import annotations

import torch
import triton

from ninfer_compile.errors import RouteError

from .kernels import conv1d_kernel, conv1d_state_kernel, conv1d_verify_kernel
from ..pdl import pdl_launch

DECODE_MAX_T = 64
BLOCK_C = 256
ACTIVATIONS = ("silu", "none")  # the kernel's SILU constexpr: SiLU(conv) or the plain conv


def refuse_columns(name: str, columns, operand: str = "conv_state_columns") -> None:
    """A plain (window 0) route writes no per-column states: the optional verify output must be absent."""
    if columns is not None:
        raise RouteError(f"{name}: writes no {operand} (a verify op, window >= 2, takes route conv1d_verify)")


def _silu(name: str, activation) -> bool:
    if activation not in ACTIVATIONS:
        raise RouteError(f"{name}: activation {activation!r} is not supported (supported: {', '.join(ACTIVATIONS)})")
    return activation == "silu"


def _parts(name, x, x0, x1, x2):
    """The input as (x, x1, x2, C0, C01, PARTS): one [T, C] tensor, or up to three [T, C_i] channel
    ranges x0 | x1 | x2 (each with its own row stride; C0 = x0's width, C01 = C0 + x1's width).
    The unused pointers repeat the first part (never read)."""
    if x is not None:
        if x0 is not None:
            raise RouteError(f"{name}: pass x or its parts x0, x1, x2, not both")
        return x, x, x, x.shape[1], x.shape[1], 1, x.shape
    parts = [t for t in (x0, x1, x2) if t is not None]
    if x0 is None or (x2 is not None and x1 is None):
        raise RouteError(f"{name}: no input (x, or parts x0[, x1[, x2]])")
    if any(t.dim() != 2 or t.shape[0] != x0.shape[0] for t in parts):
        raise RouteError(f"{name}: input parts must be [T, C_i] with one T: {[tuple(t.shape) for t in parts]}")
    widths = [t.shape[1] for t in parts]
    c0 = widths[0]
    c01 = c0 + (widths[1] if len(parts) > 1 else 0)
    a, b = (parts + [x0, x0])[1:3]
    return x0, a, b, c0, c01, len(parts), (x0.shape[0], sum(widths))


def _check(name, shape, parts, weight, conv_state, out, positions, slots):
    T, C = shape
    K = weight.shape[0]
    if weight.shape != (K, C) or conv_state.shape[1:] != (K - 1, C) or out.shape != (T, C):
        raise RouteError(
            f"{name}: shapes x{tuple(shape)} weight{tuple(weight.shape)} "
            f"conv_state{tuple(conv_state.shape)} out{tuple(out.shape)}"
        )
    if K < 2:
        raise RouteError(f"{name}: kernel width {K} must be >= 2")
    if positions.shape != (T,) or slots.shape != (T,):
        raise RouteError(f"{name}: positions/slots must be [T={T}] int32")
    for n, t in (*parts, ("out", out), ("weight", weight), ("conv_state", conv_state)):
        if t.stride(-1) != 1:
            raise RouteError(f"{name}: operand {n} must have a contiguous last axis")
    if weight.stride(0) != C:
        raise RouteError(f"{name}: weight must be contiguous [K, C]")
    return T, C, K


def _inputs(name, x, x0, x1, x2, weight, conv_state, out, positions, slots):
    missing = [n for n, t in (("weight", weight), ("conv_state", conv_state), ("positions", positions),
                              ("slots", slots), ("out", out)) if t is None]
    if missing:  # every operand but the input has a default only so that x may come as parts
        raise RouteError(f"{name}: missing operand(s) {', '.join(missing)}")
    x, a, b, c0, c01, n, shape = _parts(name, x, x0, x1, x2)
    named = [("x" if n == 1 else "x0", x)] + [(f"x{i}", t) for i, t in ((1, x1), (2, x2)) if n > 1 and t is not None]
    T, C, K = _check(name, shape, named, weight, conv_state, out, positions, slots)
    # the x-pointer arguments shared by both kernels: (x, x1, x2 + their row strides, C0, C01) and PARTS
    return T, C, K, (x, a, b), (x.stride(0), a.stride(0), b.stride(0), c0, c01), n


def conv1d_decode(
    x: torch.Tensor | None = None, weight: torch.Tensor = None, conv_state: torch.Tensor = None,
    positions: torch.Tensor = None, slots: torch.Tensor = None, out: torch.Tensor = None,
    x0: torch.Tensor | None = None, x1: torch.Tensor | None = None, x2: torch.Tensor | None = None,
    activation: str = "silu", conv_state_columns: torch.Tensor | None = None,
) -> None:
    """x[T,C] (T distinct slots; or its channel ranges x0 | x1 | x2), weight[K,C],
    conv_state[slots,K-1,C] (rolled in place) -> out[T,C] = activation(conv) (silu | none)."""
    refuse_columns("conv1d_decode", conv_state_columns, "conv_state_columns")
    silu = _silu("conv1d_decode", activation)
    T, C, K, (xa, xb, xc), (sa, sb, sc, c0, c01), parts = _inputs(
        "conv1d_decode", x, x0, x1, x2, weight, conv_state, out, positions, slots)
    if not 1 <= T <= DECODE_MAX_T:
        raise RouteError(f"conv1d_decode: T={T} outside the route domain [1, {DECODE_MAX_T}]")
    grid = (T, triton.cdiv(C, BLOCK_C))
    conv1d_kernel[grid](
        xa, weight, conv_state, out, positions, slots,
        C, sa, out.stride(0), conv_state.stride(0), conv_state.stride(1), xb, sb, xc, sc, c0, c01,
        K=K, KP=triton.next_power_of_2(K), BLOCK_C=BLOCK_C, FUSE_STATE=True, PARTS=parts, SILU=silu, num_warps=2,
        **pdl_launch(conv1d_kernel),
    )


def conv1d_prefill(
    x: torch.Tensor | None = None, weight: torch.Tensor = None, conv_state: torch.Tensor = None,
    positions: torch.Tensor = None, slots: torch.Tensor = None, out: torch.Tensor = None,
    x0: torch.Tensor | None = None, x1: torch.Tensor | None = None, x2: torch.Tensor | None = None,
    activation: str = "silu", conv_state_columns: torch.Tensor | None = None,
) -> None:
    """x[T,C] (contiguous per-slot runs; or its channel ranges x0 | x1 | x2), weight[K,C],
    conv_state[slots,K-1,C] (updated) -> out[T,C] = activation(conv) (silu | none)."""
    refuse_columns("conv1d_prefill", conv_state_columns, "conv_state_columns")
    silu = _silu("conv1d_prefill", activation)
    T, C, K, (xa, xb, xc), (sa, sb, sc, c0, c01), parts = _inputs(
        "conv1d_prefill", x, x0, x1, x2, weight, conv_state, out, positions, slots)
    grid = (T, triton.cdiv(C, BLOCK_C))
    kp = triton.next_power_of_2(K)
    conv1d_kernel[grid](
        xa, weight, conv_state, out, positions, slots,
        C, sa, out.stride(0), conv_state.stride(0), conv_state.stride(1), xb, sb, xc, sc, c0, c01,
        K=K, KP=kp, BLOCK_C=BLOCK_C, FUSE_STATE=False, PARTS=parts, SILU=silu, num_warps=2,
        **pdl_launch(conv1d_kernel),
    )
    conv1d_state_kernel[grid](
        xa, conv_state, positions, slots, T, C, sa, conv_state.stride(0), conv_state.stride(1),
        xb, sb, xc, sc, c0, c01,
        K=K, KP=kp, BLOCK_C=BLOCK_C, PARTS=parts, num_warps=2,
        **pdl_launch(conv1d_state_kernel),
    )


def conv1d_verify(
    x: torch.Tensor | None = None, weight: torch.Tensor = None, conv_state: torch.Tensor = None,
    positions: torch.Tensor = None, slots: torch.Tensor = None, out: torch.Tensor = None,
    conv_state_columns: torch.Tensor = None,
    x0: torch.Tensor | None = None, x1: torch.Tensor | None = None, x2: torch.Tensor | None = None,
    activation: str = "silu", block_c: int = BLOCK_C, num_warps: int = 2,
) -> None:
    """x[T,C] (or its channel ranges x0 | x1 | x2), weight[K,C], conv_state[slots,K-1,C] (updated to
    each row's state after its last column), conv_state_columns [R, W-1, K-1, C] (same dtype as the
    state; T = R*W) -> out[T,C] = activation(conv) (silu | none). Rows must use distinct slots."""
    name = "conv1d_verify"
    silu = _silu(name, activation)
    T, C, K, (xa, xb, xc), (sa, sb, sc, c0, c01), parts = _inputs(
        name, x, x0, x1, x2, weight, conv_state, out, positions, slots)
    cols = conv_state_columns
    if cols is None or cols.dim() != 4:
        raise RouteError(f"{name}: needs conv_state_columns [R, W-1, {K - 1}, {C}] (a verify op, window >= 2)")
    W = cols.shape[1] + 1
    R = T // W  # rows run (the runtime may narrow the columns to the first rows; the buffer keeps its R)
    if W < 2 or R * W != T or R > cols.shape[0] or cols.shape[2:] != (K - 1, C) or cols.stride(3) != 1:
        raise RouteError(f"{name}: conv_state_columns{tuple(cols.shape)} must be [R, W-1, {K - 1}, {C}] with "
                         f"T={T} = R*W (or fewer whole rows) and a contiguous last axis")
    if cols.dtype != conv_state.dtype:
        raise RouteError(f"{name}: conv_state_columns dtype {cols.dtype} != conv_state dtype {conv_state.dtype}")
    grid = (R, triton.cdiv(C, block_c))
    conv1d_verify_kernel[grid](
        xa, weight, conv_state, out, positions, slots, cols,
        C, sa, out.stride(0), conv_state.stride(0), conv_state.stride(1),
        cols.stride(0), cols.stride(1), cols.stride(2), xb, sb, xc, sc, c0, c01,
        W=W, K=K, KP=triton.next_power_of_2(K), EP=triton.next_power_of_2(K - 1 + W), BLOCK_C=block_c, PARTS=parts, SILU=silu, num_warps=num_warps,
        **pdl_launch(conv1d_verify_kernel),
    )
