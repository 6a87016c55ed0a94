"""Before/After of the `gdn_gating_proj` fuse rule: GDN a/b projections + gdn_gating -> one op."""

from __future__ import annotations

from types import SimpleNamespace

import re

import pytest
import torch

from compile.support import make_registry, tiny_artifact
from ninfer_compile.ir.execute import ExecState, Executor
from ninfer_compile.ir.graph import Graph
from ninfer_compile.ir.types import Extent, Op, TensorType
from ninfer_compile.ir.verify import verify
from ninfer_compile.kernels.registry import ParamSpec, Route, RouteDomain, default_registry
from ninfer_compile.passes import bind_weights, fuse, select_routes
from ninfer_compile.passes.context import PassContext
from ninfer_compile.passes.pipeline import run_pipeline

HV, K = 6, 40


def _spec():
    def obj(name, shape, fmt):
        return SimpleNamespace(name=name, kind="tensor", shape=shape, format=fmt, bytes=1000)

    objects = {o.name: o for o in [obj("p/norm", (K,), "BF16"), obj("p/a", (HV, K), "BF16"),
                                   obj("p/b", (HV, K), "BF16"), obj("p/a_log", (HV,), "FP32"),
                                   obj("p/dt_bias", (HV,), "FP32")]}
    return SimpleNamespace(model_id="hand-gdn", objects=objects, aliases={}, views={})


def gating_graph(t: int = 1, phase: str = "decode", a_is_output: bool = False) -> Graph:
    """x -> rmsnorm -> h -> {a_proj, b_proj} (BF16 [6, 40]) -> gdn_gating -> g, beta."""
    g = Graph(Extent(name=f"gdn_{phase}_t{t}", phase=phase, t=t), meta={"passes": []})
    A = lambda n, s, dt="bf16", role="activation": g.add_tensor(TensorType(name=n, shape=s, dtype=dt, role=role))  # noqa: E731
    W = lambda n, obj, s, fmt: g.add_tensor(TensorType(name=n, shape=s, dtype=fmt, role="weight", logical=obj))  # noqa: E731
    A("x", (t, K), role="input")
    g.add_op(Op(name="inputs", kind="input", outputs={"x": "x"}))
    W("w:norm", "p/norm", (K,), "BF16")
    A("h", (t, K))
    g.add_op(Op(name="l0.norm", kind="rmsnorm", inputs={"x": "x", "weight": "w:norm"}, outputs={"out": "h"},
                attrs={"eps": 1e-6}))
    for n in ("a", "b"):
        W(f"w:{n}", f"p/{n}", (HV, K), "BF16")
        A(f"{n}.out", (t, HV), role="output" if (a_is_output and n == "a") else "activation")
        g.add_op(Op(name=f"l0.{n}_proj", kind="linear", inputs={"x": "h", "weight": f"w:{n}"},
                    outputs={"out": f"{n}.out"}, attrs={"epilogue": "none"}))
    W("w:a_log", "p/a_log", (HV,), "FP32")
    W("w:dt_bias", "p/dt_bias", (HV,), "FP32")
    A("g", (t, HV), "f32", role="output")
    A("beta", (t, HV), "f32", role="output")
    g.add_op(Op(name="l0.gating", kind="gdn_gating",
                inputs={"a": "a.out", "b": "b.out", "a_log": "w:a_log", "dt_bias": "w:dt_bias"},
                outputs={"g": "g", "beta": "beta"}))
    outs = {"g": "g", "beta": "beta", **({"a": "a.out"} if a_is_output else {})}
    g.add_op(Op(name="outputs", kind="output", inputs=outs))
    return g


def _ctx(**kw):
    spec = _spec()
    return PassContext(spec=spec, objects=spec.objects, **kw)


def _bound(ctx, **kw):
    g = bind_weights.run(gating_graph(**kw), ctx)
    g.meta["passes"] = ["bind_weights"]
    return g


