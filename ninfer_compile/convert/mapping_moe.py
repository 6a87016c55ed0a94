"""Hugging Face `qwen3_5_moe` tensors → NInfer logical tensors (the qwen3.6-35b-a3b structure).

The sparse-MoE checkpoints store every text layer's mixer in NInfer's fused parents (artifact
reference of qwen3.6-35b-a3b, sections 3.2, 9 and 12):

- full attention: one `attention/query_key_gate_value` parent `[query | key | output_gate | value]`
  (the per-head `[query | gate]` halves of `q_proj` split as for the dense models);
- GDN: `gdn/query_key_value_z = [in_proj_qkv | in_proj_z]` and `gdn/a_b_projection =
  [in_proj_a | in_proj_b]`, `conv1d.weight [C, 1, kernel]` → tap-major `[kernel, C]`;
- MoE block (text layers and the MTP layer): `moe/router_shared_gate = [mlp.gate | shared_expert_gate]`
  (router rows 0..E-1, the shared expert's scalar gate row E), the routed banks flattened
  expert-major — `routed_gate_up` row `e*2I + p*I + r` is row `r` of expert `e`'s gate (p=0) or up
  (p=1) projection, `routed_down` row `e*H + h` is row `h` of expert `e`'s down projection — and the
  shared expert as `shared_gate_up = [gate_proj | up_proj]`, `shared_down`.

The routed experts come under either name scheme transformers uses: the fused in-memory parameters
`mlp.experts.gate_up_proj [E, 2I, H]` (gate rows before up rows, as the official checkpoint stores
them) and `mlp.experts.down_proj [E, H, I]`, or the per-expert tensors `save_pretrained` writes
(`mlp.experts.{e}.gate_proj.weight [I, H]`, `up_proj`, `down_proj [H, I]`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..errors import ConvertError
from .mapping import ObjectRecipe, TextGeometry, _cat, _conv_tap_major, _identity, _split_q, _to_f32, mtp_recipes


def _attention(out: str, src: str, g: TextGeometry, part: str) -> list[ObjectRecipe]:
    h, d = g.heads, g.head_dim
    a = src + "self_attn."

    def qkgv(qw, kw, vw):
        query, gate = _split_q(qw, h, d)
        return torch.cat([query, kw, gate, vw], dim=0)
    return [
        ObjectRecipe(out + "attention/query_key_gate_value", (a + "q_proj.weight", a + "k_proj.weight",
                                                               a + "v_proj.weight"), qkgv, part),
        ObjectRecipe(out + "attention/query_norm", (a + "q_norm.weight",), _identity, part),
        ObjectRecipe(out + "attention/key_norm", (a + "k_norm.weight",), _identity, part),
        ObjectRecipe(out + "attention/output", (a + "o_proj.weight",), _identity, part),
    ]


def _gdn(out: str, src: str) -> list[ObjectRecipe]:
    a = src + "linear_attn."
    return [
        ObjectRecipe(out + "gdn/a_log", (a + "A_log",), _to_f32, "text"),
        ObjectRecipe(out + "gdn/dt_bias", (a + "dt_bias",), _to_f32, "text"),
        ObjectRecipe(out + "gdn/convolution", (a + "conv1d.weight",), _conv_tap_major, "text"),
        ObjectRecipe(out + "gdn/a_b_projection", (a + "in_proj_a.weight", a + "in_proj_b.weight"), _cat, "text"),
        ObjectRecipe(out + "gdn/query_key_value_z", (a + "in_proj_qkv.weight", a + "in_proj_z.weight"), _cat, "text"),
        ObjectRecipe(out + "gdn/norm", (a + "norm.weight",), _identity, "text"),
        ObjectRecipe(out + "gdn/output", (a + "out_proj.weight",), _identity, "text"),
    ]


def _bank(x: torch.Tensor) -> torch.Tensor:
    """[E, rows, K] → expert-major [E*rows, K]."""
    if x.dim() != 3:
        raise ValueError(f"expected an expert bank [experts, rows, K], got {list(x.shape)}")
    return x.reshape(x.shape[0] * x.shape[1], x.shape[2])


def _per_expert_gate_up(experts: int):
    def fn(*ws):  # gate_0, up_0, gate_1, up_1, ...
        if len(ws) != 2 * experts:
            raise ValueError(f"expected {2 * experts} expert tensors, got {len(ws)}")
        return torch.cat(ws, dim=0)
    return fn


def moe_recipes(out: str, src: str, g: TextGeometry, names: set[str], part: str) -> list[ObjectRecipe]:
    """The five objects of one sparse-MoE block (`out` = "text/layers/{l}/" or "mtp/layer/")."""
    m = src + "mlp."
    fused = m + "experts.gate_up_proj" in names
    if fused:
        gate_up = ObjectRecipe(out + "moe/routed_gate_up", (m + "experts.gate_up_proj",), _bank, part)
        down = ObjectRecipe(out + "moe/routed_down", (m + "experts.down_proj",), _bank, part)
    else:
        e_ids = range(g.experts)
        gu_src = tuple(f"{m}experts.{e}.{p}_proj.weight" for e in e_ids for p in ("gate", "up"))
        gate_up = ObjectRecipe(out + "moe/routed_gate_up", gu_src, _per_expert_gate_up(g.experts), part)
        down = ObjectRecipe(out + "moe/routed_down", tuple(f"{m}experts.{e}.down_proj.weight" for e in e_ids),
                            _cat, part)
    s = m + "shared_expert."
    return [
        ObjectRecipe(out + "moe/router_shared_gate", (m + "gate.weight", m + "shared_expert_gate.weight"), _cat, part),
        gate_up,
        down,
        ObjectRecipe(out + "moe/shared_gate_up", (s + "gate_proj.weight", s + "up_proj.weight"), _cat, part),
        ObjectRecipe(out + "moe/shared_down", (s + "down_proj.weight",), _identity, part),
    ]


def moe_layer_recipes(g: TextGeometry, names: set[str], prefix: str) -> list[ObjectRecipe]:
    """Text layers 0..L-1 of a sparse-MoE checkpoint, in writer order."""
    rec: list[ObjectRecipe] = []
    for l, kind in enumerate(g.layer_kinds):
        out, src = f"text/layers/{l}/", f"{prefix}layers.{l}."
        rec.append(ObjectRecipe(out + "input_norm", (src + "input_layernorm.weight",), _identity, "text"))
        rec += _attention(out, src, g, "text") if kind == "attention" else _gdn(out, src)
        rec.append(ObjectRecipe(out + "post_attention_norm", (src + "post_attention_layernorm.weight",),
                                _identity, "text"))
        rec += moe_recipes(out, src, g, names, "text")
    return rec


def moe_mtp_recipes(g: TextGeometry, names: Iterable[str]) -> list[ObjectRecipe]:
    """The MTP part of a sparse-MoE checkpoint: one full-attention layer with its own MoE block."""
    names = set(names)
    return mtp_recipes(g, names, attention=lambda out, src: _attention(out, src, g, "mtp"),
                       feed_forward=lambda out, src: moe_recipes(out, src, g, names, "mtp"))
