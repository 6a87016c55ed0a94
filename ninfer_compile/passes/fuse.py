"""fuse — apply the fusion rules of `fuse_rules.yaml` (data) with a few generic rewriters.

Requires: weights bound (merge_views groups by stored parent); an unfused graph from lowering.
Guarantees: the graph computes the same values with fewer launches:
  - merge_views: sibling linears over contiguous row views of one parent reading one input → one
    linear over those rows + a `split` (a column view, no copy);
  - epilogue_through_split: linear → split → swiglu → one linear with `epilogue: swiglu`;
  - epilogue: linear → add → one linear with `epilogue: residual` and a `residual` operand;
  - norm_rope_pair: the q and k chains head norm -> rope of one layer become one fused op, where
    a route of that family is registered;
  - projections_into: the two linears (one input, one weight format) feeding a consumer's two
    operands, and the consumer, become one op of a fused family — only where a registered route of
    that family covers the op (T, format, phase) and, when the context has a route table, the table
    selects a route for it (e.g. GDN a/b projections + gdn_gating -> gdn_gating_proj in decode);
  - chain_into: a chain of ops of the rule's kinds, each later one reading earlier ones' outputs
    (directly or through split / reshape views, as the rule's `links` say), becomes one op of a
    fused family whose operands, outputs and attributes the rule maps from the members' — only
    when every member input is a link or a mapped operand, every member output a link or a mapped
    output, the intermediates have no other reader, no unmapped attribute is set, the family's
    shape check passes and a route covers the op (and the table selects one) (no shipped rule uses
    it now: the GDN decode chain conv1d -> gated_delta_rule -> gated_rmsnorm did, until its fused
    kernel measured slower than the three ops, bench/results/removed_fusions.md).
Each applied rewrite is counted in `graph.meta["fusions"]`. A rule the context's route table switches
off (its `fuse_off:`, with the measurement that says why) is skipped and listed, with that reason, in
`graph.meta["fusions_off"]`; a `fuse_off` name that is no rule is a CompileError at the table's line.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any


from ..errors import CompileError
from ..ir.graph import Graph
from ..ir.types import Op, RowView
from ..yaml_lines import YamlInputError, read_yaml_text, safe_load
from .context import PassContext

NAME = "fuse"
RULES_PATH = Path(__file__).with_name("fuse_rules.yaml")
_KINDS = ("concat_into", "merge_views", "epilogue_through_split", "epilogue", "norm_rope_pair",
          "projections_into", "chain_into")


def load_rules(path: Path = RULES_PATH) -> tuple[dict, ...]:
    try:
        rules = safe_load(read_yaml_text(path), path.name)
    except YamlInputError as exc:
        raise CompileError(f"{exc}: fusion rules refused") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CompileError(f"{path.name}: cannot read fusion rules: {exc}") from None
    if not isinstance(rules, list):
        raise CompileError(f"{path.name}: fusion rules must be a list")
    for i, r in enumerate(rules):
        if not isinstance(r, dict) or "name" not in r or r.get("kind") not in _KINDS:
            raise CompileError(f"{path.name}: rule {i}: needs a name and a kind in {list(_KINDS)}")
    return tuple(rules)


def run(graph: Graph, ctx: PassContext) -> Graph:
    rules = ctx.fuse_rules if ctx.fuse_rules is not None else load_rules()
    g = graph.copy()
    counts = dict(g.meta.get("fusions", {}))
    table_off = dict(getattr(ctx.table, "fuse_off", None) or {})
    unknown = sorted(set(table_off) - {r["name"] for r in rules})
    if unknown:
        _, line = table_off[unknown[0]]
        raise CompileError(f"{ctx.table.name}:{line}: fuse_off: {unknown[0]}: no such fusion rule "
                           f"(passes/fuse_rules.yaml has {', '.join(r['name'] for r in rules)})")
    off = dict(g.meta.get("fusions_off", {}))
    for rule in rules:
        if not rule.get("enabled", True):
            continue
        if rule["name"] in table_off:
            off[rule["name"]] = f"{ctx.table.name}: {table_off[rule['name']][0]}"
            continue
        n = _REWRITERS[rule["kind"]](g, rule, ctx)
        counts[rule["name"]] = counts.get(rule["name"], 0) + n
    g.meta["fusions"] = counts
    if off:
        g.meta["fusions_off"] = off
    g.prune_tensors()
    return g


# ------------------------------------------------------------------------------ rewriters


def _single_consumer(g: Graph, tensor: str) -> Op | None:
    cs = g.consumers(tensor)
    return cs[0] if len(cs) == 1 else None


def _merge_views(g: Graph, rule: Mapping[str, Any], ctx: PassContext) -> int:
    fam = rule.get("family", "linear")
    groups: dict[tuple[str, str], list[tuple[Op, RowView]]] = defaultdict(list)
    for op in g.ops():
        if op.kind != fam or op.attrs.get("epilogue", "none") != "none" or set(op.inputs) != {"x", "weight"}:
            continue
        w = g.tensors[op.inputs["weight"]]
        if w.view is None:
            continue
        groups[(op.inputs["x"], w.object)].append((op, w.view))
    merged = 0
    for (x, parent), members in sorted(groups.items()):
        members.sort(key=lambda m: m[1].row_begin)
        run: list[tuple[Op, RowView]] = []
        for m in members + [(None, None)]:
            if run and m[0] is not None and m[1].row_begin == run[-1][1].row_begin + run[-1][1].row_count:
                run.append(m)
                continue
            if len(run) >= 2:
                _merge_run(g, x, parent, run, ctx)
                merged += 1
            run = [m] if m[0] is not None else []
    return merged


def _merge_run(g: Graph, x: str, parent: str, run: list[tuple[Op, RowView]], ctx: PassContext) -> None:
    first_w = g.tensors[run[0][0].inputs["weight"]]
    begin = run[0][1].row_begin
    count = sum(v.row_count for _, v in run)
    exp = (getattr(ctx.spec, "objects", None) or {}).get(parent)
    parent_rows = tuple(exp.shape)[0] if exp is not None else None
    whole = parent_rows == count and begin == 0
    wname = f"w:{parent}" if whole else f"w:{parent}[{begin}:{begin + count}]"
    view = None if whole else RowView(parent=parent, row_begin=begin, row_count=count)
    g.set_tensor(first_w.model_copy(update={
        "name": wname, "shape": (count, *first_w.shape[1:]), "view": view, "logical": parent,
        "logical_rows": None}))
    ops = [op for op, _ in run]
    base = _common_prefix([op.name for op in ops])
    name = g.fresh_name(f"{base}{parent.rsplit('/', 1)[-1]}")
    T = g.tensors[x].shape[0]
    out = g.fresh_name(f"{name}.out")
    g.set_tensor(g.tensors[ops[0].outputs["out"]].model_copy(update={"name": out, "shape": (T, count)}))
    seq = min(op.seq for op in ops)
    for op in ops:
        g.remove_op(op.name)
    g.add_op(Op(name=name, kind="linear", inputs={"x": x, "weight": wname}, outputs={"out": out},
                attrs={"epilogue": "none", "merged": [op.name for op in ops]}, seq=seq))
    g.add_op(Op(name=g.fresh_name(f"{name}.split"), kind="split", inputs={"x": out},
                outputs={f"out{i}": op.outputs["out"] for i, op in enumerate(ops)},
                attrs={"axis": 1, "sizes": [g.tensors[op.outputs["out"]].shape[1] for op in ops]},
                seq=seq + 0.5))


def _common_prefix(names: list[str]) -> str:
    p = names[0]
    for n in names[1:]:
        while not n.startswith(p):
            p = p[:-1]
    cut = p.rfind(".")
    return p[:cut + 1] if cut >= 0 else (p or "fused.")


def _epilogue_through_split(g: Graph, rule: Mapping[str, Any], ctx: PassContext) -> int:
    a_op, b_op = rule.get("operands", ["gate", "up"])
    n = 0
    for op in g.ops_of([rule["consumer"]]):
        if op.name not in g.g:
            continue
        sp = g.producer(op.inputs[a_op])
        if sp is None or sp.kind != "split" or g.producer(op.inputs[b_op]) is not sp:
            continue
        if list(sp.outputs.values()) != [op.inputs[a_op], op.inputs[b_op]]:
            continue
        sizes = sp.attrs.get("sizes", [])
        if len(sizes) != 2 or sizes[0] != sizes[1]:
            continue
        lin = g.producer(sp.inputs["x"])
        if lin is None or lin.kind != rule["producer"] or lin.attrs.get("epilogue", "none") != "none":
            continue
        if _single_consumer(g, sp.inputs["x"]) is not sp:
            continue
        if any(_single_consumer(g, t) is not op for t in sp.outputs.values()):
            continue
        g.remove_op(op.name)
        g.remove_op(sp.name)
        g.replace_op(lin.model_copy(update={
            "outputs": {"out": op.outputs["out"]},
            "attrs": {**lin.attrs, "epilogue": rule["epilogue"]}}))
        n += 1
    return n


def _epilogue(g: Graph, rule: Mapping[str, Any], ctx: PassContext) -> int:
    n = 0
    for op in g.ops_of([rule["consumer"]]):
        a, b = op.inputs.get("a"), op.inputs.get("b")
        for main, other in ((b, a), (a, b)):
            lin = g.producer(main)
            if lin is None or lin.kind != rule["producer"] or lin.attrs.get("epilogue", "none") != "none":
                continue
            if _single_consumer(g, main) is not op or main == other:
                continue
            if g.tensors[other].shape != g.tensors[op.outputs["out"]].shape:
                continue
            g.remove_op(op.name)
            g.replace_op(lin.model_copy(update={
                "inputs": {**lin.inputs, rule.get("operand", "residual"): other},
                "outputs": {"out": op.outputs["out"]},
                "attrs": {**lin.attrs, "epilogue": rule["epilogue"]}}))
            n += 1
            break
    return n


def _family_routes(ctx: PassContext, family: str) -> list | None:
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


def _route_supports(ctx: PassContext, req: Mapping[str, Any]) -> bool:
    routes = _family_routes(ctx, req["family"])
    return bool(routes)


def _norm_rope_pair(g: Graph, rule: Mapping[str, Any], ctx: PassContext) -> int:
    req = rule.get("requires_route_support")
    if req and not _route_supports(ctx, req):
        return 0
    chains: dict[str, list[tuple[Op, Op]]] = defaultdict(list)
    for rope in g.ops_of([rule["rope"]]):
        norm = g.producer(rope.inputs["x"])
        if norm is None or norm.kind != rule["norm"] or _single_consumer(g, norm.outputs["out"]) is not rope:
            continue
        src = norm.inputs["x"]  # trace through reshapes to the op that produced the columns
        p = g.producer(src)
        while p is not None and p.kind == "reshape":
            p = g.producer(p.inputs["x"])
        if p is None or p.kind != "split":
            continue
        chains[p.name].append((norm, rope))
    n = 0
    for key in sorted(chains):
        pair = chains[key]
        if len(pair) != 2:
            continue
        (qn, qr), (kn, kr) = sorted(pair, key=lambda c: c[0].seq)
        if qr.inputs["positions"] != kr.inputs["positions"] or qr.attrs != kr.attrs or qn.attrs != kn.attrs:
            continue
        for op in (qn, qr, kn, kr):
            g.remove_op(op.name)
        name = g.fresh_name(_common_prefix([qn.name, kn.name]) + rule["into"])
        g.add_op(Op(name=name, kind=rule["into"], seq=qn.seq,
                    inputs={"q": qn.inputs["x"], "k": kn.inputs["x"], "q_weight": qn.inputs["weight"],
                            "k_weight": kn.inputs["weight"], "positions": qr.inputs["positions"]},
                    outputs={"q_out": qr.outputs["out"], "k_out": kr.outputs["out"]},
                    attrs={"eps": qn.attrs.get("eps"), **qr.attrs}))
        n += 1
    return n


def _fused_route_ok(ctx: PassContext, family: str, t: int, match: Mapping[str, Any]) -> bool:
    """A registered route of `family` covers (t, match), and the context's table (if any) selects one."""
    routes = _family_routes(ctx, family)
    if routes is None:
        return False
    if not any(r.covers(t, t, match) is None for r in routes):
        return False
    if ctx.table is None:
        return True
    try:
        sel = ctx.table.select(family, t, dict(match))
    except Exception:  # no section / unsupported range / miss: keep the unfused ops
        return False
    return not getattr(sel, "nearest", None)


