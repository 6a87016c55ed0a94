"""Executing lowered (and compiled) graphs reproduces the reference model: lowering and the passes
preserve semantics."""

from __future__ import annotations

import pytest
import torch

from compile.support import make_context, tiny_artifact
from ninfer_compile.artifact import Artifact
from ninfer_compile.contracts import check_artifact, find_contract
from ninfer_compile.ir.execute import ExecState, Executor, step_inputs
from ninfer_compile.ir.lower import LowerOptions, lower, plan_extents
from ninfer_compile.passes.pipeline import run_pipeline
from ninfer_compile.reference.model import ReferenceModel
from ninfer_compile.reference.weights import ArtifactWeights

TOKENS = [5, 17, 3, 99, 250, 7, 64, 12, 1, 33]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tiny_artifact(tmp_path_factory.mktemp("art") / "tiny.ninfer")
    art = Artifact.open(path)
    spec = find_contract(path, art.model_id).resolve_for(art)
    check_artifact(art, spec)
    weights = ArtifactWeights(art)
    ref = ReferenceModel(spec, weights)
    yield art, spec, weights, ref
    art.close()


def _graphs(spec, opts):
    return {e.name: lower(spec, e, opts) for e in plan_extents(spec, opts)}


def test_lowered_prefill_matches_reference(tiny):
    art, spec, weights, ref = tiny
    want = ref.prefill(TOKENS)
    opts = LowerOptions(prefill_chunk=len(TOKENS), max_context=32, prefill_logits="all", mtp=False)
    g = _graphs(spec, opts)[f"prefill_t{len(TOKENS)}"]
    out = Executor(weights).run(g, step_inputs(g, TOKENS), ExecState.zeros(g))
    assert out["logits"].shape == want.shape
    torch.testing.assert_close(out["logits"], want, rtol=1e-4, atol=1e-4)
    assert torch.equal(out["ids"], want.argmax(-1).to(torch.int32))


@pytest.mark.parametrize("registry", ["test", "shipped"])
def test_compiled_graphs_with_route_references_match(tiny, tmp_path, registry):
    """After the full pipeline (merged views, fused epilogues, selected routes whose references
    run the ops): a chunked prefill then decode steps carry state exactly like the reference.
    `shipped`: the registered routes and routes/sm90.yaml, whose launchers enable the fusions that
    need launcher support (the GDN conv reading q | k | v in place, the gating projection)."""
    art, spec, weights, ref = tiny
    want = ref.prefill(TOKENS)  # logits of every position
    if registry == "test":
        ctx = make_context(spec, art.by_name, tmp_path)
    else:
        from ninfer_compile.passes.context import PassContext
        from ninfer_compile.routes import table_for_sm

        ctx = PassContext(spec=spec, objects=art.by_name, table=table_for_sm(90))
    opts = LowerOptions(prefill_chunk=6, concurrency=(1,), max_context=32, mtp=False)
    gs = {n: run_pipeline(g, ctx) for n, g in _graphs(spec, opts).items()}
    pre, dec = gs["prefill_t6"], gs["decode_c1_k0"]
    assert any(o.attrs.get("epilogue") == "swiglu" for o in pre.ops())
    assert pre.meta["fusions"]["qk_norm_rope"] == 2 and "qk_norm_rope" in [o.kind for o in dec.ops()]
    n_parts = spec.layer_kinds.count("gdn") if registry == "shipped" else 0  # test routes have no launchers
    for g in (pre, dec):
        assert g.meta["fusions"]["conv_input_parts"] == n_parts
        assert [o.kind for o in g.ops()].count("concat") == spec.layer_kinds.count("gdn") - n_parts
    assert all(o.route.reference for o in dec.ops() if o.is_family)
    ex = Executor(weights)
    st = ExecState.zeros([pre, dec])
    out = ex.run(pre, step_inputs(pre, TOKENS[:6]), st)  # head on the last column only
    torch.testing.assert_close(out["logits"][0], want[5], rtol=1e-4, atol=1e-4)
    for i in range(6, len(TOKENS)):
        out = ex.run(dec, step_inputs(dec, TOKENS[i:i + 1], start=i), st)
        torch.testing.assert_close(out["logits"][0], want[i], rtol=1e-4, atol=1e-4)


def test_decode_extent_runs_two_slots(tiny, tmp_path):
    art, spec, weights, ref = tiny
    a, b = TOKENS[:4], TOKENS[4:8]
    wa, wb = ref.prefill(a), ref.prefill(b)
    ctx = make_context(spec, art.by_name, tmp_path)
    opts = LowerOptions(prefill_chunk=4, concurrency=(2,), max_context=16, mtp=False)
    dec = run_pipeline(_graphs(spec, opts)["decode_c2_k0"], ctx)
    ex, st = Executor(weights), ExecState.zeros(dec)
    for i in range(4):  # both sequences decoded in lockstep, one column per slot
        out = ex.run(dec, step_inputs(dec, [a[i], b[i]], positions=torch.tensor([i, i], dtype=torch.int32),
                                      slots=torch.tensor([0, 1], dtype=torch.int32)), st)  # (+ greedy sampling rows)
        torch.testing.assert_close(out["logits"], torch.stack([wa[i], wb[i]]), rtol=1e-4, atol=1e-4)


def test_mtp_graph_matches_reference(tiny):
    art, spec, weights, ref = tiny
    ref.prefill(TOKENS[:5])
    hidden = ref.last_state.hidden
    nxt = TOKENS[1:6]
    want = ref.mtp_logits(nxt, hidden)
    opts = LowerOptions(prefill_chunk=5, max_context=16, prefill_logits="all", draft_head="full")
    g = _graphs(spec, opts)["mtp_prefill_t5"]
    out = Executor(weights).run(g, step_inputs(g, nxt, hidden=hidden), ExecState.zeros(g))
    torch.testing.assert_close(out["logits"], want, rtol=1e-4, atol=1e-4)


def test_shipped_table_real_route_references_match(tiny):
    """Compiled with the shipped sm90 table, every op runs the route library's own reference
    (attention, conv1d, GDN, norms, fused qk_norm_rope, ...) and the logits still match."""
    from ninfer_compile.passes.context import PassContext
    from ninfer_compile.routes import table_for_sm

    art, spec, weights, ref = tiny
    want = ref.prefill(TOKENS[:8])
    ctx = PassContext(spec=spec, objects=art.by_name, table=table_for_sm(90))
    opts = LowerOptions(prefill_chunk=6, concurrency=(1,), max_context=16, mtp=False)
    gs = {n: run_pipeline(g, ctx) for n, g in _graphs(spec, opts).items()}
    pre, dec = gs["prefill_t6"], gs["decode_c1_k0"]
    refs = {o.route.reference for o in dec.ops() if o.route}
    assert "ninfer_compile.kernels.attention.reference:attention" in refs
    ex, st = Executor(weights), ExecState.zeros([pre, dec])
    out = ex.run(pre, step_inputs(pre, TOKENS[:6]), st)
    torch.testing.assert_close(out["logits"][0], want[5], rtol=1e-4, atol=1e-4)
    for i in (6, 7):
        out = ex.run(dec, step_inputs(dec, TOKENS[i:i + 1], start=i), st)
        torch.testing.assert_close(out["logits"][0], want[i], rtol=1e-4, atol=1e-4)
