"""CPU path of the embedding family: out[T, H] = dequantised table[ids] (the launchers' arguments).

A row-split table (`QuantWeight`) is decoded only at the looked-up rows (their plane spans are
gathered, then decoded exactly: float32(scale) × code; one fused C++ call where the linear family's
CPU kernel builds, `linear.torch_fused.fused_rows`), unless the CPU path already holds the
table's fp32 matrix (a tied output head, `torch_util.fp32_weight`) or the table is small
(<= SMALL_TABLE elements: decoded whole once), which is then indexed. A bf16
table is indexed directly. One rounding at the store. `vocab_begin` (a vocabulary-parallel rank's
table): ids outside [vocab_begin, vocab_begin + V) give zero rows.
"""

from __future__ import annotations

import torch

from ...errors import RouteError
from ..linear.reference import dequantize
from ..linear.torch_fused import fused_rows
from ..linear.weights import QuantWeight
from ..torch_util import cached_fp32_weight, fp32_weight

__all__ = ["embedding"]

SMALL_TABLE = 1 << 22  # elements: a table this small is decoded whole once (16 MiB fp32) and indexed


def _gathered_rows(table: QuantWeight, rows: torch.Tensor) -> QuantWeight:
    """A QuantWeight holding copies of `rows`' plane spans, in order (duplicates allowed)."""
    def take(plane, row_bytes):
        return plane.view(table.n, row_bytes)[rows].reshape(-1)

    return QuantWeight(format=table.format, n=int(rows.numel()), k=table.k, k_pad=table.k_pad,
                       groups_per_row=table.groups_per_row, base=take(table.base, table.base_row_bytes),
                       high=None if table.high is None else take(table.high, table.high_row_bytes),
                       scale=take(table.scale, table.scale_row_bytes))


def embedding(ids, table, out, workspace=None, vocab_begin=None, **params) -> None:
    rows = ids.long()
    if vocab_begin is not None:
        n = table.n if isinstance(table, QuantWeight) else int(table.shape[0])
        rows = rows - int(vocab_begin)
        outside = (rows < 0) | (rows >= n)
        rows = rows.clamp(0, n - 1)
        _lookup(rows, table, out)
        out[outside] = 0
        return
    _lookup(rows, table, out)


def _lookup(rows, table, out) -> None:
    if isinstance(table, QuantWeight):
        if table.k != out.shape[1]:
            raise RouteError(f"embedding (torch): table {table.format} [{table.n},{table.k}] does not match "
                             f"out H={out.shape[1]}")
        full = cached_fp32_weight(table)
        if full is None and table.n * table.k <= SMALL_TABLE:
            full = fp32_weight(table)
        if full is not None:
            out.copy_(full[rows])
        elif not fused_rows(table, rows, out):
            out.copy_(dequantize(_gathered_rows(table, rows)))
        return
    if not isinstance(table, torch.Tensor) or table.dim() != 2 or table.shape[1] != out.shape[1]:
        raise RouteError("embedding (torch): table must be a QuantWeight or a [V, H] tensor matching out")
    out.copy_(table[rows])
