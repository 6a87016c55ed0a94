"""Family specs of rotary embeddings: rope, qk_norm_rope (no torch / triton imports)."""

from ..family import Attr, FamilySpec, OpView, Operand
from ..spec_util import INDEX, VALUE, Bad, checker, eq

_REF = "ninfer_compile.kernels.rope.reference"
_ROT = Attr("rotary_dim", (int,), doc="leading head dims rotated (partial RoPE); the rest pass through")
_THETA = Attr("theta", (float, int), doc="RoPE base")
_POS = Operand("positions", roles=INDEX, dtypes=("i32",), rank=1, doc="[T] absolute positions")


@checker
def _check_rope(v: OpView) -> None:
    x = v.shape("x")
    eq("positions", v.shape("positions"), (x[0],))
    eq("out", v.shape("out", out=True), x)
    if v.attr("rotary_dim", 0) > x[-1]:
        raise Bad("rotary_dim exceeds head dim")


@checker
def _check_qk(v: OpView) -> None:
    q, k = v.shape("q"), v.shape("k")
    if q[2] != k[2] or q[0] != k[0]:
        raise Bad(f"q {list(q)} and k {list(k)} must be [T, heads, D] with one T and D")
    eq("q_weight", v.shape("q_weight"), (q[2],))
    eq("k_weight", v.shape("k_weight"), (q[2],))
    eq("positions", v.shape("positions"), (q[0],))
    eq("q_out", v.shape("q_out", out=True), q)
    eq("k_out", v.shape("k_out", out=True), k)
    if v.attr("rotary_dim", 0) > q[-1]:
        raise Bad("rotary_dim exceeds head dim")


def _match_rope(v: OpView) -> dict:
    return {"format": "BF16", "n": int(v.shape("x")[-1])}


def _match_qk(v: OpView) -> dict:
    return {"format": v.format("q_weight"), "n": int(v.shape("q_weight")[0])}


SPECS = (
    FamilySpec(
        name="rope",
        operands=(
            Operand("x", roles=VALUE, doc="[T, heads, D]"),
            _POS,
            Operand("out", io="out", roles=VALUE, doc="like x"),
        ),
        attrs=(_ROT, _THETA),
        t_operand="x", match=_match_rope, check=_check_rope, reference=f"{_REF}:rope",
        torch_impl="ninfer_compile.kernels.rope.torch_impl:rope",
        layer_kind="attention",
        doc="(partial) rotary position embedding, neox halves",
    ),
    FamilySpec(
        name="qk_norm_rope",
        operands=(
            Operand("q", roles=VALUE, rank=3, doc="[T, Hq, D]"),
            Operand("k", roles=VALUE, rank=3, doc="[T, Hk, D]"),
            Operand("q_weight", roles=("weight",), rank=1, doc="[D] q head-norm weight"),
            Operand("k_weight", roles=("weight",), rank=1, doc="[D] k head-norm weight"),
            _POS,
            Operand("q_out", io="out", roles=VALUE, rank=3, doc="like q"),
            Operand("k_out", io="out", roles=VALUE, rank=3, doc="like k"),
        ),
        attrs=(Attr("eps", (float, int), doc="head RMSNorm eps"), _ROT, _THETA),
        t_operand="q", match=_match_qk, check=_check_qk, reference=f"{_REF}:qk_norm_rope",
        torch_impl="ninfer_compile.kernels.rope.torch_impl:qk_norm_rope",
        layer_kind="attention",
        doc="head_rmsnorm then rope of q and k in one launch (fuse rule qk_norm_rope)",
    ),
)
