"""The table writer: a picked table validates with load_table, says `source: measured`, carries
the evidence, and is written atomically (an invalid table never replaces the output)."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from ninfer_compile.cli import main
from ninfer_compile.errors import RouteError
from ninfer_compile.routes import load_table
from ninfer_compile.tune import cli as tcli
from ninfer_compile.tune.crossover import Candidate, Group, Row, carry_groups, pick_rows, render_table, write_table
from ninfer_compile.tune.shapes import derive_match_set, load_model

PROV = {"source": "measured", "command": "ninfer-compile tune --sm 90", "date": "2026-12-01 10:00 UTC",
        "device": "NVIDIA H200", "driver": "580.1", "cuda": "13.0", "torch": "2.11.0", "triton": "3.6.0",
        "power_w": 700}


def _linear_group():
    gemv = Candidate.make("q4_gemv", {"BLOCK_N": 16}, 1, 4)
    small = Candidate.make("q4_small_t_mma", {}, 1, 64)
    wide = Candidate.make("q4_wide_mma", {"BLOCK_T": 64}, 1, None)
    grid = {1: {gemv: 10.0, small: 30.0}, 4: {gemv: 40.0, small: 31.0}, 128: {wide: 90.0}}
    rows = pick_rows(grid, [gemv, small, wide])
    return Group("linear", {"format": "Q4G64_F16S", "n": 4096, "k": 5120, "epilogue": "none"}, rows)


def test_written_table_loads_and_is_measured(tmp_path):
    g = _linear_group()
    dec = Candidate.make("attention_decode_splitkv", {"split_tokens": 1024}, 1, 64)
    att = Group("attention", {"phase": "decode", "kv_dtype": "bf16"}, pick_rows({1: {dec: 5.0}, 128: {}}, [dec]))
    out = tmp_path / "sm90.yaml"
    table = write_table(out, render_table(90, PROV, [g, att], header_comment="test"))
    assert out.is_file() and not list(tmp_path.glob(".*tmp"))
    t2 = load_table(out)
    assert t2.provenance["source"] == "measured" and t2.provenance["device"] == "NVIDIA H200"
    assert t2.sha256 == table.sha256
    sel = t2.select("linear", 2, {"format": "Q4G64_F16S", "n": 4096, "k": 5120, "epilogue": "none"})
    assert sel.route.name == "q4_gemv" and sel.params["BLOCK_N"] == 16 and sel.t_range == (1, 3)
    sel = t2.select("linear", 500, {"format": "Q4G64_F16S", "n": 4096, "k": 5120})
    assert sel.route.name == "q4_wide_mma" and sel.params["BLOCK_T"] == 64
    row = [r for r in t2.rows("linear")[0].rows if r.route.name == "q4_gemv"][0]
    assert row.evidence == {1: {"q4_gemv": 10.0, "q4_small_t_mma": 30.0}}
    with pytest.raises(RouteError, match="unsupported"):
        t2.select("attention", 65, {"phase": "decode", "kv_dtype": "bf16"})


def test_invalid_table_leaves_the_output_untouched(tmp_path):
    out = tmp_path / "sm90.yaml"
    out.write_text("old\n")
    bad = Group("linear", {"format": "Q4G64_F16S"}, [Row(1, None, Candidate.make("q4_gemv", {}, 1, 4))])
    with pytest.raises(RouteError, match=r"^sm90.yaml:\d+: .*max_t is 4"):
        write_table(out, render_table(90, PROV, [bad]))
    assert out.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["sm90.yaml"]


def test_written_table_keeps_the_base_fuse_off(tmp_path):
    """A re-tuned table carries the base's `fuse_off:` (rule -> measured reason) unchanged."""
    off = {"qk_norm_rope": "H200: 93.1 vs 131.0 tok/s (bench/results/x.md)", "conv_input_parts": "slower: 1422 µs"}
    t = write_table(tmp_path / "sm90.yaml", render_table(90, PROV, [_linear_group()], fuse_off=off))
    assert {rule: why for rule, (why, _) in t.fuse_off.items()} == off
    kept, _ = carry_groups({"sm": 90, "fuse_off": off, "linear": []}, [_linear_group()])
    assert kept == []


