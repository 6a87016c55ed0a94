"""plan_memory — place every step value in the activation arena by liveness.

Requires: the final op set (fusion done); routes selected or not (memory does not depend on them).
Guarantees: `graph.meta["memory"]` = {
    "arena_bytes": high-water mark of this extent (the plan's arena is the max over extents),
    "tensors": {name: {"offset", "bytes"}} for every input / activation / output value,
    "views": {name: {"of", "byte_offset", "col_offset", "row_stride"}} for values that are views
             of another (reshape: same bytes; split: a column slice, no copy),
    "state": [persistent buffers this extent touches] };
  two values whose live ranges [producer, last consumer] overlap never overlap in bytes; offsets are
  256-byte aligned. Placement is first-fit in launch order (deterministic).
"""

from __future__ import annotations

from ..ir.graph import Graph
from ..ir.types import DTYPE_BYTES
from .context import PassContext

NAME = "plan_memory"
ALIGN = 256


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def run(graph: Graph, ctx: PassContext) -> Graph:
    out = graph.copy()
    ops = out.ops()
    tensors = out.tensors
    # views: reshape output = its input's bytes; split outputs = column slices of the input.
    views: dict[str, dict] = {}
    for op in ops:
        if op.kind == "reshape":
            views[op.outputs["out"]] = {"of": op.inputs["x"], "byte_offset": 0}
        elif op.kind == "split":
            x = tensors[op.inputs["x"]]
            width = x.shape[-1]
            esize = DTYPE_BYTES[x.dtype]
            col = 0
            for i in range(len(op.outputs)):
                t = op.outputs[f"out{i}"]
                views[t] = {"of": op.inputs["x"], "byte_offset": col * esize, "col_offset": col,
                            "row_stride": width}
                col += tensors[t].shape[-1]

    def root(t: str) -> str:
        while t in views:
            t = views[t]["of"]
        return t

    # resolve views to their roots (byte offsets accumulate; a view of a column slice keeps the
    # slice's stride)
    resolved: dict[str, dict] = {}
    for t in views:
        off, stride, col, cur = 0, None, None, t
        while cur in views:
            v = views[cur]
            off += v["byte_offset"]
            if "row_stride" in v and stride is None:
                stride, col = v["row_stride"], v["col_offset"]
            cur = v["of"]
        entry = {"of": cur, "byte_offset": off}
        if stride is not None:
            entry.update(col_offset=col, row_stride=stride)
        resolved[t] = entry

    # live ranges over launch indices, per root value
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    end = len(ops)
    for i, op in enumerate(ops):
        for t in op.outputs.values():
            tt = tensors[t]
            if tt.role in ("state", "weight"):
                continue
            r = root(t)
            first.setdefault(r, i)
            last[r] = max(last.get(r, i), i)
        for t in op.inputs.values():
            tt = tensors[t]
            if tt.role in ("state", "weight"):
                continue
            r = root(t)
            last[r] = max(last.get(r, i), i)
    for r in first:
        if tensors[r].role in ("input", "output"):  # step buffers: live for the whole step
            first[r], last[r] = 0, end

    dies_at: dict[int, list[str]] = {}
    born_at: dict[int, list[str]] = {}
    for r, i in first.items():
        born_at.setdefault(i, []).append(r)
        dies_at.setdefault(last[r], []).append(r)

    free: list[list[int]] = []  # sorted [offset, size] gaps below `top`
    top = 0
    placed: dict[str, dict] = {}
    for i in range(end + 1):
        for r in sorted(born_at.get(i, ())):
            size = _align(max(tensors[r].nbytes, 1))
            off = None
            for gap in free:
                if gap[1] >= size:
                    off = gap[0]
                    gap[0] += size
                    gap[1] -= size
                    break
            if off is None:
                off = top
                top += size
            free = [g for g in free if g[1] > 0]
            placed[r] = {"offset": off, "bytes": size}
        for r in sorted(dies_at.get(i, ())):
            p = placed[r]
            free.append([p["offset"], p["bytes"]])
            free = _coalesce(free)
    state = sorted({tensors[t].buffer for t in tensors if tensors[t].role == "state"})
    out.meta["memory"] = {"arena_bytes": top, "tensors": placed, "views": resolved, "state": state}
    return out


def _coalesce(free: list[list[int]]) -> list[list[int]]:
    free.sort()
    out: list[list[int]] = []
    for g in free:
        if out and out[-1][0] + out[-1][1] == g[0]:
            out[-1][1] += g[1]
        else:
            out.append(list(g))
    return out
