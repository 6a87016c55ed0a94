"""The MoE families are not measured by `ninfer-compile tune` yet (no bench builder: timing them needs a
routing distribution, uniform and skewed, which the MoE GPU issue defines): their entries only place
their hand-written, untimed rows in a written table (after every tunable family)."""

from ninfer_compile.kernels.tuning import TuneSpec

TUNE = (
    TuneSpec(family="moe_router", order=190, builder=None,
             doc="router projection + softmax + top-k: untimed until the MoE GPU issue measures it"),
    TuneSpec(family="moe_experts", order=191, builder=None,
             doc="expert GEMV / grouped GEMM: untimed until the MoE GPU issue measures them"),
)
