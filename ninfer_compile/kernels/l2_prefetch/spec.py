"""Family spec of `l2_prefetch` (no torch / triton imports).

An `l2_prefetch` op names the weight of a later linear and issues its first bytes to the L2 cache
as a hint: it reads nothing into registers, writes nothing, and its result is "no value". The pass
`plan_l2_prefetch` places one right before a run of small launches that stands between two
weight-streaming linears, so that DRAM keeps streaming while those launches run. `after` is the
activation the run's first op reads: it orders the prefetch after that tensor's producer (the
prefetch never reads it) and gives the op its column count T.
"""

from ..family import Attr, FamilySpec, OpView, Operand
from ..spec_util import VALUE

# The folded form (passes/plan_l2_prefetch.py, row param FOLD): a family whose kernel can issue the
# prefetch itself declares these two (rmsnorm, gdn_gating_proj); the pass sets both or neither.
PREFETCH_OPERAND = Operand("prefetch", roles=("weight",), rank=2, optional=True,
                           doc="the next linear's weight: its first prefetch_bytes issued to L2 (a hint, not read)")
PREFETCH_BYTES_ATTR = Attr("prefetch_bytes", (int,), default=None, optional=True,
                           doc="bytes of `prefetch` issued to L2 (set with the operand)")


def _match(v: OpView) -> dict:
    n, k = v.shape("weight")
    return {"format": v.format("weight"), "n": int(n), "k": int(k), "phase": v.phase}


SPECS = (FamilySpec(
    name="l2_prefetch",
    operands=(
        Operand("after", roles=VALUE, doc="[T, ...] ordering only: the prefetch follows its producer; never read"),
        Operand("weight", roles=("weight",), rank=2, doc="the later linear's weight (any format; a row view allowed)"),
    ),
    t_operand="after", match=_match,
    reference="ninfer_compile.kernels.l2_prefetch.reference:l2_prefetch",
    torch_impl="ninfer_compile.kernels.l2_prefetch.torch_impl:l2_prefetch",
    match_keys=("phase",),
    doc="the first bytes of a later linear's weight, issued to L2 while small kernels run (a hint: no value)",
),)
