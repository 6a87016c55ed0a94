"""fp32 PyTorch references of the Gated DeltaNet core.

Shapes: T token columns, Hk q/k heads, Hv value heads (a multiple of Hk; value head j reads q/k
head j // (Hv // Hk)), Dk/Dv head dims, state [slots, Hv, Dk, Dv] float32 (S maps k -> v).

Per token and value head (q, k L2-normalised with eps 1e-6, scale = 1/sqrt(Dk)):
    S  = exp(g) * S
    u  = beta * (v - S^T k)
    S  = S + k u^T
    o  = scale * S^T q
A sequence whose first column has position 0 starts from a zero state (whatever its slot holds).

Verify ops (attribute window W >= 2, docs/SPECULATIVE.md): the T columns are C = T / W rows of W
consecutive columns (row r = columns r*W .. r*W + W-1, one slot at consecutive positions), and the
reference also returns state_columns [C, W-1, Hv, Dk, Dv] f32: row r's state after each of its first
W-1 columns (state_select rolls a slot back to one of them).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def gdn_gating(a, b, a_log, dt_bias):
    """a, b: [T, Hv]; a_log, dt_bias: [Hv] f32 -> (g [T, Hv] f32, beta [T, Hv] f32).

    g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b).
    """
    g = -torch.exp(a_log.float()) * F.softplus(a.float() + dt_bias.float())
    return g, torch.sigmoid(b.float())


def gdn_gating_proj(x, a_weight, b_weight, a_log, dt_bias):
    """Fused a/b projections + gating (the oracle of route gdn_gating_proj_rows).

    x: [T, K]; a_weight, b_weight: [Hv, K] (bf16, or float32 when the executor hands dequantized
    weights); a_log, dt_bias: [Hv] f32 -> (g [T, Hv] f32, beta [T, Hv] f32) with
    a = x @ a_weight^T, b = x @ b_weight^T (fp32, no rounding of a / b) and gdn_gating(a, b, ...).
    """
    from ..linear.reference import linear

    return gdn_gating(linear(x, a_weight), linear(x, b_weight), a_log, dt_bias)


def _l2(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def gated_delta_rule(q, k, v, g, beta, state, positions, slots, scale=None, l2_eps=1e-6, window=0):
    """Sequential recurrence over the columns in order (the oracle for every route).

    q, k: [T, Hk, Dk]; v: [T, Hv, Dv]; g, beta: [T, Hv]; state: [slots, Hv, Dk, Dv];
    positions, slots: [T] int; scale: the output scale (None: 1/sqrt(Dk)); l2_eps: the q / k L2
    normalisation eps. Returns (o [T, Hv, Dv] f32, new state [slots, Hv, Dk, Dv] f32), and with
    window W >= 2 also state_columns [T // W, W-1, Hv, Dk, Dv] f32 (entry [r, j] = the state of
    row r's slot after the row's column j).
    Columns of one slot are processed in column order (each slot's columns are consecutive
    positions of one sequence).
    """
    W = int(window or 0)
    if W == 1 or W < 0 or (W and q.shape[0] % W):
        raise ValueError(f"gated_delta_rule: window={W} must be 0 or >= 2 and divide T={q.shape[0]}")
    T, Hk, Dk = q.shape
    Hv = v.shape[1]
    rep = Hv // Hk
    scale = 1.0 / math.sqrt(Dk) if scale is None else float(scale)
    qn = _l2(q.float(), l2_eps).repeat_interleave(rep, dim=1)  # [T, Hv, Dk]
    kn = _l2(k.float(), l2_eps).repeat_interleave(rep, dim=1)
    vf, gf, bf = v.float(), g.float(), beta.float()
    S_all = state.float().clone()
    o = torch.empty(T, Hv, v.shape[2], dtype=torch.float32)
    cols = torch.zeros(T // W, W - 1, *S_all.shape[1:], dtype=torch.float32) if W else None
    for t in range(T):
        s = int(slots[t])
        if int(positions[t]) == 0:
            S_all[s] = 0.0
        S = S_all[s] * torch.exp(gf[t])[:, None, None]  # [Hv, Dk, Dv]
        kv = torch.einsum("hkv,hk->hv", S, kn[t])
        u = bf[t][:, None] * (vf[t] - kv)
        S = S + kn[t][:, :, None] * u[:, None, :]
        o[t] = torch.einsum("hkv,hk->hv", S, qn[t]) * scale
        S_all[s] = S
        if W and t % W < W - 1:
            cols[t // W, t % W] = S
    return (o, S_all) if not W else (o, S_all, cols)

