"""Route registrations of the MoE families (no torch / triton imports here).

`moe_experts_workspace(view, params)` is the one sizing of the expert routes' workspace (float32
elements; layout in `workspace_layout`, used by the launchers)."""

from ninfer_compile.kernels.registry import ParamSpec, Route, RouteDomain, register

_M = "ninfer_compile.kernels.moe"
WEIGHT_FORMATS = ("Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S", "BF16")
GEMV_MAX_T = 16


def workspace_layout(E: int, I: int, H: int, pairs: int) -> dict[str, int]:
    """Float32-element offsets of the expert routes' workspace: int32 offsets [E+1], tile_end [E],
    sorted pairs [P]; fp32 act [P, I] and y [P, H]; `total` elements."""
    offsets, tile_end, order = 0, E + 1, 2 * E + 1
    act = order + pairs
    y = act + pairs * I
    return {"offsets": offsets, "tile_end": tile_end, "sorted": order, "act": act, "y": y,
            "total": y + pairs * H}


def moe_experts_workspace(view, params) -> int:
    """Workspace of one moe_experts op: its banks give E, I, H; expert_ids [T, k] gives P = T*k."""
    n_gu, H = view.shape("gate_up")
    n_d, I = view.shape("down")
    T, k = view.shape("expert_ids")
    return workspace_layout(n_d // H, I, H, T * k)["total"]


def moe_router_workspace(view, params) -> int:
    """The split router's fp32 logits [T, E+1]."""
    T, _ = view.shape("x")
    n, _ = view.shape("weight")
    return T * n


def _warps(default: int = 4) -> ParamSpec:
    return ParamSpec("num_warps", (1, 2, 4, 8), default, "warps per program")


register(Route(
    name="moe_router_split", family="moe_router",
    domain=RouteDomain(formats=WEIGHT_FORMATS),
    params={"BLOCK_R": ParamSpec("BLOCK_R", (8, 16, 32), 16, "router rows per program"),
            "BLOCK_K": ParamSpec("BLOCK_K", (64, 128, 256), 128, "hidden columns per K step"),
            "num_warps": _warps()},
    reference=f"{_M}.reference:moe_router", launcher=f"{_M}.launch:moe_router_split",
    kernels=(f"{_M}.kernels:moe_router_split_kernel",), workspace=f"{_M}.routes:moe_router_workspace",
    doc="a (row block, 16-token block) grid, each row read once per token block into fp32 logits; the "
        "last row block to arrive at a token block (acq_rel ticket) routes its tokens; T = 1: a GEMV",
))
# both expert routes run the same four kernels (group, gate/up, down, combine; they differ in tiling),
# listed main kernel first (gate/up: the one every launch runs; bench/limits charges a launch's floor to it)
_EXPERT_KERNELS = tuple(f"{_M}.kernels:moe_{k}_kernel" for k in ("gate_up", "down", "group", "combine"))
register(Route(
    name="moe_experts_gemv", family="moe_experts",
    domain=RouteDomain(formats=WEIGHT_FORMATS, max_t=GEMV_MAX_T),
    params={"BLOCK_N": ParamSpec("BLOCK_N", (8, 16, 32, 64), 32, "bank rows per program"),
            "BLOCK_K": ParamSpec("BLOCK_K", (32, 64, 128, 256, 512), 64, "columns per K step"),
            "GROUP": ParamSpec("GROUP", (True, False), True, "one tile per hit expert after a grouping launch "
                               "(else one per (token, slot) pair, no grouping launch)"),
            "COMBINE": ParamSpec("COMBINE", ("kernel", "fused"), "kernel", "the slots' weighted sum: a launch, or "
                                 "the down launch's last arrivals per h-block"),
            "num_warps": _warps()},
    reference=f"{_M}.reference:moe_experts", launcher=f"{_M}.launch:moe_experts_gemv",
    kernels=_EXPERT_KERNELS, workspace=f"{_M}.routes:moe_experts_workspace",
    doc="decode: pairs grouped by expert, one tile per hit expert (slots past the step's tile count "
        "exit), each hit expert's gate/up and down rows read once; broadcast-FMA; deterministic combine",
))
register(Route(
    name="moe_experts_grouped_gemm", family="moe_experts", domain=RouteDomain(formats=WEIGHT_FORMATS),
    params={"BLOCK_T": ParamSpec("BLOCK_T", (16, 32, 64), 16, "pairs of one expert per tile"),
            "BLOCK_N": ParamSpec("BLOCK_N", (32, 64, 128), 64, "bank rows per program"),
            "BLOCK_K": ParamSpec("BLOCK_K", (32, 64, 128), 64, "columns per K step"),
            "num_warps": _warps()},
    reference=f"{_M}.reference:moe_experts", launcher=f"{_M}.launch:moe_experts_grouped_gemm",
    kernels=_EXPERT_KERNELS, workspace=f"{_M}.routes:moe_experts_workspace",
    doc="prefill: tokens grouped by expert (sort / offsets), per-expert tiles of BLOCK_T pairs x "
        "BLOCK_N rows with tl.dot on dequantized bf16 tiles; deterministic combine",
))
