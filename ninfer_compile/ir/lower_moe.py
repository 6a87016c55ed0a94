"""Lowering pieces of the fused-parent layouts and of the sparse-MoE feed-forward block.

The qwen3.6-35b-a3b layout (contract family qwen3_5_moe) stores the attention input as one parent
`attention/query_key_gate_value` and the GDN input as `gdn/query_key_value_z` + `gdn/a_b_projection`
(rows `[a_0..a_H-1, b_0..b_H-1]`); the dense 27B stores two parents each. Lowering asks for the
same logical row views either way (`attention_projections`, `gdn_projection_weights`).

The MoE block (model doc §6; reference: reference/moe.py), for the normed rows h of residual x:

    moe_router   h, router_shared_gate[E+1, H]  -> expert_ids [T, k] i32, expert_weights [T, k] f32,
                                                   shared_gate [T] f32 (sigmoid of row E)
    shared MLP   linear gate / up rows of shared_gate_up, swiglu, linear shared_down -> shared [T, H]
                 (the dense linear family and its fuse rules: one W8G32 swiglu-epilogue launch + down)
    moe_experts  h, routing, routed_gate_up bank, routed_down bank, shared, residual x -> x + moe(h)

The routing tensors are ordinary activations of the arena (explicit launch bindings between the
two families); the experts' grouping scratch is their route's workspace (kernels/moe/routes.py).
"""

from __future__ import annotations

__all__ = ["attention_projections", "gdn_projection_weights", "moe_block"]


def _has(spec, obj: str) -> bool:
    return obj in (getattr(spec, "objects", None) or {})


def attention_projections(spec, p: str) -> list[tuple[str, str]]:
    """[(object, role)] of query, key, gate, value of the attention layer `p`."""
    fused = f"{p}/attention/query_key_gate_value"
    if _has(spec, fused):
        return [(fused, "query"), (fused, "key"), (fused, "gate"), (fused, "value")]
    qk, gv = f"{p}/attention/query_key", f"{p}/attention/gate_value"
    return [(qk, "query"), (qk, "key"), (gv, "gate"), (gv, "value")]


def gdn_projection_weights(b, p: str) -> tuple[str, str, str, str, str, str]:
    """The weight tensors of q, k, v, z, a, b of the GDN layer `p` (row views of their parents)."""
    d = b.d
    kw, vw, hv = d.gdn_k_width, d.gdn_v_width, d.gdn_v_heads
    qkvz = f"{p}/gdn/query_key_value_z"
    if _has(b.spec, qkvz):
        ab = f"{p}/gdn/a_b_projection"
        return (b.weight(qkvz, "query", (0, kw)), b.weight(qkvz, "key", (kw, kw)),
                b.weight(qkvz, "value", (2 * kw, vw)), b.weight(qkvz, "z", (2 * kw + vw, vw)),
                b.weight(ab, "a", (0, hv)), b.weight(ab, "b", (hv, hv)))
    qk, vz = f"{p}/gdn/query_key", f"{p}/gdn/value_z"
    return (b.weight(qk, "query", (0, kw)), b.weight(qk, "key", (kw, kw)),
            b.weight(vz, "value", (0, vw)), b.weight(vz, "z", (vw, vw)),
            b.weight(f"{p}/gdn/a_projection"), b.weight(f"{p}/gdn/b_projection"))


def moe_block(b, p: str, tag: str, x: str, h: str) -> str:
    """x + moe(h) for the block `<p>/moe/` (p: `text/layers/{l}` or `mtp/layer`); returns the new residual."""
    d, T = b.d, b.T
    k, S = d.experts_per_token, d.shared_intermediate
    routing = {"expert_ids": b.act(f"{tag}.router.expert_ids", (T, k), "i32"),
               "expert_weights": b.act(f"{tag}.router.expert_weights", (T, k), "f32"),
               "shared_gate": b.act(f"{tag}.router.shared_gate", (T,), "f32")}
    b.op("moe_router", f"{tag}.router", {"x": h, "weight": b.weight(f"{p}/moe/router_shared_gate")}, routing,
         top_k=k)
    sgu = f"{p}/moe/shared_gate_up"
    gate = b.linear(f"{tag}.shared_gate_proj", h, b.weight(sgu, "mlp_gate", (0, S)), S)
    up = b.linear(f"{tag}.shared_up_proj", h, b.weight(sgu, "mlp_up", (S, S)), S)
    act = b.act(f"{tag}.shared_swiglu.out", (T, S))
    b.op("swiglu", f"{tag}.shared_swiglu", {"gate": gate, "up": up}, {"out": act})
    shared = b.linear(f"{tag}.shared_down_proj", act, b.weight(f"{p}/moe/shared_down"), d.hidden)
    out = b.act(f"{tag}.experts.out", (T, d.hidden))
    b.op("moe_experts", f"{tag}.experts",
         {"x": h, **routing, "gate_up": b.weight(f"{p}/moe/routed_gate_up"),
          "down": b.weight(f"{p}/moe/routed_down"), "shared": shared, "residual": x}, {"out": out})
    return out
