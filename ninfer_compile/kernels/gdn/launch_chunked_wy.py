"""Launcher of the Gated DeltaNet chunked WY prefill (route gdn_chunked_wy_prefill).

gated_delta_rule_chunked_wy    same operands and domain as launch.gated_delta_rule_chunked (ONE
                               sequence per launch: all T columns belong to slot slots[0] with
                               consecutive positions from positions[0]; any T; position 0 starts
                               from a zero state), three kernels (kernels_chunked_wy.py):
                               prep (chunk-parallel WY/UT), state (sequential over chunks,
                               parallel over heads x Dv blocks), output (chunk-parallel).
Needs a float32 workspace of chunked_workspace_numel(T, Hv, Dk, Dv) elements (this module's: the
runtime sizes a route's workspace with the function of the launcher's own module).
"""

from __future__ import annotations


import torch
import triton

from ninfer_compile.errors import RouteError

from .kernels_chunked_wy import gdn_wy_out_kernel, gdn_wy_prep_kernel, gdn_wy_state_kernel
from .launch import L2_EPS, _check_core, check_scale_eps, refuse_columns
from ..interpret import interpreting as _interpreting
from .routes import WY_CHUNK, wy_sections, wy_workspace_numel

CHUNK = WY_CHUNK

# (block_v, num_warps, num_stages) of the state / output kernels refused on a GPU. Measured on the
# H200 (sm_90, triton 3.6): (32, 4, 1) faults with an illegal memory access at T=1024
# (tests/kernels/gdn/test_gdn_guard.py's isolated sweep, 2026-11-29) and (32, 4, 2) at T=1
# (test_gdn_chunked_wy.py's 27B comparison, 2026-12-03; block_v=64 ran clean at T = 1, 300, 1024, 4096).
# The CPU guard-region tests find no out-of-bounds access, so the suspect is the compiler; every
# block_v=32 config shares that tiling and is refused with them, untested. Refused outside the
# interpreter so a tuner sweep cannot poison its CUDA context.
KNOWN_FAULTS = {(32, nw, ns) for nw in (4, 8) for ns in (1, 2, 3)}


def _sections(T: int, Hv: int, Dk: int, Dv: int) -> tuple[int, int, int, int]:
    """float32-element sizes of the workspace sections (routes.wy_sections, CHUNK = 64)."""
    return wy_sections(T, Hv, Dk, Dv)


def chunked_workspace_numel(T: int, Hv: int, Dk: int, Dv: int) -> int:
    """float32 elements this route's launcher needs (routes.wy_workspace_numel)."""
    return wy_workspace_numel(T, Hv, Dk, Dv)


def gated_delta_rule_chunked_wy(q, k, v, g, beta, state, positions, slots, out, workspace,
                                  scale: float | None = None, l2_eps: float = L2_EPS,
                                  chunk: int = CHUNK, block_v: int = 64, num_warps: int = 4,
                                  num_stages: int = 2, state_columns=None) -> None:
    """Chunked (chunk 64) prefill of one sequence (slot slots[0]), any T.

    q, k: [T, Hk, Dk] (raw; L2 norm fused), v: [T, Hv, Dv], g, beta: [T, Hv] f32 contiguous,
    state: [slots, Hv, Dk, Dv] f32 (slot slots[0] updated in place), out: [T, Hv, Dv],
    workspace: contiguous float32 with >= chunked_workspace_numel(T, Hv, Dk, Dv) elements (scratch).
    block_v: Dv columns per state / output program; num_warps, num_stages: those two kernels'.
    scale (None = 1/sqrt(Dk)) and l2_eps: as gated_delta_rule_decode.
    """
    refuse_columns("gated_delta_rule_chunked_wy", state_columns)
    if (block_v, num_warps, num_stages) in KNOWN_FAULTS and not _interpreting():
        raise RouteError(f"gated_delta_rule_chunked_wy: block_v={block_v}, num_warps={num_warps}, "
                         f"num_stages={num_stages} is refused on a GPU (illegal memory access measured on "
                         f"the H200 with triton 3.6; see launch_chunked_wy.KNOWN_FAULTS)")
    T, Hk, Dk, Hv, Dv = _check_core("gated_delta_rule_chunked_wy", q, k, v, g, beta, state, positions, slots, out)
    scale, l2_eps = check_scale_eps("gated_delta_rule_chunked_wy", Dk, scale, l2_eps)
    if chunk != CHUNK:
        raise RouteError(f"gated_delta_rule_chunked_wy: chunk={chunk} unsupported (only {CHUNK})")
    if block_v not in (16, 32, 64, 128):
        raise RouteError(f"gated_delta_rule_chunked_wy: block_v={block_v} not in 16/32/64/128")
    need = chunked_workspace_numel(T, Hv, Dk, Dv)
    if workspace is None or workspace.dtype != torch.float32 or workspace.numel() < need \
            or not workspace.is_contiguous():
        raise RouteError(f"gated_delta_rule_chunked_wy: workspace must be contiguous float32 with >= {need} "
                         f"elements")
    if T == 0:
        return
    n_gc, n_w, n_u, n_h = _sections(T, Hv, Dk, Dv)
    flat = workspace.view(-1)
    gc_ws = flat[:T * Hv]
    rk_ws = flat[T * Hv: n_gc]
    w_ws = flat[n_gc: n_gc + n_w].view(torch.bfloat16)
    u_ws = flat[n_gc + n_w: n_gc + n_w + n_u].view(torch.bfloat16)
    h_ws = flat[n_gc + n_w + n_u: n_gc + n_w + n_u + n_h].view(torch.bfloat16)
    nt = triton.cdiv(T, CHUNK)
    rep = Hv // Hk
    bk = max(16, triton.next_power_of_2(Dk))
    bvf = max(16, triton.next_power_of_2(Dv))
    bv = min(block_v, bvf)
    f32 = _interpreting()
    gdn_wy_prep_kernel[(nt, Hv)](
        k, v, g, beta, gc_ws, rk_ws, w_ws, u_ws,
        T, Hv, rep, Dk, Dv, l2_eps,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        BK=bk, BVF=bvf, PRECISION="ieee" if f32 else "tf32", F32=f32, num_warps=4, num_stages=1,
    )
    gdn_wy_state_kernel[(Hv, triton.cdiv(Dv, bv))](
        k, gc_ws, rk_ws, w_ws, u_ws, h_ws, state, positions, slots,
        T, nt, Hv, rep, Dk, Dv,
        k.stride(0), k.stride(1), state.stride(0), state.stride(1),
        BK=bk, BV=bv, F32=f32, NUM_STAGES=num_stages, num_warps=num_warps,
    )
    gdn_wy_out_kernel[(triton.cdiv(Dv, bv), nt, Hv)](
        q, k, gc_ws, rk_ws, u_ws, h_ws, out,
        T, nt, Hv, rep, Dk, Dv, scale, l2_eps,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), out.stride(0), out.stride(1),
        BK=bk, BV=bv, F32=f32, num_warps=num_warps, num_stages=num_stages,
    )