def _projections_into(g: Graph, rule: Mapping[str, Any], ctx: PassContext) -> int:
    from .select_routes import op_match, op_t

    a_op, b_op = rule.get("operands", ["a", "b"])
    formats = set(rule.get("formats") or [])
    fam = rule["into"]
    n = 0
    for op in g.ops_of([rule["consumer"]]):
        lins = [g.producer(op.inputs[a_op]), g.producer(op.inputs[b_op])]
        if any(lin is None or lin.kind != rule["producer"] or set(lin.inputs) != {"x", "weight"}
               or lin.attrs.get("epilogue", "none") != "none" for lin in lins):
            continue
        la, lb = lins
        if la is lb or la.name == lb.name or la.inputs["x"] != lb.inputs["x"]:
            continue
        if any(_single_consumer(g, lin.outputs["out"]) is not op or g.tensors[lin.outputs["out"]].role == "output"
               for lin in lins):
            continue
        wa, wb = g.tensors[la.inputs["weight"]], g.tensors[lb.inputs["weight"]]
        fmt_a, fmt_b = wa.format or wa.dtype, wb.format or wb.dtype
        if fmt_a != fmt_b or (formats and fmt_a not in formats) or wa.shape != wb.shape:
            continue
        fused = Op(name=g.fresh_name(op.name + "_proj"), kind=fam, seq=min(la.seq, lb.seq),
                   inputs={"x": la.inputs["x"], f"{a_op}_weight": la.inputs["weight"],
                           f"{b_op}_weight": lb.inputs["weight"],
                           **{k: v for k, v in op.inputs.items() if k not in (a_op, b_op)}},
                   outputs=dict(op.outputs), attrs={**op.attrs, "merged": [la.name, lb.name, op.name]})
        if not _fused_route_ok(ctx, fam, op_t(g, fused), op_match(g, fused)):
            continue
        for o in (la, lb, op):
            g.remove_op(o.name)
        g.add_op(fused)
        n += 1
    return n


