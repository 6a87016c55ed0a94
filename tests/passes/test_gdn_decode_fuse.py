"""Before/After of the `gdn_decode_fused` fuse rule (rewriter `chain_into`): a GDN layer's
conv1d -> split / reshape -> gated_delta_rule -> gated_rmsnorm becomes one gdn_decode_fused op at
decode, computing the same values (outputs and both states) in the IR executor."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ninfer_compile.ir.execute import ExecState, Executor
from ninfer_compile.ir.graph import Graph
from ninfer_compile.ir.types import Extent, Op, TensorType
from ninfer_compile.ir.verify import verify
from ninfer_compile.kernels.registry import default_registry
from ninfer_compile.passes import bind_weights, fuse
from ninfer_compile.passes.context import PassContext

HK, HV, DK, DV, KW, SLOTS = 2, 4, 16, 12, 4, 3
C = 2 * HK * DK + HV * DV
REPO = Path(__file__).resolve().parents[2]


def _spec():
    def obj(name, shape, fmt):
        return SimpleNamespace(name=name, kind="tensor", shape=shape, format=fmt, bytes=1000)

    objects = {o.name: o for o in [obj("p/conv", (KW, C), "BF16"), obj("p/norm", (DV,), "BF16")]}
    return SimpleNamespace(model_id="hand-gdn", objects=objects, aliases={}, views={})


def gdn_graph(t: int = 3, phase: str = "decode", window: int = 0, out_also: str | None = None) -> Graph:
    """q, k, v, z, g, beta (graph inputs) -> concat -> conv1d -> split -> reshapes -> gated_delta_rule
    -> gated_rmsnorm(out, reshape(z)) -> out; states conv [SLOTS, KW-1, C] bf16, rec [SLOTS, HV, DK, DV] f32.
    `window`: a verify-shaped graph (the *_columns outputs); `out_also`: that tensor is a graph output too."""
    g = Graph(Extent(name=f"gdn_{phase}_t{t}", phase=phase, t=t), meta={"passes": []})

    def A(n, s, dt="bf16", role="activation"):
        return g.add_tensor(TensorType(name=n, shape=s, dtype=dt, role=role))

    def S(n, s, dt, buf):
        return g.add_tensor(TensorType(name=n, shape=s, dtype=dt, role="state", buffer=buf))

    ins = {"q": (t, HK * DK), "k": (t, HK * DK), "v": (t, HV * DV), "z": (t, HV * DV)}
    for n, s in ins.items():
        A(n, s, role="input")
    A("g", (t, HV), "f32", "input")
    A("beta", (t, HV), "f32", "input")
    A("positions", (t,), "i32", "input")
    A("slots", (t,), "i32", "input")
    g.add_op(Op(name="inputs", kind="input", outputs={n: n for n in [*ins, "g", "beta", "positions", "slots"]}))
    g.add_tensor(TensorType(name="w:conv", shape=(KW, C), dtype="BF16", role="weight", logical="p/conv"))
    g.add_tensor(TensorType(name="w:norm", shape=(DV,), dtype="BF16", role="weight", logical="p/norm"))
    S("conv", (SLOTS, KW - 1, C), "bf16", "conv")
    S("conv@1", (SLOTS, KW - 1, C), "bf16", "conv")
    S("rec", (SLOTS, HV, DK, DV), "f32", "rec")
    S("rec@1", (SLOTS, HV, DK, DV), "f32", "rec")
    A("qkv", (t, C))
    g.add_op(Op(name="l0.gdn.qkv_concat", kind="concat", inputs={"x0": "q", "x1": "k", "x2": "v"},
                outputs={"out": "qkv"}, attrs={"axis": 1}))
    A("conv.out", (t, C))
    couts, cattrs, routs, rattrs = {"out": "conv.out", "conv_state": "conv@1"}, {}, {}, {}
    if window:
        A("conv.cols", (t // window, window - 1, KW - 1, C))
        A("rec.cols", (t // window, window - 1, HV, DK, DV), "f32")
        couts["conv_state_columns"] = "conv.cols"
        routs["state_columns"] = "rec.cols"
        cattrs = rattrs = {"window": window}
    g.add_op(Op(name="l0.gdn.conv", kind="conv1d", inputs={"x": "qkv", "weight": "w:conv", "conv_state": "conv",
                                                           "positions": "positions", "slots": "slots"},
                outputs=couts, attrs={"activation": "silu", **cattrs}))
    for n, w in (("cq", HK * DK), ("ck", HK * DK), ("cv", HV * DV)):
        A(n, (t, w))
    g.add_op(Op(name="l0.gdn.conv_split", kind="split", inputs={"x": "conv.out"},
                outputs={"out0": "cq", "out1": "ck", "out2": "cv"}, attrs={"axis": 1, "sizes": [HK * DK, HK * DK, HV * DV]}))
    for n, src, s in (("q3", "cq", (t, HK, DK)), ("k3", "ck", (t, HK, DK)), ("v3", "cv", (t, HV, DV))):
        A(n, s)
        g.add_op(Op(name=f"l0.gdn.{n}_heads", kind="reshape", inputs={"x": src}, outputs={"out": n},
                    attrs={"shape": list(s)}))
    A("o", (t, HV, DV))
    g.add_op(Op(name="l0.gdn.delta_rule", kind="gated_delta_rule",
                inputs={"q": "q3", "k": "k3", "v": "v3", "g": "g", "beta": "beta", "state": "rec",
                        "positions": "positions", "slots": "slots"},
                outputs={"out": "o", "state": "rec@1", **routs},
                attrs={"scale": DK ** -0.5, "l2_eps": 1e-6, **rattrs}))
    A("z3", (t, HV, DV))
    g.add_op(Op(name="l0.gdn.z_heads", kind="reshape", inputs={"x": "z"}, outputs={"out": "z3"},
                attrs={"shape": [t, HV, DV]}))
    A("out", (t, HV * DV), role="output")
    g.add_op(Op(name="l0.gdn.gated_norm", kind="gated_rmsnorm", inputs={"x": "o", "z": "z3", "weight": "w:norm"},
                outputs={"out": "out"}, attrs={"eps": 1e-6}))
    outs = {"out": "out", **({out_also: out_also} if out_also else {}),
            **({"cc": "conv.cols", "rc": "rec.cols"} if window else {})}
    if out_also:
        g.set_tensor(g.tensors[out_also].model_copy(update={"role": "output"}))
    g.add_op(Op(name="outputs", kind="output", inputs=outs))
    return g


def _ctx(**kw):
    spec = _spec()
    return PassContext(spec=spec, objects=spec.objects, registry=default_registry, **kw)


def _bound(ctx, **kw):
    g = bind_weights.run(gdn_graph(**kw), ctx)
    g.meta["passes"] = ["bind_weights"]
    return g


def _run(graph, t):
    gen = torch.Generator().manual_seed(5)
    w = {"p/conv": 0.5 * torch.randn(KW, C, generator=gen), "p/norm": 1 + 0.1 * torch.randn(DV, generator=gen)}
    ins = {n: torch.randn(t, s, generator=gen).bfloat16() for n, s in
           (("q", HK * DK), ("k", HK * DK), ("v", HV * DV), ("z", HV * DV))}
    ins.update(g=-torch.rand(t, HV, generator=gen), beta=torch.rand(t, HV, generator=gen),
               positions=torch.tensor([5, 1, 0][:t], dtype=torch.int32),
               slots=torch.tensor([2, 0, 1][:t], dtype=torch.int32))
    st = ExecState(buffers={"conv": torch.randn(SLOTS, KW - 1, C, generator=gen),
                            "rec": 0.3 * torch.randn(SLOTS, HV, DK, DV, generator=gen)})
    res = Executor(SimpleNamespace(get=lambda name: w[name]), use_routes=False).run(graph, ins, st)
    return res, st.buffers


def test_gdn_decode_fused_before_after():
    ctx = _ctx()
    before = _bound(ctx, t=3)
    after = fuse.run(before, ctx)
    verify(after, ctx.objects, after="fuse")
    assert after.meta["fusions"]["gdn_decode_fused"] == 1 and after.meta["fusions"]["conv_input_parts"] == 1
    kinds = [o.kind for o in after.ops()]
    for k in ("conv1d", "gated_delta_rule", "gated_rmsnorm", "split", "concat"):
        assert k not in kinds, kinds
    assert kinds.count("reshape") == 1  # z's reshape stays: an input of the fused op
    (op,) = after.ops_of(["gdn_decode_fused"])
    assert op.name == "l0.gdn.decode_fused"
    assert op.inputs == {"x0": "q", "x1": "k", "x2": "v", "conv_weight": "w:conv", "conv_state": "conv",
                         "g": "g", "beta": "beta", "state": "rec", "positions": "positions", "slots": "slots",
                         "z": "z3", "norm_weight": "w:norm"}
    assert list(op.outputs.items()) == [("out", "out"), ("conv_state", "conv@1"), ("state", "rec@1")]
    assert op.attrs["key_heads"] == HK and op.attrs["parts_of"] == "x" and op.attrs["eps"] == 1e-6
    assert op.attrs["scale"] == DK ** -0.5 and op.attrs["activation"] == "silu" and op.attrs["l2_eps"] == 1e-6
    assert op.attrs["merged"][:4] == ["l0.gdn.qkv_concat", "l0.gdn.conv", "l0.gdn.delta_rule", "l0.gdn.gated_norm"]
    for gone in ("conv.out", "cq", "q3", "o", "qkv"):
        assert gone not in after.tensors
    # same values (references, float32): the output and both states
    (want, wst), (got, gst) = _run(before, 3), _run(after, 3)
    torch.testing.assert_close(got["out"], want["out"], rtol=1e-5, atol=1e-5)
    for b in ("conv", "rec"):
        torch.testing.assert_close(gst[b], wst[b], rtol=1e-6, atol=1e-6)
    assert "conv1d" in [o.kind for o in before.ops()]  # the input graph is untouched


@pytest.mark.parametrize("kw", [{"t": 3, "phase": "prefill"}, {"t": 65}, {"t": 2, "phase": "verify", "window": 2},
                                {"t": 2, "out_also": "o"}, {"t": 2, "out_also": "cq"}],
                         ids=["prefill", "t65", "verify", "rule_out_is_output", "conv_col_is_output"])
def test_gdn_decode_fused_not_applied(kw):
    ctx = _ctx()
    after = fuse.run(_bound(ctx, **kw), ctx)
    assert after.meta["fusions"]["gdn_decode_fused"] == 0
    kinds = [o.kind for o in after.ops()]
    assert {"conv1d", "gated_delta_rule", "gated_rmsnorm"} <= set(kinds) and "gdn_decode_fused" not in kinds


def test_gdn_decode_fused_off_switch():
    rules = tuple(dict(r, enabled=False) if r["name"] == "gdn_decode_fused" else r for r in fuse.load_rules())
    ctx = _ctx(fuse_rules=rules)
    after = fuse.run(_bound(ctx, t=1), ctx)
    assert "gdn_decode_fused" not in [o.kind for o in after.ops()]
    assert "gated_rmsnorm" in [o.kind for o in after.ops()]


def test_gdn_decode_fused_needs_a_table_row(tmp_path):
    """A table without a gdn_decode_fused section keeps today's three ops; one with its row fuses; the
    shipped sm90 table has the row but switches the rule off (`fuse_off:`, measured slower)."""
    import yaml

    from ninfer_compile.routes.table import load_table

    src = REPO / "routes" / "sm90.yaml"
    data = yaml.safe_load(src.read_text())
    data.pop("fuse_off")
    on = tmp_path / "on.yaml"
    on.write_text(yaml.safe_dump(data, sort_keys=False))
    data.pop("gdn_decode_fused")
    no_row = tmp_path / "no_row.yaml"
    no_row.write_text(yaml.safe_dump(data, sort_keys=False))
    for path, n in ((no_row, 0), (on, 1)):
        ctx = _ctx(table=load_table(path, default_registry))
        after = fuse.run(_bound(ctx, t=2), ctx)
        assert after.meta["fusions"]["gdn_decode_fused"] == n
    ctx = _ctx(table=load_table(src, default_registry))
    after = fuse.run(_bound(ctx, t=2), ctx)
    assert "gdn_decode_fused" not in after.meta["fusions"] and "gdn_decode_fused" in after.meta["fusions_off"]
    assert "gdn_decode_fused" not in [o.kind for o in after.ops()]


def test_chain_into_rule_is_data():
    """The rewriter names no family: everything family-specific is in the rule."""
    body = (REPO / "ninfer_compile" / "passes" / "fuse_chain.py").read_text()
    for fam in ("conv1d", "gated_delta_rule", "gated_rmsnorm", "gdn_decode_fused"):
        assert fam not in body
    rule = next(r for r in fuse.load_rules() if r["name"] == "gdn_decode_fused")
    assert rule["kind"] == "chain_into" and rule.get("enabled", True)
