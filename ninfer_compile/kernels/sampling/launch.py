"""Launcher of token selection: `sample`, per-row greedy / temperature / top-k / top-p.

sample(logits, temperature, top_k, top_p, seed, sample_pos, ids, workspace): ids[R] int32, four
Triton launches (kernels.py), no allocation and no host sync: CUDA-graph capturable. The float32
workspace (sizing.workspace_elems(R, V) elements) holds partials A [R, NB, 2], partials B
[R, NB, 2], then the row records [R, 2].
"""

from __future__ import annotations

import torch
import triton

from ninfer_compile.errors import RouteError

from .kernels import block_max_kernel, gumbel_block_kernel, gumbel_final_kernel, threshold_kernel
from .sizing import PARAM_DTYPES, block, workspace_elems
from ..pdl import pdl_launch

_TORCH = {"f32": torch.float32, "i32": torch.int32}


def select_workspace_numel(T: int, V: int) -> int:
    """float32 elements of the workspace of `sample` for logits [T, V]."""
    return workspace_elems(T, V)



def check_param_rows(who: str, R: int, **rows) -> None:
    """The per-row parameter inputs (temperature, top_k, top_p, sample_pos: [R]; seed: [R, 2]) in their
    PARAM_DTYPES, contiguous; else a RouteError naming `who` and the input (shared with spec_accept)."""
    for name, t in rows.items():
        want = (R, 2) if name == "seed" else (R,)
        if tuple(t.shape) != want or t.dtype != _TORCH[PARAM_DTYPES[name]] or not t.is_contiguous():
            raise RouteError(f"{who}: {name} must be a contiguous {PARAM_DTYPES[name]} {list(want)}")

def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           seed: torch.Tensor, sample_pos: torch.Tensor, ids: torch.Tensor, workspace: torch.Tensor) -> None:
    """ids[r] = argmax(logits[r]) where temperature[r] <= 0, else a draw from
    reference.filtered_probs(logits[r], temperature[r], top_k[r], top_p[r]) with the noise of
    (seed[r], sample_pos[r])."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise RouteError("sampling: logits must be [R, V] with a contiguous last axis")
    R, V = logits.shape
    if V >= 1 << 24:
        raise RouteError(f"sampling: V={V} must be < 2^24")
    if ids.shape != (R,) or ids.dtype != torch.int32:
        raise RouteError(f"sampling: ids must be int32 [R={R}]")
    check_param_rows("sampling", R, temperature=temperature, top_k=top_k, top_p=top_p, sample_pos=sample_pos,
                     seed=seed)
    blk = block(V)
    nb = triton.cdiv(V, blk)
    need = workspace_elems(R, V)
    if workspace is None or workspace.dtype != torch.float32 or workspace.numel() < need:
        raise RouteError(f"sampling: needs a float32 workspace of >= {need} elements")
    part_a = workspace[: R * nb * 2]
    part_b = workspace[R * nb * 2: R * nb * 4]
    rows = workspace[R * nb * 4: need]
    warps = 8 if blk >= 2048 else 4
    bs = max(16, triton.next_power_of_2(nb))
    block_max_kernel[(R, nb)](logits, part_a, V, nb, logits.stride(0), BLOCK=blk, num_warps=warps,
                              **pdl_launch(block_max_kernel))
    threshold_kernel[(R,)](logits, temperature, top_k, top_p, ids, part_a, rows, V, nb, logits.stride(0),
                           BS=bs, BLOCK=blk, num_warps=warps, **pdl_launch(threshold_kernel))
    gumbel_block_kernel[(R, nb)](logits, temperature, seed, sample_pos, part_b, rows, V, nb, logits.stride(0),
                                 BLOCK=blk, num_warps=warps, **pdl_launch(gumbel_block_kernel))
    gumbel_final_kernel[(R,)](temperature, part_b, rows, ids, nb, BS=bs, num_warps=2,
                              **pdl_launch(gumbel_final_kernel))
