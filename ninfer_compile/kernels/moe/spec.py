"""Family specs of `moe_router` and `moe_experts` (no torch / triton imports)."""

from ..family import Attr, FamilySpec, OpView, Operand
from ..spec_util import VALUE, Bad, checker, eq

_REF = "ninfer_compile.kernels.moe.reference"
_TORCH = "ninfer_compile.kernels.moe.torch_impl"
_ROUTING = (
    Operand("expert_ids", roles=VALUE, dtypes=("i32",), rank=2, doc="[T, k] chosen experts, largest weight first"),
    Operand("expert_weights", roles=VALUE, dtypes=("f32",), rank=2, doc="[T, k] renormalised routing weights"),
    Operand("shared_gate", roles=VALUE, dtypes=("f32",), rank=1, doc="[T] sigmoid of the shared-expert gate row"),
)


@checker
def _check_router(v: OpView) -> None:
    T, H = v.shape("x")
    n, k = v.shape("weight")
    if k != H:
        raise Bad(f"x {[T, H]} has H={H}, weight {[n, k]} has K={k}")
    top_k = v.attr("top_k")
    if not 1 <= top_k <= n - 1:
        raise Bad(f"top_k {top_k} is outside 1..{n - 1} (the weight's router rows)")
    eq("expert_ids", v.shape("expert_ids", out=True), (T, top_k))
    eq("expert_weights", v.shape("expert_weights", out=True), (T, top_k))
    eq("shared_gate", v.shape("shared_gate", out=True), (T,))


def _match_router(v: OpView) -> dict:
    n, k = v.shape("weight")
    return {"format": v.format("weight"), "n": int(n), "k": int(k)}


@checker
def _check_experts(v: OpView) -> None:
    T, H = v.shape("x")
    n_gu, k_gu = v.shape("gate_up")
    n_d, I = v.shape("down")
    if k_gu != H or n_d % H or n_gu % (2 * I) or n_gu // (2 * I) != n_d // H:
        raise Bad(f"gate_up {[n_gu, k_gu]} and down {[n_d, I]} are not E banks of [2I, {H}] and [{H}, I] rows")
    ids = v.shape("expert_ids")
    if ids[0] != T or not 1 <= ids[1] <= n_d // H:
        raise Bad(f"expert_ids {list(ids)}: expected [{T}, k] with 1 <= k <= {n_d // H}")
    eq("expert_weights", v.shape("expert_weights"), ids)
    eq("shared_gate", v.shape("shared_gate"), (T,))
    for name in ("shared", "residual"):
        eq(name, v.shape(name), (T, H))
    eq("out", v.shape("out", out=True), (T, H))


def _match_experts(v: OpView) -> dict:
    n, k = v.shape("gate_up")
    return {"format": v.format("gate_up"), "n": int(n), "k": int(k)}


SPECS = (
    FamilySpec(
        name="moe_router",
        operands=(
            Operand("x", roles=VALUE, rank=2, doc="[T, H] the post-attention-normed hidden rows"),
            Operand("weight", roles=("weight",), rank=2, doc="[E+1, H] router rows 0..E-1, shared gate row E"),
            *(Operand(o.name, io="out", roles=o.roles, dtypes=o.dtypes, rank=o.rank, doc=o.doc) for o in _ROUTING),
        ),
        attrs=(Attr("top_k", (int,), doc="experts per token"),),
        t_operand="x", match=_match_router, check=_check_router, reference=f"{_REF}:moe_router",
        torch_impl=f"{_TORCH}:moe_router",
        doc="softmax over the E router logits, top-k, renormalised; sigmoid of the shared gate",
    ),
    FamilySpec(
        name="moe_experts",
        operands=(
            Operand("x", roles=VALUE, rank=2, doc="[T, H] the normed hidden rows the experts read"),
            *_ROUTING,
            Operand("gate_up", roles=("weight",), rank=2, doc="[E*2I, H] bank, row e*2I + p*I + r"),
            Operand("down", roles=("weight",), rank=2, doc="[E*H, I] bank, row e*H + h"),
            Operand("shared", roles=VALUE, rank=2, doc="[T, H] the shared expert's MLP output (ungated)"),
            Operand("residual", roles=VALUE, rank=2, doc="[T, H] the residual stream"),
            Operand("out", io="out", roles=VALUE, rank=2, doc="[T, H] residual + gated shared + routed sum"),
        ),
        t_operand="x", match=_match_experts, check=_check_experts, reference=f"{_REF}:moe_experts",
        torch_impl=f"{_TORCH}:moe_experts",
        doc="out = residual + shared_gate * shared + sum_j w_j down_e(SiLU(gate_e x) * up_e x)",
    ),
)
