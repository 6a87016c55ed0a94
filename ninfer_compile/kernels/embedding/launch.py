"""Launchers of the embedding lookup (preallocated output, no allocation, return None).

`table` is a `QuantWeight` (kernels/linear/weights.py: the stored row-split planes, no repack) or
a bf16 [V, H] tensor. Ids are not range-checked on the device (the tokenizer/runtime guarantees
0 <= id < V); with `vocab_begin` (a vocabulary-parallel rank's rows [vocab_begin, vocab_begin + V)),
an id outside the table's rows writes a zero row.
"""

from __future__ import annotations

import torch
import triton

from ninfer_compile.errors import RouteError

from ..linear.weights import FORMAT_BITS, QuantWeight
from .kernels import embed_dense_kernel, embed_rowsplit_kernel
from ..pdl import pdl_launch

BLOCK = 1024


def embedding(ids: torch.Tensor, table, out: torch.Tensor, vocab_begin: int | None = None) -> None:
    """out[T, H] = dequantised table[ids[T] - vocab_begin] (Q4/Q5/Q6/W8 row-split planes or a bf16
    table; zero rows for ids outside the table)."""
    T = ids.shape[0]
    if ids.dim() != 1 or ids.dtype != torch.int32:
        raise RouteError(f"embedding: ids must be int32 [T], got {ids.dtype} {tuple(ids.shape)}")
    if out.dim() != 2 or out.shape[0] != T or out.stride(1) != 1:
        raise RouteError(f"embedding: out must be [T={T}, H] with a contiguous last axis, got {tuple(out.shape)}")
    H = out.shape[1]
    first = int(vocab_begin or 0)
    rows = table.n if isinstance(table, QuantWeight) else int(table.shape[0])
    grid = (T, triton.cdiv(H, BLOCK))
    if isinstance(table, QuantWeight):
        if table.k != H:
            raise RouteError(f"embedding: table {table.format} [{table.n},{table.k}] does not match out H={H}")
        bits = FORMAT_BITS[table.format]
        high = table.high if table.high is not None else table.base
        embed_rowsplit_kernel[grid](
            ids, table.base, high, table.scales(), out, H, table.groups_per_row, out.stride(0), first, rows,
            BITS=bits, GROUP=table.group, BLOCK=BLOCK, num_warps=4,
            **pdl_launch(embed_rowsplit_kernel),
        )
        return
    if not isinstance(table, torch.Tensor) or table.dim() != 2 or table.shape[1] != H or table.stride(1) != 1 \
            or table.dtype != torch.bfloat16:
        raise RouteError("embedding: table must be a QuantWeight or a bf16 [V, H] tensor matching out")
    embed_dense_kernel[grid](ids, table, out, H, table.stride(0), out.stride(0), first, rows, BLOCK=BLOCK,
                             num_warps=4,
                             **pdl_launch(embed_dense_kernel))
