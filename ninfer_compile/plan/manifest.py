"""Build the plan manifest (`plan.json`) from the compiled extent graphs.

Layout (DESIGN §7):
  format, compiler {name, version}, model_id, artifact {file, directory_sha256}, contract, sm,
  routes {table, sha256, provenance, miss, misses}, options, passes {enabled, disabled},
  memory {...}, buffers {arena {bytes, align}, state {name: {shape, per_slot_shape, dtype, bytes, kind}}},
  extents {name: {graph, phase, t, concurrency, draft_tokens, cuda_graph, dependent_launch, arena_bytes,
                  tensors {name: {shape, dtype, offset, bytes} | {shape, dtype, view_of, byte_offset, ...}},
                  inputs, outputs, launches [...]}},
  used_routes [...].
A launch = {op, kind, t, route, params, source, args {operand: ref}, attrs}; a ref is
{"buffer": name} (an arena value of this extent), {"state": buffer} or
{"weight": object, "format": F, "rows": [begin, count]} (rows only for a row view).
Structural ops that need work (add, concat, swiglu, select_rows when not fused away) are launches
with `route: null` and `builtin: kind`; reshape and split are views (no launch).
"""

from __future__ import annotations

from typing import Any

from .. import __version__
from ..errors import CompileError
from ..ir.graph import Graph
from ..ir.types import TensorType
from ..passes.plan_memory import ALIGN
from ..passes.select_routes import op_t
from .memory import MemoryReport

PLAN_FORMAT = "ninfer-plan-v1"
_NO_LAUNCH = {"input", "output", "reshape", "split"}


def _ref(t: TensorType) -> dict[str, Any]:
    if t.role == "weight":
        if t.object is None:
            raise CompileError(f"weight {t.name} is not bound (bind_weights disabled?)")
        r: dict[str, Any] = {"weight": t.object, "format": t.format}
        if t.view is not None:
            r["rows"] = [t.view.row_begin, t.view.row_count]
        return r
    if t.role == "state":
        return {"state": t.buffer}
    return {"buffer": t.name}


def extent_entry(g: Graph) -> dict[str, Any]:
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
        else:
            L.update({"t": e.t, "route": None, "builtin": op.kind})
        attrs = {k: v for k, v in op.attrs.items() if k != "merged"}
        if attrs:
            L["attrs"] = attrs
        launches.append(L)
    return {
        "graph": e.graph, "phase": e.phase, "t": e.t, "concurrency": e.concurrency,
        "draft_tokens": e.draft_tokens,
        "cuda_graph": g.meta.get("cuda_graph", {"capture": False, "reason": "plan_cuda_graphs disabled"}),
        "dependent_launch": g.meta.get("dependent_launch",
                                       {"enabled": False, "reason": "plan_dependent_launch disabled"}),
        "memory_planned": mem is not None,
        "arena_bytes": mem["arena_bytes"] if mem is not None else None,
        "fusions": dict(sorted(g.meta.get("fusions", {}).items())),
        "inputs": inputs, "outputs": outputs, "tensors": tensors, "launches": launches,
    }


def build_manifest(graphs: list[Graph], *, model_id: str, artifact_file: str, directory_sha256: str,
                   contract: str, sm: int, table, table_ref: str, options: dict[str, Any],
                   enabled: list[str], disabled: list[str], memory: MemoryReport) -> dict[str, Any]:
    extents = {g.extent.name: extent_entry(g) for g in graphs}
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
