"""bench/bench_moe.py on the CPU: the byte counts at the 35B geometry, the routing draws' peer plans,
and the script end to end in --dry-run (tiny shapes under the interpreter; no timing is asserted)."""

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_moe  # noqa: E402
import moe_bench_ops as O  # noqa: E402


def test_stored_bytes_per_expert_at_the_35b_geometry():
    geo = O.GEOMETRY["35b"]
    assert O.row_bytes("Q4G64_F16S", 2048) == 1024 + 64 and O.row_bytes("Q5G64_F16S", 512) == 256 + 64 + 16
    lay = O.Layer(geo, "Q4G64_F16S", "Q5G64_F16S", torch.device("cpu"))
    assert lay.expert_bytes == 1024 * 1088 + 2048 * 336
    assert 3.4 < lay.expert_bytes_bf16 / lay.expert_bytes < 3.6  # the bf16 peer's extra reads
    w8 = O.Layer(geo, "W8G32_F16S", "W8G32_F16S", torch.device("cpu"))
    assert w8.expert_bytes == 1024 * (2048 + 128) + 2048 * (512 + 32)


def test_draw_plans_cover_every_pair_once():
    geo = {"E": 16, "top_k": 4, "hot": 4}
    gen = torch.Generator().manual_seed(3)
    hot = torch.tensor([1, 5, 9, 13])
    for dist in bench_moe.DISTS:
        (d,) = O.make_draws(1, 9, geo, dist, gen, "cpu", hot)
        toks = torch.cat([tok for _, tok, _ in d.plan])
        assert d.hits == len(d.plan) == len(torch.unique(d.ids)) and toks.numel() == 9 * 4
        assert sorted(toks.tolist()) == sorted(list(range(9)) * 4)
        assert torch.allclose(torch.cat([w for _, _, w in d.plan]).sum(), torch.tensor(9.0))


def test_dry_run_end_to_end(tmp_path):
    """T 1 (both expert routes) and 17 (past the decode route's domain)."""
    assert bench_moe.main(["--dry-run", "--out", str(tmp_path), "--t", "1,17"]) == 0
    res = json.loads((tmp_path / "bench_moe.json").read_text())
    assert res["dry_run"] and not res["errors"] and res["geometry"]["E"] == 16
    router = [r for r in res["rows"] if r["op"] == "router"]
    assert [(r["t"], r["route"]) for r in router] == [(1, "moe_router_split"), (17, "moe_router_split")]
    assert all(r["check"] < 1e-2 for r in router)
    experts = {(r["t"], r["dist"], r["route"]): r for r in res["rows"] if r["op"] == "experts"}
    assert set(experts) == {(1, d, r) for d in bench_moe.DISTS for r in bench_moe.EXPERT_ROUTES} | \
        {(17, d, "moe_experts_grouped_gemm") for d in bench_moe.DISTS}
    geo = res["geometry"]
    for (t, _, _), r in experts.items():
        assert r["check"] < 1e-2 and r["peer_check"] < 2e-2, r
        assert 1 <= r["hits"] <= min(geo["E"], t * geo["top_k"])
        assert r["floor_us"] == pytest.approx(r["bytes"] / res["read_bw"] * 1e6)
        assert r["us"] > 0 and r["peer_us"] > 0
    md = (tmp_path / "bench_moe.md").read_text()
    assert md.startswith("# MoE routes on none (CPU") and "| 17 | skewed | moe_experts_grouped_gemm |" in md
