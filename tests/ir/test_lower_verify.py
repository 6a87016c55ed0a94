"""Lowering (extents, structure), the verifier, and the printers."""

from __future__ import annotations

import networkx as nx
import pytest
import yaml

from compile.support import hand_graph
from ninfer_compile.contracts import load_contract
from ninfer_compile.errors import CompileError
from ninfer_compile.ir import printer
from ninfer_compile.ir.lower import LowerOptions, lower_all, plan_extents
from ninfer_compile.ir.types import Op
from ninfer_compile.ir.verify import verify


@pytest.fixture(scope="module")
def spec():
    return load_contract("tiny-qwen3.5-mtp").resolve()


def test_extents_t_is_c_times_k_plus_1(spec):
    ext = plan_extents(spec, LowerOptions(prefill_chunk=64, concurrency=(4, 1, 2), draft_tokens=3, max_context=128))
    text = [(e.name, e.phase, e.t) for e in ext if e.graph == "text"]
    # docs/SPECULATIVE.md: plain decode steps (T = C) and the verify rounds (T = C x (K+1))
    assert text == [("prefill_t64", "prefill", 64), ("decode_c1_k0", "decode", 1), ("decode_c2_k0", "decode", 2),
                    ("decode_c4_k0", "decode", 4), ("verify_c1_k3", "verify", 4), ("verify_c2_k3", "verify", 8),
                    ("verify_c4_k3", "verify", 16)]
    assert [e.name for e in ext if e.graph == "mtp"] == [f"mtp_{n}" for n, _, _ in text]
    k0 = plan_extents(spec, LowerOptions(prefill_chunk=64, concurrency=(2,), max_context=128))
    assert [(e.name, e.phase, e.t) for e in k0 if e.graph == "text"] == [("prefill_t64", "prefill", 64),
                                                                         ("decode_c2_k0", "decode", 2)]


@pytest.mark.parametrize("opts, needle", [
    (dict(concurrency=(0,)), "--concurrency values must be >= 1"),
    (dict(concurrency=(8,), draft_tokens=3, prefill_chunk=16), "T 32 exceeds the prefill chunk 16"),
    (dict(prefill_chunk=0), "--prefill-chunk must be >= 1"),
    (dict(prefill_chunk=256, max_context=128), "exceeds --max-context"),
    (dict(kv_dtype="fp6"), "--kv-dtype must be one of"),
])
def test_impossible_extents(spec, opts, needle):
    with pytest.raises(CompileError, match=needle):
        plan_extents(spec, LowerOptions(**{"max_context": 4096, **opts}))


def test_lowered_text_graph_structure(spec):
    graphs = lower_all(spec, LowerOptions(prefill_chunk=16, concurrency=(2,), max_context=64))
    text = graphs[1]
    assert text.extent.name == "decode_c2_k0" and nx.is_directed_acyclic_graph(text.g)
    verify(text)
    kinds = [o.kind for o in text.ops()]
    n_attn = spec.layer_kinds.count("attention")
    n_gdn = spec.layer_kinds.count("gdn")
    assert kinds.count("kv_append") == kinds.count("attention") == n_attn
    assert kinds.count("gated_delta_rule") == kinds.count("conv1d") == n_gdn
    assert kinds.count("add") == 2 * spec.dims["layers"] and kinds.count("swiglu") == spec.dims["layers"]
    # every weight is logical until bind_weights; views carry the contract's rows
    q = text.tensors["w:text/layers/3/attention/query_key[query]"]
    assert q.object is None and q.logical_rows == ("query", 0, 128) and q.dtype == "Q4G64_F16S"
    # the KV cache is per slot (slots = max concurrency) x max context; attention reads the appended version
    att = text.op("l3.attn.attention")
    assert att.inputs["k_cache"] == "kv/3/k_cache@1"
    assert text.tensors["kv/3/k_cache"].shape == (2, 64, 1, 32)
    assert text.tensors["gdn/0/recurrent_state"].shape == (2, 6, 32, 24)
    assert text.tensors["gdn/0/recurrent_state"].dtype == "f32"
    mtp = graphs[3]
    assert mtp.extent.graph == "mtp" and "hidden" in mtp.tensors and mtp.tensors["hidden"].role == "input"
    verify(mtp)


def test_int8_kv_has_scales(spec):
    with pytest.raises(CompileError, match="int8 needs head_dim a multiple of 64"):
        lower_all(spec, LowerOptions(prefill_chunk=16, max_context=64, kv_dtype="int8"))
    big = load_contract("qwen3.6-27b").resolve()
    g = lower_all(big, LowerOptions(prefill_chunk=4, concurrency=(2,), max_context=64, kv_dtype="int8"))[1]
    assert g.tensors["kv/3/k_cache"].dtype == "i8" and g.tensors["kv/3/k_cache"].shape == (2, 64, 4, 256)
    assert g.tensors["kv/3/k_scale"].dtype == "f16" and g.tensors["kv/3/k_scale"].shape == (2, 64, 4, 4)
    assert set(g.op("l3.attn.attention").inputs) >= {"k_scale", "v_scale"}


def test_verifier_catches_shape_and_dataflow_errors():
    g = hand_graph()
    bad = g.copy()
    op = bad.op("o_proj")
    bad.replace_op(op.model_copy(update={"inputs": {"x": "h", "weight": "w:out"}}))  # K 64 vs weight K 48
    with pytest.raises(CompileError, match=r"op o_proj \(linear\): x \[4, 64\] has K=64, weight \[64, 48\] has K=48"):
        verify(bad)
    dangling = g.copy()
    from ninfer_compile.ir.types import TensorType

    dangling.add_tensor(TensorType(name="ghost", shape=(4, 64), dtype="bf16", role="activation"))
    dangling.replace_op(dangling.op("residual").model_copy(update={"inputs": {"a": "ghost", "b": "o"}}))
    with pytest.raises(CompileError, match="input a=ghost is produced by no op"):
        verify(dangling)
    cyc = g.copy()
    cyc.replace_op(cyc.op("norm").model_copy(update={"inputs": {"x": "x2", "weight": "w:norm"}}))
    with pytest.raises(CompileError, match="cycle"):
        verify(cyc)
    unknown = g.copy()
    unknown.add_op(Op(name="mystery", kind="frobnicate", inputs={"x": "x"}))
    with pytest.raises(CompileError, match="unknown op kind"):
        verify(unknown)


def test_printers():
    g = hand_graph()
    txt = printer.to_text(g)
    assert "q_proj = linear(x=%h, weight=@?p/qk[query])" in txt
    d = yaml.safe_load(printer.to_yaml(g))
    assert d["extent"]["t"] == 4 and any(o["name"] == "residual" for o in d["ops"])
    dot = printer.to_dot(g)
    assert dot.startswith('digraph "hand_t4"') and '"norm" -> "q_proj"' in dot
