"""Operand builders and the drop-on-failed-check rule. Without a GPU the builders run on the CPU
under the Triton interpreter (tests/conftest.py sets TRITON_INTERPRET); timings never run here."""

from __future__ import annotations

import argparse

import pytest
import torch

from ninfer_compile.kernels.registry import all_routes, get_route
from ninfer_compile.tune import cli as tcli
from ninfer_compile.tune import measure as M
from ninfer_compile.tune.shapes import MatchCase


@pytest.fixture
def device(monkeypatch):
    monkeypatch.setattr(M, "DEVICE", None if torch.cuda.is_available() else "cpu")


def test_param_candidates_are_legal_and_start_with_defaults():
    for r in all_routes():
        for t in (1, 5, 64, 1024):
            if r.domain.covers_t(t, t) is not None:
                continue
            full = M.param_candidates(r, t, quick=False)
            quick = M.param_candidates(r, t, quick=True)
            assert full and 1 <= len(quick) <= 2 and quick == full[:len(quick)]
            for p in full:
                assert r.check_params(p) is None, (r.name, p)
            keys = [tuple(sorted(p.items())) for p in full]
            assert len(keys) == len(set(keys))


def test_linear_builder_checks_against_the_reference(device):
    case = MatchCase("linear", {"format": "Q4G64_F16S", "n": 64, "k": 128, "epilogue": "swiglu"},
                     {"x": (1, 128), "weight": (64, 128)})
    bench = M.build(case, 3, copies=2)
    assert bench.copies == 2 and len(bench.launches(get_route("q4_gemv"), {})) == 2
    assert bench.check(get_route("q4_gemv"), {}) < 2e-2
    # random planes of the right sizes with small positive scales
    w = M.random_linear_weight("Q5G64_F16S", 32, 128, torch.Generator(device=M._dev()).manual_seed(0))
    assert w.nbytes == 32 * (2 * 32 + 2 * 8 + 2 * 2)
    assert (w.scales().float() > 0).all() and (w.scales().float() < 0.03).all()


def test_attention_int8_decode_builder(device):
    case = MatchCase("attention", {"format": "BF16", "kv_dtype": "int8_g64", "head_dim": 64, "phase": "decode"},
                     {"q": (1, 4, 64), "k_cache": (1, 32, 2, 64)})
    bench = M.build(case, 2, ctx=40, copies=1)
    assert bench.check(get_route("attention_decode_splitkv"), {}) < 2e-2


def test_gdn_gating_proj_builder(device):
    """Every tunable family has a builder; the fused GDN gating projection checks against its
    reference with its bf16 weight pair rotated as the cold operand."""
    from ninfer_compile.kernels.tuning import tune_specs

    tunable = {f for f, s in tune_specs().items() if s.tunable}
    assert tunable >= {"linear", "attention", "gated_delta_rule", "gdn_gating", "gdn_gating_proj", "conv1d",
                       "rmsnorm", "gated_rmsnorm", "head_rmsnorm", "qk_norm_rope", "kv_append"}
    assert all(callable(tune_specs()[f].load_builder()) for f in tunable)
    case = MatchCase("gdn_gating_proj", {"format": "BF16", "n": 6, "k": 200, "phase": "decode"},
                     {"x": (1, 200), "a_weight": (6, 200), "b_weight": (6, 200)})
    bench = M.build(case, 3, copies=2)
    route = get_route("gdn_gating_proj_rows")
    assert bench.copies == 2 and bench.cold_bytes == 2 * 6 * 200 * 2
    assert len(bench.launches(route, {})) == 2
    for p in M.param_candidates(route, 3, quick=False):
        assert bench.check(route, p) < 2e-2, p


