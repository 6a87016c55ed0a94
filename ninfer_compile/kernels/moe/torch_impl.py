"""CPU path of the MoE families: the launchers' arguments, fp32 math, one rounding at each store.

The router is one fp32 matmul over the E + 1 rows (the dequantized weight kept per object,
`torch_util.fp32_weight`), then softmax / top-k / renormalise. The experts follow the grouped
design of the Triton routes: the (token, slot) pairs are grouped by expert (one stable sort), and
each expert hit runs ONE multi-column product over all of its tokens (gate and up rows together,
then down), so a step costs one GEMM per distinct expert, never one per pair; the weighted rows are
summed per token with `index_add_`. Banks are dequantized once into fp32 [E, 2I, H] / [E, H, I]
(the CPU path's weight layout). Route params and the workspace are accepted and ignored.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...errors import RouteError
from ..torch_util import fp32_weight

__all__ = ["moe_router", "moe_experts"]


def moe_router(x, weight, expert_ids, expert_weights, shared_gate, top_k, workspace=None, **params) -> None:
    w = fp32_weight(weight)
    if x.shape[-1] != w.shape[1]:
        raise RouteError(f"moe_router (torch): x {list(x.shape)} has H={x.shape[-1]}, weight has K={w.shape[1]}")
    logits = torch.mm(x.float(), w.t())
    probs = torch.softmax(logits[:, :-1], dim=-1)
    vals, ids = torch.topk(probs, int(top_k), dim=-1)
    expert_ids.copy_(ids)
    expert_weights.copy_(vals / vals.sum(dim=-1, keepdim=True))
    shared_gate.copy_(torch.sigmoid(logits[:, -1]))


def moe_experts(x, expert_ids, expert_weights, gate_up, down, shared, shared_gate, residual, out,
                workspace=None, **params) -> None:
    gu, dn = fp32_weight(gate_up), fp32_weight(down)
    H, I = gu.shape[1], dn.shape[1]
    if dn.shape[0] % H or gu.shape[0] % (2 * I) or gu.shape[0] // (2 * I) != dn.shape[0] // H:
        raise RouteError(f"moe_experts (torch): gate_up {list(gu.shape)} and down {list(dn.shape)} are not E "
                         f"expert banks")
    E = dn.shape[0] // H
    gu, dn = gu.view(E, 2 * I, H), dn.view(E, H, I)
    k = expert_ids.shape[1]
    flat = expert_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=E).tolist()
    xf = x.float()
    acc = residual.float() + shared_gate.float()[:, None] * shared.float()
    wts = expert_weights.reshape(-1).float()
    start = 0
    for e, c in enumerate(counts):
        if not c:
            continue
        pairs = order[start:start + c]
        start += c
        tok = pairs // k
        h = torch.mm(xf[tok], gu[e].t())
        y = torch.mm(F.silu(h[:, :I]) * h[:, I:], dn[e].t())
        acc.index_add_(0, tok, y * wts[pairs][:, None])
    out.copy_(acc)
