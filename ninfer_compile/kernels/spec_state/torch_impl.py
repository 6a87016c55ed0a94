"""CPU path of `state_select` (route state_select_copy): row r's slot (slots[r*(K+1)]) takes
columns[r, accepted[r]] where 0 <= accepted[r] < K, else is untouched; slots may cover fewer rows
than columns / accepted hold (slots.numel() // (K+1) rows run). One vectorised copy."""

from __future__ import annotations

import torch

__all__ = ["state_select"]


def state_select(state, columns, accepted, slots, workspace=None, **params) -> None:
    K = columns.shape[1]
    C = slots.shape[0] // (K + 1)
    acc = accepted[:C].long()
    rows = torch.nonzero((acc >= 0) & (acc < K)).flatten()
    if rows.numel() == 0:
        return
    state[slots.long()[rows * (K + 1)]] = columns[rows, acc[rows]].to(state.dtype)
