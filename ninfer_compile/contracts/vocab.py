"""Closed vocabularies of model contracts, and the family rules (which dimensions a family knows,
which part needs which, the invariants its math relies on). Plain data: no pydantic, no YAML."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

PART_NAMES: tuple[str, ...] = ("text", "mtp", "draft_head", "vision", "frontend", "dflash", "dflash2")
LAYER_KINDS: tuple[str, ...] = ("attention", "gdn")

# Registered NInfer tensor formats and the one storage layout each may use. The artifact reader
# owns the byte-level definitions; a contract only needs the names and which layout goes with
# them (a quantized format is only legal as a rank-2 row-split matrix).
DIRECT_LAYOUT = "contiguous-le-v1"
ROW_SPLIT_LAYOUT = "row-split-k128-v1"
RESOURCE_ENCODING = "raw-bytes-v1"
FORMAT_LAYOUTS: dict[str, str] = {
    "BF16": DIRECT_LAYOUT,
    "FP32": DIRECT_LAYOUT,
    "I32": DIRECT_LAYOUT,
    "Q4G64_F16S": ROW_SPLIT_LAYOUT,
    "Q5G64_F16S": ROW_SPLIT_LAYOUT,
    "Q6G64_F16S": ROW_SPLIT_LAYOUT,
    "W8G32_F16S": ROW_SPLIT_LAYOUT,
}

PartName = Literal["text", "mtp", "draft_head", "vision", "frontend", "dflash", "dflash2"]
PartStatus = Literal["required", "optional", "absent"]
FormatName = Literal["BF16", "FP32", "I32", "Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]
LayerKind = Literal["attention", "gdn"]

# A model id is used as a file name (graphs/<id>.yaml), so it may not contain path syntax.
MODEL_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
IDENTIFIER_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"


# --------------------------------------------------------------------------------------------
# Family rules: which dimensions exist and the invariants the family's math relies on.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FamilyRules:
    """Dimension names a family knows, which part needs which, and cross-dimension invariants."""

    text_dims: tuple[str, ...]
    optional_text_dims: tuple[str, ...]
    part_dims: dict[str, tuple[str, ...]]
    # (dims the rule reads, predicate over (dims, params), message). The error points at the
    # first dim's line.
    invariants: tuple[tuple[tuple[str, ...], Callable[[dict, dict], bool], str], ...]

    @property
    def known_dims(self) -> set[str]:
        out = set(self.text_dims) | set(self.optional_text_dims)
        for names in self.part_dims.values():
            out |= set(names)
        return out


# Dims of the parts every family may carry (the drafter companions and the vision tower).
_PART_DIMS: dict[str, tuple[str, ...]] = {
    "mtp": ("mtp_layers",),
    "draft_head": ("draft_rows",),
    "vision": (
        "vision_depth", "vision_hidden", "vision_intermediate", "vision_heads",
        "vision_patch_in", "vision_positions", "vision_merge_in", "vision_out",
    ),
    # DFlash: dense non-causal draft blocks fed by `dflash_features` captured target layers.
    "dflash": ("dflash_layers", "dflash_intermediate", "dflash_heads", "dflash_kv_heads", "dflash_head_dim",
               "dflash_features"),
    # DFlash2: DFlash plus dynamic convolutions around attention and MLP and a candidate selector.
    "dflash2": ("dflash2_layers", "dflash2_intermediate", "dflash2_heads", "dflash2_kv_heads",
                "dflash2_head_dim", "dflash2_features", "dflash2_conv_sides", "dflash2_conv_taps",
                "dflash2_conv_group_size", "dflash2_selector_rank"),
}

_HYBRID_TEXT_DIMS = ("vocab_rows", "hidden", "layers", "attn_heads", "kv_heads", "head_dim", "rotary_dim",
                     "gdn_k_heads", "gdn_k_dim", "gdn_v_heads", "gdn_v_dim", "conv_kernel")

_HYBRID_INVARIANTS: tuple = (
    (("attn_heads", "kv_heads"), lambda d, p: d["attn_heads"] % d["kv_heads"] == 0,
     "attn_heads must be a multiple of kv_heads (grouped-query attention)"),
    (("gdn_v_heads", "gdn_k_heads"), lambda d, p: d["gdn_v_heads"] % d["gdn_k_heads"] == 0,
     "gdn_v_heads must be a multiple of gdn_k_heads (value heads share key heads)"),
    (("rotary_dim", "head_dim"),
     lambda d, p: d["rotary_dim"] <= d["head_dim"] and d["rotary_dim"] % 2 == 0,
     "rotary_dim must be even and at most head_dim (NeoX partial rotary)"),
    (("rotary_dim",),
     lambda d, p: p.get("mrope_section") is None or 2 * sum(p["mrope_section"]) == d["rotary_dim"],
     "params.mrope_section must sum to rotary_dim/2 (one frequency per rotated pair)"),
    (("rotary_dim", "head_dim"),
     lambda d, p: p.get("partial_rotary_factor") is None
     or abs(p["partial_rotary_factor"] * d["head_dim"] - d["rotary_dim"]) < 1e-6,
     "params.partial_rotary_factor must equal rotary_dim/head_dim"),
    (("vocab_rows",), lambda d, p: p["token_ids"] <= d["vocab_rows"],
     "params.token_ids must not exceed vocab_rows"),
    (("mtp_layers",), lambda d, p: d.get("mtp_layers", 1) == 1,
     "mtp_layers must be 1 (the NInfer MTP inventory holds one unindexed layer)"),
    (("draft_rows",), lambda d, p: d.get("draft_rows", 0) <= p["token_ids"],
     "draft_rows must not exceed params.token_ids (draft rows are distinct token ids)"),
    (("vision_out",), lambda d, p: d.get("vision_out", d["hidden"]) == d["hidden"],
     "vision_out must equal hidden (merged vision tokens replace text embeddings)"),
    (("vision_hidden", "vision_heads"),
     lambda d, p: "vision_hidden" not in d or "vision_heads" not in d
     or d["vision_hidden"] % d["vision_heads"] == 0,
     "vision_hidden must be a multiple of vision_heads"),
    (("layers",),
     lambda d, p: not p.get("dflash_target_layers")
     or (len(p["dflash_target_layers"]) == d.get("dflash_features", d.get("dflash2_features"))
         and all(0 <= t < d["layers"] for t in p["dflash_target_layers"])),
     "params.dflash_target_layers must hold dflash_features (or dflash2_features) text layer indices"),
    (("vocab_rows",), lambda d, p: p.get("dflash_mask_row") is None or p["dflash_mask_row"] < d["vocab_rows"],
     "params.dflash_mask_row must be an embedding row (< vocab_rows)"),
)

FAMILIES: dict[str, FamilyRules] = {
    "qwen3_5_hybrid": FamilyRules(
        text_dims=_HYBRID_TEXT_DIMS + ("intermediate",),
        # Only needed when the layer pattern is written as `attention_every`.
        optional_text_dims=("full_attention_interval",),
        part_dims=_PART_DIMS,
        invariants=_HYBRID_INVARIANTS,
    ),
    # The same hybrid stack with a sparse mixture-of-experts block in place of every dense MLP
    # (text and MTP): `experts` routed SwiGLU experts of width `expert_intermediate`, the top
    # `experts_per_token` chosen per token, plus one always-on gated shared expert.
    "qwen3_5_moe": FamilyRules(
        text_dims=_HYBRID_TEXT_DIMS + ("experts", "experts_per_token", "expert_intermediate",
                                       "shared_intermediate"),
        optional_text_dims=("full_attention_interval",),
        part_dims=_PART_DIMS,
        invariants=_HYBRID_INVARIANTS + (
            (("experts_per_token", "experts"), lambda d, p: d["experts_per_token"] <= d["experts"],
             "experts_per_token must not exceed experts"),
        ),
    ),
}
