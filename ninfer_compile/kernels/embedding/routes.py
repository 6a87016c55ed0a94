"""Route registrations of the embedding lookup."""

from ninfer_compile.kernels.registry import Route, RouteDomain, register

_M = "ninfer_compile.kernels.embedding"

register(Route(
    name="embedding_rowsplit", family="embedding",
    domain=RouteDomain(formats=("Q6G64_F16S", "Q5G64_F16S", "Q4G64_F16S", "W8G32_F16S")),
    reference=f"{_M}.reference:embedding", launcher=f"{_M}.launch:embedding",
    kernels=(f"{_M}.kernels:embed_rowsplit_kernel",),
    doc="row gather straight from the stored row-split planes (QuantWeight), dequantised to bf16",
))
register(Route(
    name="embedding_bf16", family="embedding", domain=RouteDomain(formats=("BF16",)),
    reference=f"{_M}.reference:embedding", launcher=f"{_M}.launch:embedding",
    kernels=(f"{_M}.kernels:embed_dense_kernel",),
    doc="row gather from a bf16 [V, H] table",
))
