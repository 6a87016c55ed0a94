"""Launcher of route gdn_decode_fused_keyhead (preallocated outputs, no allocation, return None).

gdn_decode_fused: x [T, C] (or its channel ranges x0 | x1 | x2: the q, k, v projection columns read
in place), conv_weight [K, C], conv_state [slots, K-1, C] (rolled in place), g / beta [T, Hv] f32,
state [slots, Hv, Dk, Dv] f32 (updated in place), positions / slots [T] (decode: every column its
own slot), z [T, Hv, Dv], norm_weight [Dv] -> out [T, Hv*Dv] = gated_rmsnorm(delta_rule(conv(x))).
One launch, grid (T, Hk) (kernels_fused.py says why one program per key head).
"""

from __future__ import annotations

import torch
import triton

from ninfer_compile.errors import RouteError

from .kernels_fused import gdn_fused_decode_kernel
from .launch import L2_EPS, check_scale_eps
from ..pdl import pdl_launch

DECODE_MAX_T = 64
NAME = "gdn_decode_fused"


def _segments(x, x0, x1, x2, widths):
    """The q, k, v channel ranges as [T, w] views of x or of the parts x0 | x1 | x2 (a range must lie
    inside one part); views only, nothing is allocated on the device."""
    if x is not None:
        if x0 is not None:
            raise RouteError(f"{NAME}: pass x or its parts x0, x1, x2, not both")
        parts = [x]
    else:
        if x0 is None or (x2 is not None and x1 is None):
            raise RouteError(f"{NAME}: no input (x, or parts x0[, x1[, x2]])")
        parts = [p for p in (x0, x1, x2) if p is not None]
    if any(p.dim() != 2 or p.shape[0] != parts[0].shape[0] or p.stride(1) != 1 for p in parts):
        raise RouteError(f"{NAME}: input parts must be [T, C_i] with one T and a contiguous last axis: "
                         f"{[tuple(p.shape) for p in parts]}")
    if sum(p.shape[1] for p in parts) != sum(widths):
        raise RouteError(f"{NAME}: conv input width {sum(p.shape[1] for p in parts)} != "
                         f"2 * Hk * Dk + Hv * Dv = {sum(widths)}")
    out, c0, pi, pstart = [], 0, 0, 0
    for w in widths:
        while c0 >= pstart + parts[pi].shape[1]:
            pstart += parts[pi].shape[1]
            pi += 1
        if c0 + w > pstart + parts[pi].shape[1]:
            raise RouteError(f"{NAME}: the q / k / v channel ranges must each lie inside one input part")
        out.append(parts[pi][:, c0 - pstart: c0 - pstart + w])
        c0 += w
    return out, parts[0].shape[0]


def gdn_decode_fused(x=None, conv_weight=None, conv_state=None, g=None, beta=None, state=None,
                     positions=None, slots=None, z=None, norm_weight=None, out=None,
                     x0=None, x1=None, x2=None, key_heads: int = 1, scale: float | None = None,
                     l2_eps: float = L2_EPS, eps: float = 1e-6, activation: str = "silu",
                     PREFETCH: bool = True, num_warps: int = 16) -> None:
    """See the module doc. `key_heads` = Hk; scale None = 1/sqrt(Dk); PREFETCH: load the next value
    head's state block while the current one computes; num_warps per program."""
    missing = [n for n, t in (("conv_weight", conv_weight), ("conv_state", conv_state), ("g", g), ("beta", beta),
                              ("state", state), ("positions", positions), ("slots", slots), ("z", z),
                              ("norm_weight", norm_weight), ("out", out)) if t is None]
    if missing:
        raise RouteError(f"{NAME}: missing operand(s) {', '.join(missing)}")
    if activation not in ("silu", "none"):
        raise RouteError(f"{NAME}: activation {activation!r} is not supported (supported: silu, none)")
    if state.dim() != 4 or state.dtype != torch.float32 or state.stride(3) != 1 or state.stride(2) != state.shape[3]:
        raise RouteError(f"{NAME}: state must be float32 [slots, Hv, Dk, Dv] with contiguous [Dk, Dv] blocks")
    _, Hv, Dk, Dv = state.shape
    Hk = int(key_heads)
    if Hk < 1 or Hv % Hk:
        raise RouteError(f"{NAME}: value heads {Hv} not a multiple of key_heads {Hk}")
    (xq, xk, xv), T = _segments(x, x0, x1, x2, (Hk * Dk, Hk * Dk, Hv * Dv))
    C = 2 * Hk * Dk + Hv * Dv
    if not 1 <= T <= DECODE_MAX_T:
        raise RouteError(f"{NAME}: T={T} outside the route domain [1, {DECODE_MAX_T}]")
    K = conv_weight.shape[0]
    if conv_weight.dim() != 2 or conv_weight.shape[1] != C or K < 2 or not conv_weight.is_contiguous():
        raise RouteError(f"{NAME}: conv_weight{tuple(conv_weight.shape)} must be contiguous [K >= 2, {C}]")
    if conv_state.dim() != 3 or conv_state.shape[1:] != (K - 1, C) or conv_state.stride(2) != 1:
        raise RouteError(f"{NAME}: conv_state{tuple(conv_state.shape)} must be [slots, {K - 1}, {C}] "
                         f"with a contiguous last axis")
    if g.shape != (T, Hv) or beta.shape != (T, Hv) or g.dtype != torch.float32 or beta.dtype != torch.float32 \
            or not (g.is_contiguous() and beta.is_contiguous()):
        raise RouteError(f"{NAME}: g and beta must be contiguous float32 [T={T}, Hv={Hv}]")
    if z.shape != (T, Hv, Dv) or z.stride(2) != 1:
        raise RouteError(f"{NAME}: z{tuple(z.shape)} must be [T, {Hv}, {Dv}] with a contiguous last axis")
    if norm_weight.shape != (Dv,) or out.shape != (T, Hv * Dv) or out.stride(1) != 1:
        raise RouteError(f"{NAME}: norm_weight must be [{Dv}] and out [T, {Hv * Dv}] (contiguous last axis)")
    if positions.shape != (T,) or slots.shape != (T,):
        raise RouteError(f"{NAME}: positions / slots must be [T={T}]")
    if not (16 <= Dk <= 256 and 1 <= Dv <= 256):
        raise RouteError(f"{NAME}: head dims Dk={Dk} Dv={Dv} outside [16, 256]")
    scale, l2_eps = check_scale_eps(NAME, Dk, scale, l2_eps)
    gdn_fused_decode_kernel[(T, Hk)](
        xq, xk, xv, conv_weight, conv_state, g, beta, state, positions, slots, z, norm_weight, out,
        C, Hk, Hv, Hv // Hk, Dk, Dv, scale, l2_eps, float(eps),
        xq.stride(0), xk.stride(0), xv.stride(0), conv_state.stride(0), conv_state.stride(1),
        state.stride(0), state.stride(1), z.stride(0), z.stride(1), out.stride(0),
        K=K, KP=triton.next_power_of_2(K), BK=max(16, triton.next_power_of_2(Dk)),
        BV=max(16, triton.next_power_of_2(Dv)), SILU=activation == "silu", PREFETCH=bool(PREFETCH),
        num_warps=num_warps,
        **pdl_launch(gdn_fused_decode_kernel),
    )
