"""Route registrations of the causal conv1d family."""

from ninfer_compile.kernels.registry import ParamSpec, Route, RouteDomain, register

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
register(Route(
    name="conv1d_verify", family="conv1d",
    domain=RouteDomain(max_t=128, extra={"phase": ("verify",)}),
    params={
        "block_c": ParamSpec("block_c", (64, 128, 256, 512, 1024), 256, "channels per program"),
        "num_warps": ParamSpec("num_warps", (1, 2, 4, 8), 2),
    },
    reference=f"{_M}.reference:conv1d", launcher=f"{_M}.launch:conv1d_verify",
    kernels=(f"{_M}.kernels:conv1d_verify_kernel",),
    doc="verify rows (attribute window W): grid (C = T/W, channel blocks); the row's W outputs, "
        "conv_state_columns (its last K-1 inputs after each of the first W-1 columns) and the final state "
        "in one kernel",
))
