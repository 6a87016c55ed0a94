"""Route registrations of speculative acceptance."""

from ninfer_compile.kernels.registry import Route, RouteDomain, register

_M = "ninfer_compile.kernels.spec_accept"

register(Route(
    name="spec_accept_rows", family="spec_accept", domain=RouteDomain(),
    reference=f"{_M}.reference:spec_accept", launcher=f"{_M}.launch:spec_accept",
    kernels=("ninfer_compile.kernels.sampling.kernels:block_max_kernel",
             "ninfer_compile.kernels.sampling.kernels:threshold_kernel",
             f"{_M}.kernels:residual_block_kernel", f"{_M}.kernels:accept_rows_kernel"),
    workspace=f"{_M}.sizing:workspace_numel",
    doc="per verify row: greedy prefix match or speculative sampling with a one-hot proposal (the sampling "
        "family's exact top-k / top-p thresholds, Philox accept uniforms, Gumbel-max residual / bonus draws); "
        "four launches, graph-capturable",
))
