"""Fuse rule conv_input_parts (rewriter `concat_into`): concat(q, k, v) -> conv1d becomes the conv1d
reading the parts in place — Before/After on a small hand-built graph."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ninfer_compile.ir.execute import ExecState, Executor
from ninfer_compile.ir.graph import Graph
from ninfer_compile.ir.types import Extent, Op, TensorType
from ninfer_compile.ir.verify import verify
from ninfer_compile.passes import bind_weights, fuse
from ninfer_compile.passes.context import PassContext

KW, VW, KTAP, SLOTS = 8, 16, 4, 2
C = 2 * KW + VW


def _spec():
    o = SimpleNamespace(name="p/conv", kind="tensor", shape=(KTAP, C), format="BF16", bytes=KTAP * C * 2)
    return SimpleNamespace(model_id="hand-conv", objects={"p/conv": o}, aliases={}, views={})


def conv_graph(t: int = 3, phase: str = "decode", concat_is_output: bool = False, second_reader: bool = False):
    """q, k, v (inputs) -> concat -> conv1d (rolling state) -> out."""
    g = Graph(Extent(name=f"conv_{phase}_t{t}", phase=phase, t=t), meta={"passes": []})
    A = lambda n, s, dt="bf16", role="activation": g.add_tensor(TensorType(name=n, shape=s, dtype=dt, role=role))  # noqa: E731
    for n, w in (("q", KW), ("k", KW), ("v", VW)):
        A(n, (t, w), role="input")
    A("positions", (t,), "i32", role="input")
    A("slots", (t,), "i32", role="input")
    g.add_op(Op(name="inputs", kind="input", outputs={n: n for n in ("q", "k", "v", "positions", "slots")}))
    A("qkv", (t, C), role="output" if concat_is_output else "activation")
    g.add_op(Op(name="l0.qkv_concat", kind="concat", inputs={"x0": "q", "x1": "k", "x2": "v"},
                outputs={"out": "qkv"}, attrs={"axis": 1}))
    g.add_tensor(TensorType(name="w:conv", shape=(KTAP, C), dtype="BF16", role="weight", logical="p/conv"))
    g.add_tensor(TensorType(name="conv", shape=(SLOTS, KTAP - 1, C), dtype="bf16", role="state", buffer="conv"))
    g.add_tensor(TensorType(name="conv@1", shape=(SLOTS, KTAP - 1, C), dtype="bf16", role="state", buffer="conv"))
    A("out", (t, C), role="output")
    g.add_op(Op(name="l0.conv", kind="conv1d", inputs={"x": "qkv", "weight": "w:conv", "conv_state": "conv",
                                                       "positions": "positions", "slots": "slots"},
                outputs={"out": "out", "conv_state": "conv@1"}, attrs={"activation": "silu"}))
    outs = {"out": "out"}
    if second_reader:
        A("qkv2", (t, C))
        g.add_op(Op(name="l0.copy", kind="reshape", inputs={"x": "qkv"}, outputs={"out": "qkv2"}))
        outs["qkv2"] = "qkv2"
    if concat_is_output:
        outs["qkv"] = "qkv"
    g.add_op(Op(name="outputs", kind="output", inputs=outs))
    return g


def _ctx():
    spec = _spec()
    return PassContext(spec=spec, objects=spec.objects)  # the shipped registry (conv1d launchers take parts)


def _run(graph, t):
    gen = torch.Generator().manual_seed(t)
    w = {"p/conv": torch.randn(KTAP, C, generator=gen) * 0.3}
    ins = {n: torch.randn(t, wd, generator=gen) for n, wd in (("q", KW), ("k", KW), ("v", VW))}
    ins |= {"positions": torch.arange(5, 5 + t, dtype=torch.int32) if t > 1 else torch.tensor([5], dtype=torch.int32),
            "slots": torch.full((t,), 1, dtype=torch.int32)}
    st = ExecState({"conv": torch.randn(SLOTS, KTAP - 1, C, generator=gen)})
    out = Executor(SimpleNamespace(get=lambda n: w[n]), use_routes=False).run(graph, ins, st)
    return out["out"], st.buffers["conv"]


@pytest.mark.parametrize("t,phase", [(1, "decode"), (3, "prefill")])
def test_concat_feeding_conv_becomes_parts(t, phase):
    ctx = _ctx()
    before = bind_weights.run(conv_graph(t, phase), ctx)
    before.meta["passes"] = ["bind_weights"]
    after = fuse.run(before, ctx)
    verify(after, ctx.objects, after="fuse")
    assert after.meta["fusions"]["conv_input_parts"] == 1
    assert "concat" not in [o.kind for o in after.ops()]
    (conv,) = after.ops_of(["conv1d"])
    assert {k: conv.inputs[k] for k in ("x0", "x1", "x2")} == {"x0": "q", "x1": "k", "x2": "v"}
    assert "x" not in conv.inputs and "l0.qkv_concat" in conv.attrs["merged"]
    (o1, s1), (o2, s2) = _run(before, t), _run(after, t)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)


@pytest.mark.parametrize("kw", [{"concat_is_output": True}, {"second_reader": True}])
def test_concat_with_another_reader_stays(kw):
    ctx = _ctx()
    before = bind_weights.run(conv_graph(2, **kw), ctx)
    after = fuse.run(before, ctx)
    assert after.meta["fusions"]["conv_input_parts"] == 0 and "concat" in [o.kind for o in after.ops()]


def test_no_fusion_when_a_conv_launcher_cannot_take_parts():
    from compile.support import make_registry

    spec = _spec()
    ctx = PassContext(spec=spec, objects=spec.objects, registry=make_registry())  # routes without launchers
    after = fuse.run(bind_weights.run(conv_graph(2), ctx), ctx)
    assert after.meta["fusions"]["conv_input_parts"] == 0
