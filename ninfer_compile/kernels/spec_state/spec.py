"""Family spec of `state_select`: roll a per-slot recurrent state back to the accepted column of a
verify round.

A verify extent runs C rows of W = K + 1 columns (T = C * W; row r = columns r*W .. r*W + W - 1, one
sequence at consecutive positions, its slot `slots[r*W]`). A stateful op of that extent (the GDN
recurrence, the conv taps) writes, besides its updated state (the state after the row's last
column), `columns[r, j]` = the state after column j, for j = 0 .. K - 1. Once the round's
acceptance is known (`accepted[r]` drafts kept, so columns 0 .. accepted[r] were consumed):

    state[slots[r*W]] = columns[r, accepted[r]]     when accepted[r] < K   (else left as it is)

Any state shape and dtype: state [slots, *S], columns [C, K, *S] of the same dtype.
Light module: no torch / triton at import.
"""

from __future__ import annotations

from ..family import FamilySpec, Operand, OpView
from ..kv_cache.spec import SLOTS
from ..spec_util import VALUE, Bad, checker, eq

_M = "ninfer_compile.kernels.spec_state"


@checker
def _check(v: OpView) -> None:
    st, cols = v.shape("state"), v.shape("columns")
    if len(cols) != len(st) + 1 or tuple(cols[2:]) != tuple(st[1:]):
        raise Bad(f"columns {list(cols)} must be [C, K, {', '.join(map(str, st[1:]))}] for state {list(st)}")
    C, K = cols[0], cols[1]
    if v.dtype("columns") != v.dtype("state"):
        raise Bad(f"columns dtype {v.dtype('columns')} != state dtype {v.dtype('state')}")
    eq("accepted", v.shape("accepted"), (C,))
    eq("slots", v.shape("slots"), (C * (K + 1),))
    eq("state (updated)", v.shape("state", out=True), st)


def _match(v: OpView) -> dict:
    return {"format": "BF16"}


SPECS = (FamilySpec(
    name="state_select",
    operands=(
        Operand("state", io="inout", roles=("state",), doc="[slots, *S] the state after each row's last column"),
        Operand("columns", roles=VALUE, doc="[C, K, *S] the state after each of the row's first K columns"),
        Operand("accepted", roles=VALUE, dtypes=("i32",), rank=1, doc="[C] accepted drafts per row"),
        SLOTS,
    ),
    t_operand="slots",
    match=_match,
    check=_check,
    reference=f"{_M}.reference:state_select",
    torch_impl="ninfer_compile.kernels.spec_state.torch_impl:state_select",
    doc="state[slot of row r] = columns[r, accepted[r]] where accepted[r] < K",
),)
