"""Route table loading, validation errors (file:line), selection and miss policies."""

from __future__ import annotations

import re

import pytest

from ninfer_compile.errors import RouteError
from ninfer_compile.routes import load_table, table_for_sm
from ninfer_compile.routes.schema import TableErrors

from .conftest import GOOD_BODY


def load(write, reg, body=GOOD_BODY, **kw):
    return load_table(write(body, **kw), registry=reg)


def errors_of(write, reg, body, **kw) -> list[str]:
    with pytest.raises(TableErrors) as ei:
        load(write, reg, body, **kw)
    return ei.value.errors


def one_error(write, reg, body, line: int, *needles: str, **kw) -> str:
    errs = errors_of(write, reg, body, **kw)
    assert len(errs) == 1, errs
    err = errs[0]
    assert err.startswith(f"sm90.yaml:{line}: "), err
    for n in needles:
        assert n in err, (n, err)
    return err


def test_good_table_loads(write, reg):
    t = load(write, reg)
    assert t.sm == 90 and t.miss == "error" and t.provenance["source"] == "unmeasured"
    assert t.families == ["linear", "rmsnorm", "attention"]
    assert re.fullmatch(r"[0-9a-f]{64}", t.sha256)


def test_select_basic_and_params(write, reg):
    t = load(write, reg)
    s = t.select("linear", 1, {"format": "Q4G64_F16S", "n": 17408, "k": 5120, "epilogue": "none"})
    assert s.route.name == "f_gemv" and s.params == {"BLOCK_N": 128, "SPLIT_K": 1}
    assert s.source == "sm90.yaml:7" and s.t_range == (1, 4) and s.nearest is None
    s = t.select("linear", 5, {"format": "Q4G64_F16S", "n": 17408, "k": 5120})
    assert (s.route.name, s.source, s.t_range) == ("f_small", "sm90.yaml:8", (5, 32))
    s = t.select("linear", 100000, {"format": "Q4G64_F16S", "n": 17408, "k": 5120})
    assert (s.route.name, s.t_range) == ("f_wide", (33, None))
    s = t.select("rmsnorm", 7, {})
    assert s.route.name == "f_rms" and s.params == {"BLOCK": 512}


def test_most_specific_match_wins(write, reg):
    t = load(write, reg)
    op = {"format": "Q4G64_F16S", "n": 5120, "k": 17408, "epilogue": "none"}
    s = t.select("linear", 1, op)
    assert s.source == "sm90.yaml:16" and s.params["SPLIT_K"] == 4 and s.match["n"] == 5120
    assert t.select("linear", 3, op).route.name == "f_wide"
    # epilogue swiglu is its own group; a row without epilogue means epilogue none
    s = t.select("linear", 2, {"format": "Q4G64_F16S", "n": 34816, "k": 5120, "epilogue": "swiglu"})
    assert s.route.name == "f_small" and s.params == {"BLOCK_T": 32}


def test_miss_error_names_family_match_and_t(write, reg):
    t = load(write, reg)
    with pytest.raises(RouteError, match=r"no route for linear match \{.*format: Q6G64_F16S.*\} at T=3"):
        t.select("linear", 3, {"format": "Q6G64_F16S", "n": 64, "k": 64})
    # residual epilogue has no group for Q4: never silently the 'none' row
    with pytest.raises(RouteError, match="epilogue: residual"):
        t.select("linear", 1, {"format": "Q4G64_F16S", "epilogue": "residual"})
    with pytest.raises(RouteError, match="no section for family 'sampling'"):
        t.select("sampling", 1, {})
    with pytest.raises(RouteError, match="T must be an integer >= 1"):
        t.select("rmsnorm", 0, {})


def test_select_rechecks_shape_rules(write, reg):
    t = load(write, reg)
    # k=100 is not a multiple of 64: the matched row's f_gemv does not cover this op
    with pytest.raises(RouteError, match="k=100 is not a multiple of 64"):
        t.select("linear", 1, {"format": "Q4G64_F16S", "n": 128, "k": 100})


