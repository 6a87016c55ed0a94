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
from ..ir.graph import Graph
from ..ir.types import Op, RouteChoice
from .context import PassContext

NAME = "select_routes"

# The operand whose leading dimension is the op's column count T.
_T_OPERAND = {
    "embedding": "ids", "rmsnorm": "x", "linear": "x", "head_rmsnorm": "x", "rope": "x",
    "kv_append": "k", "attention": "q", "conv1d": "x", "gdn_gating": "a", "gated_delta_rule": "q",
    "gated_rmsnorm": "x", "sampling": "logits", "qk_norm_rope": "q", "l2norm": "x",
    "gdn_gating_proj": "x",
}

# The CLI's --kv-dtype spelling -> the route tables' kv_dtype match value.
KV_MATCH = {"bf16": "bf16", "int8": "int8_g64"}


def op_t(graph: Graph, op: Op) -> int:
    name = _T_OPERAND[op.kind]
    if name not in op.inputs and f"{name}0" in op.inputs:  # input in parts (fuse rule concat_into)
        name = f"{name}0"
    return int(graph.tensors[op.inputs[name]].shape[0])


def gating_proj_match(a_weight, phase: str) -> dict[str, Any]:
    """gdn_gating_proj's match: the a/b weights' format and [Hv, K], and the extent's phase (the
    fuse rule asks the same match before it fuses)."""
    return {"format": a_weight.format or a_weight.dtype, "n": int(a_weight.shape[0]),
            "k": int(a_weight.shape[1]), "phase": phase}


def op_match(graph: Graph, op: Op) -> dict[str, Any]:
    """The match keys an op presents to the table (docs/ARCHITECTURE.md "Route tables")."""
    t = graph.tensors
    k = op.kind
    phase = graph.extent.phase
    m: dict[str, Any] = {}
    if k == "linear":
        w = t[op.inputs["weight"]]
        m = {"format": w.format or w.dtype, "n": int(w.shape[0]), "k": int(w.shape[1]),
             "epilogue": op.attrs.get("epilogue", "none")}
    elif k == "embedding":
        w = t[op.inputs["table"]]
        m = {"format": w.format or w.dtype, "n": int(w.shape[0]), "k": int(w.shape[1])}
    elif k in ("rmsnorm", "head_rmsnorm", "gated_rmsnorm"):
        w = t[op.inputs["weight"]]
        m = {"format": w.format or w.dtype, "n": int(w.shape[0])}
    elif k == "rope":
        m = {"format": "BF16", "n": int(t[op.inputs["x"]].shape[-1])}
    elif k in ("kv_append", "attention"):
        kvd = op.attrs.get("kv_dtype", graph.meta.get("kv_dtype", "bf16"))
        m = {"format": "BF16", "kv_dtype": KV_MATCH.get(kvd, kvd),
             "head_dim": int(t[op.inputs["k_cache"]].shape[-1])}
        if k == "attention":
            m["phase"] = phase
    elif k == "conv1d":
        w = t[op.inputs["weight"]]
        m = {"format": w.format or w.dtype, "n": int(w.shape[1]), "k": int(w.shape[0]), "phase": phase}
    elif k == "gdn_gating":
        m = {"format": "FP32", "n": int(t[op.inputs["a"]].shape[1])}
    elif k == "gated_delta_rule":
        m = {"format": "BF16", "phase": phase}
    elif k == "sampling":
        m = {"format": "BF16", "n": int(t[op.inputs["logits"]].shape[1]), "mode": op.attrs.get("mode", "greedy")}
    elif k == "qk_norm_rope":
        w = t[op.inputs["q_weight"]]
        m = {"format": w.format or w.dtype, "n": int(w.shape[0])}
    elif k == "l2norm":
        m = {"format": "BF16", "n": int(t[op.inputs["x"]].shape[-1])}
    elif k == "gdn_gating_proj":
        m = gating_proj_match(t[op.inputs["a_weight"]], phase)
    return m


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
        variants = {}
        for mode in op.attrs.get("variants", ()):
            vm = {**match, "mode": mode}
            try:
                vs = ctx.table.select(op.kind, t, vm)
            except RouteError as exc:
                raise RouteError(f"{graph.extent.name}: op {op.name} ({op.kind} variant {mode}): {exc}") from None
            variants[mode] = {"route": vs.route.name, "params": dict(vs.params), "source": vs.source}
        out.replace_op(op.model_copy(update={"route": RouteChoice(
            route=sel.route.name, params=dict(sel.params), source=sel.source,
            t_range=tuple(sel.t_range), match=match, reference=getattr(sel.route, "reference", None) or None,
            variants=variants)}))
    out.meta["route_misses"] = misses
    return out
