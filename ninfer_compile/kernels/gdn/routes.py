"""Route registrations of the Gated DeltaNet family (gdn_gating, gdn_gating_proj, gated_delta_rule)."""

from ninfer_compile.kernels.registry import ParamSpec, Route, RouteDomain, register

_M = "ninfer_compile.kernels.gdn"

register(Route(
    name="gdn_gating_elementwise", family="gdn_gating", domain=RouteDomain(),
    reference=f"{_M}.reference:gdn_gating", launcher=f"{_M}.launch:gdn_gating",
    kernels=(f"{_M}.kernels:gdn_gating_kernel",),
    doc="g = -exp(A_log)*softplus(a+dt_bias), beta = sigmoid(b), float32 outputs",
))
register(Route(
    name="gdn_gating_proj_rows", family="gdn_gating_proj",
    domain=RouteDomain(formats=("BF16",), max_t=128, extra={"phase": ("decode", "verify")}),
    params={
        "BLOCK_H": ParamSpec("BLOCK_H", (1, 2, 4, 8), 1, "value heads (rows of Wa and Wb) per program"),
        "BLOCK_T": ParamSpec("BLOCK_T", (1, 2, 4, 8), 1, "token columns per program (weight reuse)"),
        "BLOCK_K": ParamSpec("BLOCK_K", (256, 512, 1024, 2048, 4096, 8192), 2048,
                             "K elements per loop step (>= K: one step, every load in flight at once)"),
        "num_warps": ParamSpec("num_warps", (1, 2, 4, 8, 16), 8),
    },
    reference=f"{_M}.reference:gdn_gating_proj", launcher=f"{_M}.launch:gdn_gating_proj",
    kernels=(f"{_M}.kernels:gdn_gating_proj_kernel",),
    doc="decode / verify (T <= 128; per column, so several columns of one slot are fine): a = x Wa^T, b = x Wb^T (bf16 [Hv, K], fp32 accumulation, K reduced in "
        "registers across the program's warps) + g / beta in one launch; grid (cdiv(Hv, BLOCK_H), "
        "cdiv(T, BLOCK_T)). Replaces 2x bf16_gemv (+ split-K reduces) + gdn_gating_elementwise",
))
register(Route(
    name="gdn_recurrent_decode", family="gated_delta_rule",
    domain=RouteDomain(max_t=64, extra={"phase": ("decode",)}),
    params={
        "block_v": ParamSpec("block_v", (16, 32, 64, 128), 32, "Dv columns of state per program"),
        "num_warps": ParamSpec("num_warps", (1, 2, 4, 8), 4),
    },
    reference=f"{_M}.reference:gated_delta_rule", launcher=f"{_M}.launch:gated_delta_rule_decode",
    kernels=(f"{_M}.kernels:gdn_decode_kernel",),
    doc="one recurrent step per column, columns = distinct slots; grid (T, Hv, Dv/block_v); q/k L2 norm fused",
))
register(Route(
    name="gdn_recurrent_verify", family="gated_delta_rule",
    domain=RouteDomain(max_t=128, extra={"phase": ("verify",)}),
    params={
        "block_v": ParamSpec("block_v", (16, 32, 64, 128), 32, "Dv columns of state per program"),
        "num_warps": ParamSpec("num_warps", (1, 2, 4, 8), 4),
    },
    reference=f"{_M}.reference:gated_delta_rule", launcher=f"{_M}.launch:gated_delta_rule_verify",
    kernels=(f"{_M}.kernels:gdn_verify_kernel",),
    doc="verify rows (attribute window W): grid (C = T/W, Hv, Dv/block_v); each program walks its row's W "
        "columns with the state block in registers (read once; q/k L2 norm fused), writes the state after "
        "each of the first W-1 columns to state_columns and the final state in place",
))
register(Route(
    name="gdn_chunked_prefill", family="gated_delta_rule",
    domain=RouteDomain(extra={"phase": ("prefill",)}),
    params={
        "block_v": ParamSpec("block_v", (16, 32, 64), 32, "Dv columns per state-passing program"),
        "chunk": ParamSpec("chunk", (16, 32, 64), 64, "chunk length (halved automatically on shared-memory overflow)"),
    },
    reference=f"{_M}.reference:gated_delta_rule", launcher=f"{_M}.launch:gated_delta_rule_chunked",
    workspace=f"{_M}.routes:chunked_workspace",
    kernels=(f"{_M}.kernels:gdn_chunk_prep_kernel", f"{_M}.kernels:gdn_chunk_state_kernel"),
    doc="one sequence per launch, any T; chunk 64 UT transform (chunk-parallel) + sequential state passing; "
        "float32 workspace chunked_workspace_numel(T, Hv, Dk, Dv)",
))
register(Route(
    name="gdn_chunked_wy_prefill", family="gated_delta_rule",
    domain=RouteDomain(extra={"phase": ("prefill",)}),
    params={
        "chunk": ParamSpec("chunk", (64,), 64, "chunk length (four 16-row blocks)"),
        "block_v": ParamSpec("block_v", (32, 64), 64, "Dv columns per state / output program"),
        "num_warps": ParamSpec("num_warps", (4, 8), 4, "warps of the state and output kernels"),
        "num_stages": ParamSpec("num_stages", (1, 2, 3), 2, "software pipelining of the state / output loads"),
    },
    reference=f"{_M}.reference:gated_delta_rule", launcher=f"{_M}.launch_chunked_wy:gated_delta_rule_chunked_wy",
    workspace=f"{_M}.routes:chunked_wy_workspace",
    kernels=(f"{_M}.kernels_chunked_wy:gdn_wy_prep_kernel", f"{_M}.kernels_chunked_wy:gdn_wy_state_kernel",
             f"{_M}.kernels_chunked_wy:gdn_wy_out_kernel"),
    doc="one sequence per launch, any T; chunk 64 WY/UT prep (blocked 16x16 inverse, chunk-parallel) + "
        "bf16 tensor-core state passing (heads x Dv blocks) storing per-chunk states + chunk-parallel output; "
        "float32 workspace launch_chunked_wy.chunked_workspace_numel(T, Hv, Dk, Dv)",
))



