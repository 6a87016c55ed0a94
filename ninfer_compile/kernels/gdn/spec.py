"""Family specs of the Gated DeltaNet core: gdn_gating, gdn_gating_proj, gated_delta_rule (no torch /
triton imports)."""

from ..family import Attr, FamilySpec, OpView, Operand
from ..kv_cache.spec import POSITIONS, SLOTS
from ..spec_util import VALUE, Bad, checker, eq

_REF = "ninfer_compile.kernels.gdn.reference"
_GATES_OUT = (
    Operand("g", io="out", roles=VALUE, dtypes=("f32",), rank=2, doc="[T, Hv] f32 log decay"),
    Operand("beta", io="out", roles=VALUE, dtypes=("f32",), rank=2, doc="[T, Hv] f32 write strength"),
)
_GATE_PARAMS = (
    Operand("a_log", roles=("weight",), rank=1, doc="[Hv] A_log"),
    Operand("dt_bias", roles=("weight",), rank=1, doc="[Hv]"),
)


@checker
def _check_gating(v: OpView) -> None:
    a = v.shape("a")
    eq("b", v.shape("b"), a)
    eq("a_log", v.shape("a_log"), (a[1],))
    eq("dt_bias", v.shape("dt_bias"), (a[1],))
    eq("g", v.shape("g", out=True), a)
    eq("beta", v.shape("beta", out=True), a)


@checker
def _check_gating_proj(v: OpView) -> None:
    x, wa = v.shape("x"), v.shape("a_weight")
    if wa[1] != x[1]:
        raise Bad(f"x {list(x)} and a_weight {list(wa)} must be [T, K] and [Hv, K]")
    eq("b_weight", v.shape("b_weight"), wa)
    eq("a_log", v.shape("a_log"), (wa[0],))
    eq("dt_bias", v.shape("dt_bias"), (wa[0],))
    eq("g", v.shape("g", out=True), (x[0], wa[0]))
    eq("beta", v.shape("beta", out=True), (x[0], wa[0]))


@checker
def _check_rule(v: OpView) -> None:
    q, k, vv = v.shape("q"), v.shape("k"), v.shape("v")
    eq("k", k, q)
    if vv[1] % q[1]:
        raise Bad(f"value heads {vv[1]} not a multiple of key heads {q[1]}")
    eq("g", v.shape("g"), (q[0], vv[1]))
    eq("beta", v.shape("beta"), (q[0], vv[1]))
    st = v.shape("state")
    if tuple(st[1:]) != (vv[1], q[2], vv[2]):
        raise Bad(f"state {list(st)} must be [slots, {vv[1]}, {q[2]}, {vv[2]}]")
    eq("out", v.shape("out", out=True), vv)
    eq("state (updated)", v.shape("state", out=True), st)
    check_window(v, "state_columns", q[0], tuple(st[1:]))


