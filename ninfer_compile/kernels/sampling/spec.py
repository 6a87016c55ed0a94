"""Family spec of `sampling`: the next token id per logits row (no torch / triton imports).

PROVISIONAL (written by spine-specs so that shared code iterating over the specs keeps knowing the
family): helper spine-sampling owns this folder and replaces this file (per-slot parameter inputs,
the device routes' attributes). On a merge conflict, take spine-sampling's version.
"""

from ..family import Attr, FamilySpec, OpView, Operand
from ..spec_util import VALUE, checker, eq


@checker
def _check(v: OpView) -> None:
    eq("ids", v.shape("ids", out=True), (v.shape("logits")[0],))


def _match(v: OpView) -> dict:
    return {"format": "BF16", "n": int(v.shape("logits")[1]), "mode": v.attr("mode", "greedy")}


SPECS = (FamilySpec(
    name="sampling",
    operands=(
        Operand("logits", roles=VALUE, rank=2, doc="[R, V]"),
        Operand("ids", io="out", roles=VALUE, dtypes=("i32",), rank=1, doc="[R] next token ids"),
    ),
    attrs=(
        Attr("mode", (str,), "greedy", to_launcher=False, doc="the compiled default mode (route match)"),
        Attr("variants", (list, tuple), (), to_launcher=False,
             doc="modes also selected for per-request choice (RouteChoice.variants)"),
    ),
    t_operand="logits", match=_match, check=_check,
    reference="ninfer_compile.kernels.sampling.reference:argmax",
    match_keys=("mode",),
    doc="greedy argmax (the reference); temperature / top-k / top-p variants",
),)
