"""Before/After tests of every pass on the hand-built graph (tests/compile/support.py)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from compile.support import hand_graph, hand_spec, load_test_table, make_context
from ninfer_compile.errors import CompileError, RouteError
from ninfer_compile.ir.verify import verify
from ninfer_compile.passes import bind_weights, fuse, plan_cuda_graphs, plan_dependent_launch, plan_memory, select_routes
from ninfer_compile.passes.context import PassContext
from ninfer_compile.passes.pipeline import PASS_NAMES, run_pipeline


@pytest.fixture
def spec():
    return hand_spec()


@pytest.fixture
def ctx(spec, tmp_path):
    return make_context(spec, spec.objects, tmp_path)


def _after(g, name):
    g.meta["passes"] = [*g.meta.get("passes", []), name]
    return g


def test_bind_weights_before_after(ctx):
    before = hand_graph()
    assert all(t.object is None for t in before.tensors.values() if t.role == "weight")
    after = _after(bind_weights.run(before, ctx), "bind_weights")
    verify(after, ctx.objects, after="bind_weights")
    q = after.tensors["w:q"]
    assert (q.object, q.view.row_begin, q.view.row_count, q.format) == ("p/qk", 0, 32, "Q4G64_F16S")
    assert after.tensors["w:norm"].view is None and after.tensors["w:norm"].object == "p/norm"
    # pure: the input graph is untouched
    assert before.tensors["w:q"].object is None


def test_bind_weights_rejects_wrong_format(ctx, spec):
    from types import SimpleNamespace

    objects = dict(spec.objects)
    objects["p/qk"] = SimpleNamespace(name="p/qk", kind="tensor", shape=(48, 64), format="Q5G64_F16S")
    with pytest.raises(CompileError, match="artifact object p/qk is Q5G64_F16S"):
        bind_weights.run(hand_graph(), PassContext(spec=spec, objects=objects))


def test_verify_catches_unbound_weight_after_bind(ctx):
    g = _after(hand_graph(), "bind_weights")
    with pytest.raises(CompileError, match="not bound to an artifact object"):
        verify(g, ctx.objects)


def test_fuse_before_after(ctx):
    before = _after(bind_weights.run(hand_graph(), ctx), "bind_weights")
    n_before = len(before)
    after = fuse.run(before, ctx)
    verify(after, ctx.objects, after="fuse")
    kinds = [o.kind for o in after.ops()]
    assert "add" not in kinds and "swiglu" not in kinds
    assert after.meta["fusions"] == {"merge_row_views": 2, "swiglu_epilogue": 1, "residual_epilogue": 1,
                                     "gdn_gating_proj": 0, "qk_norm_rope": 0, "conv_input_parts": 0}
    lin = {o.name: o for o in after.ops_of(["linear"])}
    qk = lin["fused.qk"]
    assert after.tensors[qk.inputs["weight"]].view is None  # the whole parent p/qk
    assert qk.attrs["merged"] == ["q_proj", "k_proj"]
    assert lin["o_proj"].attrs["epilogue"] == "residual" and lin["o_proj"].inputs["residual"] == "x"
    assert lin["fused.gate_up"].attrs["epilogue"] == "swiglu" and lin["fused.gate_up"].outputs["out"] == "act"
    # no attribute that no kernel reads (the old shared_staging rule's staged_input is gone)
    assert all("staged_input" not in o.attrs for o in lin.values())
    assert len(after) < n_before and len(before) == n_before


def test_fuse_rules_are_data(ctx):
    g = _after(bind_weights.run(hand_graph(), ctx), "bind_weights")
    rules = tuple(r for r in fuse.load_rules() if r["name"] != "residual_epilogue")
    after = fuse.run(g, PassContext(spec=ctx.spec, objects=ctx.objects, fuse_rules=rules))
    assert "add" in [o.kind for o in after.ops()]
    assert "residual_epilogue" not in after.meta["fusions"]


def test_fuse_without_binding_merges_nothing(ctx):
    after = fuse.run(hand_graph(), ctx)
    assert after.meta["fusions"]["merge_row_views"] == 0
    assert after.meta["fusions"]["swiglu_epilogue"] == 0  # needs the merged [gate|up] parent


def test_select_routes_before_after(ctx):
    g = fuse.run(_after(bind_weights.run(hand_graph(t=2), ctx), "bind_weights"), ctx)
    after = _after(select_routes.run(_after(g, "fuse"), ctx), "select_routes")
    verify(after, ctx.objects, after="select_routes")
    lin = {o.name: o for o in after.ops_of(["linear"])}
    assert lin["fused.qk"].route.route == "t_gemv" and lin["fused.qk"].route.params == {"BLOCK_N": 128}
    assert lin["fused.qk"].route.match == {"format": "Q4G64_F16S", "n": 48, "k": 64, "epilogue": "none"}
    assert lin["fused.gate_up"].route.route == "t_wide"  # the swiglu row covers every T
    assert lin["o_proj"].route.source.startswith("sm90.yaml:")
    assert all(o.route is not None for o in after.ops() if o.is_family)
    # wider T takes the other row
    wide = select_routes.run(fuse.run(_after(bind_weights.run(hand_graph(t=8), ctx), "bind_weights"), ctx), ctx)
    assert {o.name: o for o in wide.ops_of(["linear"])}["fused.qk"].route.route == "t_wide"


def test_select_routes_miss_is_an_error(spec, tmp_path):
    table = load_test_table(tmp_path, skip=("rmsnorm",))
    ctx = PassContext(spec=spec, objects=spec.objects, table=table)
    g = bind_weights.run(hand_graph(), ctx)
    with pytest.raises(RouteError, match="op norm: .*rmsnorm"):
        select_routes.run(g, ctx)


def test_plan_memory_before_after(ctx):
    before = fuse.run(_after(bind_weights.run(hand_graph(), ctx), "bind_weights"), ctx)
    assert "memory" not in before.meta
    after = plan_memory.run(before, ctx)
    mem = after.meta["memory"]
    ops = after.ops()
    # every value placed (or a view), aligned, and no two simultaneously-live values overlap
    live = {}
    for i, op in enumerate(ops):
        for t in [*op.inputs.values(), *op.outputs.values()]:
            tt = after.tensors[t]
            if tt.role in ("weight", "state"):
                continue
            root = mem["views"].get(t, {}).get("of", t)
            lo, hi = live.get(root, (i, i))
            live[root] = (min(lo, i), max(hi, i))
    for r in live:
        if after.tensors[r].role in ("input", "output"):
            live[r] = (0, len(ops))
    roots = sorted(live)
    for a in roots:
        pa = mem["tensors"][a]
        assert pa["offset"] % plan_memory.ALIGN == 0
        for b in roots:
            if a >= b:
                continue
            pb = mem["tensors"][b]
            overlap_t = live[a][0] <= live[b][1] and live[b][0] <= live[a][1]
            overlap_m = pa["offset"] < pb["offset"] + pb["bytes"] and pb["offset"] < pa["offset"] + pa["bytes"]
            assert not (overlap_t and overlap_m), (a, b)
    # the split outputs are column views of the merged projection, not copies
    assert mem["views"]["k.out"] == {"of": "fused.qk.out", "byte_offset": 64, "col_offset": 32, "row_stride": 48}
    assert mem["arena_bytes"] >= max(p["offset"] + p["bytes"] for p in mem["tensors"].values())


def test_plan_cuda_graphs_before_after(ctx):
    dec = plan_memory.run(bind_weights.run(hand_graph(phase="decode"), ctx), ctx)
    pre = plan_memory.run(bind_weights.run(hand_graph(phase="prefill"), ctx), ctx)
    assert "cuda_graph" not in dec.meta
    assert plan_cuda_graphs.run(dec, ctx).meta["cuda_graph"]["capture"] is True
    assert plan_cuda_graphs.run(pre, ctx).meta["cuda_graph"]["capture"] is False
    unplanned = plan_cuda_graphs.run(bind_weights.run(hand_graph(), ctx), ctx)
    assert unplanned.meta["cuda_graph"]["capture"] is False


def test_plan_dependent_launch_before_after(ctx):
    """Decode (CUDA-graph) extents on sm >= 90 launch with PDL; prefill and older sms do not."""
    dec = plan_cuda_graphs.run(plan_memory.run(bind_weights.run(hand_graph(phase="decode"), ctx), ctx), ctx)
    pre = plan_cuda_graphs.run(plan_memory.run(bind_weights.run(hand_graph(phase="prefill"), ctx), ctx), ctx)
    assert "dependent_launch" not in dec.meta
    for sm, want in ((90, True), (120, True), (89, False), (86, False)):
        c = dataclasses.replace(ctx, table=SimpleNamespace(sm=sm))
        assert plan_dependent_launch.run(dec, c).meta["dependent_launch"]["enabled"] is want, sm
        assert plan_dependent_launch.run(pre, c).meta["dependent_launch"]["enabled"] is False


def test_pipeline_order_off_switch_and_dump(ctx, tmp_path):
    assert PASS_NAMES == ("bind_weights", "shard_tensor_parallel", "fuse", "select_routes", "plan_memory",
                          "plan_cuda_graphs", "plan_dependent_launch")
    full = run_pipeline(hand_graph(), ctx, dump_dir=tmp_path / "dump")
    # shard_tensor_parallel applies to --tp N > 1 compiles only: skipped there, not numbered
    assert full.meta["passes"] == [p for p in PASS_NAMES if p != "shard_tensor_parallel"]
    files = sorted(p.name for p in (tmp_path / "dump" / "hand_t4").iterdir())
    assert files[:3] == ["00-lower.dot", "00-lower.txt", "00-lower.yaml"]
    assert "02-fuse.txt" in files and "05-plan_cuda_graphs.yaml" in files and "06-plan_dependent_launch.txt" in files
    nofuse = run_pipeline(hand_graph(), ctx, disabled=["fuse"])
    assert nofuse.meta["disabled"] == ["fuse"] and "add" in [o.kind for o in nofuse.ops()]
    with pytest.raises(CompileError, match="unknown pass nope"):
        run_pipeline(hand_graph(), ctx, disabled=["nope"])
