"""Family specs of the norms: rmsnorm, head_rmsnorm, gated_rmsnorm (no torch / triton imports)."""

from ..family import Attr, FamilySpec, OpView, Operand
from ..spec_util import VALUE, checker, eq, numel

_REF = "ninfer_compile.kernels.norms.reference"
_EPS = Attr("eps", (float, int), doc="added to mean(x^2) under the square root")


def _match(v: OpView) -> dict:
    return {"format": v.format("weight"), "n": int(v.shape("weight")[0])}


@checker
def _check_rmsnorm(v: OpView) -> None:
    eq("weight", v.shape("weight"), (v.shape("x")[-1],))
    eq("out", v.shape("out", out=True), v.shape("x"))


@checker
def _check_head(v: OpView) -> None:
    x = v.shape("x")
    eq("weight", v.shape("weight"), (x[2],))
    eq("out", v.shape("out", out=True), x)


@checker
def _check_gated(v: OpView) -> None:
    x = v.shape("x")
    eq("z", v.shape("z"), x)
    eq("weight", v.shape("weight"), (x[-1],))
    eq("out", v.shape("out", out=True), (x[0], numel(x[1:])))


SPECS = (
    FamilySpec(
        name="rmsnorm",
        operands=(
            Operand("x", roles=VALUE, doc="[T, H]"),
            Operand("weight", roles=("weight",), rank=1, doc="[H] (1 + w scaling)"),
            Operand("out", io="out", roles=VALUE, doc="like x"),
        ),
        attrs=(_EPS,),
        t_operand="x", match=_match, check=_check_rmsnorm, reference=f"{_REF}:rmsnorm",
        torch_impl="ninfer_compile.kernels.norms.torch_impl:rmsnorm",
        doc="zero-centred RMSNorm over the last axis",
    ),
    FamilySpec(
        name="head_rmsnorm",
        operands=(
            Operand("x", roles=VALUE, rank=3, doc="[T, heads, D]"),
            Operand("weight", roles=("weight",), rank=1, doc="[D]"),
            Operand("out", io="out", roles=VALUE, rank=3, doc="like x"),
        ),
        attrs=(_EPS,),
        t_operand="x", match=_match, check=_check_head, reference=f"{_REF}:head_rmsnorm",
        torch_impl="ninfer_compile.kernels.norms.torch_impl:head_rmsnorm",
        layer_kind="attention",
        doc="per-head zero-centred RMSNorm (attention q / k norms)",
    ),
    FamilySpec(
        name="gated_rmsnorm",
        operands=(
            Operand("x", roles=VALUE, doc="[T, Hv, Dv]"),
            Operand("z", roles=VALUE, doc="[T, Hv, Dv] gate"),
            Operand("weight", roles=("weight",), rank=1, doc="[Dv] (plain w)"),
            Operand("out", io="out", roles=VALUE, rank=2, doc="[T, Hv * Dv]"),
        ),
        attrs=(_EPS,),
        t_operand="x", match=_match, check=_check_gated, reference=f"{_REF}:gated_rmsnorm",
        torch_impl="ninfer_compile.kernels.norms.torch_impl:gated_rmsnorm",
        layer_kind="gdn",
        doc="GDN output norm RMSNorm(x) * w * SiLU(z)",
    ),
)
