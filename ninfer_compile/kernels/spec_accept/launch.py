"""Launcher of speculative acceptance: `spec_accept` (kernels.py describes the four launches).

spec_accept(logits [T, V], ids [T], n_drafts [C], temperature, top_k, top_p [T], seed [T, 2],
sample_pos [T], tokens [T] i32 (out), accepted [C] i32 (out), workspace f32
[sizing.workspace_elems(T, V)]): no allocation, no host sync (CUDA-graph capturable), returns None.
"""

from __future__ import annotations

import torch
import triton

from ninfer_compile.errors import RouteError

from ..pdl import pdl_launch
from ..sampling.kernels import block_max_kernel, threshold_kernel
from ..sampling.launch import check_param_rows
from ..sampling.sizing import block
from .kernels import accept_rows_kernel, residual_block_kernel
from .sizing import workspace_elems



def spec_accept(logits: torch.Tensor, ids: torch.Tensor, n_drafts: torch.Tensor, temperature: torch.Tensor,
                top_k: torch.Tensor, top_p: torch.Tensor, seed: torch.Tensor, sample_pos: torch.Tensor,
                tokens: torch.Tensor, accepted: torch.Tensor, workspace: torch.Tensor) -> None:
    """tokens / accepted of reference.spec_accept (greedy columns exactly; sampling columns with
    the same distribution, Philox noise of (seed, sample_pos))."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise RouteError("spec_accept: logits must be [T, V] with a contiguous last axis")
    T, V = logits.shape
    if V >= 1 << 24:
        raise RouteError(f"spec_accept: V={V} must be < 2^24")
    if n_drafts.dim() != 1 or n_drafts.dtype != torch.int32 or not n_drafts.is_contiguous():
        raise RouteError("spec_accept: n_drafts must be a contiguous int32 [C]")
    C = n_drafts.shape[0]
    if C < 1 or T % C or T // C < 2:
        raise RouteError(f"spec_accept: logits rows {T} must be C x W with W >= 2 for n_drafts [{C}]")
    W = T // C
    for name, t, want, dt in (("ids", ids, (T,), torch.int32), ("tokens", tokens, (T,), torch.int32),
                              ("accepted", accepted, (C,), torch.int32)):
        if tuple(t.shape) != want or t.dtype != dt or not t.is_contiguous():
            raise RouteError(f"spec_accept: {name} must be a contiguous int32 {list(want)}")
    check_param_rows("spec_accept", T, temperature=temperature, top_k=top_k, top_p=top_p, sample_pos=sample_pos,
                     seed=seed)
    blk = block(V)
    nb = triton.cdiv(V, blk)
    need = workspace_elems(T, V)
    if workspace is None or workspace.dtype != torch.float32 or workspace.numel() < need:
        raise RouteError(f"spec_accept: needs a float32 workspace of >= {need} elements")
    part_a = workspace[: T * nb * 2]  # [T, NB, 2]
    part_b = workspace[T * nb * 2: T * nb * 5]  # [T, NB, 3]
    rows = workspace[T * nb * 5: need]  # [T, 2]
    warps = 8 if blk >= 2048 else 4
    bs = max(16, triton.next_power_of_2(nb))
    st = logits.stride(0)
    block_max_kernel[(T, nb)](logits, part_a, V, nb, st, BLOCK=blk, num_warps=warps, **pdl_launch(block_max_kernel))
    threshold_kernel[(T,)](logits, temperature, top_k, top_p, tokens, part_a, rows, V, nb, st,
                           BS=bs, BLOCK=blk, num_warps=warps, **pdl_launch(threshold_kernel))
    residual_block_kernel[(T, nb)](logits, ids, n_drafts, temperature, seed, sample_pos, part_b, rows, V, nb, W, st,
                                   BLOCK=blk, num_warps=warps, **pdl_launch(residual_block_kernel))
    accept_rows_kernel[(C,)](logits, ids, n_drafts, temperature, seed, sample_pos, part_b, rows, tokens, accepted,
                             V, nb, W, st, BS=bs, num_warps=4, **pdl_launch(accept_rows_kernel))
