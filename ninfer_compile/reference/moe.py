"""The sparse mixture-of-experts block of the `qwen3_5_moe` family, float32 (model doc §6).

For every token h (the post-attention-normed residual, [H]):

    probs    = softmax(router h)                  # over all E routed experts, float32
    w, ids   = top-k(probs)                       # k = experts_per_token, largest first
    w        = w / sum(w)                         # renormalised to sum to 1
    routed   = sum_j w_j * down_e(SiLU(gate_e h) * up_e h)      for e = ids_j
    shared   = sigmoid(shared_gate . h) * down_s(SiLU(gate_s h) * up_s h)
    moe(h)   = routed + shared

The shared expert is not one of the E routed experts: it never takes part in the top-k and always
runs. Renormalising the top-k softmax values equals a softmax over the selected logits only.

Weights come from the NInfer objects of one block (`<prefix>/moe/...`): the router rows and the
shared gate row share one parent, the routed experts are expert-major banks (row `e*2I + p*I + r`
of `routed_gate_up` is row r of expert e's gate (p=0) or up (p=1) projection, row `e*H + h` of
`routed_down` row h of expert e's down projection), checked against the contract's expert banks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import ArtifactError


@dataclass
class MoEWeights:
    """One sparse-MoE block in logical form (float32)."""

    router: torch.Tensor         # [E, H]
    shared_gate: torch.Tensor    # [H]     the shared expert's scalar gate (row E of the parent)
    routed_gate: torch.Tensor    # [E, I, H]
    routed_up: torch.Tensor      # [E, I, H]
    routed_down: torch.Tensor    # [E, H, I]
    shared_gate_proj: torch.Tensor  # [S, H]
    shared_up_proj: torch.Tensor    # [S, H]
    shared_down_proj: torch.Tensor  # [H, S]


def _check_bank(spec, parent: str, roles: dict[str, tuple[int, int]], block_rows: int, experts: int) -> None:
    """The contract's expert bank for `parent` (when it declares one) must match the layout here."""
    bank = (getattr(spec, "expert_banks", None) or {}).get(parent)
    if bank is None:
        return
    if (bank.experts, bank.block_rows, dict(bank.roles)) != (experts, block_rows, roles):
        raise ArtifactError(f"{parent}: contract expert bank {bank.experts} x {bank.block_rows} rows "
                            f"{dict(bank.roles)}, the reference expects {experts} x {block_rows} {roles}")


def load_moe_weights(source, spec, dims, prefix: str) -> MoEWeights:
    """Bind the five objects of the block `<prefix>/moe/` (prefix `text/layers/{l}` or `mtp/layer`)."""
    from .weights import _mat, _rows  # weights.py imports this module: bind lazily

    E, H, I, S = dims.experts, dims.hidden, dims.expert_intermediate, dims.shared_intermediate
    p = f"{prefix}/moe"
    rs = _rows(source, spec, f"{p}/router_shared_gate", [("router", E), ("shared_gate", 1)])
    gate_up = _mat(source, f"{p}/routed_gate_up", E * 2 * I, H)
    down = _mat(source, f"{p}/routed_down", E * H, I)
    _check_bank(spec, f"{p}/routed_gate_up", {"gate": (0, I), "up": (I, I)}, 2 * I, E)
    _check_bank(spec, f"{p}/routed_down", {"down": (0, H)}, H, E)
    bank = gate_up.view(E, 2 * I, H)
    shared = _rows(source, spec, f"{p}/shared_gate_up", [("mlp_gate", S), ("mlp_up", S)])
    return MoEWeights(
        router=rs["router"], shared_gate=rs["shared_gate"][0],
        routed_gate=bank[:, :I], routed_up=bank[:, I:], routed_down=down.view(E, H, I),
        shared_gate_proj=shared["mlp_gate"], shared_up_proj=shared["mlp_up"],
        shared_down_proj=_mat(source, f"{p}/shared_down", H, S),
    )


def route(h: torch.Tensor, router: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing. h: [T, H]; router: [E, H]. Returns (weights [T, k] summing to 1 per row,
    expert ids [T, k] int64), largest weight first."""
    probs = torch.softmax(h @ router.t(), dim=-1)                    # [T, E]
    weights, ids = torch.topk(probs, top_k, dim=-1)
    return weights / weights.sum(dim=-1, keepdim=True), ids


def moe_block(h: torch.Tensor, w: MoEWeights, top_k: int) -> torch.Tensor:
    """The block's output [T, H] for normalised input h [T, H] (before the residual add)."""
    weights, ids = route(h, w.router, top_k)
    out = torch.zeros_like(h)
    # Token-grouped per expert (each expert's rows are used once per token that chose it).
    for e in torch.unique(ids).tolist():
        rows, slot = (ids == e).nonzero(as_tuple=True)               # tokens that picked e, and where
        x = h[rows]
        y = (F.silu(x @ w.routed_gate[e].t()) * (x @ w.routed_up[e].t())) @ w.routed_down[e].t()
        out.index_add_(0, rows, y * weights[rows, slot][:, None])
    shared = (F.silu(h @ w.shared_gate_proj.t()) * (h @ w.shared_up_proj.t())) @ w.shared_down_proj.t()
    return out + torch.sigmoid(h @ w.shared_gate)[:, None] * shared


__all__ = ["MoEWeights", "load_moe_weights", "moe_block", "route"]
