"""Route registrations of the RoPE family."""

from ninfer_compile.kernels.registry import Route, RouteDomain, register

_M = "ninfer_compile.kernels.rope"

register(Route(
    name="rope_neox_partial", family="rope", domain=RouteDomain(),
    reference=f"{_M}.reference:rope", launcher=f"{_M}.launch:rope",
    kernels=(f"{_M}.kernels:rope_kernel",),
    doc="partial NeoX RoPE over the first rotary_dim dims of each head, per-column positions; in place allowed",
))
register(Route(
    name="qk_norm_rope_fused", family="qk_norm_rope", domain=RouteDomain(),
    reference=f"{_M}.reference:qk_norm_rope", launcher=f"{_M}.launch:qk_norm_rope",
    kernels=(f"{_M}.kernels:qk_norm_rope_kernel",),
    doc="q and k head RMSNorm (1+w) + partial NeoX RoPE in one launch (replaces 2x head_rmsnorm + 2x rope)",
))
