"""Family specs (kernels/<family>/spec.py): every routed family has one, the verifier checks what
they declare, and a family declared only by a spec (plus its routes and table rows) flows through
verify, select_routes and the executor without any change to shared code."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from compile.support import hand_graph
from ninfer_compile.errors import CompileError
from ninfer_compile.ir.execute import ExecState, Executor
from ninfer_compile.ir.graph import Graph, op_view
from ninfer_compile.ir.types import Extent, Op, TensorType
from ninfer_compile.ir.verify import verify
from ninfer_compile.kernels import family
from ninfer_compile.kernels.family import Attr, FamilySpec, OpView, Operand, family_spec, family_specs
from ninfer_compile.kernels.registry import ParamSpec, Registry, Route, RouteDomain, default_registry, load_callable
from ninfer_compile.passes import select_routes
from ninfer_compile.passes.context import PassContext
from ninfer_compile.routes.table import load_table

KERNELS = Path(family.__file__).parent


def test_every_registered_route_family_has_a_spec():
    specs = family_specs()
    routed = {r.family for r in default_registry.all_routes()}
    assert routed and not routed - set(specs), f"routes of undeclared families: {sorted(routed - set(specs))}"
    assert "l2norm" not in specs and "l2norm" not in routed  # deleted: nothing lowered to it


@pytest.mark.parametrize("name", sorted(family_specs()))
def test_spec_is_consistent(name):
    s = family_spec(name)
    assert callable(load_callable(s.reference)), s.reference
    names = [o.name for o in s.operands]
    assert len(names) == len(set(names)), f"{name}: operand declared twice"
    assert s.t_operand in {o.name for o in s.inputs}
    assert set(s.int_match_keys) <= set(s.match_keys)
    assert s.outputs, f"{name} declares no output"


def test_spec_modules_import_no_torch_or_triton():
    for p in sorted(KERNELS.glob("*/spec.py")):
        for node in ast.parse(p.read_text()).body:
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not [m for m in mods if m.split(".")[0] in ("torch", "triton")], f"{p} imports {mods}"


def test_verifier_names_the_operand_the_spec_rejects():
    g = hand_graph()
    norm = g.op("norm")
    g.replace_op(norm.model_copy(update={"inputs": {"x": "x", "weight": "x"}}))  # an input where a weight goes
    with pytest.raises(CompileError, match=r"op norm \(rmsnorm\): input operand weight=x has role input, "
                                           r"the family wants weight"):
        verify(g)
    g = hand_graph()
    g.replace_op(g.op("norm").model_copy(update={"inputs": {"x": "x"}}))
    with pytest.raises(CompileError, match=r"op norm \(rmsnorm\): missing input operand 'weight'"):
        verify(g)
    g = hand_graph()
    g.replace_op(g.op("norm").model_copy(update={"inputs": {"x": "x", "weight": "w:norm", "bias": "x"}}))
    with pytest.raises(CompileError, match=r"input operand 'bias' is not declared by the family"):
        verify(g)


def test_undeclared_attribute_fails_naming_it():
    g = hand_graph()
    g.replace_op(g.op("norm").model_copy(update={"attrs": {"eps": 1e-6, "staged_input": {"first": True}}}))
    with pytest.raises(CompileError, match=r"op norm \(rmsnorm\): attribute staged_input=.*nothing consumes it"):
        verify(g)
    g = hand_graph()
    g.replace_op(g.op("norm").model_copy(update={"attrs": {"eps": "tiny"}}))
    with pytest.raises(CompileError, match=r"op norm \(rmsnorm\): attribute eps='tiny' is not float/int"):
        verify(g)
    g = hand_graph()
    g.replace_op(g.op("norm").model_copy(update={"attrs": {}}))
    with pytest.raises(CompileError, match=r"op norm \(rmsnorm\): attribute eps is required"):
        verify(g)


def test_op_view_fills_defaults_and_formats():
    g = hand_graph()
    v = op_view(g, g.op("q_proj"))
    assert v.shape("weight") == (32, 64) and v.format("weight") == "Q4G64_F16S"
    assert v.attr("epilogue") == "none" and v.attr("merged") is None and v.phase == "decode"
    assert family_spec("linear").match(v) == {"format": "Q4G64_F16S", "n": 32, "k": 64, "epilogue": "none"}


# ------------------------------------------------------------------------------ a fake family

CALLS: list[str] = []


def scale_rows(x, factor):
    """The fake family's fp32 reference (the executor's choice before route selection)."""
    CALLS.append("spec")
    return x.float() * factor


def scale_rows_route(x, factor):
    CALLS.append("route")
    return x.float() * factor


def _check(v: OpView) -> str | None:
    if v.shape("out", out=True) != v.shape("x"):
        return f"out {list(v.shape('out', out=True))} must equal x {list(v.shape('x'))}"
    return None


FAKE = FamilySpec(
    name="scale_rows",
    operands=(Operand("x", roles=("input", "activation"), rank=2), Operand("out", io="out", roles=("output",), rank=2)),
    attrs=(Attr("factor", (float, int)),),
    t_operand="x",
    match=lambda v: {"format": "BF16", "n": int(v.shape("x")[1]), "parity": "even" if v.shape("x")[1] % 2 == 0 else "odd"},
    check=_check,
    reference=f"{__name__}:scale_rows",
    match_keys=("parity",),
)


@pytest.fixture
def fake_family(monkeypatch):
    monkeypatch.setattr(family._default, "_specs", {**family_specs(), FAKE.name: FAKE})
    CALLS.clear()
    yield FAKE


def _fake_graph(n: int, out_n: int | None = None, **attrs) -> Graph:
    g = Graph(Extent(name="fake_t3", phase="decode", t=3), meta={"passes": []})
    g.add_tensor(TensorType(name="x", shape=(3, n), dtype="bf16", role="input"))
    g.add_tensor(TensorType(name="y", shape=(3, out_n or n), dtype="bf16", role="output"))
    g.add_op(Op(name="inputs", kind="input", outputs={"x": "x"}))
    g.add_op(Op(name="s", kind="scale_rows", inputs={"x": "x"}, outputs={"out": "y"}, attrs={"factor": 2.0, **attrs}))
    g.add_op(Op(name="outputs", kind="output", inputs={"y": "y"}))
    return g


def test_a_new_family_is_its_spec_routes_and_rows(fake_family, tmp_path):
    reg = Registry()
    ref = f"{__name__}:scale_rows_route"
    reg.register(Route("scale_even", "scale_rows", RouteDomain(), {}, ref))
    reg.register(Route("scale_odd", "scale_rows", RouteDomain(),
                       {"B": ParamSpec("B", (1, 2), 1)}, ref))
    p = tmp_path / "sm90.yaml"
    p.write_text('sm: 90\nprovenance: {source: unmeasured, reason: "fake family test"}\nmiss: error\n'
                 "scale_rows:\n"
                 "  - match: {parity: even}\n    routes:\n      - {t: [1, max], route: scale_even}\n"
                 "  - match: {parity: odd}\n    routes:\n      - {t: [1, max], route: scale_odd, params: {B: 2}}\n")
    table = load_table(p, reg)

    g = _fake_graph(5)
    verify(g)
    assert g.op("s").is_family
    x = torch.arange(15, dtype=torch.float32).reshape(3, 5)
    before = Executor(SimpleNamespace(get=None)).run(g, {"x": x}, ExecState())
    assert CALLS == ["spec"] and torch.equal(before["y"], x * 2)

    g.meta["passes"] = ["select_routes"]
    sel = select_routes.run(g, PassContext(spec=None, table=table, registry=reg))
    verify(sel, after="select_routes")
    rc = sel.op("s").route
    assert (rc.route, rc.params, rc.match) == ("scale_odd", {"B": 2}, {"format": "BF16", "n": 5, "parity": "odd"})
    assert rc.source == "sm90.yaml:10"  # the row's line
    assert select_routes.op_t(sel, sel.op("s")) == 3
    after = Executor(SimpleNamespace(get=None)).run(sel, {"x": x}, ExecState())
    assert CALLS == ["spec", "route"] and torch.equal(after["y"], before["y"])
    even = select_routes.run(_fake_graph(4), PassContext(spec=None, table=table, registry=reg))
    assert even.op("s").route.route == "scale_even"


def test_a_new_family_is_verified_from_its_spec(fake_family):
    with pytest.raises(CompileError, match=r"op s \(scale_rows\): out \[3, 6\] must equal x \[3, 5\]"):
        verify(_fake_graph(5, out_n=6))
    with pytest.raises(CompileError, match=r"op s \(scale_rows\): attribute bias=1: nothing consumes it"):
        verify(_fake_graph(5, bias=1))