def _weights():
    gen = torch.Generator().manual_seed(0)
    w = {"p/norm": torch.randn(K, generator=gen) * 0.1, "p/a": torch.randn(HV, K, generator=gen) / 6,
         "p/b": torch.randn(HV, K, generator=gen) / 6, "p/a_log": torch.log(torch.rand(HV, generator=gen) * 8 + 0.5),
         "p/dt_bias": torch.randn(HV, generator=gen)}
    return SimpleNamespace(get=lambda name: w[name])


def _run(graph, t):
    x = torch.randn(t, K, generator=torch.Generator().manual_seed(1))
    return Executor(_weights(), use_routes=False).run(graph, {"x": x}, ExecState())


def test_gating_proj_before_after():
    ctx = _ctx()  # default registry (gdn_gating_proj_rows registered), no table
    before = _bound(ctx, t=3)
    after = fuse.run(before, ctx)
    verify(after, ctx.objects, after="fuse")
    assert after.meta["fusions"]["gdn_gating_proj"] == 1
    kinds = [o.kind for o in after.ops()]
    assert "gdn_gating" not in kinds and "linear" not in kinds and kinds.count("gdn_gating_proj") == 1
    (op,) = after.ops_of(["gdn_gating_proj"])
    assert op.name == "l0.gating_proj"
    assert op.inputs == {"x": "h", "a_weight": "w:a", "b_weight": "w:b", "a_log": "w:a_log",
                         "dt_bias": "w:dt_bias"}
    assert after.tensors["w:a"].object == "p/a" and after.tensors["w:b"].format == "BF16"
    assert op.outputs == {"g": "g", "beta": "beta"}
    assert op.attrs["merged"] == ["l0.a_proj", "l0.b_proj", "l0.gating"]
    assert "a.out" not in after.tensors and "b.out" not in after.tensors  # pruned
    # the rmsnorm stays, feeding the fused op
    assert [o.kind for o in after.consumers("h")] == ["gdn_gating_proj"]
    # same values (executor built-ins, float32) before and after
    want, got = _run(before, 3), _run(after, 3)
    for k in ("g", "beta"):
        torch.testing.assert_close(got[k], want[k], rtol=1e-6, atol=1e-6)
    # the input graph is untouched
    assert "gdn_gating" in [o.kind for o in before.ops()]


@pytest.mark.parametrize("kw", [{"t": 3, "phase": "prefill"}, {"t": 129}, {"t": 2, "a_is_output": True}],
                         ids=["prefill", "t129", "a_also_output"])  # the route serves T <= 128
def test_gating_proj_not_applied_outside_the_route(kw):
    ctx = _ctx()
    after = fuse.run(_bound(ctx, **kw), ctx)
    assert after.meta["fusions"]["gdn_gating_proj"] == 0
    assert "gdn_gating" in [o.kind for o in after.ops()] and "gdn_gating_proj" not in [o.kind for o in after.ops()]


def test_gating_proj_needs_a_registered_route():
    reg = make_registry()  # every family except gdn_gating_proj
    ctx = _ctx(registry=reg)
    assert fuse.run(_bound(ctx), ctx).meta["fusions"]["gdn_gating_proj"] == 0
    reg.register(Route("t_gp", "gdn_gating_proj", RouteDomain(formats=("BF16",), max_t=8),
                       {"B": ParamSpec("B", (1, 2), 1)}, "ninfer_compile.kernels.gdn.reference:gdn_gating_proj"))
    assert fuse.run(_bound(ctx, t=8), ctx).meta["fusions"]["gdn_gating_proj"] == 1
    assert fuse.run(_bound(ctx, t=9), ctx).meta["fusions"]["gdn_gating_proj"] == 0


