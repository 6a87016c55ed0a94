"""The tuner measures the new routes (issue 17 item 4): verify cases per draft window at the round
sizes T = C x (K+1), all seven KV formats by default, the state_select variants, `--untimed-in`
selecting exactly what routes/sm90.yaml has no measured group for, and a replayed measurement file
replacing the hand-added untimed rows with measured ones."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml

from ninfer_compile.cli import main
from ninfer_compile.errors import NinferError
from ninfer_compile.kernels.kv_cache.formats import kv_format
from ninfer_compile.routes import load_table
from ninfer_compile.routes.table import ROUTES_DIR, effective_match
from ninfer_compile.tune import cli as tcli
from ninfer_compile.tune import plan as P
from ninfer_compile.tune import shapes as S
from ninfer_compile.tune.shapes import MatchCase, describe

from .conftest import DRAFT_SUBSET, KV_SUBSET

SM90 = ROUTES_DIR / "sm90.yaml"
# the shipped table before the 2026-12-02 tune_new run, with its hand-added untimed rows: the
# tune_new workflow's tests run on it (the shipped table has none left, test_shipped_sm90_*)
SM90_HAND = Path(__file__).resolve().parent / "data" / "sm90_2026-12-02_before_tune_new.yaml"
REPO = Path(__file__).resolve().parents[2]
MEASUREMENTS = REPO / "routes" / "measurements" / "sm90"  # the tuner's inputs that rebuild routes/sm90.yaml
# the measurement files routes/sm90.yaml was picked from, in its provenance's merge order (later wins);
# bench/gpu_session.sh's tune_new stage replays them with the new measurements
COMMITTED = ["tune_sm90_linear_2026-11-29", "tune_sm90_gemv_2026-11-29", "tune_sm90_gemv2_2026-11-29",
             "tune_sm90_gemv_tc_2026-11-29", "tune_sm90_quick_2026-11-29", "tune_sm90_cliff_2026-12-01",
             "tune_sm90_gemv_fused_2026-12-01", "tune_sm90_attn_gating_2026-12-01"]


def _args(**kw):
    base = dict(quick=True, decode_contexts=None, prefill_contexts=None, routes=None, candidates=None,
                verify_rows=None)
    base.update(kw)
    return argparse.Namespace(**base)


def test_defaults_derive_every_kv_format_and_draft_window():
    from ninfer_compile.ir.lower import KV_DTYPES

    assert S.KV_DTYPES == tuple(KV_DTYPES) == ("bf16", "int8", "fp8", "k8v4", "rk8v4", "nvfp4", "rk4v4")
    assert S.DRAFT_TOKENS == (1, 2, 3, 4, 5) and S.VERIFY_ROWS == (1, 2, 4, 8)
    parser = argparse.ArgumentParser()
    tcli.configure(parser)
    args = parser.parse_args(["--sm", "90"])
    assert args.kv_dtypes.split(",") == list(KV_DTYPES)
    assert args.draft_tokens is None and args.verify_rows is None  # the defaults above


def test_verify_cases_per_window_with_the_27b_shapes(cases27b):
    ver = [c for c in cases27b if c.window]
    windows = sorted({c.window for c in ver})
    assert windows == [k + 1 for k in DRAFT_SUBSET]
    kinds = {(c.family, c.match.get("kv_dtype"), c.variant) for c in ver}
    want = {("gated_delta_rule", None, ""), ("conv1d", None, ""), ("gdn_gating_proj", None, ""),
            ("spec_accept", None, ""), ("state_select", None, "f32[48,128,128]"),
            ("state_select", None, "bf16[3,10240]")}
    want |= {("attention", kv_format(k).match, "") for k in KV_SUBSET}
    assert kinds == want
    for w in windows:  # every kind at every window, once
        assert sorted((c.family, c.match.get("kv_dtype") or "", c.variant) for c in ver if c.window == w) == \
            sorted((f, k or "", v) for f, k, v in want)
    by = {(c.family, c.window, c.variant, c.match.get("kv_dtype")): c for c in ver}
    gdn = by[("gated_delta_rule", 4, "", None)]
    assert gdn.match == {"format": "BF16", "phase": "verify"} and gdn.attrs["window"] == 4
    assert gdn.shapes["q"] == (4, 16, 128) and gdn.shapes["v"] == (4, 48, 128)
    assert gdn.shapes["out:state_columns"] == (1, 3, 48, 128, 128) and len(gdn.ops) == 48
    conv = by[("conv1d", 2, "", None)]
    assert conv.match == {"format": "BF16", "n": 10240, "k": 4, "phase": "verify"}
    assert conv.shapes["out:conv_state_columns"] == (1, 1, 3, 10240)
    att = by[("attention", 4, "", "nvfp4")]
    assert att.match == {"format": "BF16", "kv_dtype": "nvfp4", "head_dim": 256, "phase": "verify"}
    assert att.shapes["q"] == (4, 24, 256) and "mtp.attn.attention" in att.ops  # the MTP verify graph's too
    rec = by[("state_select", 4, "f32[48,128,128]", None)]
    assert rec.shapes["columns"] == (1, 3, 48, 128, 128) and rec.dtypes["state"] == "f32"
    assert all(o.endswith(".gdn.state_select") for o in rec.ops) and len(rec.ops) == 48
    conv_sel = by[("state_select", 2, "bf16[3,10240]", None)]
    assert all(o.endswith(".gdn.conv_state_select") for o in conv_sel.ops)
    acc = by[("spec_accept", 2, "", None)]
    assert acc.match == {"format": "BF16", "n": 248320} and acc.shapes["logits"] == (2, 248320)
    proj = by[("gdn_gating_proj", 4, "", None)]
    assert proj.match == {"format": "BF16", "n": 48, "k": 5120, "phase": "verify"}
    # the round sizes: C x W for C in 1, 2, 4, 8
    assert P.case_points(gdn, P.DEFAULT_T_POINTS, _args()) == (4, 8, 16, 32)
    assert P.case_points(conv, P.DEFAULT_T_POINTS, _args(verify_rows="1,8")) == (2, 16)
    assert describe(rec) == "state_select BF16 W=4 [f32[48,128,128]] (l0.gdn.state_select)"
    # a verify op whose match a decode op already presents is that case's op (no window, no duplicate)
    lin = [c for c in cases27b if c.family == "linear"]
    assert not any(c.window for c in lin) and len({json.dumps(sorted(c.match.items())) for c in lin}) == len(lin)
    assert len({c.ident for c in cases27b}) == len(cases27b)


def test_kv_format_cases_and_the_draft_head(cases27b):
    plain = {(c.family, c.match.get("phase"), c.match.get("kv_dtype")) for c in cases27b if not c.window}
    for k in KV_SUBSET:
        m = kv_format(k).match
        assert {("kv_append", None, m), ("attention", "decode", m), ("attention", "prefill", m)} <= plain
    head = [c for c in cases27b if c.family == "linear" and c.match["n"] == 131072]
    assert [c.match for c in head] == [{"format": "Q4G64_F16S", "n": 131072, "k": 5120, "epilogue": "none"}]


def test_untimed_in_sm90_selects_the_new_routes_cases(cases27b):
    untimed = P.untimed_cases([c for c in cases27b if c.family in S.tunable()], SM90_HAND, 90)
    got = {c.ident for c in untimed}
    want = {c.ident for c in cases27b if c.window}  # every verify case
    want |= {c.ident for c in cases27b if c.match.get("kv_dtype") == "nvfp4"}  # the issue-15 format
    want |= {c.ident for c in cases27b if c.family == "linear" and c.match["n"] == 131072}  # the draft head
    want |= {c.ident for c in cases27b if c.family == "sampling"}  # sample_per_slot (the text and MTP heads)
    assert want <= got
    # (on main today got == want: 83 cases at the default kv formats / windows; a family another branch
    # adds without measured rows joins them, so only the measured ones are named here)
    timed = [c for c in cases27b if not c.window and (
        (c.family in ("attention", "kv_append") and c.match.get("kv_dtype") in ("bf16", "int8_g64"))
        or (c.family in ("gated_delta_rule", "conv1d") and c.match.get("phase") in ("decode", "prefill")))]
    assert len(timed) == 10 and not {c.ident for c in timed} & got
    with pytest.raises(NinferError, match="--untimed-in .*nope.yaml: cannot read"):
        P.untimed_cases(untimed, SM90_HAND.with_name("nope.yaml"), 90)
    with pytest.raises(NinferError, match="table is for sm 90, not 89"):
        P.untimed_cases(untimed, SM90_HAND, 89)


def test_timed_in_table_needs_a_group_of_the_exact_match_with_evidence():
    case = MatchCase("linear", {"format": "Q4G64_F16S", "n": 64, "k": 128, "epilogue": "none"}, {})
    ev = {"t": [1, "max"], "route": "q4_gemv", "evidence": {1: {"q4_gemv": 3.0}}}
    bare = {"t": [1, "max"], "route": "q4_gemv"}
    pinned = {"format": "Q4G64_F16S", "n": 64, "k": 128}  # epilogue defaults to none
    assert S.timed_in_table(case, {"linear": [{"match": pinned, "routes": [ev]}]})
    assert not S.timed_in_table(case, {"linear": [{"match": pinned, "routes": [bare]}]})  # hand-added
    assert not S.timed_in_table(case, {"linear": [{"match": {"format": "Q4G64_F16S"}, "routes": [ev]}]})  # fallback
    assert not S.timed_in_table(case, {"linear": [{"match": {**pinned, "epilogue": "swiglu"}, "routes": [ev]}]})
    assert not S.timed_in_table(case, {"rmsnorm": [{"match": pinned, "routes": [ev]}]}) and \
        not S.timed_in_table(case, None)


def test_plan_of_verify_cases_contexts_and_candidate_limit(cases27b):
    from ninfer_compile.kernels.tuning import find_tune_spec

    att = next(c for c in cases27b if c.family == "attention" and c.window == 2 and c.match["kv_dtype"] == "bf16")
    sel = next(c for c in cases27b if c.family == "state_select" and c.window == 4)
    args = _args(quick=False, decode_contexts="4096,32768", candidates=2)
    assert find_tune_spec("attention").contexts
    assert P.contexts_for(att, args) == [4096, 32768] and P.contexts_for(sel, args) == [None]
    plan = P.build_plan([att, sel], P.DEFAULT_T_POINTS, args)
    assert [(ci, ctx, t) for ci, ctx, t, _ in plan] == (
        [(0, ctx, t) for ctx in (4096, 32768) for t in (2, 4, 8, 16)] + [(1, None, t) for t in (4, 8, 16, 32)])
    for _, _, _, cands in plan:
        per_route: dict[str, int] = {}
        for r, _p in cands:
            per_route[r.name] = per_route.get(r.name, 0) + 1
        assert per_route and max(per_route.values()) <= 2
    assert {r.name for _, _, _, c in plan[:1] for r, _ in c} == {"attention_decode_splitkv", "attention_verify_packed"}
    assert P.all_points([att, sel], (1, 64), args) == (1, 2, 4, 8, 16, 32, 64)


def _us(ci: int, t: int, ctx, route: str, params: dict) -> float:
    """A fake, deterministic timing (µs): grows with T and the context, the route's name picks a
    constant, non-default params cost 1% each."""
    return round((1.0 + 0.5 * ci + 0.1 * t + (ctx or 0) / 1e4 + len(route) % 5) * (1 + 0.01 * len(params)), 4)


def _fake_file(path: Path, cases, args) -> list[dict]:
    plan = P.build_plan(cases, P.QUICK_T_POINTS, args)
    recs = []
    for ci, ctx, t, cands in plan:
        for r, p in cands:
            recs.append({"case": ci, "family": cases[ci].family, "match": dict(cases[ci].match), "t": t, "ctx": ctx,
                         "route": r.name, "params": p, "min_t": r.domain.min_t, "max_t": r.domain.max_t,
                         "us": _us(ci, t, ctx, r.name, p)})
    path.write_text(json.dumps({
        "sm": 90, "source": "contract qwen3.6-27b", "command": "ninfer-compile tune --sm 90 --untimed-in sm90.yaml",
        "environment": {"device": "NVIDIA H200", "driver": "580.1", "cuda": "13.0", "torch": "2.11.0",
                        "triton": "3.6.0", "power_w": 700},
        "t_points": list(P.all_points(cases, P.QUICK_T_POINTS, args)), "warnings": [],
        "cases": [dataclasses.asdict(c) for c in cases], "records": recs}, default=str))
    return recs


def _hand_marked(path: Path) -> list[tuple[str, dict]]:
    """The groups of a table written under a comment block that says `untimed` (the convention of
    the rows added by hand in stops 10-11), as (family, match)."""
    fam, marked, prev_comment, out = None, False, False, []
    for line in path.read_text().splitlines():
        if re.match(r"^[a-z_0-9]+:$", line):
            fam, marked, prev_comment = line[:-1], False, False
            continue
        m = re.match(r"^\s+# (.*)", line)
        if m:
            marked = (marked and prev_comment) or "untimed" in m.group(1)
            prev_comment = True
            continue
        prev_comment = False
        g = re.match(r"^  - match: (\{.*\})\s*$", line)
        if g and marked and fam:
            out.append((fam, yaml.safe_load(g.group(1)) or {}))
    return out


def _group(table, fam: str, match: dict):
    want = effective_match(match)
    hits = [g for g in table.rows(fam) if g.eff == want]
    return hits[0] if hits else None


def test_replay_replaces_the_hand_added_untimed_rows(cases27b, tmp_path, capsys):
    marked = _hand_marked(SM90_HAND)
    assert len(marked) >= 20 and ("state_select", {}) in marked and ("spec_accept", {}) in marked
    new = P.untimed_cases([c for c in cases27b if c.family in S.tunable()], SM90_HAND, 90)
    meas = tmp_path / "tune_new.meas.json"
    recs = _fake_file(meas, new, _args())
    out = tmp_path / "sm90.yaml"
    merged = tmp_path / "merged.meas.json"  # --replay with --save-measurements: the merged file
    assert main(["tune", "--sm", "90", "--replay", str(meas), "--base", str(SM90_HAND), "-o", str(out),
                 "--save-measurements", str(merged)]) == 0, capsys.readouterr().err
    assert len(json.loads(merged.read_text())["records"]) == len(recs)
    table = load_table(out)
    from ninfer_compile.kernels.registry import routes_for

    # a hand-added group is replaced when a measured case presents its match (pinned or fallback)
    served = {(c.family, json.dumps(effective_match(m), sort_keys=True)) for c in new
              for m in (c.match, S.generic_match(c.family, c.match, routes_for(c.family)))}
    replaced = kept = 0
    for fam, match in marked:
        g = _group(table, fam, match)
        assert g is not None, (fam, match)
        covered = (fam, json.dumps(effective_match(match), sort_keys=True)) in served
        has_evidence = any(r.evidence for r in g.rows)
        if covered:  # measured now: evidence in its rows, and every T of a verify round is served
            replaced += 1
            assert has_evidence, (fam, match)
            if match.get("phase") == "verify" or fam in ("state_select", "spec_accept"):
                assert g.rows[0].lo == 1 and g.rows[0].route is not None, (fam, match, g.rows[0])
                assert all(r.route is not None for r in g.rows if r.hi is not None and r.hi <= 48)
        else:  # a format this run did not measure: carried unchanged
            kept += 1
            assert not has_evidence, (fam, match)
    # nvfp4 kv_append, attention {bf16, int8_g64, nvfp4} verify + nvfp4 decode / prefill, the five verify
    # families, sampling {mode: per_slot}; kept: fp8 / k8v4 / rk8v4 / rk4v4 (not measured here)
    assert replaced >= 12 and kept >= 12
    assert ("sampling", {"mode": "per_slot"}) in marked
    for fam, match in marked:
        if match.get("kv_dtype") in ("fp8", "k8v4", "rk8v4", "rk4v4"):
            assert not any(r.evidence for r in _group(table, fam, match).rows)
    prov = table.provenance["notes"]
    assert "carried over unmeasured" in prov and "kv_dtype: fp8" in prov
    # the draft head: a group pinned to its shape, with evidence
    head = _group(table, "linear", {"format": "Q4G64_F16S", "n": 131072, "k": 5120, "epilogue": "none"})
    assert head is not None and any(r.evidence for r in head.rows)
    # state_select: one group for both state shapes, the evidence is their sum
    sel = _group(table, "state_select", {"format": "BF16"})
    idx = [i for i, c in enumerate(new) if c.family == "state_select" and c.window == 2]
    assert len(idx) == 2
    params = [r["params"] for r in recs if r["case"] == idx[0] and r["t"] == 2]
    best = min(sum(r["us"] for r in recs if r["case"] in idx and r["t"] == 2 and r["params"] == p) for p in params)
    row = next(r for r in sel.rows if r.contains(2))
    assert row.evidence[2]["state_select_copy"] == pytest.approx(round(best, 2))
    # attention verify at T 8 = C 4 x W 2 plus C 2 x W 4, each summed over the decode contexts
    att = _group(table, "attention", {"format": "BF16", "kv_dtype": "bf16", "head_dim": 256, "phase": "verify"})
    ev8 = next(r for r in att.rows if r.contains(8)).evidence[8]
    members = [i for i, c in enumerate(new) if c.family == "attention" and c.window and c.match["kv_dtype"] == "bf16"
               and 8 in P.case_points(c, (), _args())]
    assert len(members) == 2
    for route in ("attention_decode_splitkv", "attention_verify_packed"):
        mine = [r for r in recs if r["route"] == route and r["t"] == 8]
        assert ev8[route] == pytest.approx(round(min(
            sum(r["us"] for r in mine if r["case"] in members and r["params"] == p)
            for p in [r["params"] for r in mine if r["case"] == members[0]]), 2)), route


def test_replay_with_the_committed_measurements_keeps_their_rows(cases27b, tmp_path, capsys):
    """The tune_new stage replays the committed measurement files and the new one over sm90.yaml:
    every measured group of sm90.yaml stays as it is, except the Q4 fallback (it now also sums the
    draft head's shape)."""
    new = P.untimed_cases([c for c in cases27b if c.family in S.tunable()], SM90_HAND, 90)
    meas = tmp_path / "tune_new.meas.json"
    _fake_file(meas, new, _args())
    files = [str(MEASUREMENTS / f"{n}.meas.json") for n in COMMITTED]
    out = tmp_path / "sm90.yaml"
    assert main(["tune", "--sm", "90", "--replay", *files, str(meas), "--base", str(SM90_HAND), "-o", str(out)]) == 0, \
        capsys.readouterr().err
    from ninfer_compile.kernels.registry import routes_for

    before, after = load_table(SM90_HAND), load_table(out)
    changed = []
    for fam in before.families:
        for g in before.rows(fam):
            if not any(r.evidence for r in g.rows):
                continue
            h = _group(after, fam, dict(g.match))
            rows = lambda x: [(r.lo, r.hi, r.route and r.route.name, r.resolved, r.evidence) for r in x.rows]  # noqa: E731
            if h is None or rows(h) != rows(g):
                changed.append((fam, dict(g.match)))
    # on main: exactly the Q4 fallback; only a fallback that a new case also sums may ever change
    assert ("linear", {"format": "Q4G64_F16S", "epilogue": "none"}) in changed
    fallbacks = {(c.family, json.dumps(effective_match(S.generic_match(c.family, c.match, routes_for(c.family))),
                                       sort_keys=True)) for c in new}
    assert all((f, json.dumps(effective_match(m), sort_keys=True)) in fallbacks for f, m in changed), changed


def test_merge_keeps_windows_and_variants_apart(tmp_path):
    a = MatchCase("conv1d", {"format": "BF16", "n": 8, "k": 4, "phase": "verify"}, {"x": (2, 8)}, window=2)
    b = dataclasses.replace(a, shapes={"x": (4, 8)}, window=4)
    recs = [{"case": i, "family": "conv1d", "match": dict(a.match), "t": t, "ctx": None, "route": "conv1d_verify",
             "params": {}, "min_t": 1, "max_t": 128, "us": us} for i, t, us in ((0, 2, 1.0), (0, 8, 3.0), (1, 8, 5.0))]
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"sm": 90, "cases": [dataclasses.asdict(a), dataclasses.asdict(b)], "records": recs,
                             "t_points": [2, 8]}, default=str))
    old = {k: v for k, v in dataclasses.asdict(a).items() if k not in ("window", "variant", "dtypes")}
    g = tmp_path / "old.json"  # a file written before windows existed: its case is window 0
    g.write_text(json.dumps({"sm": 90, "cases": [old], "records": [dict(recs[1], us=7.0)], "t_points": [8]}))
    merged = tcli.merge_measurements([f, g], 90)
    assert [(c["window"] if "window" in c else 0) for c in merged["cases"]] == [2, 4, 0]
    cases = [MatchCase(**c) for c in merged["cases"]]
    assert len(merged["records"]) == 4  # nothing replaced: the old file's case is another case
    groups = tcli.pick_groups(cases[:2], [r for r in merged["records"] if r["case"] < 2], (2, 8), 0.03,
                              generic=False)
    assert len(groups) == 1 and "sum over: W=2; W=4" in groups[0].comment
    rows = groups[0].rows
    # one row from T 1 (a verify round has >= 2 columns); at T 8 the two windows' sum 3 + 5
    assert [(r.lo, r.hi, r.route) for r in rows] == [(1, 128, "conv1d_verify"), (129, None, None)]
    assert rows[0].evidence == {2: {"conv1d_verify": 1.0}, 8: {"conv1d_verify": 8.0}}