def test_failed_reference_check_drops_the_candidate_with_a_warning(monkeypatch):
    case = MatchCase("linear", {"format": "Q4G64_F16S", "n": 4096, "k": 5120, "epilogue": "none"},
                     {"x": (1, 5120), "weight": (4096, 5120)})

    class FakeBench:
        copies = 1
        cold_bytes = 1

        def check(self, route, params):
            return 0.5 if params.get("BLOCK_N") == 16 else 1e-3

        def launches(self, route, params):
            return [lambda: None]

    monkeypatch.setattr(M, "build", lambda *a, **k: FakeBench())
    monkeypatch.setattr(M, "time_launches", lambda fns, reps, warmup=1, use_graph=True: (12.5, "graph"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    args = argparse.Namespace(quick=True, decode_contexts=None, prefill_contexts=None, reps=3, warmup=1,
                              tol=None, check="once", no_graph=False)
    plan = tcli.build_plan([case], (1, 2), args)
    warnings: list[str] = []
    recs = tcli.measure_all([case], plan, args, warnings.append)
    bad = [r for r in recs if r["params"].get("BLOCK_N") == 16]
    assert bad and all("us" not in r and "error" in r for r in bad)
    assert any(w.startswith("dropping q4_gemv") and "relative RMS" in w for w in warnings)
    assert all("us" in r for r in recs if r["params"].get("BLOCK_N") != 16)
    groups = tcli.pick_groups([case], recs, (1, 2), 0.03)
    assert all(r.candidate.params_dict.get("BLOCK_N") != 16 for g in groups for r in g.rows if r.candidate)


def test_replay_merge_keeps_points_measured_for_other_matches_out_of_a_match():
    """A T point that only another match was measured at (a later --routes run with extra T points)
    is no point of this match: no `unsupported` hole; a point where every candidate of this match
    failed stays one."""
    a = MatchCase("linear", {"format": "BF16", "n": 48, "k": 5120, "epilogue": "none"},
                  {"x": (1, 5120), "weight": (48, 5120)})
    b = MatchCase("linear", {"format": "Q4G64_F16S", "n": 4096, "k": 5120, "epilogue": "none"},
                  {"x": (1, 5120), "weight": (4096, 5120)})

    def rec(case, route, t, us=None, max_t=None):
        r = {"case": case, "family": "linear", "match": [a, b][case].match, "t": t, "ctx": None, "route": route,
             "params": {}, "min_t": 1, "max_t": max_t}
        if us is None:
            r["error"] = "failed"
        else:
            r["us"] = us
        return r

    recs = [rec(0, "bf16_tiled", t, 6.5) for t in (1, 8, 16)] + [rec(1, "q4_gemv_tc", t, 9.0, 16) for t in (1, 8, 12, 16)]
    groups = tcli.pick_groups([a, b], recs, (1, 8, 12, 16), 0.03, generic=False)
    rows_a = groups[0].rows
    assert [(r.lo, r.hi, r.route) for r in rows_a] == [(1, None, "bf16_tiled")]
    # every candidate of match a failed at T=12: T 12..15 is unsupported there
    groups = tcli.pick_groups([a, b], recs + [rec(0, "bf16_tiled", 12)], (1, 8, 12, 16), 0.03, generic=False)
    assert [(r.lo, r.hi, r.route) for r in groups[0].rows] == [(1, 11, "bf16_tiled"), (12, 15, None),
                                                              (16, None, "bf16_tiled")]


def _tiny_cases():
    from ninfer_compile.tune.shapes import derive_match_set, load_model

    spec, objs, _ = load_model(contract="tiny-qwen3.5")
    cases, seen = [], set()
    # the KV formats' builders: tests/kernels/kv_cache/test_tune_formats.py; one draft window (K = 1)
    # brings the verify cases (attention, gated_delta_rule, conv1d, gdn_gating_proj, state_select x 2
    # state shapes, spec_accept)
    for c in derive_match_set(spec, objs, kv_dtypes=("bf16", "int8"), draft_tokens=(1,)):
        key = (c.family, c.match.get("phase"), c.match.get("kv_dtype"), c.variant)
        if key not in seen:
            seen.add(key)
            cases.append(c)
    # families / variants the tiny model lacks (its head_dim 32 refuses the int8 KV cache)
    cases.append(MatchCase("head_rmsnorm", {}, {"x": (1, 4, 64), "weight": (64,)}, {"eps": 1e-6}))
    cases.append(MatchCase("kv_append", {"kv_dtype": "int8_g64", "head_dim": 64},
                           {"k": (1, 2, 64), "v": (1, 2, 64)}))
    # verify extents (speculative decoding, docs/SPECULATIVE.md): rows of W = window columns
    cases.append(MatchCase("gated_delta_rule", {"format": "BF16", "phase": "verify"},
                           {"q": (2, 1, 16), "k": (2, 1, 16), "v": (2, 2, 16)}, {"window": 2}))
    cases.append(MatchCase("conv1d", {"format": "BF16", "n": 24, "k": 4, "phase": "verify"},
                           {"x": (2, 24), "weight": (4, 24)}, {"window": 2}))
    cases.append(MatchCase("spec_accept", {"format": "BF16", "n": 50}, {"logits": (8, 50)}))
    cases.append(MatchCase("state_select", {"format": "BF16"},
                           {"state": (3, 2, 16, 16), "columns": (1, 1, 2, 16, 16), "accepted": (1,), "slots": (2,)}))
    # the MoE families (the tiny dense model has none): 8 experts of width 32, top-2
    cases.append(MatchCase("moe_router", {"format": "BF16", "n": 9, "k": 96},
                           {"x": (1, 96), "weight": (9, 96), "out:expert_ids": (1, 2)}, {"top_k": 2}))
    cases.append(MatchCase("moe_experts", {"format": "Q4G64_F16S", "n": 8 * 64, "k": 96},
                           {"x": (1, 96), "expert_ids": (1, 2), "gate_up": (8 * 64, 96), "down": (8 * 96, 32)},
                           dtypes={"down": "Q5G64_F16S"}))
    return cases


def test_every_tunable_family_builds_and_checks_through_its_tune_spec(device):
    """Each TuneSpec builder (kernels/<family>/tune.py) builds its operands and every covering
    route's launcher passes its reference check at the family's tolerance: the GPU path's
    builders and launcher calls, under the interpreter."""
    from ninfer_compile.kernels.registry import routes_for
    from ninfer_compile.kernels.tuning import tune_spec
    from ninfer_compile.routes.table import effective_match
    from ninfer_compile.tune.shapes import parse_families

    args = argparse.Namespace(quick=True, decode_contexts="40", prefill_contexts="16")
    tunable = set(parse_families(None))
    built: set[str] = set()
    for case in _tiny_cases():
        if case.family not in tunable:
            continue
        for ctx in tcli.contexts_for(case, args):
            bench = M.build(case, 2, ctx, copies=1)
            for r in routes_for(case.family):
                if r.covers(2, 2, effective_match(case.match)) is not None:
                    continue
                err = bench.check(r, {})
                assert err <= tune_spec(case.family).tol, (case.key, r.name, err)
                built.add(case.family)
    assert built == tunable
