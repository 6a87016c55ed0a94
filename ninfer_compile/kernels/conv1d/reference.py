"""fp32 PyTorch reference of the causal depthwise conv1d + SiLU with a per-slot rolling state.

Operands:
  x:          [T, C]           input columns (token order)
  weight:     [K, C]           tap-major; tap j multiplies the input at lag K-1-j (tap K-1 = current)
  conv_state: [slots, K-1, C]  per slot the last K-1 inputs before the step, oldest first
  positions:  [T] int          absolute position of each column
  slots:      [T] int          sequence slot of each column
Columns of one slot form one contiguous run with consecutive positions. An input at a negative
position is zero (so a sequence starting at position 0 ignores whatever its slot's state holds).
Returns out [T, C] float32 = act(sum_j weight[j] * in(t - (K-1-j))) and the new state
[slots, K-1, C] float32 (untouched slots copied): the run's last K-1 inputs. act: SiLU
(`activation="silu"`, the default) or the identity (`"none"`).

Verify ops (attribute window W >= 2, docs/SPECULATIVE.md): the T columns are C = T / W rows of W
consecutive columns, each row one run of its own slot; the reference then also returns
conv_state_columns [C, W-1, K-1, C_ch] float32 (like the state): entry [r, j] = the row's last K-1
inputs after its column j (what the slot's state would be had the row stopped there).
"""

from __future__ import annotations

import torch


def conv1d(
    x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor,
    positions: torch.Tensor, slots: torch.Tensor, activation: str = "silu", window: int = 0,
) -> tuple[torch.Tensor, ...]:
    if activation not in ("silu", "none"):
        raise ValueError(f"conv1d: activation {activation!r} is not silu or none")
    W = int(window or 0)
    if W == 1 or W < 0 or (W and x.shape[0] % W):
        raise ValueError(f"conv1d: window={W} must be 0 or >= 2 and divide T={x.shape[0]}")
    T, C = x.shape
    K = weight.shape[0]
    xf, wf = x.float(), weight.float()
    new_state = conv_state.float().clone()
    out = torch.empty(T, C, dtype=torch.float32)
    cols = torch.zeros(T // W, W - 1, K - 1, C, dtype=torch.float32) if W else None
    t = 0
    while t < T:
        s = int(slots[t])
        e = t
        if W:  # a verify row: W columns of one slot, never merged with the next row
            e = t + W - 1
        else:
            while e + 1 < T and int(slots[e + 1]) == s:
                e += 1
        p0 = int(positions[t])
        hist = conv_state[s].float().clone()  # [K-1, C], positions p0-K+1 .. p0-1
        for i in range(K - 1):
            if p0 - (K - 1) + i < 0:
                hist[i] = 0.0
        seq = torch.cat([hist, xf[t:e + 1]], 0)  # [K-1 + n, C]
        for i in range(e - t + 1):
            win = seq[i:i + K]  # [K, C]
            y = (win * wf).sum(0)
            out[t + i] = torch.nn.functional.silu(y) if activation == "silu" else y
        new_state[s] = seq[-(K - 1):]
        if W:
            for j in range(W - 1):
                cols[t // W, j] = seq[j + 1:j + K]  # the last K-1 inputs up to column j
        t = e + 1
    return (out, new_state) if not W else (out, new_state, cols)
