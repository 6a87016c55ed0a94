"""`extends:` tables: a per-sm override file over a shared base (routes/base.yaml for the unmeasured
sm86/89/120 tables). Inherited rows cite the base's file:line, the table's own groups replace the
base's of the same match, errors name the file they are in, and sha256 covers both files."""

from __future__ import annotations

import hashlib
import textwrap

import pytest

from ninfer_compile.routes import load_table
from ninfer_compile.routes.schema import TableErrors
from ninfer_compile.routes.table import load_table_data

from .conftest import GOOD_BODY

BASE_HEAD = 'provenance: {source: unmeasured, reason: "shared test rows"}\n'
OVERRIDE = """\
sm: 86
extends: base.yaml
provenance: {source: unmeasured, reason: "test override"}
miss: error
"""
OP = {"format": "Q4G64_F16S", "n": 17408, "k": 5120, "epilogue": "none"}


@pytest.fixture
def pair(tmp_path):
    """pair(own_body="", base_body=GOOD_BODY, base_head=BASE_HEAD, head=OVERRIDE) -> (table, base) paths"""

    def _pair(own_body: str = "", base_body: str = GOOD_BODY, base_head: str = BASE_HEAD, head: str = OVERRIDE):
        base = tmp_path / "base.yaml"
        base.write_text(base_head + textwrap.dedent(base_body))
        table = tmp_path / "sm86.yaml"
        table.write_text(head + textwrap.dedent(own_body))
        return table, base

    return _pair


def _line_of(path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def test_inherited_rows_cite_the_base(pair, reg):
    table, base = pair()
    t = load_table(table, registry=reg)
    assert (t.sm, t.miss, t.provenance["reason"], t.base) == (86, "error", "test override", base)
    assert t.families == ["linear", "rmsnorm", "attention"]
    s = t.select("linear", 1, OP)
    assert s.route.name == "f_gemv" and s.source == f"base.yaml:{_line_of(base, 'route: f_gemv, params: {BLOCK_N: 128}')}"
    assert t.where(t.rows("linear")[0]) == f"base.yaml:{_line_of(base, '- match: {format: Q4G64_F16S}')}"
    assert t.sha256 == hashlib.sha256(table.read_bytes() + base.read_bytes()).hexdigest()


def test_an_override_group_wins_in_place(pair, reg):
    own = """\
    linear:
      - match: {format: Q4G64_F16S, epilogue: none}
        routes:
          - {t: [1, 2], route: f_gemv, params: {SPLIT_K: 2}}
          - {t: [3, max], route: f_wide}
      - match: {format: Q5G64_F16S, epilogue: residual}
        routes:
          - {t: [1, max], route: f_wide}
    """
    table, base = pair(own)
    t = load_table(table, registry=reg)
    s = t.select("linear", 1, OP)  # the override's group, same effective match as the base's first
    assert (s.route.name, s.params["SPLIT_K"], s.source) == ("f_gemv", 2, "sm86.yaml:8")
    assert t.select("linear", 3, OP).source == "sm86.yaml:9"
    groups = t.rows("linear")
    assert groups[0].file == "sm86.yaml" and groups[-1].file == "sm86.yaml"  # replaced in place; new appended
    assert [g.file for g in groups[1:-1]] == ["base.yaml"] * (len(groups) - 2)
    # untouched groups and families still come from the base
    assert t.select("linear", 1, {**OP, "epilogue": "swiglu"}).source.startswith("base.yaml:")
    assert t.select("rmsnorm", 4, {}).source.startswith("base.yaml:")
    # tune --base sees the same merge as plain data
    data = load_table_data(table)
    assert "extends" not in data and data["sm"] == 86
    assert data["linear"][0]["routes"][0]["params"] == {"SPLIT_K": 2}
    assert data["linear"][-1]["match"] == {"format": "Q5G64_F16S", "epilogue": "residual"}
    assert len(data["linear"]) == len(groups) and "rmsnorm" in data


def test_a_bad_base_line_is_reported_with_the_base_name(pair, reg):
    bad = GOOD_BODY.replace("route: f_small}", "route: f_nope}", 1)
    table, base = pair(base_body=bad)
    with pytest.raises(TableErrors) as ei:
        load_table(table, registry=reg)
    line = _line_of(base, "f_nope")
    assert ei.value.errors[0].startswith(f"base.yaml:{line}: linear[0].routes[1].route: unknown route 'f_nope'")
    # base errors come first, then the table's own, each naming its file
    own = "rmsnorm:\n  - match: {}\n    routes:\n      - {t: [2, max], route: f_rms}\n"
    table, base = pair(own, base_body=bad)
    with pytest.raises(TableErrors) as ei:
        load_table(table, registry=reg)
    errs = ei.value.errors
    assert errs[0].startswith("base.yaml:") and errs[1].startswith("sm86.yaml:8: rmsnorm[0].routes[0].t:"), errs


def test_base_header_rules(pair, reg):
    table, _ = pair(base_head="sm: 86\n" + BASE_HEAD)
    with pytest.raises(TableErrors, match=r"^base.yaml:1: sm: unknown key"):
        load_table(table, registry=reg)
    table, _ = pair(base_head=BASE_HEAD + "extends: other.yaml\n")
    with pytest.raises(TableErrors, match=r"^base.yaml:2: extends: unknown key"):
        load_table(table, registry=reg)
    table, _ = pair(base_head="provenance: {source: unmeasured}\n")
    with pytest.raises(TableErrors, match=r"^base.yaml:1: provenance: source unmeasured needs a reason"):
        load_table(table, registry=reg)


def test_extends_errors(pair, reg, tmp_path):
    table, base = pair()
    base.unlink()
    with pytest.raises(TableErrors, match=r"^sm86.yaml:2: extends: .*base.yaml: cannot read route table"):
        load_table(table, registry=reg)
    table, _ = pair(head=OVERRIDE.replace("base.yaml", "sm86.yaml"))
    with pytest.raises(TableErrors, match=r"^sm86.yaml:2: extends: a table cannot extend itself"):
        load_table(table, registry=reg)
    measured = OVERRIDE.replace('{source: unmeasured, reason: "test override"}',
                                '{source: measured, command: x, date: 2026-12-01, device: d, triton: "3.6"}')
    table, _ = pair(head=measured)
    with pytest.raises(TableErrors, match=r"^sm86.yaml:3: provenance: source measured, but the rows of "
                                          r"base.yaml are unmeasured"):
        load_table(table, registry=reg)


def test_shipped_unmeasured_tables_share_one_base():
    from ninfer_compile.routes import ROUTES_DIR, shipped_tables, table_for_sm

    base = ROUTES_DIR / "base.yaml"
    for sm in (86, 89, 120):
        t = table_for_sm(sm)
        assert t.base == base and t.provenance["source"] == "unmeasured"
        assert all(g.file == "base.yaml" for gs in t.groups.values() for g in gs)  # no row differs today
        assert len(shipped_tables()[sm].read_text().splitlines()) < 30
    assert table_for_sm(90).base is None  # the measured table stands alone
    with pytest.raises(TableErrors, match=r"^base.yaml:1: \(top\): a base table \(no sm, no miss\), not a table"):
        load_table(base)


def test_base_takes_no_fuse_off(pair, reg):
    """Switching a fusion rule off is a per-sm, measured decision: a base table refuses `fuse_off:`."""
    table, _ = pair(base_head=BASE_HEAD + "fuse_off: {qk_norm_rope: slower}\n")
    with pytest.raises(TableErrors, match=r"^base.yaml:2: fuse_off: unknown key"):
        load_table(table, registry=reg)
