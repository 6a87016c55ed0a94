"""Route registration of `state_select` (the rollback copy after a verify round)."""

from ninfer_compile.kernels.registry import ParamSpec, Route, RouteDomain, register

_M = "ninfer_compile.kernels.spec_state"

register(Route(
    name="state_select_copy", family="state_select", domain=RouteDomain(max_t=128),
    params={
        "BLOCK": ParamSpec("BLOCK", (256, 512, 1024, 2048, 4096), 1024, "per-slot state elements per program"),
        "num_warps": ParamSpec("num_warps", (1, 2, 4, 8), 4),
    },
    reference=f"{_M}.reference:state_select", launcher=f"{_M}.launch:state_select",
    kernels=(f"{_M}.kernels:state_select_kernel",),
    doc="state[slot of row r] = columns[r, accepted[r]] where accepted[r] < K; any state shape / dtype "
        "(flattened per slot); grid (C, cdiv(N, BLOCK)); a row with accepted >= K copies nothing",
))