def test_gating_proj_switches():
    ctx = _ctx()
    rules = tuple({**r, "enabled": False} if r["name"] == "gdn_gating_proj" else r for r in fuse.load_rules())
    off = fuse.run(_bound(ctx), PassContext(spec=ctx.spec, objects=ctx.objects, fuse_rules=rules))
    assert "gdn_gating_proj" not in off.meta["fusions"] and "gdn_gating" in [o.kind for o in off.ops()]
    nofuse = run_pipeline(gating_graph(), ctx, disabled=["fuse", "select_routes", "plan_memory", "plan_cuda_graphs"])
    assert "gdn_gating" in [o.kind for o in nofuse.ops()]


def test_gating_proj_follows_the_table(tmp_path):
    from ninfer_compile.routes import table_for_sm
    from ninfer_compile.routes.table import load_table

    table = table_for_sm(90)
    ctx = _ctx(table=table)
    after = select_routes.run(fuse.run(_bound(ctx, t=4), ctx), ctx)
    (op,) = after.ops_of(["gdn_gating_proj"])
    assert op.route.route == "gdn_gating_proj_rows"
    assert op.route.match == {"format": "BF16", "n": HV, "k": K, "phase": "decode"}
    lo, hi = op.route.t_range  # the measured sm90 rows split the decode range by T
    assert lo <= 4 <= hi <= 64
    # a table without the section keeps the unfused ops (and still selects them)
    text = table.path.read_text()
    lines = text.split("\n")
    start = lines.index("gdn_gating_proj:")
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"\w+:", lines[i])), len(lines))  # next section
    p = tmp_path / "sm90.yaml"
    p.write_text("\n".join(lines[:start] + lines[end:]))
    ctx2 = _ctx(table=load_table(p))
    g2 = fuse.run(_bound(ctx2, t=4), ctx2)
    assert g2.meta["fusions"]["gdn_gating_proj"] == 0
    assert "gdn_gating" in [o.kind for o in select_routes.run(g2, ctx2).ops()]


@pytest.mark.parametrize("sm", [86, 89, 90, 120])
def test_every_table_has_the_decode_row(sm):
    from ninfer_compile.routes import table_for_sm

    table = table_for_sm(sm)
    m = {"format": "BF16", "n": 48, "k": 5120, "phase": "decode"}
    for t in (1, 8, 64):
        assert table.select("gdn_gating_proj", t, m).route.name == "gdn_gating_proj_rows"
    if sm == 90:  # measured on the H200 (2026-12-01): the rows carry their evidence
        row = table.select("gdn_gating_proj", 1, m)
        assert row.source.startswith("sm90.yaml:")
        assert "evidence" in table.path.read_text().split("gdn_gating_proj:", 1)[1].split("\n\n", 1)[0]
    else:
        assert "gdn_gating_proj" in table.provenance["notes"] and "untimed" in table.provenance["notes"]


def test_tiny_model_decode_fused_prefill_not(tmp_path_factory):
    from ninfer_compile.artifact import Artifact
    from ninfer_compile.contracts import find_contract
    from ninfer_compile.ir.lower import LowerOptions, lower_all
    from ninfer_compile.routes import table_for_sm

    path = tiny_artifact(tmp_path_factory.mktemp("art") / "tiny.ninfer")
    with Artifact.open(path) as art:
        spec = find_contract(path, art.model_id).resolve_for(art)
        ctx = PassContext(spec=spec, objects=art.by_name, table=table_for_sm(90))
        opts = LowerOptions(prefill_chunk=16, concurrency=(1, 4), max_context=32, mtp=False)
        gs = {g.extent.name: run_pipeline(g, ctx) for g in lower_all(spec, opts)}
    n_gdn = spec.layer_kinds.count("gdn")
    assert n_gdn > 0
    for name, g in gs.items():
        kinds = [o.kind for o in g.ops()]
        if g.extent.phase == "decode":
            assert g.meta["fusions"]["gdn_gating_proj"] == n_gdn, name
            assert kinds.count("gdn_gating_proj") == n_gdn and "gdn_gating" not in kinds
        else:
            assert g.meta["fusions"]["gdn_gating_proj"] == 0 and kinds.count("gdn_gating") == n_gdn
