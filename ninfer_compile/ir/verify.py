"""The IR verifier: run after lowering and after every pass.

Checks: the graph is acyclic; every op input exists and is produced by an op (or is a weight, or a
state root); tensor dtypes are known; a family op's operands and attributes are the ones its
`FamilySpec` declares (presence, roles, dtypes, rank, updated states both in and out; an attribute
the spec does not declare is an error: nothing consumes it), then the spec's shape rules
(`spec.check`); structural ops' shapes agree;
once `bind_weights` ran, every weight names an existing artifact object (or a row view inside it)
with the format and shape the op needs; once `select_routes` ran, every family op has a route.
Failures raise `CompileError` naming the extent, the op and the operand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import CompileError
from ..kernels.family import REQUIRED, FamilySpec, family_specs
from .graph import Graph, op_view
from .types import DTYPE_BYTES, STRUCTURAL, Op


class _Fail(Exception):
    pass


def verify(graph: Graph, objects: Mapping[str, Any] | None = None, *, after: str = "lowering") -> None:
    """Raise CompileError on the first violation. `objects`: artifact object name → object with
    `.shape` and `.format` (an open artifact's `by_name`, or a contract's `objects`)."""
    where = f"verify after {after}: {graph.extent.name}"
    ops = graph.ops()  # raises on cycles
    passes = set(graph.meta.get("passes", []))
    bound = "bind_weights" in passes
    routed = "select_routes" in passes
    T = graph.extent.t
    specs = family_specs()
    for op in ops:
        spec = specs.get(op.kind)
        try:
            if spec is None and op.kind not in STRUCTURAL:
                raise _Fail(f"unknown op kind {op.kind!r}")
            for operand, t in op.inputs.items():
                tt = graph.tensors.get(t)
                if tt is None:
                    raise _Fail(f"input {operand}={t} is not a declared tensor")
                if graph.producer(t) is None:
                    if tt.role == "weight" or (tt.role == "state" and tt.buffer == t):
                        continue
                    raise _Fail(f"input {operand}={t} is produced by no op")
            for operand, t in op.outputs.items():
                tt = graph.tensors.get(t)
                if tt is None:
                    raise _Fail(f"output {operand}={t} is not a declared tensor")
                if tt.role == "weight":
                    raise _Fail(f"output {operand}={t} is a weight")
            for t in (*op.inputs.values(), *op.outputs.values()):
                tt = graph.tensors[t]
                if tt.role == "weight":
                    if bound:
                        _check_weight(tt, objects)
                elif tt.dtype not in DTYPE_BYTES:
                    raise _Fail(f"tensor {t} has unknown dtype {tt.dtype}")
            if spec is not None:
                operands = tuple(graph.tensors[t] for t in (*op.inputs.values(), *op.outputs.values()))
                hit = graph.family_checked.get(op.name)
                if hit is None or not _same_checks(hit[0], op) or len(hit[1]) != len(operands) or \
                        any(a is not b for a, b in zip(hit[1], operands)):
                    _check_family(graph, op, spec)
                    graph.family_checked[op.name] = (op, operands)
            else:
                _check_shapes(graph, op, T)
            if routed and spec is not None and op.route is None:
                raise _Fail("no route selected")
        except _Fail as exc:
            raise CompileError(f"{where}: op {op.name} ({op.kind}): {exc}") from None


def _check_weight(tt, objects) -> None:
    if tt.object is None:
        raise _Fail(f"weight {tt.name} is not bound to an artifact object")
    if tt.format != tt.dtype:
        raise _Fail(f"weight {tt.name}: format {tt.format} != dtype {tt.dtype}")
    if objects is None:
        return
    obj = objects.get(tt.object)
    if obj is None:
        raise _Fail(f"weight {tt.name}: artifact has no object {tt.object}")
    if getattr(obj, "kind", "tensor") != "tensor":
        raise _Fail(f"weight {tt.name}: artifact object {tt.object} is not a tensor")
    if obj.format != tt.format:
        raise _Fail(f"weight {tt.name}: object {tt.object} is {obj.format}, the op needs {tt.format}")
    oshape = tuple(obj.shape)
    if tt.shard is not None:  # a tensor-parallel rank's copy: its ranges inside the object
        sh = tt.shard
        ranges = [("rows", b, c, oshape[0]) for b, c in (sh.rows or ())]
        ranges += [("columns", b, c, oshape[1] if len(oshape) > 1 else 0) for b, c in (sh.cols or ())]
        for what, b, c, n in ranges:
            if b < 0 or c < 1 or b + c > n:
                raise _Fail(f"weight {tt.name}: shard {what} [{b},{b + c}) outside {tt.object} {list(oshape)}")
        oshape = sh.shape(oshape)
    if tt.view is not None:
        v = tt.view
        if v.parent != tt.object or v.row_begin < 0 or v.row_count < 1 or v.row_begin + v.row_count > oshape[0]:
            raise _Fail(f"weight {tt.name}: rows [{v.row_begin},{v.row_begin + v.row_count}) outside "
                        f"{tt.object} {list(oshape)}")
        want = (v.row_count, *oshape[1:])
    else:
        want = oshape
    if tuple(tt.shape) != want:
        raise _Fail(f"weight {tt.name}: shape {list(tt.shape)} != bound {list(want)}")


def _shape(graph: Graph, op: Op, operand: str, out: bool = False) -> tuple[int, ...]:
    names = op.outputs if out else op.inputs
    if operand not in names:
        raise _Fail(f"missing {'output' if out else 'input'} operand {operand!r}")
    return tuple(graph.tensors[names[operand]].shape)


def _eq(what: str, got, want) -> None:
    if tuple(got) != tuple(want):
        raise _Fail(f"{what}: shape {list(got)}, expected {list(want)}")


def _numel(s) -> int:
    n = 1
    for d in s:
        n *= d
    return n


def _same_checks(a: Op, b: Op) -> bool:
    """`b` passes the family checks `a` passed (on the same tensors): only its route may differ."""
    return a is b or (a.kind == b.kind and a.inputs == b.inputs and a.outputs == b.outputs and a.attrs == b.attrs)


class _Decl:
    """A spec's declarations indexed for the per-op checks (built once per spec)."""

    def __init__(self, spec: FamilySpec):
        self.groups = (("input", {o.name: o for o in spec.inputs}), ("output", {o.name: o for o in spec.outputs}))
        self.parts = tuple(o for o in spec.inputs if o.parts)
        self.inout = tuple(o.name for o in spec.operands if o.io == "inout")
        self.attrs = {a.name: a for a in spec.attrs}
        self.required = tuple(a.name for a in spec.attrs if a.default is REQUIRED)


