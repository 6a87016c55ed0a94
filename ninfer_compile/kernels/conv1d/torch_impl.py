"""CPU path of the conv1d family (routes conv1d_decode / conv1d_prefill / conv1d_verify): the causal
depthwise conv (+ SiLU) over each slot's history with its rolling state, vectorised over columns.

Same arguments as the launchers: the input as `x` [T, C] or its channel ranges `x0 | x1 | x2`;
`conv_state` [slots, K-1, C] updated in place (each run's last K-1 inputs); with
`conv_state_columns` [R, W-1, K-1, C] (verify routes, W = its dim 1 + 1) the columns are rows of W
columns each and entry [r, j] receives row r's last K-1 inputs after its column j. Without it, a
run is a maximal stretch of consecutive same-slot columns (decode: one column per slot). Tap j
reads the input at lag K-1-j: from x inside the run, else from the slot's state; inputs at negative
positions are zero. fp32 math, one rounding at each store. One decode column takes one fused C++
call where it builds (`torch_fused`), the same arithmetic.
"""

from __future__ import annotations

import torch

from ...errors import RouteError
from ..torch_util import derived
from .torch_fused import fused_decode

__all__ = ["conv1d"]


def _input(x, x0, x1, x2):
    if x is not None:
        return x
    parts = [t for t in (x0, x1, x2) if t is not None]
    if not parts:
        raise RouteError("conv1d (torch): no input (x, or parts x0[, x1[, x2]])")
    return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]


def _decode_one(x, weight, conv_state, pos: int, slot: int, out, activation: str) -> None:
    """One column (decode at C = 1): window = the slot's K-1 state rows then x; rows at negative
    positions are zero; the state becomes the window's last K-1 rows."""
    K = weight.shape[0]
    state = conv_state[slot]                                  # [K-1, C] view
    win = torch.cat((state.float(), x.float()), 0)            # [K, C]
    if pos < K - 1:
        win[: K - 1 - pos] = 0.0
    acc = (win * derived(weight, "f32", lambda t: t.float())).sum(0, keepdim=True)
    out.copy_(torch.nn.functional.silu(acc) if activation == "silu" else acc)
    state.copy_(win[1:])


def conv1d(x=None, weight=None, conv_state=None, positions=None, slots=None, out=None, *, x0=None, x1=None,
           x2=None, activation: str = "silu", conv_state_columns=None, workspace=None, **params) -> None:
    if activation not in ("silu", "none"):
        raise RouteError(f"conv1d (torch): activation {activation!r} is not supported (silu, none)")
    if conv_state_columns is None and (x if x is not None else x0).shape[0] == 1:
        parts = [x] if x is not None else [t for t in (x0, x1, x2) if t is not None]
        if fused_decode(parts, derived(weight, "f32", lambda t: t.float()), conv_state,
                        slots.tolist()[0], positions.tolist()[0], out, activation == "silu"):
            return
    xin = _input(x, x0, x1, x2)
    T, C = xin.shape
    K = weight.shape[0]
    dev = xin.device
    if T == 1 and conv_state_columns is None:
        _decode_one(xin, weight, conv_state, int(positions[0]), int(slots[0]), out, activation)
        return
    t = torch.arange(T, device=dev)
    cols = conv_state_columns
    if cols is not None:  # verify rows of W columns
        W = cols.shape[1] + 1
        if W < 2 or T % W:
            raise RouteError(f"conv1d (torch): conv_state_columns {list(cols.shape)} do not split T={T} into rows")
        run_start = t - t % W
    else:
        slots_l = slots.long()
        is_start = torch.ones(T, dtype=torch.bool, device=dev)
        is_start[1:] = slots_l[1:] != slots_l[:-1]
        run_start = torch.where(is_start, t, torch.zeros_like(t)).cummax(0).values
    n_prev = t - run_start                          # same-run columns before t
    lags = torch.arange(K - 1, -1, -1, device=dev)  # tap j reads lag K-1-j
    from_x = lags[None, :] <= n_prev[:, None]       # [T, K]
    valid = (positions.long()[:, None] - lags[None, :]) >= 0
    # one source table: x rows, then every column's K-1 state rows, then a zero row
    state_rows = conv_state[slots.long()].float().reshape(T * (K - 1), C)
    src = torch.cat((xin.float(), state_rows, xin.new_zeros(1, C, dtype=torch.float32)), 0)
    x_idx = (t[:, None] - lags[None, :]).clamp_min(0)
    s_idx = T + t[:, None] * (K - 1) + (K - 1 - (lags[None, :] - n_prev[:, None])).clamp(0, K - 2)
    idx = torch.where(from_x, x_idx, s_idx)
    idx = torch.where(valid, idx, torch.full_like(idx, src.shape[0] - 1))  # [T, K]
    wf = weight.float()
    acc = src[idx[:, 0]] * wf[0]
    for j in range(1, K):
        acc.addcmul_(src[idx[:, j]], wf[j])
    if activation == "silu":
        acc = torch.nn.functional.silu(acc)
    # the inputs each state keeps: taps 1..K-1 of a column (its last K-1 inputs)
    if cols is not None:
        R = T // W
        cols[:R].copy_(src[idx[:, 1:]].view(R, W, K - 1, C)[:, :W - 1])
        ends = t[W - 1::W]
    else:
        is_end = torch.ones(T, dtype=torch.bool, device=dev)
        is_end[:-1] = is_start[1:]
        ends = t[is_end]
    new_state = src[idx[ends, 1:]]                  # [runs, K-1, C], read before any store
    out.copy_(acc)
    conv_state[slots.long()[ends]] = new_state.to(conv_state.dtype)
