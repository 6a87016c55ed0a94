"""Route registrations of gated GQA attention over the KV cache."""

from ninfer_compile.kernels.registry import ParamSpec, Route, RouteDomain, register

from ..kv_cache.formats import KV_MATCH

_M = "ninfer_compile.kernels.attention"
_KV = tuple(KV_MATCH.values())  # every KV format (kv_cache/formats.py); dequantized on load

def _split_kv_params(num_warps: int) -> dict:
    """The params of the split-KV routes (decode and packed verify), `num_warps` their default."""
    return {
        "split_tokens": ParamSpec("split_tokens", (256, 512, 1024, 2048, 4096), 512, "cache rows per split"),
        "balance": ParamSpec("balance", ("ctx", "fixed"), "ctx",
                             "fixed = splits of split_tokens rows; ctx = each column's depth spread over all "
                             "cdiv(max_ctx, split_tokens) splits (every program busy at any depth; the packed "
                             "verify route: the row's deepest column)"),
        "block_n": ParamSpec("block_n", (32, 64, 128), 64),
        "num_warps": ParamSpec("num_warps", (2, 4, 8), num_warps),
    }


register(Route(
    name="attention_decode_splitkv", family="attention",
    domain=RouteDomain(max_t=128, extra={"kv_dtype": _KV, "phase": ("decode", "verify")}),
    params=_split_kv_params(4),
    reference=f"{_M}.reference:attention", launcher=f"{_M}.launch:attention_decode",
    workspace=f"{_M}.routes:decode_workspace",
    kernels=(f"{_M}.kernels:attn_decode_kernel", f"{_M}.kernels:attn_decode_reduce_kernel"),
    doc="flash-decoding: per (column, KV head, split) with the GQA group as dot rows; split merge + sigmoid gate; "
        "float32 workspace decode_workspace_numel(T, Hq, D, max_ctx, split_tokens) when max_ctx > split_tokens",
))
register(Route(
    name="attention_verify_packed", family="attention",
    domain=RouteDomain(max_t=128, extra={"kv_dtype": _KV, "phase": ("verify",)}),
    # num_warps 8: the 27B's W x G = 24 packed rows at head dim 256 take 254 registers without spills
    # (ptxas sm_90a, triton 3.9); at 4 warps 255 + 208 B of stack
    params=_split_kv_params(8),
    reference=f"{_M}.reference:attention", launcher=f"{_M}.launch:attention_verify",
    workspace=f"{_M}.routes:decode_workspace",
    kernels=(f"{_M}.kernels:attn_verify_kernel", f"{_M}.kernels:attn_decode_reduce_kernel"),
    doc="verify rows (attribute window W): per (row, KV head, split) with the row's W x G query heads as dot rows, "
        "so a row reads its cache rows once; causal within the row; the split-KV workspace and reduce of "
        "attention_decode_splitkv",
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


# ------------------------------------------------------------------ workspace sizing (pure arithmetic)

def decode_workspace_numel(T: int, Hq: int, D: int, max_ctx: int, split_tokens: int = 512) -> int:
    """float32 elements of the split-KV decode workspace (0 when one split covers the cache): the
    per-split partial outputs [T, Hq, splits, D] and their running max / sum [T, Hq, splits, 2]."""
    ns = -(-int(max_ctx) // int(split_tokens))
    return 0 if ns == 1 else int(T) * int(Hq) * ns * (int(D) + 2)


def decode_workspace(view, params) -> int:
    """Route workspace hook of attention_decode_splitkv (`Route.workspace`): q [T, Hq, D], the cache's
    max context (k_cache [slots, ctx, Hkv, D]) and the route's `split_tokens`."""
    T, Hq, D = view.shape("q")
    return decode_workspace_numel(T, Hq, D, view.shape("k_cache")[1], int(params.get("split_tokens", 512)))
