"""The hybrid model's dimensions, read once from a resolved `ModelSpec`.

One record serves both the IR lowering (`ir/lower.py`) and the torch reference / float64 oracle
(`reference/`). No torch import: the compile path reads headers only.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ContractError

_NEEDED = ("vocab_rows", "hidden", "layers", "attn_heads", "kv_heads", "head_dim",
           "gdn_k_heads", "gdn_k_dim", "gdn_v_heads", "gdn_v_dim", "conv_kernel")
# The feed-forward block of every text/MTP layer: a dense SwiGLU MLP, or (family qwen3_5_moe) a
# sparse mixture of experts with a gated shared expert.
_DENSE_NEEDED = ("intermediate",)
_MOE_NEEDED = ("experts", "experts_per_token", "expert_intermediate", "shared_intermediate")


@dataclass(frozen=True)
class HybridDims:
    """The concrete dimensions and numeric parameters the hybrid text/MTP math needs."""

    vocab_rows: int
    hidden: int
    layers: int
    intermediate: int
    attn_heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int
    gdn_k_heads: int
    gdn_k_dim: int
    gdn_v_heads: int
    gdn_v_dim: int
    conv_kernel: int
    rms_eps: float
    rope_theta: float
    layer_kinds: tuple[str, ...]
    has_mtp: bool
    # sparse MoE (family qwen3_5_moe); 0 for the dense family, whose layers use `intermediate`
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    # The L2 norm of GDN q/k uses a fixed epsilon (HF `l2norm`, FLA): not the RMSNorm epsilon.
    l2_eps: float = 1e-6

    @classmethod
    def from_spec(cls, spec) -> HybridDims:
        """Read a resolved ModelSpec (dims, params, layer_kinds, parts); ContractError if bad."""
        mid = getattr(spec, "model_id", "?")
        d = dict(spec.dims)
        p = dict(getattr(spec, "params", None) or {})
        moe = getattr(spec, "family", None) == "qwen3_5_moe"
        missing = [k for k in _NEEDED + (_MOE_NEEDED if moe else _DENSE_NEEDED) if k not in d]
        if missing:
            raise ContractError(f"contract {mid}: missing dims {', '.join(missing)}")
        rotary = d.get("rotary_dim")
        if rotary is None:
            rotary = int(d["head_dim"] * float(p.get("partial_rotary_factor") or 0.25))
        kinds = tuple(spec.layer_kinds)
        if len(kinds) != d["layers"] or any(k not in ("attention", "gdn") for k in kinds):
            raise ContractError(f"contract {mid}: layer_kinds {list(kinds)} do not match {d['layers']} layers")
        if d["attn_heads"] % d["kv_heads"] or d["gdn_v_heads"] % d["gdn_k_heads"]:
            raise ContractError(f"contract {mid}: head counts must divide (attn_heads/kv_heads, gdn_v/gdn_k)")
        if rotary % 2 or rotary > d["head_dim"]:
            raise ContractError(f"contract {mid}: rotary_dim {rotary} must be even and <= head_dim")
        parts = dict(getattr(spec, "parts", None) or {})
        return cls(
            vocab_rows=d["vocab_rows"], hidden=d["hidden"], layers=d["layers"], intermediate=d.get("intermediate", 0),
            attn_heads=d["attn_heads"], kv_heads=d["kv_heads"], head_dim=d["head_dim"], rotary_dim=int(rotary),
            gdn_k_heads=d["gdn_k_heads"], gdn_k_dim=d["gdn_k_dim"], gdn_v_heads=d["gdn_v_heads"],
            gdn_v_dim=d["gdn_v_dim"], conv_kernel=d["conv_kernel"], rms_eps=float(p.get("rms_eps") or 1e-6),
            rope_theta=float(p.get("rope_theta") or 1e7), layer_kinds=kinds,
            has_mtp=bool(parts.get("mtp", False)),
            **({k: d[k] for k in _MOE_NEEDED} if moe else {}))

    @property
    def is_moe(self) -> bool:
        """Whether the feed-forward block of every layer is a sparse mixture of experts."""
        return self.experts > 0

    @property
    def q_width(self) -> int:
        return self.attn_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def gdn_k_width(self) -> int:
        return self.gdn_k_heads * self.gdn_k_dim

    @property
    def gdn_v_width(self) -> int:
        return self.gdn_v_heads * self.gdn_v_dim

    @property
    def conv_channels(self) -> int:
        return 2 * self.gdn_k_width + self.gdn_v_width


__all__ = ["HybridDims"]
