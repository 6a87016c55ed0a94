"""Plain fp32 PyTorch references of the MoE families (the meaning; shapes below).

`moe_router(x[T, H], weight[E+1, H], top_k) -> (expert_ids[T, k] int32, expert_weights[T, k] f32,
shared_gate[T] f32)`: rows 0..E-1 of `weight` are the router, row E the shared expert's gate;
probabilities are a softmax over the E router logits, the k largest are kept (largest first) and
renormalised to sum to 1; `shared_gate = sigmoid(x . weight[E])`.

`moe_experts(x[T, H], expert_ids, expert_weights, gate_up[E*2I, H], down[E*H, I], shared[T, H],
shared_gate[T], residual[T, H]) -> out[T, H]`:

    out[t] = residual[t] + shared_gate[t] * shared[t]
             + sum_j expert_weights[t, j] * down_e (SiLU(gate_e x[t]) * up_e x[t]),  e = expert_ids[t, j]

with the stored bank rows `gate_up[e*2I + p*I + r]` (p = 0 gate, 1 up) and `down[e*H + h]`.
`shared` is the shared expert's SwiGLU MLP output (linear ops of the graph), not yet gated.
Weights are QuantWeight / bf16 / fp32 tensors (dequantized exactly: linear.reference.dequantize).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..linear.reference import dequantize

__all__ = ["moe_router", "moe_experts", "bank_dims"]


def bank_dims(gate_up_shape, down_shape) -> tuple[int, int, int]:
    """(E, I, H) of the two expert banks [E*2I, H] and [E*H, I]; ValueError when they disagree."""
    n_gu, h = int(gate_up_shape[0]), int(gate_up_shape[1])
    n_d, i = int(down_shape[0]), int(down_shape[1])
    if h < 1 or i < 1 or n_d % h or n_gu % (2 * i) or n_gu // (2 * i) != n_d // h:
        raise ValueError(f"expert banks gate_up {list(gate_up_shape)} and down {list(down_shape)} do not "
                         f"describe E experts of [2I, H] and [H, I] rows")
    return n_d // h, i, h


def moe_router(x: torch.Tensor, weight, top_k: int):
    w = dequantize(weight).to(x.device)
    logits = x.float() @ w.t()                                   # [T, E+1]
    probs = torch.softmax(logits[:, :-1], dim=-1)
    vals, ids = torch.topk(probs, int(top_k), dim=-1)
    return ids.to(torch.int32), vals / vals.sum(dim=-1, keepdim=True), torch.sigmoid(logits[:, -1])


def moe_experts(x, expert_ids, expert_weights, gate_up, down, shared, shared_gate, residual):
    E, I, H = bank_dims(gate_up.shape, down.shape)
    gu = dequantize(gate_up).to(x.device).view(E, 2 * I, H)
    dn = dequantize(down).to(x.device).view(E, H, I)
    xf = x.float()
    out = residual.float() + shared_gate.float()[:, None] * shared.float()
    ids = expert_ids.long()
    for e in torch.unique(ids).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        h = xf[tok] @ gu[e].t()
        y = (F.silu(h[:, :I]) * h[:, I:]) @ dn[e].t()
        out.index_add_(0, tok, y * expert_weights.float()[tok, slot][:, None])
    return out
