"""Build the plan manifest (`plan.json`) from the compiled extent graphs.

Layout (DESIGN §7):
  format, compiler {name, version}, model_id, artifact {file, directory_sha256}, contract, sm,
  routes {table, sha256, provenance, miss, misses}, options, passes {enabled, disabled},
  memory {...}, buffers {arena {bytes, align}, state {name: {shape, per_slot_shape, dtype, bytes, kind}}},
  extents {name: {graph, phase, t, concurrency, draft_tokens, [head: "argmax" (a --tp greedy twin)],
                  cuda_graph, dependent_launch, arena_bytes,
                  tensors {name: {shape, dtype, offset, bytes} | {shape, dtype, view_of, byte_offset, ...}},
                  inputs, outputs, launches [...]}},
  used_routes [...].
A launch = {op, kind, t, route, params, source, match, args {operand: ref}, outs {operand: ref},
attrs, bind [...]}; a ref is {"buffer": name} (an arena value of this extent), {"state": buffer}
or {"weight": object, "format": F, "rows": [begin, count]} (rows only for a row view; a --tp rank's
weight also has "shard": {"rows": [[begin, count], ..], "cols": [[begin, count], ..]}, the copy of the
object the runtime makes at upload, whose rows `rows` counts).
`bind` (routed launches): the launcher's arguments by name, written from the family spec
(`kernels.family.launch_bindings`): `{"arg": name, "buffer"|"weight"|"state": ref..}` per operand,
`{"arg", "scalar"}` per launcher attribute, `{"arg", "constexpr"}` per route param (defaults
overlaid), `{"arg": "workspace", "workspace": numel}` for a route with a workspace hook. The runtime
binds exactly that list. An extent's `workspace` = {numel, dtype f32}: the max over its launches
(plan/memory.py::extent_workspace_numel, which the memory report reads too). `args` / `outs` stay
for the readers that index a launch's weights (loader, integrity, bench tools).
Structural ops that need work (add, concat, swiglu, select_rows when not fused away) are launches
with `route: null` and `builtin: kind`; reshape and split are views (no launch).
"""

from __future__ import annotations

from typing import Any

from .. import __version__
from ..errors import CompileError
from ..ir.graph import Graph
from ..ir.types import TensorType
from ..kernels.family import launch_bindings
from ..passes.plan_memory import ALIGN
from ..passes.select_routes import op_t
from .memory import MemoryReport, op_workspace_numel

PLAN_FORMAT = "ninfer-plan-v1"
_NO_LAUNCH = {"input", "output", "reshape", "split"}


def _ref(t: TensorType) -> dict[str, Any]:
    if t.role == "weight":
        if t.object is None:
            raise CompileError(f"weight {t.name} is not bound (bind_weights disabled?)")
        r: dict[str, Any] = {"weight": t.object, "format": t.format}
        if getattr(t, "shard", None) is not None:  # a --tp rank's copy of the object (made at upload)
            r["shard"] = {k: [list(x) for x in v] for k, v in (("rows", t.shard.rows), ("cols", t.shard.cols))
                          if v is not None}
        if t.view is not None:
            r["rows"] = [t.view.row_begin, t.view.row_count]
        return r
    if t.role == "state":
        return {"state": t.buffer}
    return {"buffer": t.name}


def _where(g: Graph, op) -> str:
    return f"extent {g.extent.name}: op {op.name} ({op.kind})"


def operand_refs(g: Graph, op, spec) -> dict[str, dict[str, Any]]:
    """Operand name -> plan reference of every operand the family spec declares (`in` / `inout`
    from the op's inputs, `out` from its outputs; parts `x0, x1..` by their own names). An
    operand of the op the spec does not declare is a CompileError (nothing would consume it), as
    is an updated state whose output is not the same buffer as its input."""
    refs: dict[str, dict[str, Any]] = {}
    used_in: set[str] = set()
    used_out: set[str] = set()

    def names(o, src):
        if o.name in src:
            return [o.name]
        if not o.parts:
            return []
        return sorted((n for n in src if n.startswith(o.name) and n[len(o.name):].isdigit()),
                      key=lambda n: int(n[len(o.name):]))

    for o in spec.operands:
        src, used = (op.outputs, used_out) if o.io == "out" else (op.inputs, used_in)
        for n in names(o, src):
            refs[n] = _ref(g.tensors[src[n]])
            used.add(n)
            if o.io == "inout":
                if n not in op.outputs:
                    raise CompileError(f"{_where(g, op)}: updated operand {n} has no output")
                if _ref(g.tensors[op.outputs[n]]) != refs[n]:
                    raise CompileError(f"{_where(g, op)}: updated operand {n}: its output is not the buffer of its "
                                       f"input (an inout operand is one launcher argument)")
                used_out.add(n)
    for group, src, used in (("input", op.inputs, used_in), ("output", op.outputs, used_out)):
        extra = sorted(set(src) - used)
        if extra:
            raise CompileError(f"{_where(g, op)}: {group} operand {extra[0]!r} is not declared by family {spec.name}: "
                               f"no launcher argument and nothing in the compiler consumes it")
    return refs


_UNSET: Any = object()


