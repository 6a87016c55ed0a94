"""The shipped tables (routes/smNN.yaml) validate against the live route registry and cover every
op family the 27B text model + MTP head needs. Nothing is skipped: if a kernel family has not
registered its routes, these tests fail."""

from __future__ import annotations

import pytest

from ninfer_compile.kernels import registry as R
from ninfer_compile.routes import load_table, shipped_tables, table_for_sm

SHIPPED = (86, 89, 90, 120)

# Families (and the op matches) the qwen3.6-27b text model + MTP head present.
FAMILIES_27B = ("linear", "embedding", "rmsnorm", "head_rmsnorm", "rope", "kv_append", "attention",
                "conv1d", "gdn_gating", "gated_delta_rule", "gated_rmsnorm", "sampling")
LINEAR_27B = [  # (format, n, k, epilogue)
    ("Q4G64_F16S", 7168, 5120, "none"),      # attention query_key
    ("Q5G64_F16S", 7168, 5120, "none"),      # attention gate_value
    ("Q5G64_F16S", 5120, 6144, "residual"),  # attention output
    ("Q4G64_F16S", 4096, 5120, "none"),      # gdn query_key
    ("Q5G64_F16S", 12288, 5120, "none"),     # gdn value_z
    ("Q5G64_F16S", 5120, 6144, "residual"),  # gdn output
    ("BF16", 48, 5120, "none"),              # gdn a / b projections
    ("Q4G64_F16S", 34816, 5120, "swiglu"),   # mlp gate_up
    ("Q5G64_F16S", 5120, 17408, "residual"),  # mlp down
    ("Q6G64_F16S", 248320, 5120, "none"),    # output head
    ("Q4G64_F16S", 131072, 5120, "none"),    # draft head
    ("W8G32_F16S", 5120, 10240, "none"),     # mtp input projection
    ("W8G32_F16S", 14336, 5120, "none"),     # mtp query_key_gate_value
    ("W8G32_F16S", 5120, 6144, "residual"),  # mtp attention output
    ("W8G32_F16S", 34816, 5120, "swiglu"),   # mtp gate_up
    ("W8G32_F16S", 5120, 17408, "residual"),  # mtp down
]
SAMPLE_T = (1, 2, 3, 4, 5, 8, 16, 17, 32, 33, 64, 65, 128, 512, 4096, 65536)


def test_all_four_tables_are_shipped():
    assert sorted(shipped_tables()) == list(SHIPPED)


@pytest.mark.parametrize("sm", SHIPPED)
def test_shipped_table_validates(sm):
    table = table_for_sm(sm)  # full validation against the live registry
    assert table.sm == sm and table.name == f"sm{sm}.yaml"
    assert table.miss == "error"
    prov = table.provenance
    if prov["source"] != "measured":
        assert len(prov.get("reason", "")) > 40
    missing = [f for f in FAMILIES_27B if f not in table.groups]
    assert not missing, f"sm{sm}.yaml lacks families {missing}"
    assert not [f for f in FAMILIES_27B if not R.routes_for(f)], "a family registered no routes"


@pytest.mark.parametrize("sm", SHIPPED)
def test_shipped_table_selects_every_27b_linear(sm):
    table = table_for_sm(sm)
    for fmt, n, k, epi in LINEAR_27B:
        for t in SAMPLE_T:
            sel = table.select("linear", t, {"format": fmt, "n": n, "k": k, "epilogue": epi})
            assert sel.nearest is None
            assert sel.route.covers(t, t, {"format": fmt, "n": n, "k": k, "epilogue": epi}) is None
            # a real file:LINE naming the route: the table's own, or its base's for an inherited row
            file, line = sel.source.split(":")
            assert file in {f"sm{sm}.yaml", table.base.name if table.base is not None else None}, sel.source
            text = (table.path.parent / file).read_text().splitlines()[int(line) - 1]
            assert f"route: {sel.route.name}" in text, (sel.source, text)


@pytest.mark.parametrize("sm", SHIPPED)
def test_shipped_table_rows_honour_route_domains(sm):
    # Redundant with validation, stated directly: no row hands a route more columns than it takes.
    table = load_table(shipped_tables()[sm])
    for fam, groups in table.groups.items():
        for g in groups:
            for row in g.rows:
                if row.route is None:
                    assert len(row.unsupported) > 20  # an explicit, reasoned gap
                    continue
                d = row.route.domain
                assert row.route.family == fam
                assert d.min_t <= row.lo
                assert d.max_t is None or (row.hi is not None and row.hi <= d.max_t), (fam, row)


OTHER_27B = [  # (family, op match) as the IR presents them
    ("embedding", {"format": "Q6G64_F16S", "n": 248320, "k": 5120}),
    ("rmsnorm", {}),
    ("head_rmsnorm", {}),
    ("rope", {}),
    ("kv_append", {"kv_dtype": "bf16"}),
    ("kv_append", {"kv_dtype": "int8_g64"}),
    ("attention", {"phase": "prefill", "kv_dtype": "bf16"}),
    ("attention", {"phase": "prefill", "kv_dtype": "int8_g64"}),
    ("conv1d", {"phase": "prefill"}),
    ("conv1d", {"phase": "decode"}),
    ("gdn_gating", {}),
    ("gated_delta_rule", {"phase": "prefill"}),
    ("gated_rmsnorm", {}),
    ("sampling", {"mode": "per_slot"}),
]
DECODE_ONLY = [("attention", {"phase": "decode", "kv_dtype": "bf16"}),
               ("attention", {"phase": "decode", "kv_dtype": "int8_g64"}),
               ("gated_delta_rule", {"phase": "decode"})]


@pytest.mark.parametrize("sm", SHIPPED)
def test_shipped_table_selects_other_families(sm):
    from ninfer_compile.routes import UnsupportedRange

    table = table_for_sm(sm)
    for fam, match in OTHER_27B:
        for t in SAMPLE_T:
            sel = table.select(fam, t, match)
            assert sel.route.family == fam and sel.route.covers(t, t, match) is None
    for fam, match in DECODE_ONLY:
        for t in (1, 4, 16, 64):
            # the route's own domain: attention decode also serves verify extents (up to 8 x 9 columns)
            assert table.select(fam, t, match).route.domain.max_t == {"attention": 128}.get(fam, 64)
        with pytest.raises(UnsupportedRange, match="at T=65: the table marks T 65..max unsupported"):
            table.select(fam, 65, match)
