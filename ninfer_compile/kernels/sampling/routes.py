"""Route registrations of token selection."""

from ninfer_compile.kernels.registry import Route, RouteDomain, register

_M = "ninfer_compile.kernels.sampling"

register(Route(
    name="argmax_two_stage", family="sampling", domain=RouteDomain(extra={"mode": ("greedy",)}),
    reference=f"{_M}.reference:argmax", launcher=f"{_M}.launch:argmax",
    kernels=(f"{_M}.kernels:select_stage1_kernel", f"{_M}.kernels:select_stage2_kernel"),
    doc="greedy: block max + first index, then merge (float32 workspace select_workspace_numel(T, V))",
))
register(Route(
    name="sample_gumbel_two_stage", family="sampling", domain=RouteDomain(extra={"mode": ("temperature",)}),
    reference=f"{_M}.reference:filtered_probs", launcher=f"{_M}.launch:sample_gumbel",
    kernels=(f"{_M}.kernels:select_stage1_kernel", f"{_M}.kernels:select_stage2_kernel"),
    doc="temperature sampling by Gumbel-max with seeded Philox noise; no top-k/top-p; graph-capturable",
))
register(Route(
    name="sample_top_k_top_p_torch", family="sampling",
    domain=RouteDomain(extra={"mode": ("temperature", "top_k_top_p")}),
    reference=f"{_M}.reference:filtered_probs", launcher=f"{_M}.launch:sample",
    kernels=(),
    doc="temperature + top-k + top-p via torch sort/multinomial (allocates; not CUDA-graph capturable)",
))
