"""CPU path of the MoE families: the launchers' arguments, fp32 math, one rounding at each store.

The router is one product over the E + 1 rows, then softmax / top-k / renormalise. The experts
follow the grouped design of the Triton routes: the (token, slot) pairs are grouped by expert (one
stable sort: expert-major, then pair order), and each expert hit runs ONE multi-column product over
all of its tokens (its gate and up rows together, then its down rows), so a step costs one GEMM per
distinct expert, never one per pair. The weighted rows are then summed per token in slot order onto
residual + shared_gate * shared (as `moe_combine_kernel`).

Products (`_rows_product`) read the stored banks in place: a quantized bank ([E x 2I, H] gate_up,
[E x H, I] down, `QuantWeight`) goes through the linear family's fused multi-column CPU kernel on
the expert's row range (`torch_fused.fused_matmul(..., rows=)`: x rounded to int16 per K group,
exact int32 group sums, fp32 accumulation), so no fp32 copy of a bank is ever made. Where that
kernel is off (no compiler, no AVX2, NINFER_CPU_FUSED=0) only the hit expert's rows are dequantized
(exactly) for its fp32 torch.mm; a bf16 / fp32 bank's hit rows are upcast the same way. The router
takes the fused kernel too when quantized, else its small fp32 matrix kept per weight object
(`torch_util.fp32_weight`). Route params and the workspace are accepted and ignored.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...errors import RouteError
from ..linear import torch_fused
from ..linear.reference import dequantize
from ..linear.weights import QuantWeight
from ..torch_util import fp32_weight
from .reference import bank_dims

__all__ = ["moe_router", "moe_experts"]


def _rows_product(x: torch.Tensor, weight, begin: int, count: int) -> torch.Tensor:
    """x [T, K] @ weight[begin:begin + count]^T as fp32 [T, count], the weight read in place (module doc)."""
    if isinstance(weight, QuantWeight):
        if torch_fused.kernel() is not None:
            return torch_fused.fused_matmul(x, weight, rows=(begin, count))
        w = dequantize(weight.rows(begin, count))
    else:
        w = weight[begin:begin + count].float()
    return torch.mm(x.float(), w.t())


def moe_router(x, weight, expert_ids, expert_weights, shared_gate, top_k, workspace=None, **params) -> None:
    k = weight.k if isinstance(weight, QuantWeight) else weight.shape[1]
    if x.shape[-1] != k:
        raise RouteError(f"moe_router (torch): x {list(x.shape)} has H={x.shape[-1]}, weight has K={k}")
    if isinstance(weight, QuantWeight) and torch_fused.kernel() is not None:
        logits = torch_fused.fused_matmul(x, weight)
    else:
        logits = torch.mm(x.float(), fp32_weight(weight).t())
    probs = torch.softmax(logits[:, :-1], dim=-1)
    vals, ids = torch.topk(probs, int(top_k), dim=-1)
    expert_ids.copy_(ids)
    expert_weights.copy_(vals / vals.sum(dim=-1, keepdim=True))
    shared_gate.copy_(torch.sigmoid(logits[:, -1]))


def moe_experts(x, expert_ids, expert_weights, gate_up, down, shared, shared_gate, residual, out,
                workspace=None, **params) -> None:
    try:
        E, I, H = bank_dims(gate_up.shape, down.shape)
    except ValueError as e:
        raise RouteError(f"moe_experts (torch): {e}") from None
    if x.shape[-1] != H:
        raise RouteError(f"moe_experts (torch): x {list(x.shape)} has H={x.shape[-1]}, the banks have H={H}")
    T, k = expert_ids.shape
    flat = expert_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)                      # sorted position -> pair (t * k + j)
    counts = torch.bincount(flat, minlength=E).tolist()
    xs = x.index_select(0, order // k)                            # the pairs' token rows, grouped by expert
    ys = torch.empty(T * k, H, dtype=torch.float32)
    start = 0
    for e, c in enumerate(counts):
        if not c:
            continue
        h = _rows_product(xs[start:start + c], gate_up, e * 2 * I, 2 * I)
        ys[start:start + c] = _rows_product(F.silu(h[:, :I]) * h[:, I:], down, e * H, H)
        start += c
    weighted = ys.index_select(0, torch.argsort(order)).mul_(expert_weights.reshape(-1, 1).float()).view(T, k, H)
    acc = residual.float() + shared_gate.float()[:, None] * shared.float()
    for j in range(k):
        acc += weighted[:, j]
    out.copy_(acc)