def test_miss_nearest_records(write, reg):
    t = load(write, reg, miss="nearest")
    assert t.miss == "nearest"
    # residual with Q5: no group pins it; nearest = Q5 group (its routes support residual)
    s = t.select("linear", 2, {"format": "Q5G64_F16S", "n": 5120, "k": 5120, "epilogue": "residual"})
    assert s.route.name == "f_gemv" and s.source == "sm90.yaml:20"
    assert s.nearest and "nearest" in s.nearest and "no row matches" in s.nearest
    assert len(t.misses) == 1
    # nearest never hands a route an op outside its domain
    with pytest.raises(RouteError, match="found no row whose route covers the op"):
        t.select("linear", 2, {"format": "Q6G64_F16S", "n": 64, "k": 64})
    # an exact hit records nothing
    t.select("linear", 2, {"format": "Q5G64_F16S"})
    assert len(t.misses) == 1


def test_gap(write, reg):
    body = GOOD_BODY.replace("{t: [5, 32], route: f_small}", "{t: [6, 32], route: f_small}")
    one_error(write, reg, body, 8, "linear[0].routes[1].t", "gap: T 5..5 is not covered")


def test_overlap(write, reg):
    body = GOOD_BODY.replace("{t: [5, 32], route: f_small}", "{t: [4, 32], route: f_small}")
    one_error(write, reg, body, 8, "linear[0].routes[1].t", "overlaps the previous row")


def test_not_covering_1_and_not_ending_at_max(write, reg):
    body = GOOD_BODY.replace("- {t: [1, max], route: f_rms}", "- {t: [2, max], route: f_rms}")
    one_error(write, reg, body, 25, "rmsnorm[0].routes[0].t", "must start at 1")
    body = GOOD_BODY.replace("- {t: [1, max], route: f_rms}", "- {t: [1, 4096], route: f_rms}")
    one_error(write, reg, body, 25, "must end at max", "4097..max")


def test_bad_t_shape(write, reg):
    body = GOOD_BODY.replace("- {t: [1, max], route: f_rms}", "- {t: [3, 2], route: f_rms}")
    errs = errors_of(write, reg, body)
    assert errs[0].startswith("sm90.yaml:25: rmsnorm[0].routes[0].t:") and "below lo" in errs[0]


def test_unknown_keys(write, reg):
    body = GOOD_BODY.replace("{t: [1, max], route: f_rms}", "{t: [1, max], route: f_rms, prio: 3}")
    one_error(write, reg, body, 25, "rmsnorm[0].routes[0].prio", "unknown key")
    body = GOOD_BODY.replace("rmsnorm:\n", "rmsnrom:\n")
    one_error(write, reg, body, 22, "rmsnrom", "unknown key")
    body = GOOD_BODY.replace("  - match: {}\n", "  - match: {}\n    note: x\n")
    one_error(write, reg, body, 24, "rmsnorm[0].note", "unknown key")
    body = GOOD_BODY.replace("match: {format: Q5G64_F16S}", "match: {format: Q5G64_F16S, colour: red}")
    one_error(write, reg, body, 18, "linear[3].match.colour", "unknown match key")


def test_provenance_rules(write, reg):
    p = write("rmsnorm:\n  - match: {}\n    routes:\n      - {t: [1, max], route: f_rms}\n", header=False)
    p.write_text("sm: 90\nprovenance:\n  source: unmeasured\nmiss: error\n" + p.read_text())
    with pytest.raises(TableErrors) as ei:
        load_table(p, registry=reg)
    assert ei.value.errors == ["sm90.yaml:2: provenance: source unmeasured needs a reason saying why "
                               "the rows are what they are"]
    p.write_text("sm: 90\nprovenance: {source: measured, command: x, date: 2026-11-29}\nmiss: maybe\n")
    with pytest.raises(TableErrors) as ei:
        load_table(p, registry=reg)
    text = "\n".join(ei.value.errors)
    assert "sm90.yaml:2: provenance: source measured needs device, triton" in text
    assert "sm90.yaml:3: miss:" in text
    p.write_text("provenance: {source: derived, reason: r, derived_from: sm86.yaml}\nmiss: error\n")
    with pytest.raises(TableErrors, match=r"sm90.yaml:1: sm: required field is missing"):
        load_table(p, registry=reg)


