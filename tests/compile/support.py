"""Shared test support for the IR / passes / plan / compile tests.

An isolated route registry covering every family (references = the executor's built-ins, and the
route library's real linear reference), a route table for it, tiny artifacts, and hand-built graphs.
"""

from __future__ import annotations

from pathlib import Path

from ninfer_compile.kernels.registry import ParamSpec, Registry, Route, RouteDomain

FAMILIES = ("embedding", "rmsnorm", "linear", "head_rmsnorm", "rope", "kv_append", "attention", "conv1d",
            "gdn_gating", "gated_delta_rule", "gated_rmsnorm", "sampling", "qk_norm_rope", "spec_accept",
            "state_select")
QFORMATS = ("Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S", "BF16")
EPIS = ("none", "swiglu", "residual")


def _ref(family: str) -> str:
    from ninfer_compile.kernels.family import family_spec

    return family_spec(family).reference


def make_registry() -> Registry:
    reg = Registry()
    reg.register(Route("t_gemv", "linear", RouteDomain(formats=QFORMATS, max_t=4, epilogues=EPIS),
                       {"BLOCK_N": ParamSpec("BLOCK_N", (32, 64, 128), 64)}, _ref("linear")))
    reg.register(Route("t_wide", "linear", RouteDomain(formats=QFORMATS, epilogues=EPIS),
                       {"BLOCK_T": ParamSpec("BLOCK_T", (16, 64, 128), 64)}, _ref("linear")))
    for fam in FAMILIES:
        if fam != "linear":
            reg.register(Route(f"t_{fam}", fam, RouteDomain(), {}, _ref(fam)))
    return reg


def table_text(sm: int = 90, miss: str = "error", skip: tuple[str, ...] = ()) -> str:
    lines = [f"sm: {sm}", 'provenance: {source: unmeasured, reason: "compiler test table"}', f"miss: {miss}"]
    for fam in FAMILIES:
        if fam in skip:
            continue
        lines.append(f"{fam}:")
        if fam == "linear":
            for fmt in QFORMATS:
                lines += [f"  - match: {{format: {fmt}}}", "    routes:",
                          "      - {t: [1, 4], route: t_gemv, params: {BLOCK_N: 128}}",
                          "      - {t: [5, max], route: t_wide}"]
            lines += ["  - match: {format: Q4G64_F16S, epilogue: swiglu}", "    routes:",
                      "      - {t: [1, max], route: t_wide, params: {BLOCK_T: 16}}"]
            for fmt in QFORMATS:
                if fmt == "Q4G64_F16S":
                    continue
                lines += [f"  - match: {{format: {fmt}, epilogue: swiglu}}", "    routes:",
                          "      - {t: [1, max], route: t_wide}"]
            for fmt in QFORMATS:
                lines += [f"  - match: {{format: {fmt}, epilogue: residual}}", "    routes:",
                          "      - {t: [1, 4], route: t_gemv}", "      - {t: [5, max], route: t_wide}"]
        else:
            lines += ["  - match: {}", "    routes:", f"      - {{t: [1, max], route: t_{fam}}}"]
    return "\n".join(lines) + "\n"


def write_table(dir_: Path, sm: int = 90, **kw) -> Path:
    p = Path(dir_) / f"sm{sm}.yaml"
    p.write_text(table_text(sm, **kw))
    return p


def load_test_table(dir_: Path, sm: int = 90, registry=None, **kw):
    from ninfer_compile.routes.table import load_table

    return load_table(write_table(dir_, sm, **kw), registry or make_registry())


def make_context(spec, objects, dir_: Path, **kw):
    """A PassContext whose table and registry are the isolated test ones."""
    from ninfer_compile.passes.context import PassContext

    reg = make_registry()
    return PassContext(spec=spec, objects=objects, table=load_test_table(dir_, registry=reg, **kw), registry=reg)


def tiny_artifact(path: Path, model_id: str = "tiny-qwen3.5-mtp", sparse: bool = False) -> Path:
    from ninfer_compile.convert.synthetic import pack_synthetic

    if not path.exists():
        pack_synthetic(model_id, path, progress=False, sparse=sparse)
    return path


# ------------------------------------------------------------------------------ hand-built graphs

