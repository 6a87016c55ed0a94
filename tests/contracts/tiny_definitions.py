"""The tiny test contracts in graphs/, as render_contract inputs over the qwen3.6-27b structure.

The shipped `graphs/tiny-*.yaml` files are exactly `render_contract(qwen3.6-27b, ...)` of these
definitions (a test checks it), so they differ from the 27B only in dimensions, params, parts
and formats. Regenerate after changing a definition or the 27B structure:

    .venv/bin/python tests/contracts/tiny_definitions.py
"""

from __future__ import annotations

from pathlib import Path

TINY_TEXT_DIMS = dict(
    vocab_rows=256, hidden=96, layers=4, intermediate=160, attn_heads=4, kv_heads=2, head_dim=32,
    rotary_dim=8, gdn_k_heads=2, gdn_k_dim=16, gdn_v_heads=4, gdn_v_dim=24, conv_kernel=4,
    full_attention_interval=4,
)
TINY_MTP_DIMS = dict(
    vocab_rows=320, hidden=160, layers=8, intermediate=224, attn_heads=4, kv_heads=1, head_dim=32,
    rotary_dim=8, gdn_k_heads=2, gdn_k_dim=32, gdn_v_heads=6, gdn_v_dim=24, conv_kernel=4,
    full_attention_interval=4, mtp_layers=1, draft_rows=128,
)
TINY_FULL_DIMS = dict(
    TINY_MTP_DIMS, vocab_rows=384, hidden=128, intermediate=192, draft_rows=96,
    vision_depth=2, vision_hidden=48, vision_intermediate=80, vision_heads=4, vision_patch_in=96,
    vision_positions=64, vision_merge_in=192, vision_out=128,
)

# model_id -> (note, dims, params, parts)
TINY_CONTRACTS: dict[str, tuple[str, dict, dict, dict]] = {
    "tiny-qwen3.5": (
        "Tiny text-only test model; maps onto a Hugging Face Qwen3_5ForCausalLM tiny config\n"
        "(hidden_size 96, 4 layers with layer 3 full attention, partial_rotary_factor 0.25).\n"
        "hidden 96 and intermediate 160 are deliberately not multiples of 128 (row-split K padding).\n"
        "Frontend resources are optional: a random HF checkpoint has no tokenizer.",
        TINY_TEXT_DIMS,
        dict(rms_eps=1e-6, rope_theta=10000.0, partial_rotary_factor=0.25, token_ids=256, max_positions=512),
        dict(mtp="absent", draft_head="absent", vision="absent", frontend="optional"),
    ),
    "tiny-qwen3.5-mtp": (
        "Tiny test model with the MTP part (W8G32 matrices), 8 layers (3 and 7 full attention),\n"
        "hidden 160, interleaved MRoPE like the 27B, 20 padded vocabulary rows (token_ids 300 <\n"
        "vocab_rows 320), three value heads per key head like the 27B, one KV head.\n"
        "The optimized draft head and the frontend resources are optional (all or nothing).",
        TINY_MTP_DIMS,
        dict(rms_eps=1e-6, rope_theta=10000000.0, partial_rotary_factor=0.25, mrope_section=[2, 1, 1],
             mrope_interleaved=True, token_ids=300, max_positions=1024),
        dict(mtp="required", draft_head="optional", vision="absent", frontend="optional"),
    ),
    "tiny-qwen3.6-full": (
        "Tiny model with every part of the 27B product image required (text, draft head, MTP,\n"
        "vision, six frontend resources): the complete inventory structure at test size.",
        TINY_FULL_DIMS,
        dict(rms_eps=1e-6, rope_theta=10000000.0, partial_rotary_factor=0.25, mrope_section=[2, 1, 1],
             mrope_interleaved=True, token_ids=370, max_positions=1024, vision_rope_theta=10000.0),
        dict(mtp="required", draft_head="required", vision="required", frontend="required"),
    ),
}


def render_tiny(model_id: str) -> str:
    from ninfer_compile.contracts import render_contract

    note, dims, params, parts = TINY_CONTRACTS[model_id]
    text = render_contract("qwen3.6-27b", model_id, dims, params, parts=parts)
    return "".join(f"# {line}\n" for line in note.splitlines()) + text


if __name__ == "__main__":
    from ninfer_compile.contracts import GRAPHS_DIR

    for model_id in TINY_CONTRACTS:
        path = Path(GRAPHS_DIR) / f"{model_id}.yaml"
        path.write_text(render_tiny(model_id), encoding="utf-8")
        print(f"wrote {path}")
