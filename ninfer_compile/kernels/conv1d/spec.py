"""Family spec of `conv1d`: the GDN causal depthwise conv + SiLU with a per-slot rolling state
(no torch / triton imports)."""

from ..family import Attr, FamilySpec, OpView, Operand
from ..kv_cache.spec import POSITIONS, SLOTS
from ..gdn.spec import WINDOW, check_window
from ..spec_util import VALUE, Bad, checker, eq

ACTIVATIONS = ("silu", "none")  # the kernels' SILU constexpr (launch.ACTIVATIONS)


def _x_shape(v: OpView) -> tuple[int, int]:
    if v.has("x"):
        return v.shape("x")
    # channel ranges x0 | x1 | .. (fuse rule conv_input_parts)
    parts = [v.shape(n) for n in v.parts("x")]
    if not parts or any(len(p) != 2 or p[0] != parts[0][0] for p in parts):
        raise Bad(f"input parts {[list(p) for p in parts]} must be [T, C_i] with one T")
    return (parts[0][0], sum(p[1] for p in parts))


@checker
def _check(v: OpView) -> None:
    x = _x_shape(v)
    w, st = v.shape("weight"), v.shape("conv_state")
    if len(w) != 2 or w[1] != x[1]:
        raise Bad(f"weight {list(w)} must be [kernel, {x[1]}]")
    if len(st) != 3 or st[1] != w[0] - 1 or st[2] != x[1]:
        raise Bad(f"conv_state {list(st)} must be [slots, {w[0] - 1}, {x[1]}]")
    eq("out", v.shape("out", out=True), x)
    eq("conv_state (updated)", v.shape("conv_state", out=True), st)
    if v.attr("activation", "silu") not in ACTIVATIONS:
        raise Bad(f"activation {v.attr('activation')!r} is not one of {', '.join(ACTIVATIONS)}")
    base = v.attr("parts_of")
    if (base is not None) != (not v.has("x")):
        raise Bad("attribute parts_of must name x exactly when x arrives as ranges x0, x1, ..")
    check_window(v, "conv_state_columns", x[0], tuple(st[1:]))


def _match(v: OpView) -> dict:
    k, n = v.shape("weight")
    return {"format": v.format("weight"), "n": int(n), "k": int(k), "phase": v.phase}


SPECS = (FamilySpec(
    name="conv1d",
    operands=(
        Operand("x", roles=VALUE, rank=2, parts=3, doc="[T, C], or up to 3 channel ranges x0, x1, x2 [T, C_i]"),
        Operand("weight", roles=("weight",), rank=2, doc="[K, C] tap-major"),
        Operand("conv_state", io="inout", roles=("state",), rank=3, doc="[slots, K-1, C] last K-1 inputs"),
        POSITIONS, SLOTS,
        Operand("out", io="out", roles=VALUE, rank=2, doc="[T, C]"),
        Operand("conv_state_columns", io="out", roles=VALUE, rank=4, optional=True,
                doc="[R, W-1, K-1, C] (verify ops): row r's last K-1 inputs after each of its first W-1 columns"),
    ),
    attrs=(
        Attr("activation", (str,), "silu", doc="activation after the conv: silu | none (the launchers' `activation`)"),
        Attr("parts_of", (str, type(None)), None, to_launcher=False,
             doc="the operand given as column ranges (fuse rule conv_input_parts); the executor joins them"),
        Attr("merged", (list,), None, to_launcher=False, doc="ops a fuse rule folded into this one"),
        WINDOW,
    ),
    t_operand="x", match=_match, check=_check,
    reference="ninfer_compile.kernels.conv1d.reference:conv1d",
    torch_impl="ninfer_compile.kernels.conv1d.torch_impl:conv1d",
    match_keys=("phase",),
    layer_kind="gdn",
    doc="out = SiLU(causal depthwise conv over the slot's history); state keeps the last K-1 inputs",
),)
