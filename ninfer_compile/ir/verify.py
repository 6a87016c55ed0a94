"""The IR verifier: run after lowering and after every pass.

Checks: the graph is acyclic; every op input exists and is produced by an op (or is a weight, or a
state root); tensor dtypes are known; per-kind operand shapes agree (family operand conventions);
once `bind_weights` ran, every weight names an existing artifact object (or a row view inside it)
with the format and shape the op needs; once `select_routes` ran, every family op has a route.
Failures raise `CompileError` naming the extent, the op and the operand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import CompileError
from .graph import Graph
from .types import DTYPE_BYTES, FAMILIES, STRUCTURAL, Op


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
    for op in ops:
        try:
            if op.kind not in FAMILIES and op.kind not in STRUCTURAL:
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
            _check_shapes(graph, op, T)
            if routed and op.kind in FAMILIES and op.route is None:
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


def _dtype(graph: Graph, op: Op, operand: str, out: bool = False) -> str:
    return graph.tensors[(op.outputs if out else op.inputs)[operand]].dtype


def _eq(what: str, got, want) -> None:
    if tuple(got) != tuple(want):
        raise _Fail(f"{what}: shape {list(got)}, expected {list(want)}")


def _numel(s) -> int:
    n = 1
    for d in s:
        n *= d
    return n


def _check_shapes(graph: Graph, op: Op, T: int) -> None:
    k = op.kind
    S = lambda n: _shape(graph, op, n)  # noqa: E731
    O = lambda n: _shape(graph, op, n, out=True)  # noqa: E731
    if k == "linear":
        x, w, out = S("x"), S("weight"), O("out")
        if len(x) != 2 or len(w) != 2:
            raise _Fail(f"x {list(x)} and weight {list(w)} must be 2-D")
        if x[1] != w[1]:
            raise _Fail(f"x {list(x)} has K={x[1]}, weight {list(w)} has K={w[1]}")
        epi = op.attrs.get("epilogue", "none")
        n = w[0] // 2 if epi == "swiglu" else w[0]
        if epi == "swiglu" and w[0] % 2:
            raise _Fail(f"swiglu epilogue needs an even row count, weight {list(w)}")
        _eq("out", out, (x[0], n))
        if epi == "residual":
            _eq("residual", S("residual"), out)
        elif epi not in ("none", "swiglu"):
            raise _Fail(f"unknown epilogue {epi!r}")
    elif k == "embedding":
        ids, table = S("ids"), S("table")
        _eq("out", O("out"), (ids[0], table[1]))
        if _dtype(graph, op, "ids") != "i32":
            raise _Fail("ids must be i32")
    elif k == "rmsnorm":
        _eq("weight", S("weight"), (S("x")[-1],))
        _eq("out", O("out"), S("x"))
    elif k == "head_rmsnorm":
        x = S("x")
        if len(x) != 3:
            raise _Fail(f"x {list(x)} must be [T, heads, D]")
        _eq("weight", S("weight"), (x[2],))
        _eq("out", O("out"), x)
    elif k == "rope":
        x = S("x")
        _eq("positions", S("positions"), (x[0],))
        _eq("out", O("out"), x)
        if op.attrs.get("rotary_dim", 0) > x[-1]:
            raise _Fail("rotary_dim exceeds head dim")
    elif k == "qk_norm_rope":
        q, kk = S("q"), S("k")
        if len(q) != 3 or len(kk) != 3 or q[2] != kk[2] or q[0] != kk[0]:
            raise _Fail(f"q {list(q)} and k {list(kk)} must be [T, heads, D] with one T and D")
        _eq("q_weight", S("q_weight"), (q[2],))
        _eq("k_weight", S("k_weight"), (q[2],))
        _eq("positions", S("positions"), (q[0],))
        _eq("q out", O("q_out"), q)
        _eq("k out", O("k_out"), kk)
    elif k == "l2norm":
        _eq("out", O("out"), S("x"))
    elif k == "kv_append":
        kk, vv = S("k"), S("v")
        _eq("v", vv, kk)
        _eq("positions", S("positions"), (kk[0],))
        _eq("slots", S("slots"), (kk[0],))
        for c in ("k_cache", "v_cache"):
            cs = S(c)
            if len(cs) != 4 or tuple(cs[2:]) != tuple(kk[1:]):
                raise _Fail(f"{c} {list(cs)} does not hold [*, *, {kk[1]}, {kk[2]}]")
            _eq(f"{c} (updated)", O(c), cs)
    elif k == "attention":
        q, gate = S("q"), S("gate")
        _eq("gate", gate, q)
        kc = S("k_cache")
        if q[1] % kc[2]:
            raise _Fail(f"query heads {q[1]} not a multiple of KV heads {kc[2]}")
        if q[2] != kc[3]:
            raise _Fail(f"head dim {q[2]} != cache head dim {kc[3]}")
        _eq("out", O("out"), (q[0], q[1] * q[2]))
    elif k == "conv1d":
        if "x" in op.inputs:
            x = S("x")
        else:  # channel ranges x0 | x1 | .. (fuse rule conv_input_parts)
            parts = [S(n) for n in op.parts("x")]
            if not parts or any(len(p) != 2 or p[0] != parts[0][0] for p in parts):
                raise _Fail(f"input parts {[list(p) for p in parts]} must be [T, C_i] with one T")
            x = (parts[0][0], sum(p[1] for p in parts))
        w, st = S("weight"), S("conv_state")
        if len(w) != 2 or w[1] != x[1]:
            raise _Fail(f"weight {list(w)} must be [kernel, {x[1]}]")
        if len(st) != 3 or st[1] != w[0] - 1 or st[2] != x[1]:
            raise _Fail(f"conv_state {list(st)} must be [slots, {w[0] - 1}, {x[1]}]")
        _eq("out", O("out"), x)
        _eq("conv_state (updated)", O("conv_state"), st)
    elif k == "gdn_gating":
        a = S("a")
        _eq("b", S("b"), a)
        _eq("a_log", S("a_log"), (a[1],))
        _eq("dt_bias", S("dt_bias"), (a[1],))
        _eq("g", O("g"), a)
        _eq("beta", O("beta"), a)
        if _dtype(graph, op, "g", True) != "f32" or _dtype(graph, op, "beta", True) != "f32":
            raise _Fail("g and beta must be f32")
    elif k == "gdn_gating_proj":
        x, wa = S("x"), S("a_weight")
        if len(x) != 2 or len(wa) != 2 or wa[1] != x[1]:
            raise _Fail(f"x {list(x)} and a_weight {list(wa)} must be [T, K] and [Hv, K]")
        _eq("b_weight", S("b_weight"), wa)
        _eq("a_log", S("a_log"), (wa[0],))
        _eq("dt_bias", S("dt_bias"), (wa[0],))
        _eq("g", O("g"), (x[0], wa[0]))
        _eq("beta", O("beta"), (x[0], wa[0]))
        if _dtype(graph, op, "g", True) != "f32" or _dtype(graph, op, "beta", True) != "f32":
            raise _Fail("g and beta must be f32")
    elif k == "gated_delta_rule":
        q, kk, v = S("q"), S("k"), S("v")
        _eq("k", kk, q)
        if v[1] % q[1]:
            raise _Fail(f"value heads {v[1]} not a multiple of key heads {q[1]}")
        _eq("g", S("g"), (q[0], v[1]))
        _eq("beta", S("beta"), (q[0], v[1]))
        st = S("state")
        if tuple(st[1:]) != (v[1], q[2], v[2]):
            raise _Fail(f"state {list(st)} must be [slots, {v[1]}, {q[2]}, {v[2]}]")
        if _dtype(graph, op, "state") != "f32":
            raise _Fail("recurrent state must be f32")
        _eq("out", O("out"), v)
        _eq("state (updated)", O("state"), st)
    elif k == "gated_rmsnorm":
        x = S("x")
        _eq("z", S("z"), x)
        _eq("weight", S("weight"), (x[-1],))
        _eq("out", O("out"), (x[0], _numel(x[1:])))
    elif k == "sampling":
        lg = S("logits")
        _eq("ids", O("ids"), (lg[0],))
    elif k == "add":
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
