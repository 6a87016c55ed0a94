"""fp32 PyTorch reference of `state_select` (see spec.py).

state [slots, *S]; columns [C, K, *S]; accepted [C] int; slots [T = C*(K+1)] int.
Returns the new state [slots, *S]: row r's slot takes columns[r, accepted[r]] when accepted[r] < K.
"""

from __future__ import annotations

import torch


def state_select(state: torch.Tensor, columns: torch.Tensor, accepted: torch.Tensor,
                 slots: torch.Tensor) -> torch.Tensor:
    C, K = columns.shape[0], columns.shape[1]
    W = K + 1
    out = state.clone()
    for r in range(C):
        n = int(accepted[r])
        if 0 <= n < K:
            out[int(slots[r * W])] = columns[r, n].to(out.dtype)
    return out
