"""`ninfer-compile --tp N`: a plan with one section per rank (launches, bindings, weight shards,
memory report), memory.txt and --explain per rank, --memory-budget per card; --tp 1 is the plan
without the flag, with no trace of tensor parallelism."""

from __future__ import annotations

import json

import pytest

from ninfer_compile.cli import main

from .support import tiny_artifact

ARGS = ["--concurrency", "1,2", "--draft-tokens", "2", "--max-context", "64", "--prefill-chunk", "16",
        "--no-binaries", "-q"]


@pytest.fixture(scope="module")
def tp_art(tmp_path_factory):
    return tiny_artifact(tmp_path_factory.mktemp("tp") / "tiny-tp.ninfer", "tiny-qwen3.5-tp")


def _compile(art, out, *extra, capsys=None) -> dict:
    rc = main([str(art), "--sm", "90", "-o", str(out), *ARGS, *extra])
    assert rc == 0, capsys.readouterr().err if capsys else rc
    return json.loads((out / "plan.json").read_text())


def test_tp1_is_the_plan_without_the_flag(tp_art, tmp_path, capsys):
    a = _compile(tp_art, tmp_path / "a", capsys=capsys)
    _compile(tp_art, tmp_path / "b", "--tp", "1", capsys=capsys)
    for f in ("plan.json", "memory.txt"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    assert "tensor_parallel" not in a and "tp" not in a["options"]
    assert "shard_tensor_parallel" not in a["passes"]["enabled"]
    assert not any(L["kind"] in ("all_reduce", "all_gather", "all_argmax") for x in a["extents"].values()
                   for L in x["launches"])
    assert not any("argmax" in n or "head" in x for n, x in a["extents"].items())


def test_tp2_plan_has_a_section_per_rank(tp_art, tmp_path, capsys):
    one = _compile(tp_art, tmp_path / "one", capsys=capsys)
    plan = _compile(tp_art, tmp_path / "two", "--tp", "2", "--explain", capsys=capsys)
    out = capsys.readouterr().out
    assert "# rank 0 of 2" in out and "# rank 1 of 2" in out and "all_reduce_nccl" in out
    tp = plan["tensor_parallel"]
    assert tp["degree"] == 2 and [s["rank"] for s in tp["ranks"]] == [0, 1] and "extents" not in plan
    assert plan["options"]["tp"] == 2 and "shard_tensor_parallel" in plan["passes"]["enabled"]
    assert {"all_reduce_nccl", "all_gather_nccl"} <= set(plan["used_routes"])
    shards = []
    for sec in tp["ranks"]:
        # every one-device extent, plus a greedy twin per decode C (the distributed argmax head)
        assert set(sec["extents"]) == set(one["extents"]) | {"decode_c1_k0_argmax", "decode_c2_k0_argmax"}
        twin = sec["extents"]["decode_c2_k0_argmax"]
        assert twin["head"] == "argmax" and "logits" not in twin["outputs"] and "temperature" not in twin["inputs"]
        kinds = [L["kind"] for L in twin["launches"]]
        assert "all_gather" not in kinds and kinds.count("all_argmax") == 1 and "sampling" not in kinds
        pick = next(L for L in twin["launches"] if L["kind"] == "all_argmax")
        assert {"arg": "vocab_begin", "scalar": sec["rank"] * 128} in pick["bind"], pick["bind"]
        dec = sec["extents"]["decode_c2_k0"]
        reduces = [L for L in dec["launches"] if L["kind"] == "all_reduce"]
        assert len(reduces) == 2 * 4 + 1  # after the embedding, each layer's o_proj and down
        assert all({"arg": "group", "group": "tensor_parallel"} in L["bind"] for L in reduces)
        shards.append(sorted(json.dumps(r, sort_keys=True) for L in dec["launches"] for r in L["args"].values()
                             if "shard" in r))
        # every card holds half of one device's weights (only the norms are whole)
        assert sec["memory"]["weights_bytes"] < one["memory"]["weights_bytes"] * 0.55, (sec["memory"]["weights_bytes"], one["memory"]["weights_bytes"])
        assert sec["memory"]["kv_bytes_per_token"] * 2 == one["memory"]["kv_bytes_per_token"]
    assert shards[0] and shards[0] != shards[1]  # each rank binds its own slices
    text = (tmp_path / "two" / "memory.txt").read_text()
    assert "== rank 0 of 2 ==" in text and "== rank 1 of 2 ==" in text and "per card" in text


def test_memory_budget_is_per_card(tp_art, tmp_path, capsys):
    one = _compile(tp_art, tmp_path / "one", capsys=capsys)
    two = _compile(tp_art, tmp_path / "two", "--tp", "2", capsys=capsys)
    need1 = one["memory"]["total_bytes"]
    need2 = max(s["memory"]["total_bytes"] for s in two["tensor_parallel"]["ranks"])
    budget = str((need1 + need2) / 2 / 2**30)  # fits one card of the --tp 2 plan, not the one-GPU plan
    assert main([str(tp_art), "--sm", "90", "-o", str(tmp_path / "c"), *ARGS, "--memory-budget", budget]) == 2
    assert "budget" in capsys.readouterr().err
    _compile(tp_art, tmp_path / "d", "--tp", "2", "--memory-budget", budget, capsys=capsys)


def test_a_degree_the_heads_refuse_is_one_line(tmp_path, capsys):
    art = tiny_artifact(tmp_path / "mtp.ninfer", "tiny-qwen3.5-mtp")
    assert main([str(art), "--sm", "90", "-o", str(tmp_path / "p"), *ARGS, "--tp", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --tp 4: 4 does not divide the 2 GDN key heads of tiny-qwen3.5-mtp"]