def test_budget_stops_before_a_case(monkeypatch):
    import torch

    warned: list[str] = []
    case = MatchCase("rmsnorm", {"format": "BF16", "n": 8}, {"x": (1, 8), "weight": (8,)}, {"eps": 1e-6})
    plan = P.build_plan([case], (1, 2), _args())
    assert plan
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    args = argparse.Namespace(quick=True, reps=1, warmup=0, tol=None, check="once", no_graph=True, quiet=True,
                              budget_s=0.0)
    assert tcli.measure_all([case], plan, args, warned.append, deadline=0.0) == []
    assert len(warned) == 1 and warned[0].startswith("--budget-s 0: 1 cases not measured") and "rmsnorm" in warned[0]


def test_dry_run_lists_the_verify_cases_and_bad_options_are_one_line(capsys):
    assert main(["tune", "--sm", "90", "--dry-run", "--kv-dtypes", "bf16", "--draft-tokens", "1",
                 "--families", "state_select,spec_accept,gated_delta_rule", "--candidates", "1"]) == 0
    out = capsys.readouterr().out
    assert "4 verify cases at T = C x W, C in 1,2,4,8" in out
    assert "gated_delta_rule BF16 verify W=2 (l0.gdn.delta_rule) T=2,4,8,16: " in out
    assert "state_select BF16 W=2 [f32[48,128,128]] (l0.gdn.state_select) T=2,4,8,16: 4 measurements" in out
    assert re.search(r"spec_accept BF16 n=248320 W=2 \(spec_accept\) T=2,4,8,16: \d+ measurements", out)
    assert not re.search(r"gated_delta_rule BF16 (decode|prefill).*T=", out)  # plain cases: the run's T points
    for bad, word in ((["--kv-dtypes", "bf16,nope"], "nope"), (["--draft-tokens", "-1"], "--draft-tokens"),
                      (["--verify-rows", "0"], "--verify-rows"), (["--candidates", "0"], "--candidates")):
        assert main(["tune", "--sm", "90", "--dry-run", *bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and word in err[0], err


@pytest.mark.parametrize("kvd,window", [("bf16", 2), ("nvfp4", 3)])
def test_attention_verify_bench_rows_of_w_columns(monkeypatch, kvd, window):
    """The attention builder of a verify case: C = T / W rows (slot r, positions ctx-W .. ctx-1),
    checked against the reference through the split-KV route (the interpreter on the CPU)."""
    import torch

    from ninfer_compile.kernels.registry import get_route
    from ninfer_compile.tune import measure as M

    monkeypatch.setattr(M, "DEVICE", None if torch.cuda.is_available() else "cpu")
    case = MatchCase("attention", {"format": "BF16", "kv_dtype": kv_format(kvd).match, "head_dim": 64,
                                   "phase": "verify"}, {"q": (window, 4, 64), "k_cache": (1, 64, 2, 64)},
                     {"scale": 0.125}, window=window)
    n, positions, slots = M.verify_columns(2 * window, window, 40 - window)
    assert n == 2 and slots.tolist() == [0] * window + [1] * window
    assert positions.tolist() == list(range(40 - window, 40)) * 2
    bench = M.build(case, 2 * window, ctx=40, copies=1)
    assert bench.t == 2 * window and bench.check(get_route("attention_decode_splitkv"), {}) < 3e-2


def test_shipped_sm90_has_no_hand_added_rows_and_replays_from_its_measurements(tmp_path, capsys):
    """routes/sm90.yaml = the committed measurement files (gpu_session.sh's COMMITTED_MEAS) replayed in
    order over it: every measured group comes back row for row, and no hand-added (untimed) row is left."""
    from ninfer_compile.kernels.tuning import find_tune_spec

    # a family the tuner cannot measure on one GPU (TuneSpec builder None: the collectives) keeps its
    # hand-written rows
    # The MoE families became tunable (kernels/moe/tune.py) before a GPU run measured them: their hand rows
    # stay until `ninfer-compile tune --sm 90 --contract qwen3.6-35b-a3b --families moe` replaces them (then
    # this exception goes)
    awaiting_gpu = {"moe_router", "moe_experts"}
    measurable = [(fam, m) for fam, m in _hand_marked(SM90)
                  if ((s := find_tune_spec(fam)) is None or s.tunable) and fam not in awaiting_gpu]
    assert measurable == [] and "untimed, added by hand" not in SM90.read_text()
    # the list bench/gpu_session.sh replays (COMMITTED_MEAS), so the script and the table cannot drift apart
    script = (REPO / "bench" / "gpu_session.sh").read_text()
    listed = re.search(r'^COMMITTED_MEAS="([^"]*)"', script, re.M).group(1).split()
    assert re.search(r'^R=routes/measurements/sm90$', script, re.M), "gpu_session.sh: R is not the measurements folder"
    files = [str(MEASUREMENTS / f.removeprefix("$R/")) for f in listed]
    assert [Path(f).name.removesuffix(".meas.json") for f in files][:len(COMMITTED)] == COMMITTED
    out = tmp_path / "sm90.yaml"
    assert main(["tune", "--sm", "90", "--replay", *files, "--base", str(SM90), "-o", str(out)]) == 0, \
        capsys.readouterr().err
    before, after = load_table(SM90), load_table(out)
    rows = lambda x: [(r.lo, r.hi, r.route and r.route.name, r.resolved, r.evidence) for r in x.rows]  # noqa: E731
    differ = [(fam, dict(g.match)) for fam in before.families for g in before.rows(fam)
              if any(r.evidence for r in g.rows)
              and ((h := _group(after, fam, dict(g.match))) is None or rows(h) != rows(g))]
    assert differ == []
