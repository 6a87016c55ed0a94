"""Route registration of the KV-cache append."""

from ninfer_compile.kernels.registry import Route, RouteDomain, register

from .formats import KV_MATCH

_M = "ninfer_compile.kernels.kv_cache"

register(Route(
    name="kv_append_rows", family="kv_append",
    domain=RouteDomain(extra={"kv_dtype": tuple(KV_MATCH.values())}),
    reference=f"{_M}.reference:kv_append", launcher=f"{_M}.launch:kv_append",
    kernels=(f"{_M}.kernels:kv_append_kernel",),
    doc="write K/V columns at cache[slot, position]: bf16 copy, int8 with one fp16 scale per 64 (amax/127), or "
        "any other KV format of kv_cache/formats.py (quantize on append; rotations first)",
))
