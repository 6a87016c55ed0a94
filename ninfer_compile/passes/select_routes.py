"""select_routes — choose a route for every family op from the route table.

Requires: weights bound (the match needs each weight's format); fusion done (the epilogue is part
  of the match); a RouteTable in the context.
Guarantees: every family op carries `route` = RouteChoice(route, params, source "smNN.yaml:LINE",
  t_range, match, reference) chosen by `table.select(family, T, match)` for its own T (the leading
  column count of its activation: the extent's T, or the selected head rows). A miss raises
  RouteError under `miss: error`; under `miss: nearest` the fallback is recorded in
  `graph.meta["route_misses"]`.
"""

from __future__ import annotations

from typing import Any

from ..errors import CompileError, RouteError
from ..ir.graph import Graph, op_view
from ..kernels.family import family_spec
from ..ir.types import Op, RouteChoice
from .context import PassContext

NAME = "select_routes"

def op_t(graph: Graph, op: Op) -> int:
    """The op's column count: the leading dimension of its spec's `t_operand` (its first range when
    given in parts)."""
    name = family_spec(op.kind).t_operand
    if name not in op.inputs and f"{name}0" in op.inputs:  # input in parts (fuse rule concat_into)
        name = f"{name}0"
    return int(graph.tensors[op.inputs[name]].shape[0])


def op_match(graph: Graph, op: Op) -> dict[str, Any]:
    """The match keys an op presents to the table (its spec's `match` hook; docs/ARCHITECTURE.md
    "Route tables")."""
    spec = family_spec(op.kind)
    return spec.match(op_view(graph, op, spec))


def run(graph: Graph, ctx: PassContext) -> Graph:
    if ctx.table is None:
        raise CompileError(f"{NAME}: no route table")
    out = graph.copy()
    misses = list(out.meta.get("route_misses", []))
    for op in out.ops():
        if not op.is_family:
            continue
        t = op_t(out, op)
        match = op_match(out, op)
        try:
            sel = ctx.table.select(op.kind, t, match)
        except RouteError as exc:
            raise RouteError(f"{graph.extent.name}: op {op.name}: {exc}") from None
        nearest = getattr(sel, "nearest", None)
        if nearest:
            misses.append(f"{op.name}: {nearest}")
        out.replace_op(op.model_copy(update={"route": RouteChoice(
            route=sel.route.name, params=dict(sel.params), source=sel.source,
            t_range=tuple(sel.t_range), match=match, reference=getattr(sel.route, "reference", None) or None)}))
    out.meta["route_misses"] = misses
    return out
