"""fuse rewriter `chain_into` (passes/fuse.py's module doc; rules in fuse_rules.yaml): a chain of ops
of the rule's kinds, linked through view ops, becomes one op of a fused family. Data-driven: the rule
names the kinds, the links, the operand / output / attribute maps; this code names no family."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import CompileError
from ..ir.graph import Graph
from ..ir.types import Op
from .context import PassContext
from .fuse import RULES_PATH, _common_prefix, _fused_route_ok


def _ref_parts(ref: str) -> tuple[str, str, int | None]:
    """`kind.operand` or `kind.operand[i]` (i: the output's index in the split on the path)."""
    idx = None
    if ref.endswith("]"):
        ref, _, i = ref[:-1].partition("[")
        idx = int(i)
    kind, _, operand = ref.partition(".")
    if not kind or not operand:
        raise CompileError(f"{RULES_PATH.name}: chain_into reference {ref!r} is not kind.operand")
    return kind, operand, idx


def _is_view(g: Graph, op: Op, through: set[str]) -> bool:
    """A split along the last axis of a 2-D tensor, or a reshape that keeps the leading (T) axis."""
    if op.kind not in through or set(op.inputs) != {"x"}:
        return False
    x = g.tensors[op.inputs["x"]].shape
    if op.kind == "split":
        return len(x) == 2 and int(op.attrs.get("axis", 1)) in (1, -1)
    if op.kind == "reshape":
        (out,) = op.outputs.values()
        return g.tensors[out].shape[:1] == x[:1]
    return False


def _trace_back(g: Graph, tensor: str, through: set[str]) -> tuple[Op | None, str | None, list[int], list[Op]]:
    """From `tensor` back through view ops to the op that made it: (that op, its output operand,
    the split indexes passed, the view ops passed)."""
    idxs: list[int] = []
    views: list[Op] = []
    p = g.producer(tensor)
    while p is not None and _is_view(g, p, through):
        if p.kind == "split":
            idxs.insert(0, list(p.outputs.values()).index(tensor))
        views.append(p)
        tensor = p.inputs["x"]
        p = g.producer(tensor)
    if p is None:
        return None, None, idxs, views
    operand = next(k for k, v in p.outputs.items() if v == tensor)
    return p, operand, idxs, views


def chain_into(g: Graph, rule: Mapping[str, Any], ctx: PassContext) -> int:
    """See fuse.py's module doc. Rule keys: `chain` (member kinds, dataflow order, each kind once),
    `through` (view op kinds), `links` ({"kind.operand": "kind.output[i]"}), `inputs` / `outputs`
    ({fused operand: "kind.operand"}), `attrs` ({fused attr: "kind.attr" | {shape_of: "kind.operand",
    axis: n}}), `drop_attrs` (member attributes that may be set and are not carried), `into`,
    `op_name` (the fused op's name after the members' common prefix)."""
    from ..kernels.family import family_specs
    from ..ir.graph import op_view
    from .select_routes import op_match, op_t

    chain = list(rule["chain"])
    through = set(rule.get("through", ["split", "reshape"]))
    links = {_ref_parts(k)[:2]: _ref_parts(v) for k, v in (rule.get("links") or {}).items()}
    ins = {k: _ref_parts(v)[:2] for k, v in rule["inputs"].items()}
    outs = {k: _ref_parts(v)[:2] for k, v in rule["outputs"].items()}
    drop = set(rule.get("drop_attrs", []))
    fam = rule["into"]
    specs = family_specs()
    spec = specs.get(fam)
    if spec is None or any(k not in specs for k in chain):
        return 0
    n = 0
    for first in g.ops_of([chain[0]]):
        if first.name not in g.g:
            continue
        members: dict[str, Op] = {chain[0]: first}
        views: dict[str, Op] = {}
        ok = True
        for kind in chain[1:]:  # the next member: a reader (through views) of the members so far
            cands, frontier, seen = [], [t for m in members.values() for t in m.outputs.values()], set()
            while frontier:
                t = frontier.pop()
                for c in g.consumers(t):
                    if c.name in seen:
                        continue
                    seen.add(c.name)
                    if c.kind == kind:
                        cands.append(c)
                    elif _is_view(g, c, through):
                        frontier.extend(c.outputs.values())
            if len(cands) != 1:
                ok = False
                break
            members[kind] = cands[0]
        if not ok:
            continue
        # every link holds (through views only); the other inputs are mapped operands
        mapped_in = {}
        for fo, (kind, operand) in ins.items():
            m = members[kind]
            if operand in m.inputs:
                mapped_in[fo] = [(fo, m.inputs[operand])]
            elif m.parts(operand):
                mapped_in[fo] = [(f"{fo}{p[len(operand):]}", m.inputs[p]) for p in m.parts(operand)]
            else:
                ok = False
        delivered = {t for pairs in mapped_in.values() for _, t in pairs}
        for kind, m in members.items():
            for operand, t in m.inputs.items():
                link = links.get((kind, operand))
                if link is None:
                    if t not in delivered:
                        ok = False
                    continue
                src, so, idxs, passed = _trace_back(g, t, through)
                if src is None or src is not members.get(link[0]) or so != link[1] \
                        or idxs != ([] if link[2] is None else [link[2]]):
                    ok = False
                views.update((v.name, v) for v in passed)
            # outputs: a mapped output, or read only by members / the views between them
            for operand, t in m.outputs.items():
                if (kind, operand) in outs.values():
                    continue
                if not _internal(g, t, {x.name for x in members.values()}, views, through):
                    ok = False
            for a in m.attrs:
                if a not in drop and not any(v == f"{kind}.{a}" for v in rule.get("attrs", {}).values()):
                    ok = False
        if not ok or any(g.tensors[t].role == "output" for v in views.values() for t in v.outputs.values()):
            continue
        attrs: dict[str, Any] = {}
        for fa, src in (rule.get("attrs") or {}).items():
            if isinstance(src, Mapping):
                kind, operand, _ = _ref_parts(src["shape_of"])
                attrs[fa] = int(g.tensors[members[kind].inputs[operand]].shape[int(src["axis"])])
                continue
            kind, a, _ = _ref_parts(src)
            val = specs[kind].resolve_attrs(members[kind].attrs).get(a)
            if val is not None:
                attrs[fa] = val
        inputs = {}
        for o in spec.inputs:
            for name, t in mapped_in.get(o.name, []):
                inputs[name] = t
        parted = [fo for fo, pairs in mapped_in.items() if pairs and pairs[0][0] != fo]
        if parted:
            attrs["parts_of"] = parted[0]
        # outputs in the rule's order: the order the family's reference returns them (the executor zips)
        outputs = {fo: members[kind].outputs[operand] for fo, (kind, operand) in outs.items()
                   if operand in members[kind].outputs}
        if set(outputs) != set(outs) or any(o.name not in outs for o in spec.outputs if not o.optional):
            continue
        merged = []
        for m in members.values():
            merged += [*(m.attrs.get("merged") or []), m.name]
        merged += sorted(views)
        last = members[chain[-1]]
        fused = Op(name=g.fresh_name(_common_prefix([m.name for m in members.values()]) + rule.get("op_name", fam)),
                   kind=fam, inputs=inputs, outputs=outputs, attrs={**attrs, "merged": merged}, seq=last.seq)
        if spec.check is not None and spec.check(op_view(g, fused, spec)) is not None:
            continue
        if not _fused_route_ok(ctx, fam, op_t(g, fused), op_match(g, fused)):
            continue
        for o in [*members.values(), *views.values()]:
            g.remove_op(o.name)
        g.add_op(fused)
        n += 1
    return n


def _internal(g: Graph, tensor: str, names: set[str], views: dict[str, Op], through: set[str]) -> bool:
    """`tensor` is not a graph output and is read only by chain members (`names`) or by views whose
    outputs are in turn internal (those views are added to `views`: they go with the members)."""
    if g.tensors[tensor].role == "output":
        return False
    for c in g.consumers(tensor):
        if c.name in names:
            continue
        if not _is_view(g, c, through) or not all(_internal(g, t, names, views, through) for t in c.outputs.values()):
            return False
        views[c.name] = c
    return True