# ------------------------------------------------------------------ workspace sizing (pure arithmetic)
WY_CHUNK = 64  # gdn_chunked_wy_prefill's chunk (launch_chunked_wy.CHUNK)


def chunked_workspace_numel(T: int, Hv: int, Dk: int, Dv: int) -> int:
    """float32 elements of gdn_chunked_prefill's workspace: W [T,Hv,Dk], U [T,Hv,Dv], gc [T,Hv]."""
    return int(T) * int(Hv) * (int(Dk) + int(Dv) + 1)


def wy_sections(T: int, Hv: int, Dk: int, Dv: int) -> tuple[int, int, int, int]:
    """float32-element sizes of gdn_chunked_wy_prefill's workspace sections: gc, rk f32 [Hv, T],
    W bf16 [Hv, T, Dk], U bf16 [Hv, T, Dv], H bf16 [Hv, NT, Dk, Dv] (bf16 pairs rounded up)."""
    nt = -(-int(T) // WY_CHUNK)
    half = lambda n: (n + 1) // 2  # noqa: E731
    return 2 * T * Hv, half(Hv * T * Dk), half(Hv * T * Dv), half(Hv * nt * Dk * Dv)


def wy_workspace_numel(T: int, Hv: int, Dk: int, Dv: int) -> int:
    return sum(wy_sections(T, Hv, Dk, Dv))


def _dims(view) -> tuple[int, int, int, int]:
    T, _hk, Dk = view.shape("q")
    _t, Hv, Dv = view.shape("v")
    return T, Hv, Dk, Dv


def chunked_workspace(view, params) -> int:
    """Route workspace hook of gdn_chunked_prefill (`Route.workspace`)."""
    return chunked_workspace_numel(*_dims(view))


def chunked_wy_workspace(view, params) -> int:
    """Route workspace hook of gdn_chunked_wy_prefill (`Route.workspace`)."""
    return wy_workspace_numel(*_dims(view))
