"""Family specs of the Gated DeltaNet core: gdn_gating, gdn_gating_proj, gated_delta_rule,
gdn_decode_fused (no torch / triton imports)."""

from ..family import Attr, FamilySpec, OpView, Operand
from ..kv_cache.spec import POSITIONS, SLOTS
from ..linear.spec import NORM_EPS, NORM_WEIGHT, check_prologue, prologue_match
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
    check_prologue(v, "x")


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


@checker
def _check_fused(v: OpView) -> None:
    T, C = _conv_x_shape(v)
    st, z = v.shape("state"), v.shape("z")
    if len(st) != 4:
        raise Bad(f"state {list(st)} must be [slots, Hv, Dk, Dv]")
    _, hv, dk, dv = st
    hk = v.attr("key_heads")
    if hk < 1 or hv % hk or C != 2 * hk * dk + hv * dv:
        raise Bad(f"conv input width {C} must be 2 * key_heads ({hk}) * Dk ({dk}) + Hv ({hv}) * Dv ({dv}), "
                  f"Hv a multiple of key_heads")
    w, cs = v.shape("conv_weight"), v.shape("conv_state")
    if len(w) != 2 or w[1] != C or w[0] < 2:
        raise Bad(f"conv_weight {list(w)} must be [kernel >= 2, {C}]")
    if len(cs) != 3 or tuple(cs[1:]) != (w[0] - 1, C):
        raise Bad(f"conv_state {list(cs)} must be [slots, {w[0] - 1}, {C}]")
    eq("z", z, (T, hv, dv))
    eq("g", v.shape("g"), (T, hv))
    eq("beta", v.shape("beta"), (T, hv))
    eq("norm_weight", v.shape("norm_weight"), (dv,))
    eq("out", v.shape("out", out=True), (T, hv * dv))
    eq("conv_state (updated)", v.shape("conv_state", out=True), cs)
    eq("state (updated)", v.shape("state", out=True), st)
    if v.attr("activation", "silu") not in ("silu", "none"):
        raise Bad(f"activation {v.attr('activation')!r} is not silu or none")
    if (v.attr("parts_of") is not None) != (not v.has("x")):
        raise Bad("attribute parts_of must name x exactly when x arrives as ranges x0, x1, ..")


def _conv_x_shape(v: OpView) -> tuple[int, int]:
    if v.has("x"):
        return tuple(v.shape("x"))
    parts = [v.shape(n) for n in v.parts("x")]
    if not parts or any(len(p) != 2 or p[0] != parts[0][0] for p in parts):
        raise Bad(f"input parts {[list(p) for p in parts]} must be [T, C_i] with one T")
    return (parts[0][0], sum(p[1] for p in parts))


def _match_fused(v: OpView) -> dict:
    _, hv, dk, dv = v.shape("state")
    return {"format": v.format("conv_weight"), "n": int(hv * dv), "k": int(dk), "phase": v.phase}


def _match_gating(v: OpView) -> dict:
    return {"format": "FP32", "n": int(v.shape("a")[1])}


def gating_proj_match(v: OpView) -> dict:
    """The a/b weights' format and [Hv, K], and the extent's phase (the fuse rule gdn_gating_proj
    asks the same match before it fuses); `prologue: rmsnorm` with the folded norm (linear's)."""
    n, k = v.shape("a_weight")
    return {"format": v.format("a_weight"), "n": int(n), "k": int(k), "phase": v.phase, **prologue_match(v)}


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
            *_GATE_PARAMS, NORM_WEIGHT, *_GATES_OUT,
        ),
        attrs=(NORM_EPS, _MERGED),
        t_operand="x", match=gating_proj_match, check=_check_gating_proj, reference=f"{_REF}:gdn_gating_proj",
        torch_impl="ninfer_compile.kernels.gdn.torch_impl:gdn_gating_proj",
        match_keys=("phase", "prologue"), layer_kind="gdn",
        doc="the a / b projections and gdn_gating in one launch (fuse rule gdn_gating_proj); prologue "
            "rmsnorm: x normalised first (the linear family's norm_weight / norm_eps, fuse rule rmsnorm_prologue)",
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
    FamilySpec(
        name="gdn_decode_fused",
        operands=(
            Operand("x", roles=VALUE, rank=2, parts=3,
                    doc="[T, C] conv input [q | k | v] channels, or its ranges x0, x1, x2 (the projections' columns)"),
            Operand("conv_weight", roles=("weight",), rank=2, doc="[K, C] tap-major"),
            Operand("conv_state", io="inout", roles=("state",), rank=3, doc="[slots, K-1, C] last K-1 inputs"),
            Operand("g", roles=VALUE, rank=2, doc="[T, Hv] f32"),
            Operand("beta", roles=VALUE, rank=2, doc="[T, Hv] f32"),
            Operand("state", io="inout", roles=("state",), dtypes=("f32",), rank=4,
                    doc="[slots, Hv, Dk, Dv] f32 recurrent state"),
            POSITIONS, SLOTS,
            Operand("z", roles=VALUE, rank=3, doc="[T, Hv, Dv] output gate"),
            Operand("norm_weight", roles=("weight",), rank=1, doc="[Dv] gated-norm weight (plain w)"),
            Operand("out", io="out", roles=VALUE, rank=2, doc="[T, Hv * Dv] the gated norm's output"),
        ),
        attrs=(
            Attr("key_heads", (int,), doc="Hk: the conv input is [q (Hk*Dk) | k (Hk*Dk) | v (Hv*Dv)]"),
            Attr("scale", (float, int), doc="output scale (1/sqrt(Dk))"),
            Attr("l2_eps", (float, int), 1e-6, doc="eps of the q / k L2 normalisation"),
            Attr("eps", (float, int), doc="eps of the gated RMSNorm"),
            Attr("activation", (str,), "silu", doc="activation after the conv: silu | none"),
            Attr("parts_of", (str, type(None)), None, to_launcher=False,
                 doc="the operand given as column ranges; the executor joins them"),
            _MERGED,
        ),
        t_operand="g", match=_match_fused, check=_check_fused, reference=f"{_REF}:gdn_decode_fused",
        match_keys=("phase",), layer_kind="gdn",
        doc="decode step of a GDN layer after its projections: causal conv + SiLU of q / k / v, the gated "
            "delta rule step and the gated RMSNorm in one launch (fuse rule gdn_decode_fused)",
    ),
)