def test_carry_groups_keeps_unmeasured_and_replaces_measured():
    base = {"sm": 90, "linear": [
        {"match": {"format": "Q4G64_F16S", "n": 4096, "k": 5120, "epilogue": "none"},
         "routes": [{"t": [1, "max"], "route": "q4_wide_mma"}]},
        {"match": {"format": "Q6G64_F16S", "epilogue": "swiglu"}, "routes": [{"t": [1, "max"], "route": "q6_wide_mma"}]}],
        "rmsnorm": [{"match": {}, "routes": [{"t": [1, "max"], "route": "rmsnorm_rows"}]}]}
    kept, notes = carry_groups(base, [_linear_group()])
    assert [(g.family, g.match) for g in kept] == [("linear", {"format": "Q6G64_F16S", "epilogue": "swiglu"}),
                                                    ("rmsnorm", {})]
    assert len(notes) == 2


def _fake_measurements(path, contract="tiny-qwen3.5"):
    spec, objs, src = load_model(contract=contract)
    cases = derive_match_set(spec, objs, families=("linear", "gated_delta_rule", "attention", "conv1d"),
                             kv_dtypes=("bf16", "int8"), draft_tokens=())  # prefill / decode (verify: test_tune_new.py)
    ns = argparse.Namespace(quick=True, decode_contexts=None, prefill_contexts=None)
    plan = tcli.build_plan(cases, (1, 2, 4, 8, 64, 256), ns)
    recs = []
    for ci, ctx, t, cands in plan:
        for r, p in cands:
            kind = 0 if "gemv" in r.name else 1 if ("small" in r.name or "decode" in r.name) else 2
            us = [5.0 * t, 20.0 + t, 40.0 + 0.2 * t][kind] * (1 + 0.01 * len(p))
            rec = {"case": ci, "family": cases[ci].family, "match": dict(cases[ci].match), "t": t, "ctx": ctx,
                   "route": r.name, "params": p, "min_t": r.domain.min_t, "max_t": r.domain.max_t, "us": us}
            if r.name == "q4_small_t_mma" and p:  # a candidate the reference check dropped
                rec = {k: v for k, v in rec.items() if k != "us"}
                rec["error"] = "reference check failed"
            recs.append(rec)
    path.write_text(json.dumps({
        "sm": 90, "source": src, "command": "ninfer-compile tune --sm 90 --quick",
        "environment": {"device": "NVIDIA H200", "driver": "580.1", "cuda": "13.0", "torch": "2.11.0",
                        "triton": "3.6.0", "power_w": 700},
        "t_points": [1, 2, 4, 8, 64, 256], "warnings": ["dropping q4_small_t_mma {...}: reference check failed"],
        "cases": [dataclasses.asdict(c) for c in cases], "records": recs}, default=str))