def check_window(v: OpView, columns: str, T: int, per_slot: tuple) -> None:
    """A verify op (attribute `window` W >= 2) writes `columns` [C, W-1, *per_slot] with T = C * W;
    a plain op (window 0) has no `columns` output. Shared by gated_delta_rule and conv1d."""
    w = v.attr("window", 0)
    try:
        v.shape(columns, out=True)
        has = True
    except KeyError:
        has = False
    if w == 0:
        if has:
            raise Bad(f"{columns} is written only by a verify op (attribute window >= 2)")
        return
    if w < 2 or not has:
        raise Bad(f"window={w}: a verify op needs window >= 2 and the output {columns}")
    if T % w:
        raise Bad(f"T={T} is not a multiple of window {w}")
    eq(columns, v.shape(columns, out=True), (T // w, w - 1, *per_slot))


def _match_gating(v: OpView) -> dict:
    return {"format": "FP32", "n": int(v.shape("a")[1])}


def gating_proj_match(v: OpView) -> dict:
    """The a/b weights' format and [Hv, K], and the extent's phase (the fuse rule gdn_gating_proj
    asks the same match before it fuses)."""
    n, k = v.shape("a_weight")
    return {"format": v.format("a_weight"), "n": int(n), "k": int(k), "phase": v.phase}


def _match_rule(v: OpView) -> dict:
    return {"format": "BF16", "phase": v.phase}


WINDOW = Attr("window", (int,), 0, to_launcher=False,
              doc="0: a plain op; W >= 2: a verify op over rows of W columns (one sequence each, consecutive "
                  "positions) that also writes the per-column state `*_columns` (the launcher sees its shape)")
_MERGED = Attr("merged", (list,), None, to_launcher=False, doc="ops a fuse rule folded into this one")

SPECS = (
    FamilySpec(
        name="gdn_gating",
        operands=(
            Operand("a", roles=VALUE, rank=2, doc="[T, Hv] a projection"),
            Operand("b", roles=VALUE, rank=2, doc="[T, Hv] b projection"),
            *_GATE_PARAMS, *_GATES_OUT,
        ),
        t_operand="a", match=_match_gating, check=_check_gating, reference=f"{_REF}:gdn_gating",
        torch_impl="ninfer_compile.kernels.gdn.torch_impl:gdn_gating",
        layer_kind="gdn",
        doc="g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b)",
    ),
    FamilySpec(
        name="gdn_gating_proj",
        operands=(
            Operand("x", roles=VALUE, rank=2, doc="[T, K] the layer's normed input"),
            Operand("a_weight", roles=("weight",), rank=2, doc="[Hv, K]"),
            Operand("b_weight", roles=("weight",), rank=2, doc="[Hv, K]"),
            *_GATE_PARAMS, *_GATES_OUT,
        ),
        attrs=(_MERGED,),
        t_operand="x", match=gating_proj_match, check=_check_gating_proj, reference=f"{_REF}:gdn_gating_proj",
        torch_impl="ninfer_compile.kernels.gdn.torch_impl:gdn_gating_proj",
        match_keys=("phase",), layer_kind="gdn",
        doc="the a / b projections and gdn_gating in one launch (fuse rule gdn_gating_proj)",
    ),
    FamilySpec(
        name="gated_delta_rule",
        operands=(
            Operand("q", roles=VALUE, rank=3, doc="[T, Hk, Dk]"),
            Operand("k", roles=VALUE, rank=3, doc="[T, Hk, Dk]"),
            Operand("v", roles=VALUE, rank=3, doc="[T, Hv, Dv]"),
            Operand("g", roles=VALUE, rank=2, doc="[T, Hv] f32"),
            Operand("beta", roles=VALUE, rank=2, doc="[T, Hv] f32"),
            Operand("state", io="inout", roles=("state",), dtypes=("f32",), rank=4,
                    doc="[slots, Hv, Dk, Dv] f32 recurrent state"),
            POSITIONS, SLOTS,
            Operand("out", io="out", roles=VALUE, rank=3, doc="[T, Hv, Dv]"),
            Operand("state_columns", io="out", roles=VALUE, dtypes=("f32",), rank=5, optional=True,
                    doc="[C, W-1, Hv, Dk, Dv] f32 (verify ops): row r's state after each of its first W-1 "
                        "columns (kernels/spec_state: state_select rolls back to one)"),
        ),
        attrs=(
            Attr("scale", (float, int), doc="output scale (1/sqrt(Dk))"),
            Attr("l2_eps", (float, int), 1e-6, doc="eps of the q / k L2 normalisation"),
            WINDOW,
        ),
        t_operand="q", match=_match_rule, check=_check_rule, reference=f"{_REF}:gated_delta_rule",
        torch_impl="ninfer_compile.kernels.gdn.torch_impl:gated_delta_rule",
        match_keys=("phase",),
        layer_kind="gdn",
        doc="the gated delta rule recurrence per token and value head",
    ),
)
