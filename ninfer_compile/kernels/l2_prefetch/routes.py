"""Route registration of `l2_prefetch` (no torch / triton imports)."""

from ninfer_compile.kernels.registry import ParamSpec, Route, RouteDomain, register

_M = "ninfer_compile.kernels.l2_prefetch"

register(Route(
    name="l2_prefetch_bulk", family="l2_prefetch", domain=RouteDomain(),
    params={
        "BYTES": ParamSpec("BYTES", (1 << 22, 1 << 23, 1 << 24, 1 << 25, 1 << 26), 1 << 24,
                           "bytes of the weight issued to L2 (its first rows, every plane in proportion; "
                           "at most the whole weight)"),
        "PIECE": ParamSpec("PIECE", (1 << 19, 1 << 20, 1 << 21), 1 << 20,
                           "bytes per program: 32 lanes, one cp.async.bulk.prefetch.L2 each"),
        "FOLD": ParamSpec("FOLD", (False, True), False,
                          "plan_l2_prefetch hands the prefetch to the run's first op when its family takes "
                          "a `prefetch` operand (rmsnorm) instead of adding a launch; read by the pass"),
    },
    reference=f"{_M}.reference:l2_prefetch", launcher=f"{_M}.launch:l2_prefetch",
    kernels=(f"{_M}.kernels:l2_prefetch_kernel",),
    doc="cp.async.bulk.prefetch.L2 of the first BYTES of a weight's planes (sm_90+; a no-op elsewhere)",
))