def test_yaml_duplicate_key_and_syntax(write, reg):
    body = GOOD_BODY.replace("{t: [1, max], route: f_rms}", "{t: [1, max], route: f_rms, route: f_rms}")
    one_error(write, reg, body, 25, "duplicate key")
    body = GOOD_BODY.replace("  - match: {}\n", "  - match: {\n")
    errs = errors_of(write, reg, body)
    assert errs[0].startswith("sm90.yaml:") and "yaml:" in errs[0]


def test_unknown_route(write, reg):
    body = GOOD_BODY.replace("route: f_small}", "route: f_smal}", 1)
    one_error(write, reg, body, 8, "linear[0].routes[1].route", "unknown route 'f_smal'", "f_small")


def test_route_of_another_family(write, reg):
    body = GOOD_BODY.replace("route: f_rms}", "route: f_wide}")
    one_error(write, reg, body, 25, "rmsnorm[0].routes[0].route", "belongs to family linear")


def test_route_max_t_smaller_than_range(write, reg):
    # The seed's lesson: a kernel handed more columns than it supports corrupts memory.
    body = GOOD_BODY.replace("{t: [1, 4], route: f_gemv, params: {BLOCK_N: 128}}\n      - {t: [5, 32], route: f_small}",
                             "{t: [1, 5], route: f_gemv, params: {BLOCK_N: 128}}\n      - {t: [6, 32], route: f_small}")
    one_error(write, reg, body, 7, "f_gemv does not cover T [1, 5]", "exceeds the route's max_t 4")
    body = GOOD_BODY.replace("{t: [1, 8], route: f_attn_dec}\n      - {t: [9, max], route: f_attn_pre}",
                             "{t: [1, max], route: f_attn_dec}")
    one_error(write, reg, body, 29, "unbounded but the route's max_t is 8")


def test_route_domain_format_epilogue_extra(write, reg):
    body = GOOD_BODY.replace("- {t: [1, 4], route: f_gemv}\n      - {t: [5, max], route: f_wide}",
                             "- {t: [1, 4], route: f_small}\n      - {t: [5, max], route: f_wide}")
    one_error(write, reg, body, 20, "format Q5G64_F16S is not supported by the route")
    body = GOOD_BODY.replace("{t: [1, 32], route: f_small, params: {BLOCK_T: 32}}\n      - {t: [33, max], route: f_wide}",
                             "{t: [1, 4], route: f_gemv}\n      - {t: [5, max], route: f_wide}")
    one_error(write, reg, body, 12, "epilogue swiglu is not supported")
    body = GOOD_BODY.replace("match: {phase: decode, kv_dtype: bf16}", "match: {phase: decode, kv_dtype: fp8}")
    errs = errors_of(write, reg, body)
    assert errs[0].startswith("sm90.yaml:29:") and "kv_dtype='fp8' is not supported" in errs[0]
    body = GOOD_BODY.replace("match: {phase: decode, kv_dtype: bf16}", "match: {phase: decode}")
    errs = errors_of(write, reg, body)
    assert any(e.startswith("sm90.yaml:29:") and "does not pin kv_dtype" in e for e in errs), errs
    # a row that does not pin the format cannot use a format-restricted route
    body = GOOD_BODY.replace("match: {format: Q5G64_F16S}", "match: {n: 7}")
    errs = errors_of(write, reg, body)
    assert errs[0].startswith("sm90.yaml:20:") and "does not pin format" in errs[0]


def test_shape_rule_at_load_when_pinned(write, reg):
    body = GOOD_BODY.replace("match: {format: Q5G64_F16S}", "match: {format: Q5G64_F16S, k: 100}")
    errs = errors_of(write, reg, body)
    assert errs[0].startswith("sm90.yaml:20:") and "k=100 is not a multiple of 64" in errs[0]