_DECLS: dict[int, tuple[FamilySpec, _Decl]] = {}


def _decl(spec: FamilySpec) -> _Decl:
    hit = _DECLS.get(id(spec))
    if hit is None or hit[0] is not spec:
        hit = _DECLS[id(spec)] = (spec, _Decl(spec))
    return hit[1]


def _check_family(graph: Graph, op: Op, spec: FamilySpec) -> None:
    """The generic checks every family gets from its `Operand` / `Attr` declarations, then the
    spec's own shape rules (`spec.check`)."""
    d = _decl(spec)
    tensors = graph.tensors
    for (group, declared), names in zip(d.groups, (op.inputs, op.outputs)):
        for operand, tname in names.items():
            o = declared.get(operand)
            if o is None and group == "input":
                o = next((p for p in d.parts if operand.startswith(p.name) and operand[len(p.name):].isdigit()), None)
            if o is None:
                raise _Fail(f"{group} operand {operand!r} is not declared by the family "
                            f"(declared: {', '.join(declared) or 'none'})")
            tt = tensors[tname]
            if tt.role not in o.roles:
                raise _Fail(f"{group} operand {operand}={tt.name} has role {tt.role}, the family wants "
                            f"{' / '.join(o.roles)}")
            if o.dtypes is not None and tt.dtype not in o.dtypes:
                raise _Fail(f"{group} operand {operand}={tt.name} is {tt.dtype}, the family wants "
                            f"{' / '.join(o.dtypes)}")
            if o.rank is not None and len(tt.shape) != o.rank:
                raise _Fail(f"{group} operand {operand}={tt.name} has shape {list(tt.shape)}, the family "
                            f"wants rank {o.rank}")
        if len(names) < len(declared) or any(n not in names for n in declared):
            for o in declared.values():
                if o.optional or o.name in names or (group == "input" and o.parts and op.parts(o.name)):
                    continue
                raise _Fail(f"missing {group} operand {o.name!r}")
    for n in d.inout:
        if (n in op.inputs) != (n in op.outputs):
            raise _Fail(f"state operand {n} is updated: it must be both an input and an output")
    for name, value in op.attrs.items():
        a = d.attrs.get(name)
        if a is None:
            raise _Fail(f"attribute {name}={value!r}: nothing consumes it (family {spec.name} "
                        f"declares {', '.join(sorted(d.attrs)) or 'no attributes'})")
        if (value is not a.default and not isinstance(value, a.types)) or (isinstance(value, bool) and bool not in a.types):
            raise _Fail(f"attribute {name}={value!r} is not {'/'.join(t.__name__ for t in a.types)}")
    for name in d.required:
        if name not in op.attrs:
            raise _Fail(f"attribute {name} is required")
    if spec.check is not None:
        reason = spec.check(op_view(graph, op, spec))
        if reason:
            raise _Fail(reason)


def _check_shapes(graph: Graph, op: Op, T: int) -> None:
    """Shape rules of the structural ops (family ops: their spec, `_check_family`)."""
    k = op.kind
    S = lambda n: _shape(graph, op, n)  # noqa: E731
    O = lambda n: _shape(graph, op, n, out=True)  # noqa: E731
    if k == "add":
        _eq("b", S("b"), S("a"))
        _eq("out", O("out"), S("a"))
    elif k == "swiglu":
        _eq("up", S("up"), S("gate"))
        _eq("out", O("out"), S("gate"))
    elif k == "reshape":
        if _numel(S("x")) != _numel(O("out")):
            raise _Fail(f"reshape {list(S('x'))} -> {list(O('out'))} changes the element count")
    elif k in ("split", "concat"):
        axis = op.attrs.get("axis", 1)
        whole = O("out") if k == "concat" else S("x")
        parts = [graph.tensors[t].shape for n, t in sorted((op.inputs if k == "concat" else op.outputs).items(),
                                                             key=lambda kv: int(kv[0][-1:] or 0) if kv[0][-1:].isdigit() else 0)
                 if n.startswith("x" if k == "concat" else "out")]
        if sum(p[axis] for p in parts) != whole[axis]:
            raise _Fail(f"{k} parts {[list(p) for p in parts]} do not sum to {list(whole)} on axis {axis}")
        for p in parts:
            if tuple(p[:axis]) != tuple(whole[:axis]) or tuple(p[axis + 1:]) != tuple(whole[axis + 1:]):
                raise _Fail(f"{k} part {list(p)} does not match {list(whole)} off axis {axis}")
    elif k == "select_rows":
        x, rows = S("x"), S("rows")
        _eq("out", O("out"), (rows[0], *x[1:]))
    elif k == "take":
        tab, idx = S("table"), S("index")
        if len(tab) != 1 or len(idx) != 1:
            raise _Fail(f"take: table {list(tab)} and index {list(idx)} must be 1-D")
        _eq("out", O("out"), idx)
