"""The full qwen3.6-27b inventory compiles from a sparse, header-only artifact for every shipped
sm, with the shipped route tables, reading only the JSON directory."""

from __future__ import annotations

import json
import time

import pytest

from ninfer_compile.cli import main

from .support import tiny_artifact

SMS = (86, 89, 90, 120)


@pytest.fixture(scope="module")
def q27(tmp_path_factory):
    return tiny_artifact(tmp_path_factory.mktemp("q27") / "qwen3.6-27b.ninfer", "qwen3.6-27b", sparse=True)


@pytest.mark.parametrize("sm", SMS)
def test_27b_compiles_for_every_sm(q27, sm, tmp_path, capsys):
    out = tmp_path / f"q27.sm{sm}.plan"
    conc = "1,2,4,8" if sm == 90 else "1,8"
    t0 = time.perf_counter()
    assert main([str(q27), "--sm", str(sm), "-o", str(out), "--concurrency", conc, "--kv-dtype", "int8"]) == 0, \
        capsys.readouterr().err
    elapsed = time.perf_counter() - t0
    plan = json.loads((out / "plan.json").read_text())
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"sm{sm}: compiled in {elapsed:.2f} s, plan {size / 1e6:.2f} MB")
    assert plan["sm"] == sm and plan["routes"]["table"] == f"routes/sm{sm}.yaml"
    # 16 text layers, int8-g64; no draft window, so no MTP layer (its KV, weights and extents)
    assert plan["memory"]["kv_bytes_per_token"] == 33792
    assert not any(name.startswith("mtp_") for name in plan["extents"])
    dec = plan["extents"]["decode_c8_k0"]
    assert dec["t"] == 8 and dec["cuda_graph"]["capture"]
    kinds = [L["kind"] for L in dec["launches"]]
    # each GDN layer runs conv1d + gated_delta_rule + gated_rmsnorm, every rmsnorm its own launch
    # (bench/results/removed_fusions.md: the fused forms measured slower); no table switches a rule off
    assert kinds.count("attention") == 16
    assert kinds.count("conv1d") == kinds.count("gated_delta_rule") == kinds.count("gated_rmsnorm") == 48
    assert kinds.count("rmsnorm") == 2 * 64 + 1
    assert "fusions_off" not in dec
    # sm90 is one measured file; the unmeasured tables inherit their rows from base.yaml (cited there)
    files = (f"sm{sm}.yaml:",) if sm == 90 else (f"sm{sm}.yaml:", "base.yaml:")
    assert all(L["source"].startswith(files) for L in dec["launches"] if L["route"])


def test_27b_on_two_24gb_sm86_cards(q27, tmp_path, capsys):
    """--tp 2: every row-parallel K slice lies on whole scale groups; the context that fits a 24 GB
    card is fitted per card."""
    out = tmp_path / "q27.tp2.plan"
    assert main([str(q27), "--sm", "86", "--tp", "2", "-o", str(out), "--max-context", "auto", "--memory-budget",
                 "24", "--kv-dtype", "int8", "--no-binaries", "-q"]) == 0, capsys.readouterr().err
    plan = json.loads((out / "plan.json").read_text())
    ranks = plan["tensor_parallel"]["ranks"]
    assert len(ranks) == 2 and all(r["memory"]["total_bytes"] <= 24 * 2**30 for r in ranks)
    assert all(r["memory"]["weights_bytes"] < 9 * 2**30 for r in ranks)  # of the artifact's 17.5 GB
    assert "context fit" in (out / "memory.txt").read_text()
