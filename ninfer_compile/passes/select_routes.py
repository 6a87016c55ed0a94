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

from collections.abc import Mapping
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


def family_routes(ctx: PassContext, family: str) -> list | None:
    """The registered routes of `family` (the context's registry, else the default one); None when
    no registry is importable or the family is unknown."""
    reg = ctx.registry
    if reg is None:
        try:
            from ..kernels import registry as reg_mod

            reg = reg_mod.default_registry
        except ImportError:
            return None
    try:
        return reg.routes_for(family)
    except Exception:
        return None


def table_selects(ctx: PassContext, family: str, t: int, match: Mapping[str, Any]) -> bool:
    """A registered route of `family` covers (t, match), and the context's table (if any) selects one
    (not a `miss: nearest` fallback): the test of a pass that adds an op only where it can run."""
    routes = family_routes(ctx, family)
    if routes is None:
        return False
    if not any(r.covers(t, t, match) is None for r in routes):
        return False
    if ctx.table is None:
        return True
    try:
        sel = ctx.table.select(family, t, dict(match))
    except Exception:  # no section / unsupported range / miss: the op is not added
        return False
    return not getattr(sel, "nearest", None)


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
