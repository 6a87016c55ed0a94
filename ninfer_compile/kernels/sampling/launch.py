"""Launchers of token selection.

argmax        greedy ids[T] int32 from logits[T, V] (two Triton kernels; float32 workspace of
              select_workspace_numel(T, V) elements; no allocation, CUDA-graph friendly).
sample_gumbel temperature sampling by Gumbel-max in the same two kernels (seeded Philox noise;
              deterministic for (seed, logits)); no top-k / top-p.
sample        temperature + top-k + top-p in torch (sort-based; allocates, not graph-capturable);
              deterministic for a seed (torch.Generator on the logits' device).
"""

from __future__ import annotations

import torch
import triton

from ninfer_compile.errors import RouteError

from .kernels import select_stage1_kernel, select_stage2_kernel
from .reference import filtered_probs
from ..pdl import pdl_launch

BLOCK = 4096


def _block(V: int) -> int:
    return min(BLOCK, max(64, triton.next_power_of_2(V)))


def select_workspace_numel(T: int, V: int) -> int:
    """float32 elements of the stage-1 partials [T, cdiv(V, block), 2]."""
    return T * triton.cdiv(V, _block(V)) * 2


def _select(logits, out, workspace, gumbel, temperature, seed):
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise RouteError("sampling: logits must be [T, V] with a contiguous last axis")
    T, V = logits.shape
    if out.shape != (T,) or out.dtype != torch.int32:
        raise RouteError(f"sampling: out must be int32 [T={T}]")
    if V >= 1 << 24:
        raise RouteError(f"sampling: V={V} must be < 2^24")
    block = _block(V)
    nb = triton.cdiv(V, block)
    need = T * nb * 2
    if workspace is None or workspace.dtype != torch.float32 or workspace.numel() < need:
        raise RouteError(f"sampling: needs a float32 workspace of >= {need} elements")
    select_stage1_kernel[(T, nb)](
        logits, workspace, V, nb, logits.stride(0), 1.0 / max(temperature, 1e-6), seed,
        GUMBEL=gumbel, BLOCK=block, num_warps=8 if block >= 2048 else 4,
        **pdl_launch(select_stage1_kernel),
    )
    select_stage2_kernel[(T,)](workspace, out, nb, BS=max(16, triton.next_power_of_2(nb)), num_warps=2, **pdl_launch(select_stage2_kernel))


def argmax(logits: torch.Tensor, out: torch.Tensor, workspace: torch.Tensor) -> None:
    """out[T] int32 = first index of the row maximum of logits[T, V]."""
    _select(logits, out, workspace, False, 1.0, 0)


def sample_gumbel(logits: torch.Tensor, out: torch.Tensor, workspace: torch.Tensor,
                  temperature: float, seed: int) -> None:
    """out[T] int32 ~ softmax(logits / temperature) per row (Gumbel-max, seeded)."""
    if temperature <= 0:
        raise RouteError("sample_gumbel: temperature must be > 0 (use argmax for greedy)")
    _select(logits, out, workspace, True, temperature, seed)


def sample(logits: torch.Tensor, out: torch.Tensor, temperature: float, top_k: int = 0,
           top_p: float = 1.0, seed: int = 0) -> None:
    """out[T] int32 ~ filtered_probs(logits, temperature, top_k, top_p) (torch; greedy when temperature == 0)."""
    T = logits.shape[0]
    if out.shape != (T,) or out.dtype != torch.int32:
        raise RouteError(f"sample: out must be int32 [T={T}]")
    if temperature <= 0:
        out.copy_(torch.argmax(logits.float(), dim=-1).to(torch.int32))
        return
    probs = filtered_probs(logits, temperature, top_k, top_p)
    gen = torch.Generator(device=logits.device)
    gen.manual_seed(seed)
    out.copy_(torch.multinomial(probs, 1, generator=gen).squeeze(-1).to(torch.int32))
