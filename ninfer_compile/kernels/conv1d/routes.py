"""Route registrations of the causal conv1d family."""

from ninfer_compile.kernels.registry import Route, RouteDomain, register

_M = "ninfer_compile.kernels.conv1d"

register(Route(
    name="conv1d_decode", family="conv1d",
    domain=RouteDomain(max_t=64, extra={"phase": ("decode",)}),
    reference=f"{_M}.reference:conv1d", launcher=f"{_M}.launch:conv1d_decode",
    kernels=(f"{_M}.kernels:conv1d_kernel",),
    doc="one column per sequence (distinct slots); output + state roll fused in one kernel",
))
register(Route(
    name="conv1d_prefill", family="conv1d",
    domain=RouteDomain(extra={"phase": ("prefill", "decode")}),
    reference=f"{_M}.reference:conv1d", launcher=f"{_M}.launch:conv1d_prefill",
    kernels=(f"{_M}.kernels:conv1d_kernel", f"{_M}.kernels:conv1d_state_kernel"),
    doc="any T; each slot's columns one contiguous run of consecutive positions; output then state kernel",
))