def _launchers_take(ctx: PassContext, family: str, names: list[str]) -> bool:
    """The family's spec lets its launchers take every one of `names` (`<operand>0 .. <operand>n`):
    the operand is declared with `parts` >= n + 1 (a test holds every launcher to its spec), and every
    route of the family has a launcher at all."""
    from ..kernels.family import family_specs

    spec = family_specs().get(family)
    routes = _family_routes(ctx, family)
    if spec is None or not routes or any(r.launcher is None for r in routes):
        return False
    for n in names:
        base = n.rstrip("0123456789")
        idx = n[len(base):]
        op = next((o for o in spec.operands if o.name == base), None)
        if op is None or not idx or int(idx) >= op.parts:
            return False
    return True


def _concat_into(g: Graph, rule: Mapping[str, Any], ctx: PassContext) -> int:
    """concat(x0, .., xn) along the last axis of a 2-D tensor, feeding only operand `operand` of one
    `consumer` op, becomes that op reading the parts as operands `<operand>0..n` (no joined copy),
    where every route of the consumer's family has a launcher taking those operands."""
    operand, n = rule["operand"], 0
    for op in g.ops_of(["concat"]):
        out = op.outputs["out"]
        t = g.tensors[out]
        cons = g.consumers(out)
        if len(cons) != 1 or t.role == "output" or len(t.shape) != 2 or int(op.attrs.get("axis", -1)) not in (1, -1):
            continue
        c = cons[0]
        if c.kind != rule["consumer"] or c.inputs.get(operand) != out \
                or sum(1 for v in c.inputs.values() if v == out) != 1:
            continue
        parts = [op.inputs[k] for k in sorted(op.inputs, key=lambda k: int(k[1:]))]
        if len(parts) > int(rule.get("max_parts", 3)):
            continue
        names = [f"{operand}{i}" for i in range(len(parts))]
        if not _launchers_take(ctx, c.kind, names):
            continue
        inputs = {k: v for k, v in c.inputs.items() if k != operand}
        inputs.update(zip(names, parts))
        g.remove_op(op.name)
        g.replace_op(c.model_copy(update={"inputs": inputs, "attrs": {
            **c.attrs, "parts_of": operand, "merged": [*c.attrs.get("merged", []), op.name]}}))
        n += 1
    return n


def _chain_into(g: Graph, rule: Mapping[str, Any], ctx: PassContext) -> int:
    from .fuse_chain import chain_into  # its own module (fuse.py's size); it uses this module's helpers

    return chain_into(g, rule, ctx)


_REWRITERS = {
    "chain_into": _chain_into,
    "concat_into": _concat_into,
    "projections_into": _projections_into,
    "norm_rope_pair": _norm_rope_pair,
    "merge_views": _merge_views,
    "epilogue_through_split": _epilogue_through_split,
    "epilogue": _epilogue,
}
