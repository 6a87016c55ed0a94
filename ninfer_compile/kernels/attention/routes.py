"""Route registrations of gated GQA attention over the KV cache."""

from ninfer_compile.kernels.registry import ParamSpec, Route, RouteDomain, register

_M = "ninfer_compile.kernels.attention"
_KV = ("bf16", "int8_g64")

register(Route(
    name="attention_decode_splitkv", family="attention",
    domain=RouteDomain(max_t=64, extra={"kv_dtype": _KV, "phase": ("decode",)}),
    params={
        "split_tokens": ParamSpec("split_tokens", (256, 512, 1024, 2048, 4096), 512, "cache rows per split"),
        "balance": ParamSpec("balance", ("ctx", "fixed"), "ctx",
                             "fixed = splits of split_tokens rows; ctx = each column's depth spread over all "
                             "cdiv(max_ctx, split_tokens) splits (every program busy at any depth)"),
        "block_n": ParamSpec("block_n", (32, 64, 128), 64),
        "num_warps": ParamSpec("num_warps", (2, 4, 8), 4),
    },
    reference=f"{_M}.reference:attention", launcher=f"{_M}.launch:attention_decode",
    kernels=(f"{_M}.kernels:attn_decode_kernel", f"{_M}.kernels:attn_decode_reduce_kernel"),
    doc="flash-decoding: per (column, KV head, split) with the GQA group as dot rows; split merge + sigmoid gate; "
        "float32 workspace decode_workspace_numel(T, Hq, D, max_ctx, split_tokens) when max_ctx > split_tokens",
))
register(Route(
    name="attention_prefill_flash", family="attention",
    domain=RouteDomain(extra={"kv_dtype": _KV, "phase": ("prefill",)}),
    params={
        "block_m": ParamSpec("block_m", (16, 32, 64, 128), 64),
        "block_n": ParamSpec("block_n", (16, 32, 64), 32),
        "num_warps": ParamSpec("num_warps", (4, 8), 8),
    },
    reference=f"{_M}.reference:attention", launcher=f"{_M}.launch:attention_prefill",
    kernels=(f"{_M}.kernels:attn_prefill_kernel",),
    doc="one sequence per launch, any T: causal flash attention over the slot's cached prefix + the chunk",
))
