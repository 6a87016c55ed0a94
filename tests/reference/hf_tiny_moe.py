"""Tiny HF Qwen3_5MoeForCausalLM models (bf16-exact random weights) for the MoE reference and
converter tests. `TINY_MOE` has the dims of graphs/tiny-moe.yaml (so a checkpoint of it packs under
that registered contract); other shapes are made with overrides."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from .hf_tiny import ROPE, bf16_round, mrope_section

TINY_MOE = dict(  # = graphs/tiny-moe.yaml: layers 1 and 3 attention, 8 experts top-2
    vocab_size=320, hidden_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=32, linear_key_head_dim=16, linear_value_head_dim=24, linear_num_key_heads=2,
    linear_num_value_heads=4, linear_conv_kernel_dim=4, rms_norm_eps=1e-6, num_experts=8,
    num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
)


def make_hf_moe_model(seed: int = 0, **overrides):
    """A tiny random Qwen3_5MoeForCausalLM (eager, fp32, eval) with bf16-exact parameters, drawn at
    ~1/sqrt(fan_in) (residual outputs scaled down) so that every op, the routing included, matters."""
    from transformers import Qwen3_5MoeTextConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForCausalLM

    kw = {**TINY_MOE, **overrides}
    if "num_hidden_layers" in overrides and "layer_types" not in overrides:
        kw["layer_types"] = ["full_attention" if (l + 1) % 4 == 0 else "linear_attention"
                             for l in range(kw["num_hidden_layers"])]
    rope = {**ROPE, "mrope_section": mrope_section(int(kw["head_dim"] * ROPE["partial_rotary_factor"]))}
    cfg = Qwen3_5MoeTextConfig(**kw, rope_parameters=rope, attn_implementation="eager")
    torch.manual_seed(seed)
    model = Qwen3_5MoeForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            fan_in = p.shape[-1]
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif "norm" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.5, 4.0, generator=g).log())
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("conv1d.weight"):
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("mlp.gate.weight"):
                # router logits spread over a few units: a clear top-k, still data dependent
                p.copy_(2.0 * torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
            elif name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight", "experts.down_proj")):
                p.copy_(0.25 * torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
            else:  # input projections, expert gate/up banks, the shared expert's scalar gate
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
            p.copy_(bf16_round(p))
    return model


def random_moe_mtp(cfg, seed: int = 7) -> dict[str, torch.Tensor]:
    """bf16-exact random MTP tensors (one full-attention sparse-MoE layer) under the checkpoint's
    `mtp.*` names, experts in the fused in-memory form (transformers has no MTP module)."""
    H, D, Hq, Hkv = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    E, I, S = cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
    g = torch.Generator().manual_seed(seed)

    def mat(*shape, scale=1.0):
        return bf16_round(scale * torch.randn(*shape, generator=g) / math.sqrt(shape[-1]))

    def norm(n):
        return bf16_round(0.2 * torch.randn(n, generator=g))

    m = "mtp.layers.0."
    return {
        "mtp.fc.weight": mat(H, 2 * H),
        "mtp.pre_fc_norm_embedding.weight": norm(H), "mtp.pre_fc_norm_hidden.weight": norm(H),
        m + "input_layernorm.weight": norm(H),
        m + "self_attn.q_proj.weight": mat(2 * Hq * D, H),
        m + "self_attn.k_proj.weight": mat(Hkv * D, H),
        m + "self_attn.v_proj.weight": mat(Hkv * D, H),
        m + "self_attn.o_proj.weight": mat(H, Hq * D, scale=0.25),
        m + "self_attn.q_norm.weight": norm(D), m + "self_attn.k_norm.weight": norm(D),
        m + "post_attention_layernorm.weight": norm(H),
        m + "mlp.gate.weight": mat(E, H, scale=2.0),
        m + "mlp.shared_expert_gate.weight": mat(1, H),
        m + "mlp.experts.gate_up_proj": mat(E, 2 * I, H),
        m + "mlp.experts.down_proj": mat(E, H, I, scale=0.25),
        m + "mlp.shared_expert.gate_proj.weight": mat(S, H),
        m + "mlp.shared_expert.up_proj.weight": mat(S, H),
        m + "mlp.shared_expert.down_proj.weight": mat(H, S, scale=0.25),
        "mtp.norm.weight": norm(H),
    }


def per_expert(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The fused expert banks of a state dict split into the per-expert tensors `save_pretrained`
    writes (`experts.{e}.gate_proj.weight`, `up_proj`, `down_proj`)."""
    out = {}
    for name, t in sd.items():
        if name.endswith("experts.gate_up_proj"):
            base, inter = name[: -len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :inter].clone()
                out[f"{base}{e}.up_proj.weight"] = t[e, inter:].clone()
        elif name.endswith("experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].clone()
        else:
            out[name] = t
    return out


def moe_ninfer_dict(model, *, mtp: bool = False) -> dict[str, torch.Tensor]:
    """NInfer logical tensors of `model` through the project's converter (+ random MoE MTP)."""
    from ninfer_compile.convert.hf import convert_state_dict

    sd = dict(model.state_dict())
    if mtp:
        sd.update(random_moe_mtp(model.config))
    return convert_state_dict(model.config.to_dict(), sd)


def moe_spec_for(cfg, *, mtp: bool = False) -> SimpleNamespace:
    """A ModelSpec-shaped namespace (family qwen3_5_moe) for an HF MoE text config."""
    rp = cfg.rope_parameters
    dims = dict(
        vocab_rows=cfg.vocab_size, hidden=cfg.hidden_size, layers=cfg.num_hidden_layers,
        attn_heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        rotary_dim=int(cfg.head_dim * rp.get("partial_rotary_factor", 0.25)),
        gdn_k_heads=cfg.linear_num_key_heads, gdn_k_dim=cfg.linear_key_head_dim,
        gdn_v_heads=cfg.linear_num_value_heads, gdn_v_dim=cfg.linear_value_head_dim,
        conv_kernel=cfg.linear_conv_kernel_dim, experts=cfg.num_experts,
        experts_per_token=cfg.num_experts_per_tok, expert_intermediate=cfg.moe_intermediate_size,
        shared_intermediate=cfg.shared_expert_intermediate_size,
    )
    if mtp:
        dims["mtp_layers"] = 1
    kinds = ["attention" if t == "full_attention" else "gdn" for t in cfg.layer_types]
    return SimpleNamespace(
        model_id="tiny-hf-moe", family="qwen3_5_moe", dims=dims,
        params=dict(rms_eps=cfg.rms_norm_eps, rope_theta=rp["rope_theta"]),
        layer_kinds=kinds, parts={"text": True, "mtp": mtp}, views={},
    )
