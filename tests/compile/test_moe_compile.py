"""The sparse-MoE qwen3.6-35b-a3b compiles from a sparse, header-only artifact for every shipped sm,
without a GPU, deterministically, with a memory report: every text layer (and the MTP layer) runs
the moe_router and moe_experts families, the expert GEMV at decode and the grouped GEMM at prefill;
bf16 KV is 10 attention layers x 2 KV heads x 256 x 2 x 2 B = 20,480 B per token."""

from __future__ import annotations

import json

import pytest

from ninfer_compile.cli import main

from .support import tiny_artifact

SMS = (86, 89, 90, 120)
TEXT_LAYERS, ATTENTION_LAYERS = 40, 10


@pytest.fixture(scope="module")
def a3b(tmp_path_factory):
    return tiny_artifact(tmp_path_factory.mktemp("a3b") / "qwen3.6-35b-a3b.ninfer", "qwen3.6-35b-a3b", sparse=True)


def _compile(art, sm, out, *extra) -> dict:
    assert main([str(art), "--sm", str(sm), "-o", str(out), "--no-binaries", "-q", *extra]) == 0
    return json.loads((out / "plan.json").read_text())


@pytest.mark.parametrize("sm", SMS)
def test_35b_a3b_compiles_for_every_sm(a3b, sm, tmp_path):
    mtp = ("--draft-tokens", "2") if sm == 90 else ()
    plan = _compile(a3b, sm, tmp_path / "a.plan", *mtp)
    mem = plan["memory"]
    assert mem["kv_bytes_per_token"] == 20480 + (2048 if mtp else 0)  # + the MTP layer's KV
    # Q4 gate_up / Q5-Q6 down banks, W8G32 attention / GDN / shared experts, the Q6 head
    assert 19.5 * 2**30 < mem["weights_bytes"] < (20.7 if mtp else 19.7) * 2**30
    kinds = {name: [L["kind"] for L in x["launches"]] for name, x in plan["extents"].items()}
    for name, ks in kinds.items():
        layers = 1 if name.startswith("mtp_") else TEXT_LAYERS
        assert ks.count("moe_router") == ks.count("moe_experts") == layers, name
    routes = {L["route"] for L in plan["extents"]["decode_c1_k0"]["launches"] if L["kind"] == "moe_experts"}
    assert routes == {"moe_experts_gemv"}
    routes = {L["route"] for L in plan["extents"]["prefill_t1024"]["launches"] if L["kind"] == "moe_experts"}
    assert routes == {"moe_experts_grouped_gemm"}
    report = (tmp_path / "a.plan" / "memory.txt").read_text()
    assert "20,480 B/token" in report or mtp


def test_tiny_moe_compiles_with_mtp_deterministically(tmp_path_factory, tmp_path):
    art = tiny_artifact(tmp_path_factory.mktemp("tiny-moe") / "tiny-moe.ninfer", "tiny-moe", sparse=True)
    opts = ("--draft-tokens", "2", "--concurrency", "1,2")
    plan = _compile(art, 90, tmp_path / "t.plan", *opts)
    again = _compile(art, 90, tmp_path / "u.plan", *opts)
    assert json.dumps(again, sort_keys=True) == json.dumps(plan, sort_keys=True)
    assert {"mtp_decode_c2_k0", "verify_c2_k2", "mtp_verify_c2_k2"} <= set(plan["extents"])
    for name, x in plan["extents"].items():
        n = sum(L["kind"] == "moe_experts" for L in x["launches"])
        assert n == (1 if name.startswith("mtp_") else 4), name