def hand_spec():
    """A minimal spec-like object for hand-built graphs: one fused parent `p/qk` [48, 64] Q4 with
    views q [0,32) and k [32,48), a bf16 norm `p/norm` [64], a Q5 `p/out` [64, 48] and a Q4
    `p/gate_up` [64, 64] ([gate | up] halves)."""
    from types import SimpleNamespace

    def obj(name, shape, fmt):
        return SimpleNamespace(name=name, kind="tensor", shape=shape, format=fmt, bytes=1000)

    objects = {o.name: o for o in [obj("p/qk", (48, 64), "Q4G64_F16S"), obj("p/norm", (64,), "BF16"),
                                   obj("p/out", (64, 48), "Q5G64_F16S"), obj("p/gate_up", (64, 64), "Q4G64_F16S"),
                                   obj("p/vz", (32, 64), "Q5G64_F16S")]}
    return SimpleNamespace(model_id="hand", objects=objects, aliases={}, views={})


def hand_graph(t: int = 4, phase: str = "decode"):
    """x -> rmsnorm -> {q, k views of p/qk; v view of p/vz} -> add(x, out(q)) -> mlp swiglu.

    Returns an unbound, unfused graph (as lowering would emit it)."""
    from ninfer_compile.ir.graph import Graph
    from ninfer_compile.ir.types import Extent, Op, TensorType

    g = Graph(Extent(name=f"hand_t{t}", phase=phase, t=t), meta={"passes": []})
    A = lambda n, s, dt="bf16", role="activation": g.add_tensor(TensorType(name=n, shape=s, dtype=dt, role=role))  # noqa: E731
    W = lambda n, obj, s, fmt, rows=None: g.add_tensor(TensorType(  # noqa: E731
        name=n, shape=s, dtype=fmt, role="weight", logical=obj, logical_rows=rows))
    A("x", (t, 64), role="input")
    g.add_op(Op(name="inputs", kind="input", outputs={"x": "x"}))
    W("w:norm", "p/norm", (64,), "BF16")
    A("h", (t, 64))
    g.add_op(Op(name="norm", kind="rmsnorm", inputs={"x": "x", "weight": "w:norm"}, outputs={"out": "h"},
                attrs={"eps": 1e-6}))
    W("w:q", "p/qk", (32, 64), "Q4G64_F16S", ("query", 0, 32))
    W("w:k", "p/qk", (16, 64), "Q4G64_F16S", ("key", 32, 16))
    W("w:v", "p/vz", (16, 64), "Q5G64_F16S", ("value", 0, 16))
    for n, w, width in (("q", "w:q", 32), ("k", "w:k", 16), ("v", "w:v", 16)):
        A(f"{n}.out", (t, width))
        g.add_op(Op(name=f"{n}_proj", kind="linear", inputs={"x": "h", "weight": w}, outputs={"out": f"{n}.out"},
                    attrs={"epilogue": "none"}))
    A("qkv", (t, 64))
    g.add_op(Op(name="cat", kind="concat", inputs={"x0": "q.out", "x1": "k.out", "x2": "v.out"},
                outputs={"out": "qkv"}, attrs={"axis": 1}))
    W("w:out", "p/out", (64, 48), "Q5G64_F16S")
    A("qk", (t, 48))
    g.add_op(Op(name="cat2", kind="concat", inputs={"x0": "q.out", "x1": "k.out"}, outputs={"out": "qk"},
                attrs={"axis": 1}))
    A("o", (t, 64))
    g.add_op(Op(name="o_proj", kind="linear", inputs={"x": "qk", "weight": "w:out"}, outputs={"out": "o"},
                attrs={"epilogue": "none"}))
    A("x2", (t, 64))
    g.add_op(Op(name="residual", kind="add", inputs={"a": "x", "b": "o"}, outputs={"out": "x2"}))
    W("w:gate", "p/gate_up", (32, 64), "Q4G64_F16S", ("mlp_gate", 0, 32))
    W("w:up", "p/gate_up", (32, 64), "Q4G64_F16S", ("mlp_up", 32, 32))
    A("gate", (t, 32))
    A("up", (t, 32))
    g.add_op(Op(name="gate_proj", kind="linear", inputs={"x": "x2", "weight": "w:gate"}, outputs={"out": "gate"},
                attrs={"epilogue": "none"}))
    g.add_op(Op(name="up_proj", kind="linear", inputs={"x": "x2", "weight": "w:up"}, outputs={"out": "up"},
                attrs={"epilogue": "none"}))
    A("act", (t, 32), role="output")
    g.add_op(Op(name="swiglu", kind="swiglu", inputs={"gate": "gate", "up": "up"}, outputs={"out": "act"}))
    A("y", (t, 64), role="output")
    g.add_op(Op(name="outputs", kind="output", inputs={"act": "act", "qkv": "qkv", "x2": "x2"}))
    return g
