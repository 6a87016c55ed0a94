"""qwen3.8-27b (NInfer's `groupwise-int` profile: the 27B inventory with W8G32 embedding and output
head, plus the optional DFlash2 suffix) checks and compiles for sm90 from a sparse, header-only
artifact, without a GPU and without kernel binaries."""

from __future__ import annotations

import json

import pytest

from ninfer_compile.cli import main

from .support import tiny_artifact


@pytest.fixture(scope="module")
def q38(tmp_path_factory):
    return tiny_artifact(tmp_path_factory.mktemp("q38") / "qwen3.8-27b.ninfer", "qwen3.8-27b", sparse=True)


def test_38_checks_and_compiles_for_sm90(q38, tmp_path, capsys):
    assert main(["check", str(q38)]) == 0
    assert "ok: qwen3.8-27b: 1184 tensors, 6 resources match" in capsys.readouterr().out
    out = tmp_path / "q38.plan"
    assert main([str(q38), "--sm", "90", "-o", str(out), "--no-binaries", "--concurrency", "1,8",
                 "--draft-tokens", "3"]) == 0, capsys.readouterr().err
    plan = json.loads((out / "plan.json").read_text())
    assert plan["sm"] == 90 and plan["model_id"] == "qwen3.8-27b"
    # 16 attention layers (+ the MTP layer with a draft window): bf16 KV, 2 x 4 heads x 256 x 2 B each
    assert plan["memory"]["kv_bytes_per_token"] == 17 * 2 * 4 * 256 * 2
    dec = plan["extents"]["verify_c8_k3"]
    kinds = [L["kind"] for L in dec["launches"]]
    assert kinds.count("attention") == 16 and kinds.count("gated_delta_rule") + kinds.count("gdn_decode_fused") == 48
    embed = next(L for L in dec["launches"] if L["kind"] == "embedding")
    assert embed["match"]["format"] == "W8G32_F16S" and embed["args"]["table"]["weight"] == "text/token_embedding"
    heads = [a for L in dec["launches"] for a in L["args"].values()
             if isinstance(a, dict) and a.get("weight") == "text/output_head"]
    assert heads and all(a["format"] == "W8G32_F16S" for a in heads)
    assert any(name.startswith("mtp_") for name in plan["extents"])
    # the DFlash2 objects are checked, never bound: nothing of the plan reads them
    assert "dflash2/" not in (out / "plan.json").read_text()
