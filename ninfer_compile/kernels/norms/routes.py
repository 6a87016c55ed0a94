"""Route registrations of the norm family (no torch/triton imports here)."""

from ninfer_compile.kernels.registry import ParamSpec, Route, RouteDomain, register

_M = "ninfer_compile.kernels.norms"

register(Route(
    name="rmsnorm_rows", family="rmsnorm", domain=RouteDomain(),
    params={"num_warps": ParamSpec("num_warps", ("auto", 1, 2, 4, 8, 16), "auto",
                                   "warps per row (auto: by the row's power-of-two block; 8 at H=5120). "
                                   "At T=1 one program does the whole row: latency, not bytes")},
    reference=f"{_M}.reference:rmsnorm", launcher=f"{_M}.launch:rmsnorm",
    kernels=(f"{_M}.kernels:rmsnorm_rows_kernel",),
    doc="zero-centred (1+w) RMSNorm, one program per token row; any H (masked power-of-two block)",
))
register(Route(
    name="head_rmsnorm_rows", family="head_rmsnorm", domain=RouteDomain(),
    reference=f"{_M}.reference:head_rmsnorm", launcher=f"{_M}.launch:head_rmsnorm",
    kernels=(f"{_M}.kernels:rmsnorm_rows_kernel",),
    doc="per-head (1+w) RMSNorm of q/k [T,heads,D]; strided inputs (slices of fused projections)",
))
register(Route(
    name="gated_rmsnorm_rows", family="gated_rmsnorm", domain=RouteDomain(),
    reference=f"{_M}.reference:gated_rmsnorm", launcher=f"{_M}.launch:gated_rmsnorm",
    kernels=(f"{_M}.kernels:gated_rmsnorm_kernel",),
    doc="GDN output norm RMSNorm(x)*w*SiLU(z) per head -> [T, Hv*Dv]",
))
