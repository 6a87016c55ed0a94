"""Route registrations of token selection."""

from ninfer_compile.kernels.registry import Route, RouteDomain, register

_M = "ninfer_compile.kernels.sampling"

register(Route(
    name="sample_per_slot", family="sampling", domain=RouteDomain(extra={"mode": ("per_slot",)}),
    reference=f"{_M}.reference:sample", launcher=f"{_M}.launch:sample",
    kernels=(f"{_M}.kernels:block_max_kernel", f"{_M}.kernels:threshold_kernel",
             f"{_M}.kernels:gumbel_block_kernel", f"{_M}.kernels:gumbel_final_kernel"),
    workspace=f"{_M}.spec:workspace_numel",
    doc="per-row greedy / temperature / top-k / top-p (exact thresholds by key bisection, then Gumbel-max "
        "with seeded Philox noise); parameters from per-row device inputs; graph-capturable",
))