def launch_bind(g: Graph, op, registry=None, workspace_numel: Any = _UNSET) -> list[dict[str, Any]]:
    """The explicit argument list of one routed op's launch (`registry`: the compile's route
    registry, default the library's)."""
    from ..errors import RouteError
    from ..kernels.family import family_specs

    if registry is None:
        from ..kernels.registry import default_registry as registry

    spec = family_specs().get(op.kind)
    if spec is None:
        raise CompileError(f"{_where(g, op)}: family {op.kind} has no spec (kernels/<family>/spec.py)")
    declared = {a.name for a in spec.attrs}
    for k in sorted(op.attrs):
        if k not in declared:
            raise CompileError(f"{_where(g, op)}: attribute {k!r} is not declared by family {spec.name}: no launcher "
                               f"argument and nothing in the compiler consumes it")
    refs = operand_refs(g, op, spec)
    route = registry.get_route(op.route.route)
    try:
        return launch_bindings(spec, refs, op.attrs, route.resolve_params(dict(op.route.params or {})),
                               op_workspace_numel(g, op, registry) if workspace_numel is _UNSET
                               else workspace_numel)
    except RouteError as exc:
        raise CompileError(f"{_where(g, op)}: {exc}") from None


def extent_entry(g: Graph, registry=None) -> dict[str, Any]:
    e = g.extent
    mem = g.meta.get("memory")
    tensors: dict[str, Any] = {}
    for name, t in sorted(g.tensors.items()):
        if t.role in ("weight", "state"):
            continue
        entry: dict[str, Any] = {"shape": list(t.shape), "dtype": t.dtype}
        if mem is not None:
            if name in mem["views"]:
                v = mem["views"][name]
                entry.update({"view_of": v["of"], "byte_offset": v["byte_offset"]})
                if "row_stride" in v:
                    entry.update({"col_offset": v["col_offset"], "row_stride": v["row_stride"]})
            elif name in mem["tensors"]:
                entry.update(mem["tensors"][name])
        tensors[name] = entry
    launches = []
    ws_max = 0
    inputs: dict[str, str] = {}
    outputs: dict[str, str] = {}
    for op in g.ops():
        if op.kind == "input":
            inputs = dict(op.outputs)
            continue
        if op.kind == "output":
            outputs = dict(op.inputs)
            continue
        if op.kind in _NO_LAUNCH:
            continue
        L: dict[str, Any] = {"op": op.name, "kind": op.kind,
                             "args": {k: _ref(g.tensors[v]) for k, v in op.inputs.items()},
                             "outs": {k: _ref(g.tensors[v]) for k, v in op.outputs.items()}}
        if op.is_family:
            if op.route is None:
                raise CompileError(f"{e.name}: op {op.name} has no route (select_routes disabled?); "
                                   f"use --dump-ir to inspect the graphs")
            L.update({"t": op_t(g, op), "route": op.route.route, "params": op.route.params,
                      "source": op.route.source, "match": op.route.match})
            ws = op_workspace_numel(g, op, registry)
            ws_max = max(ws_max, ws or 0)
            L["bind"] = launch_bind(g, op, registry, ws)
        else:
            L.update({"t": e.t, "route": None, "builtin": op.kind})
        attrs = {k: v for k, v in op.attrs.items() if k != "merged"}
        if attrs:
            L["attrs"] = attrs
        launches.append(L)
    return {
        "graph": e.graph, "phase": e.phase, "t": e.t, "concurrency": e.concurrency,
        "draft_tokens": e.draft_tokens, **({"head": e.head} if e.head != "sample" else {}),
        "cuda_graph": g.meta.get("cuda_graph", {"capture": False, "reason": "plan_cuda_graphs disabled"}),
        "dependent_launch": g.meta.get("dependent_launch",
                                       {"enabled": False, "reason": "plan_dependent_launch disabled"}),
        "memory_planned": mem is not None,
        "workspace": {"numel": ws_max, "dtype": "f32"},  # = extent_workspace_numel(g, registry)
        "arena_bytes": mem["arena_bytes"] if mem is not None else None,
        "fusions": dict(sorted(g.meta.get("fusions", {}).items())),
        **({"fusions_off": dict(sorted(g.meta["fusions_off"].items()))} if g.meta.get("fusions_off") else {}),
        "inputs": inputs, "outputs": outputs, "tensors": tensors, "launches": launches,
    }


def build_manifest(graphs: list[Graph], *, model_id: str, artifact_file: str, directory_sha256: str,
                   contract: str, sm: int, table, table_ref: str, options: dict[str, Any],
                   enabled: list[str], disabled: list[str], memory: MemoryReport,
                   registry=None) -> dict[str, Any]:
    extents = {g.extent.name: extent_entry(g, registry) for g in graphs}
    used = sorted({L["route"] for x in extents.values() for L in x["launches"] if L["route"]})
    misses = sorted({m for g in graphs for m in g.meta.get("route_misses", [])})
    return {
        "format": PLAN_FORMAT,
        "compiler": {"name": "ninfer-compile", "version": __version__},
        "model_id": model_id,
        "artifact": {"file": artifact_file, "directory_sha256": directory_sha256},
        "contract": contract,
        "sm": sm,
        "routes": {"table": table_ref, "sha256": table.sha256, "provenance": table.provenance,
                   "source": (table.provenance or {}).get("source"), "miss": table.miss, "misses": misses},
        "options": options,
        "passes": {"enabled": enabled, "disabled": disabled},
        "memory": memory.to_dict(),
        "buffers": {"arena": {"bytes": memory.workspace, "align": ALIGN}, "state": memory.state_buffers},
        "extents": extents,
        "used_routes": used,
    }
