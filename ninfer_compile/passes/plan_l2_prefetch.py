"""plan_l2_prefetch — keep DRAM streaming weights while the small launches between two linears run.

A decode step alternates weight-streaming linears with runs of small launches (norms, the GDN conv /
gating / delta rule / gated norm, attention) during which the memory system reads almost nothing.
This pass puts an `l2_prefetch` op (kernels/l2_prefetch/) at the head of each such run: it issues
the first bytes of the *next* linear's weight to L2, so that linear's first programs find them there.

Requires: fusion done (the ops left are the launches the runtime will run); weights bound (the
  prefetch names the next linear's weight tensor); a route table (the op is added only where the
  table selects an `l2_prefetch` route for it: its T, the weight's format / shape, the phase).
Guarantees: for every linear op L whose nearest preceding family ops (non-family ops are views and
  launch nothing) are not linears, one `l2_prefetch` op named `<L>.l2_prefetch`, with `weight` = L's
  weight and `after` = the run's first op's column operand (its producer comes before the prefetch;
  the prefetch never reads it), ordered right before that first op — or, when the selected row says
  `FOLD: true` and that first op's family takes a `prefetch` operand (rmsnorm, gdn_gating_proj), no
  new op: the first op gets `prefetch` = L's weight and `prefetch_bytes` = the row's BYTES and issues
  it itself (no extra launch in the PDL chain). Nothing else changes; the IR executor's results are unchanged (a
  hint has no value). `graph.meta["l2_prefetch"]` counts the ops added and the prefetches folded.
  Applies only when the table has an `l2_prefetch` section (pipeline.APPLIES): other plans are as
  before the pass existed.
"""

from __future__ import annotations

import math

from ..ir.graph import Graph
from ..ir.types import Op
from ..kernels.family import family_spec
from .context import PassContext
from .select_routes import op_match, op_t, table_selects

NAME = "plan_l2_prefetch"
FAMILY = "l2_prefetch"
STREAMING = ("linear",)  # the launches that are the weight stream; every other family op is "small"


def applies(ctx: PassContext) -> bool:
    groups = getattr(ctx.table, "groups", None) or {}
    return FAMILY in groups


def _column_operand(op: Op) -> str:
    name = family_spec(op.kind).t_operand
    return op.inputs[name] if name in op.inputs else op.inputs[f"{name}0"]


def run(graph: Graph, ctx: PassContext) -> Graph:
    out = graph.copy()
    order = [op for op in graph.ops() if op.is_family]
    added = folded = 0
    for i, lin in enumerate(order):
        if lin.kind not in STREAMING or "weight" not in lin.inputs:
            continue
        j = i
        while j > 0 and order[j - 1].kind not in STREAMING:
            j -= 1
        if j == i:  # a linear right after a linear: the stream does not stop
            continue
        first = order[j]
        after = _column_operand(first)
        prev_seq = order[j - 1].seq if j > 0 else first.seq - 1.0
        seq = (prev_seq + first.seq) / 2 if prev_seq < first.seq else math.nextafter(first.seq, -math.inf)
        op = Op(name=out.fresh_name(f"{lin.name}.{FAMILY}"), kind=FAMILY, seq=seq,
                inputs={"after": after, "weight": lin.inputs["weight"]})
        t, match = op_t(out, op), op_match(out, op)
        if not table_selects(ctx, FAMILY, t, match):
            continue
        params = ctx.table.select(FAMILY, t, dict(match)).params if ctx.table is not None else {}
        if params.get("FOLD") and _takes_prefetch(first) and "prefetch" not in first.inputs:
            out.replace_op(first.model_copy(update={
                "inputs": {**first.inputs, "prefetch": lin.inputs["weight"]},
                "attrs": {**first.attrs, "prefetch_bytes": int(params.get("BYTES", 1 << 24))}}))
            folded += 1
            continue
        out.add_op(op)
        added += 1
    out.meta[FAMILY] = {"ops": added, "folded": folded}
    return out


def _takes_prefetch(op: Op) -> bool:
    return any(o.name == "prefetch" for o in family_spec(op.kind).operands)
