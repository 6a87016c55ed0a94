"""Tiny HF Qwen3_5ForCausalLM models (bf16-exact random weights) for the reference and runtime tests."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

TINY = dict(  # hidden not a multiple of 128; 2 GDN K heads serving 6 V heads; both layer kinds
    vocab_size=320, hidden_size=96, intermediate_size=160, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    linear_key_head_dim=16, linear_value_head_dim=24, linear_num_key_heads=2, linear_num_value_heads=6,
    linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
)
ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
        "mrope_interleaved": True}


def mrope_section(rotary_dim: int) -> list[int]:
    """MRoPE sections covering rotary_dim/2 frequencies (temporal gets the remainder). Text-only
    positions make the split irrelevant numerically, but contracts require it to add up."""
    half = rotary_dim // 2
    return [half - 2 * (half // 4), half // 4, half // 4]
PROMPT = [5, 77, 301, 12, 9, 250, 64, 3, 199, 42, 128, 7]


def bf16_round(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(torch.float32)


def make_hf_model(seed: int = 0, **overrides):
    """A tiny random Qwen3_5ForCausalLM (eager, fp32, eval) whose parameters are bf16-exact.

    HF's default init (std 0.02, zero norm weights) gives near-zero logits; weights are redrawn at
    ~1/sqrt(fan_in) and norm weights perturbed so every op (incl. the 1+w scales) matters.
    """
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    kw = {**TINY, **overrides}
    rope = {**ROPE, "mrope_section": mrope_section(int(kw["head_dim"] * ROPE["partial_rotary_factor"]))}
    cfg = Qwen3_5TextConfig(**kw, rope_parameters=rope, attn_implementation="eager")
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif "norm" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.5, 4.0, generator=g).log())
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("conv1d.weight"):
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
                # Residual-branch outputs scaled down (as trained models are): with unit-gain
                # branches a random 4-layer net is chaotic — a 2% weight perturbation moves the
                # logits by ~20% — which would make the quantized-artifact bound meaningless.
                p.copy_(0.25 * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            else:  # [N, K] input projections
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            p.copy_(bf16_round(p))
    return model


def spec_for(cfg, *, model_id: str = "tiny-hf", mtp: bool = False) -> SimpleNamespace:
    """A ModelSpec-shaped namespace for an HF text config (dims/params/layer_kinds/parts/views)."""
    rp = cfg.rope_parameters
    dims = dict(
        vocab_rows=cfg.vocab_size, hidden=cfg.hidden_size, layers=cfg.num_hidden_layers,
        intermediate=cfg.intermediate_size, attn_heads=cfg.num_attention_heads,
        kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        rotary_dim=int(cfg.head_dim * rp.get("partial_rotary_factor", 0.25)),
        gdn_k_heads=cfg.linear_num_key_heads, gdn_k_dim=cfg.linear_key_head_dim,
        gdn_v_heads=cfg.linear_num_value_heads, gdn_v_dim=cfg.linear_value_head_dim,
        conv_kernel=cfg.linear_conv_kernel_dim,
    )
    if mtp:
        dims["mtp_layers"] = 1
    kinds = ["attention" if t == "full_attention" else "gdn" for t in cfg.layer_types]
    return SimpleNamespace(
        model_id=model_id, family="qwen3_5_hybrid", dims=dims,
        params=dict(rms_eps=cfg.rms_norm_eps, rope_theta=rp["rope_theta"]),
        layer_kinds=kinds, parts={"text": True, "mtp": mtp}, views={},
    )


def random_hf_mtp(cfg, seed: int = 7) -> dict[str, torch.Tensor]:
    """bf16-exact random MTP tensors under the checkpoint's `mtp.*` names (HF >= 5 has no
    Qwen3_5 MTP module, so they are made here and converted with the text weights)."""
    H, I, D, Hq, Hkv = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim,
                        cfg.num_attention_heads, cfg.num_key_value_heads)
    g = torch.Generator().manual_seed(seed)

    def mat(n, k):
        return bf16_round(torch.randn(n, k, generator=g) / math.sqrt(k))

    def norm(n):
        return bf16_round(0.2 * torch.randn(n, generator=g))

    m = "mtp.layers.0."
    return {
        "mtp.fc.weight": mat(H, 2 * H),
        "mtp.pre_fc_norm_embedding.weight": norm(H), "mtp.pre_fc_norm_hidden.weight": norm(H),
        m + "input_layernorm.weight": norm(H),
        m + "self_attn.q_proj.weight": mat(2 * Hq * D, H),      # per head [query | gate]
        m + "self_attn.k_proj.weight": mat(Hkv * D, H),
        m + "self_attn.v_proj.weight": mat(Hkv * D, H),
        m + "self_attn.o_proj.weight": mat(H, Hq * D),
        m + "self_attn.q_norm.weight": norm(D), m + "self_attn.k_norm.weight": norm(D),
        m + "post_attention_layernorm.weight": norm(H),
        m + "mlp.gate_proj.weight": mat(I, H), m + "mlp.up_proj.weight": mat(I, H),
        m + "mlp.down_proj.weight": mat(H, I),
        "mtp.norm.weight": norm(H),
    }


def ninfer_dict(model, *, mtp: bool = False) -> dict[str, torch.Tensor]:
    """NInfer logical tensors of `model` through the project's converter (+ random MTP)."""
    from ninfer_compile.convert.hf import convert_state_dict

    sd = dict(model.state_dict())
    if mtp:
        sd.update(random_hf_mtp(model.config))
    return convert_state_dict(model.config.to_dict(), sd)


@torch.no_grad()
def hf_logits(model, tokens: list[int]) -> torch.Tensor:
    """[T, V] float32 logits of one full-prompt forward (no cache)."""
    return model(torch.tensor([tokens]), use_cache=False).logits[0].float()


def rel_l2(a, b) -> float:
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).norm() / b.norm())
