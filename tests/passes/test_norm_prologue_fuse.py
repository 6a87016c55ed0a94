"""Before/After of the fuse rule `rmsnorm_prologue`: an rmsnorm feeding only linears /
gdn_gating_proj becomes their prologue (operand norm_weight, attribute norm_eps), where every
consumer's route takes it (the decode GEMVs, T <= 4; gdn_gating_proj_rows)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from compile.support import hand_graph, hand_spec, make_registry
from ninfer_compile.ir.execute import ExecState, Executor
from ninfer_compile.ir.types import Op, TensorType
from ninfer_compile.ir.verify import verify
from ninfer_compile.passes import bind_weights, fuse, select_routes
from ninfer_compile.passes.context import PassContext

from .test_gating_proj_fuse import _bound as gating_bound
from .test_gating_proj_fuse import _spec as gating_spec
from .test_gating_proj_fuse import _weights as gating_weights
from .test_gating_proj_fuse import K as GK

REPO = Path(__file__).resolve().parents[2]


def _ctx(**kw):
    spec = hand_spec()
    return PassContext(spec=spec, objects=spec.objects, **kw)


def _bound(ctx, **kw):
    g = bind_weights.run(hand_graph(**kw), ctx)
    g.meta["passes"] = ["bind_weights"]
    return g


def _weights():
    gen = torch.Generator().manual_seed(0)
    shapes = {o.name: o.shape for o in hand_spec().objects.values()}
    w = {n: torch.randn(*s, generator=gen) * (0.3 if len(s) == 1 else 0.1) for n, s in shapes.items()}
    return SimpleNamespace(get=lambda name: w[name])


def _run(graph, t, weights=None):
    x = torch.randn(t, 64, generator=torch.Generator().manual_seed(1)) * 5
    return Executor(weights or _weights(), use_routes=False).run(graph, {"x": x}, ExecState())


def _without(rule):
    return tuple({**r, "enabled": False} if r["name"] == rule else r for r in fuse.load_rules())


def test_norm_folded_into_its_linears():
    ctx = _ctx()  # default registry: the decode GEMVs take the prologue; no table
    before = _bound(ctx, t=1)
    after = fuse.run(before, ctx)
    verify(after, ctx.objects, after="fuse")
    assert after.meta["fusions"]["rmsnorm_prologue"] == 1
    kinds = [o.kind for o in after.ops()]
    assert "rmsnorm" not in kinds and "h" not in after.tensors  # the norm and its output are gone
    lin = {o.name: o for o in after.ops_of(["linear"])}
    for name in ("fused.qk", "v_proj"):  # the norm's consumers after merge_row_views
        op = lin[name]
        assert op.inputs["x"] == "x" and op.inputs["norm_weight"] == "w:norm", name
        assert op.attrs["norm_eps"] == 1e-6 and op.attrs["merged"][-1] == "norm", name
    assert "norm_weight" not in lin["o_proj"].inputs and "norm_weight" not in lin["fused.gate_up"].inputs
    # the match presents the prologue; without it the match is unchanged
    from ninfer_compile.passes.select_routes import op_match

    assert op_match(after, lin["fused.qk"]) == {"format": "Q4G64_F16S", "n": 48, "k": 64, "epilogue": "none",
                                                "prologue": "rmsnorm"}
    assert "prologue" not in op_match(after, lin["o_proj"])
    # same values (the references, fp32) before and after
    want, got = _run(before, 1), _run(after, 1)
    assert set(want) == set(got)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-5)
    assert "rmsnorm" in [o.kind for o in before.ops()]  # the input graph is untouched


def test_not_folded_where_a_consumer_cannot_take_it():
    ctx = _ctx()
    # T = 5: no registered route with the prologue covers it (the GEMVs stop at T = 4)
    assert fuse.run(_bound(ctx, t=5), ctx).meta["fusions"]["rmsnorm_prologue"] == 0
    # a registry whose linear routes take no prologue
    reg_ctx = _ctx(registry=make_registry())
    assert fuse.run(_bound(reg_ctx, t=1), reg_ctx).meta["fusions"]["rmsnorm_prologue"] == 0
    # a consumer that is not a linear (here an add reading the norm's output)
    g = _bound(ctx, t=1)
    g.add_tensor(TensorType(name="hh", shape=(1, 64), dtype="bf16", role="activation"))
    g.add_op(Op(name="extra", kind="add", inputs={"a": "h", "b": "x"}, outputs={"out": "hh"}, seq=0.5))
    after = fuse.run(g, ctx)
    assert after.meta["fusions"]["rmsnorm_prologue"] == 0 and "rmsnorm" in [o.kind for o in after.ops()]
    # the norm's output is also a graph output
    g = _bound(ctx, t=1)
    g.replace_op(g.op("outputs").model_copy(update={"inputs": {**g.op("outputs").inputs, "h": "h"}}))
    g.set_tensor(g.tensors["h"].model_copy(update={"role": "output"}))
    assert fuse.run(g, ctx).meta["fusions"]["rmsnorm_prologue"] == 0


def test_shipped_table_switches_it_off():
    """routes/sm90.yaml says `fuse_off: rmsnorm_prologue` (measured slower on the H200): no fold,
    and the graph says which table turned the rule off and why."""
    from ninfer_compile.routes import table_for_sm

    ctx = _ctx(table=table_for_sm(90))
    after = fuse.run(_bound(ctx, t=1), ctx)
    assert "rmsnorm_prologue" not in after.meta["fusions"] and "rmsnorm" in [o.kind for o in after.ops()]
    assert after.meta["fusions_off"]["rmsnorm_prologue"].startswith("sm90.yaml: H200 2026-12-02")


def test_follows_the_table(tmp_path):
    import yaml

    from ninfer_compile.routes import table_for_sm

    data = yaml.safe_load((REPO / "routes" / "sm90.yaml").read_text())
    data.pop("fuse_off")
    (tmp_path / "sm90.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    ctx = _ctx(table=table_for_sm(90, tmp_path / "sm90.yaml"))
    after = select_routes.run(fuse.run(_bound(ctx, t=1), ctx), ctx)
    assert after.meta["fusions"]["rmsnorm_prologue"] == 1
    lin = {o.name: o for o in after.ops_of(["linear"])}
    assert lin["fused.qk"].route.route == "q4_gemv_lowreg" and lin["v_proj"].route.route == "q5_gemv_packed"
    assert lin["fused.qk"].route.match["prologue"] == "rmsnorm"
    # T = 2: the table's Q4 / Q5 rows select the tensor-core GEMVs, which take no prologue
    g2 = select_routes.run(fuse.run(_bound(ctx, t=2), ctx), ctx)
    assert g2.meta["fusions"]["rmsnorm_prologue"] == 0 and "rmsnorm" in [o.kind for o in g2.ops()]
    assert {o.route.route for o in g2.ops_of(["linear"]) if o.inputs["x"] == "h"} <= {"q4_gemv_tc", "q5_gemv_tc"}


def test_switched_off_leaves_the_graph_as_before():
    ctx = _ctx()
    off = fuse.run(_bound(ctx, t=1), PassContext(spec=ctx.spec, objects=ctx.objects, fuse_rules=_without("rmsnorm_prologue")))
    assert "rmsnorm_prologue" not in off.meta["fusions"]
    assert "rmsnorm" in [o.kind for o in off.ops()]
    assert not any("norm_weight" in o.inputs or "norm_eps" in o.attrs for o in off.ops())
    # and equal to the graph of the same rules without that entry at all
    rules = tuple(r for r in fuse.load_rules() if r["name"] != "rmsnorm_prologue")
    ref = fuse.run(_bound(ctx, t=1), PassContext(spec=ctx.spec, objects=ctx.objects, fuse_rules=rules))
    assert [o.model_dump() for o in off.ops()] == [o.model_dump() for o in ref.ops()]


def test_norm_folded_into_gdn_gating_proj():
    spec = gating_spec()
    ctx = PassContext(spec=spec, objects=spec.objects)
    before = gating_bound(ctx, t=3)
    after = fuse.run(before, ctx)
    verify(after, ctx.objects, after="fuse")
    assert after.meta["fusions"]["gdn_gating_proj"] == 1 and after.meta["fusions"]["rmsnorm_prologue"] == 1
    (op,) = after.ops_of(["gdn_gating_proj"])
    assert op.inputs["x"] == "x" and op.inputs["norm_weight"] == "w:norm" and op.attrs["norm_eps"] == 1e-6
    assert [o.kind for o in after.ops() if o.kind not in ("input", "output")] == ["gdn_gating_proj"]
    x = torch.randn(3, GK, generator=torch.Generator().manual_seed(1)) * 4
    want = Executor(gating_weights(), use_routes=False).run(before, {"x": x}, ExecState())
    got = Executor(gating_weights(), use_routes=False).run(after, {"x": x}, ExecState())
    for k in ("g", "beta"):
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-5)


def test_fuse_off_naming_no_rule_is_one_line_error(tmp_path):
    import yaml

    from ninfer_compile.errors import CompileError
    from ninfer_compile.routes import table_for_sm

    text = (REPO / "routes" / "sm90.yaml").read_text().replace("fuse_off:\n", "fuse_off:\n  rmsnorm_prologu: typo\n", 1)
    (tmp_path / "sm90.yaml").write_text(text)
    line = 1 + text.splitlines().index("  rmsnorm_prologu: typo")
    ctx = _ctx(table=table_for_sm(90, tmp_path / "sm90.yaml"))
    with pytest.raises(CompileError, match=rf"^sm90.yaml:{line}: fuse_off: rmsnorm_prologu: no such fusion rule "):
        fuse.run(_bound(ctx, t=1), ctx)
