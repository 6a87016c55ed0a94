"""bench/pdl_arms.py on the CPU: the prefetch-off table (every row of every route that declares
PDL_PREFETCH_BYTES, found through the registry) and the A/B summary over bench_e2e JSON files."""

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import pdl_arms as P  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def test_the_prefetching_routes_come_from_the_registry():
    names = P.prefetch_routes()
    assert {"q4_gemv_lowreg", "q5_gemv_lowreg", "q6_gemv_lowreg", "bf16_gemv", "w8_gemv_tc"} <= names
    assert not {"q4_gemv_tc", "q4_dequant_gemm", "rmsnorm_rows"} & names


def test_variant_table_sets_every_prefetching_row(tmp_path):
    dest = tmp_path / "t.yaml"
    hits = P.variant_table(REPO / "routes" / "sm90.yaml", 0, dest)
    doc = yaml.safe_load(dest.read_text())
    names = P.prefetch_routes()
    rows = [r for entries in doc.values() if isinstance(entries, list) for e in entries
            for r in e.get("routes", []) if r.get("route") in names]
    assert hits == len(rows) >= 10 and all(r["params"]["PDL_PREFETCH_BYTES"] == 0 for r in rows)
    others = [r for r in doc["linear"][0]["routes"] if r["route"] not in names]
    assert others and all("PDL_PREFETCH_BYTES" not in r.get("params", {}) for r in others)
    with pytest.raises(SystemExit, match="not one of"):
        P.variant_table(REPO / "routes" / "sm90.yaml", 3000, dest)


def _e2e(step_ms, launches):
    return {"provenance": {"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-12-06 20:00 UTC", "driver": "580",
                           "torch": "2.11", "triton": "3.6.0"}, "context": 4096, "streaming_read": {"gbs": 2960},
            "kernels": "kernels: precompiled binaries (triton 3.6.0, sm_90): 70/70 loaded from the plan, 0 JIT-compiled",
            "decode": {"1": {"tok_s": 1000 / step_ms, "step_ms": step_ms, "floor_step_ms": 5.3,
                             "fraction_of_floor": 5.3 / step_ms}},
            "decode_profile": {"1": {"launches_per_step": launches, "idle_us_per_step": 40.0}}}


def test_summary_against_the_first_arm(tmp_path):
    for name, ms in (("base", 7.65), ("both", 7.32)):
        (tmp_path / f"{name}.json").write_text(json.dumps(_e2e(ms, 710)))
    md = P.summary([("base", tmp_path / "base.json"), ("both", tmp_path / "both.json")], None)
    both = next(line for line in md.splitlines() if line.startswith("| both "))
    assert "| 7.320 | -0.330 ms (-4.3%) | 5.30 | 72% | 710 | 40 | 70/70 bin, 0 JIT |" in both
    assert "## C = 1" in md and "H100" in md
