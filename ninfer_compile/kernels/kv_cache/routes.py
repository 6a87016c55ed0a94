"""Route registration of the KV-cache append."""

from ninfer_compile.kernels.registry import Route, RouteDomain, register

_M = "ninfer_compile.kernels.kv_cache"

register(Route(
    name="kv_append_rows", family="kv_append",
    domain=RouteDomain(extra={"kv_dtype": ("bf16", "int8_g64")}),
    reference=f"{_M}.reference:kv_append", launcher=f"{_M}.launch:kv_append",
    kernels=(f"{_M}.kernels:kv_append_kernel",),
    doc="write K/V columns at cache[slot, position]; bf16 copy or int8 with one fp16 scale per 64 (amax/127)",
))