def test_bad_params(write, reg):
    body = GOOD_BODY.replace("params: {BLOCK_N: 128}", "params: {BLOCK_N: 96}")
    one_error(write, reg, body, 7, "linear[0].routes[0].params", "BLOCK_N=96 is not one of [32, 64, 128]")
    body = GOOD_BODY.replace("params: {BLOCK_N: 128}", "params: {BLOCK_M: 128}")
    one_error(write, reg, body, 7, "has no param 'BLOCK_M'")
    body = GOOD_BODY.replace("params: {BLOCK_N: 128}", "params: {BLOCK_N: [1]}")
    errs = errors_of(write, reg, body)
    assert errs and all(e.startswith("sm90.yaml:7: linear[0].routes[0].params.BLOCK_N") for e in errs), errs


def test_duplicate_match(write, reg):
    body = GOOD_BODY.replace("match: {format: Q5G64_F16S}", "match: {format: Q4G64_F16S, epilogue: none}")
    one_error(write, reg, body, 18, "linear[3].match", "duplicate match", "line 5")


def test_ambiguous_matches(write, reg):
    body = GOOD_BODY.replace("match: {format: Q5G64_F16S}", "match: {format: Q4G64_F16S, k: 17408}")
    body = body.replace("- {t: [1, 4], route: f_gemv}\n      - {t: [5, max], route: f_wide}",
                        "- {t: [1, max], route: f_wide}")
    one_error(write, reg, body, 18, "ambiguous with line 14", "k: 17408", "n: 5120")


def test_all_errors_reported(write, reg):
    body = GOOD_BODY.replace("{t: [5, 32], route: f_small}", "{t: [6, 32], route: f_small}")
    body = body.replace("route: f_rms}", "route: nope}")
    errs = errors_of(write, reg, body)
    assert [e.split(":")[1] for e in errs] == ["8", "25"]


def test_table_for_sm(tmp_path, write, reg):
    p = load(write, reg).path
    assert table_for_sm(90, p, registry=reg).sm == 90
    with pytest.raises(RouteError, match=r"table is for sm 90, not the requested sm 86"):
        table_for_sm(86, p, registry=reg)
    with pytest.raises(RouteError, match=r"no route table for sm7 \(shipped: .*sm86.*sm90"):
        table_for_sm(7)
    with pytest.raises(RouteError, match="cannot read route table"):
        table_for_sm(90, tmp_path / "missing.yaml", registry=reg)


def test_unsupported_rows(write, reg):
    body = GOOD_BODY.replace("- {t: [9, max], route: f_attn_pre}",
                             "- {t: [9, max], unsupported: \"decode takes 8 columns at most\"}")
    t = load(write, reg, body, miss="nearest")
    assert t.select("attention", 8, {"phase": "decode", "kv_dtype": "bf16"}).route.name == "f_attn_dec"
    from ninfer_compile.routes import UnsupportedRange

    with pytest.raises(UnsupportedRange, match=r"sm90.yaml:30: .* T 9..max unsupported: decode takes 8"):
        t.select("attention", 9, {"phase": "decode", "kv_dtype": "bf16"})
    body2 = GOOD_BODY.replace("- {t: [9, max], route: f_attn_pre}", "- {t: [9, max]}")
    one_error(write, reg, body2, 30, "attention[0].routes[1]", "exactly one of route")
    body3 = GOOD_BODY.replace("- {t: [9, max], route: f_attn_pre}",
                              "- {t: [9, max], unsupported: x, params: {a: 1}}")
    one_error(write, reg, body3, 30, "takes no params")


def test_fuse_off_header(write, reg):
    """`fuse_off:` maps fusion rules to the reason this sm's table switches them off; the table keeps
    each with its YAML line (the fuse pass cites it); a reason must be a string."""
    t = load(write, reg, "fuse_off:\n  qk_norm_rope: 'measured slower (bench/results/x.md)'\n" + GOOD_BODY)
    assert t.fuse_off == {"qk_norm_rope": ("measured slower (bench/results/x.md)", 5)}
    assert load(write, reg).fuse_off == {}
    one_error(write, reg, "fuse_off:\n  qk_norm_rope: 3\n" + GOOD_BODY, 5, "fuse_off.qk_norm_rope")
