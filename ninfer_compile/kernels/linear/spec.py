"""Family spec of `linear`: x @ W^T with an optional epilogue (no torch / triton imports)."""

from ..family import Attr, FamilySpec, OpView, Operand
from ..spec_util import VALUE, Bad, checker, eq

EPILOGUES = ("none", "residual", "swiglu")


@checker
def _check(v: OpView) -> None:
    x, w, out = v.shape("x"), v.shape("weight"), v.shape("out", out=True)
    if x[1] != w[1]:
        raise Bad(f"x {list(x)} has K={x[1]}, weight {list(w)} has K={w[1]}")
    epi = v.attr("epilogue", "none")
    if epi not in EPILOGUES:
        raise Bad(f"unknown epilogue {epi!r}")
    if epi == "swiglu" and w[0] % 2:
        raise Bad(f"swiglu epilogue needs an even row count, weight {list(w)}")
    eq("out", out, (x[0], w[0] // 2 if epi == "swiglu" else w[0]))
    if epi == "residual":
        if not v.has("residual"):
            raise Bad("missing input operand 'residual'")
        eq("residual", v.shape("residual"), out)
    elif v.has("residual"):
        raise Bad(f"operand residual without the residual epilogue (epilogue {epi})")


def _match(v: OpView) -> dict:
    n, k = v.shape("weight")
    return {"format": v.format("weight"), "n": int(n), "k": int(k), "epilogue": v.attr("epilogue", "none")}


SPECS = (FamilySpec(
    name="linear",
    operands=(
        Operand("x", roles=VALUE, rank=2, doc="[T, K]"),
        Operand("weight", roles=("weight",), rank=2, doc="[N, K] (artifact format: BF16 or a quantized one)"),
        Operand("residual", roles=VALUE, rank=2, optional=True, doc="[T, N]; epilogue residual only"),
        Operand("out", io="out", roles=VALUE, rank=2, doc="[T, N] (swiglu: [T, N/2])"),
    ),
    attrs=(
        Attr("epilogue", (str,), "none",
             doc="none | residual (out = residual + xW^T) | swiglu (silu(gate) * up over [gate | up] rows); "
                 "part of the route match, and the launchers' `epilogue` argument"),
        Attr("merged", (list,), None, to_launcher=False,
             doc="names of the ops a fuse rule merged into this one (provenance only)"),
        # spine-bind: declared so that a plan still compiles while the shared_staging fuse rule
        # exists (nothing reads it but fuse's projections_into); delete with that rule.
        Attr("staged_input", (dict,), None, to_launcher=False,
             doc="shared_staging fuse rule: {tensor, group, first} (no kernel reads it)"),
    ),
    t_operand="x", match=_match, check=_check,
    reference="ninfer_compile.kernels.linear.reference:linear",
    doc="out = x @ weight^T (+ epilogue)",
),)