def test_replay_writes_a_valid_measured_table_and_report(tmp_path, capsys):
    saved = tmp_path / "m.json"
    _fake_measurements(saved)
    out = tmp_path / "routes" / "sm90.yaml"
    rc = main(["tune", "--sm", "90", "--replay", str(saved), "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    table = load_table(out)
    assert table.provenance["source"] == "measured"
    assert table.provenance["command"] == "ninfer-compile tune --sm 90 --quick"
    for key in ("device", "driver", "cuda", "torch", "triton", "date", "power_w"):
        assert key in table.provenance
    # carried-over families from the shipped sm90 table keep the table complete
    assert "sampling" in table.families and "embedding" in table.families
    # the dropped candidates (q4_small_t_mma with any non-default params) are never in a row;
    # rows carry fully resolved params, so the surviving default candidate reads as the defaults
    from ninfer_compile.kernels.registry import get_route

    defaults = get_route("q4_small_t_mma").resolve_params({})
    saved_cases = json.loads(saved.read_text())["cases"]
    measured = [c["match"] for c in saved_cases if c["family"] == "linear"]
    checked = 0
    for g in table.rows("linear"):
        if dict(g.match) not in measured:  # a group carried over from the base table
            continue
        checked += 1
        for r in g.rows:
            assert not (r.route and r.route.name == "q4_small_t_mma" and r.params != defaults)
    assert checked >= 1
    report = (tmp_path / "routes" / "sm90.md").read_text()
    assert "Timing grid" in report and "Dropped candidates" in report
    # the replay of another sm is refused
    assert main(["tune", "--sm", "86", "--replay", str(saved), "-o", str(out)]) == 2


def test_replay_merges_files_later_timing_wins(tmp_path, capsys):
    first = tmp_path / "a.json"
    _fake_measurements(first)
    data = json.loads(first.read_text())
    # a second session re-measured q4_gemv at T=1 only: make it 100x slower there and add a T point
    later = {**data, "command": "ninfer-compile tune --sm 90 --t-points 1", "t_points": [1, 3]}
    recs = [dict(r, us=r["us"] * 100) for r in data["records"] if r["route"] == "q4_gemv" and r["t"] == 1]
    assert recs
    later["records"] = recs
    second = tmp_path / "b.json"
    second.write_text(json.dumps(later))
    merged = tcli.merge_measurements([first, second], 90)
    assert merged["t_points"] == sorted({1, 2, 3, 4, 8, 64, 256})
    assert len(merged["records"]) == len(data["records"])
    slow = [r for r in merged["records"] if r["route"] == "q4_gemv" and r["t"] == 1]
    assert slow and all(r["us"] >= 100 * 5.0 * 0.99 for r in slow)
    assert merged["command"].startswith("merged measurements of: ")
    out = tmp_path / "sm90.yaml"
    assert main(["tune", "--sm", "90", "--replay", str(first), str(second), "-o", str(out)]) == 0, \
        capsys.readouterr().err
    # T=1 no longer picks q4_gemv once it is 100x slower
    table = load_table(out)
    seen = 0
    for g in table.rows("linear"):
        for r in g.rows:
            if r.route and r.evidence and r.contains(1) and dict(g.match).get("format") == "Q4G64_F16S":
                seen += 1
                assert r.route.name != "q4_gemv"
    assert seen >= 1
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    assert main(["tune", "--sm", "90", "--replay", str(first), str(bad), "-o", str(out)]) == 2
    assert "bad.json" in capsys.readouterr().err


def test_replay_last_owns_points_drops_the_other_cards_timings_there(tmp_path):
    first = tmp_path / "a.json"
    _fake_measurements(first)
    data = json.loads(first.read_text())
    # another card re-measured one route at T=1 only: with ownership, T=1 holds only its records
    recs = [dict(r, us=r["us"] * 100) for r in data["records"] if r["route"] == "q4_gemv" and r["t"] == 1]
    assert recs
    second = tmp_path / "b.json"
    second.write_text(json.dumps({**data, "t_points": [1], "records": recs}))
    plain = tcli.merge_measurements([first, second], 90)
    owned = tcli.merge_measurements([first, second], 90, last_owns_points=True)
    cases = {r["case"] for r in recs}
    at1 = lambda m: [r for r in m["records"] if r["t"] == 1 and r["case"] in cases]  # noqa: E731
    assert {r["route"] for r in at1(plain)} != {"q4_gemv"}  # the first file's other routes stay
    assert {r["route"] for r in at1(owned)} == {"q4_gemv"}  # only the owning run's timings at T=1
    elsewhere = lambda m: sorted(json.dumps(r, sort_keys=True) for r in m["records"]  # noqa: E731
                                 if r["t"] != 1 or r["case"] not in cases)
    assert elsewhere(owned) == elsewhere(plain)
    assert any("owns its" in w for w in owned["warnings"])
