"""`tune` refuses without a CUDA GPU and on a mismatched sm; the match set of the 27B contract."""

from __future__ import annotations

import pytest
import torch

from ninfer_compile.cli import main
from ninfer_compile.errors import NinferError
from ninfer_compile.tune import cli as tcli
from ninfer_compile.tune.shapes import generic_match, parse_families


def test_refuses_without_a_gpu(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "sm90.yaml"
    assert main(["tune", "--sm", "90", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "no CUDA GPU" in err[0]
    assert not out.exists()


def test_refuses_a_mismatched_sm(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 6))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA GeForce RTX 3090")
    assert main(["tune", "--sm", "90", "-o", str(tmp_path / "x.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sm86" in err[0] and "--sm 90" in err[0]
    assert tcli.gpu_check(86) == (86, "NVIDIA GeForce RTX 3090")


def test_bad_options_are_one_line_errors(capsys):
    assert main(["tune", "--sm", "90", "--families", "linear,nope", "--dry-run"]) == 2
    assert "nope" in capsys.readouterr().err
    assert main(["tune", "--sm", "90", "--t-points", "0,4", "--dry-run"]) == 2


def test_parse_families_expands_groups():
    # a group expands to its families in table order (the TuneSpecs' `order`)
    assert parse_families("linear,gdn,attention") == ("linear", "conv1d", "gdn_gating", "gated_delta_rule",
                                                     "gdn_gating_proj", "state_select", "attention")
    assert parse_families("norms,rope,kv_cache") == ("rmsnorm", "head_rmsnorm", "gated_rmsnorm", "qk_norm_rope",
                                                    "kv_append")
    assert set(parse_families("all")) == set(parse_families(None)) == {
        "linear", "attention", "gated_delta_rule", "gdn_gating", "gdn_gating_proj", "conv1d", "rmsnorm",
        "gated_rmsnorm", "head_rmsnorm", "qk_norm_rope", "kv_append", "state_select", "spec_accept", "sampling",
        "moe_router", "moe_experts"}
    assert parse_families("moe") == ("moe_router", "moe_experts")
    with pytest.raises(NinferError):
        parse_families("embedding")


# cases27b: tests/tune/conftest.py (the 27B contract, bf16 / int8 / nvfp4 KV, draft windows 1 and 3)


def test_match_set_of_the_27b_contract(cases27b):
    lin = {(c.match["format"], c.match["n"], c.match["k"], c.match["epilogue"]) for c in cases27b
           if c.family == "linear"}
    expected = {
        ("Q4G64_F16S", 34816, 5120, "swiglu"),     # mlp gate_up
        ("Q5G64_F16S", 5120, 17408, "residual"),   # mlp down
        ("Q5G64_F16S", 12288, 5120, "none"),       # gdn value_z
        ("Q4G64_F16S", 4096, 5120, "none"),        # gdn query_key
        ("Q4G64_F16S", 7168, 5120, "none"),        # attention query_key
        ("Q5G64_F16S", 7168, 5120, "none"),        # attention gate_value
        ("Q5G64_F16S", 5120, 6144, "residual"),    # attention / gdn output
        ("Q6G64_F16S", 248320, 5120, "none"),      # output head
        ("BF16", 48, 5120, "none"),                # gdn a / b projections
        ("W8G32_F16S", 5120, 10240, "none"),       # mtp input projection
        ("W8G32_F16S", 14336, 5120, "none"),       # mtp query_key_gate_value
        ("W8G32_F16S", 5120, 6144, "residual"),    # mtp output
        ("W8G32_F16S", 34816, 5120, "swiglu"),     # mtp gate_up
        ("W8G32_F16S", 5120, 17408, "residual"),   # mtp down
        ("Q4G64_F16S", 131072, 5120, "none"),      # mtp shortlist draft head (text/draft_head)
    }
    assert lin == expected
    other = {(c.family, c.match.get("phase"), c.match.get("kv_dtype")) for c in cases27b if c.family != "linear"}
    for want in [("attention", "decode", "bf16"), ("attention", "prefill", "bf16"),
                 ("attention", "decode", "int8_g64"), ("attention", "prefill", "int8_g64"),
                 ("gated_delta_rule", "decode", None), ("gated_delta_rule", "prefill", None),
                 ("conv1d", "decode", None), ("conv1d", "prefill", None), ("rmsnorm", None, None),
                 ("gated_rmsnorm", None, None), ("gdn_gating", None, None), ("qk_norm_rope", None, None),
                 ("kv_append", None, "bf16"), ("kv_append", None, "int8_g64")]:
        assert want in other
    att = next(c for c in cases27b if c.family == "attention")
    assert att.shapes["q"][1:] == (24, 256) and att.shapes["k_cache"][2:] == (4, 256)
    gdn = next(c for c in cases27b if c.family == "gated_delta_rule")
    assert gdn.shapes["q"][1:] == (16, 128) and gdn.shapes["v"][1:] == (48, 128)


def test_generic_match_and_plan(cases27b):
    from ninfer_compile.kernels.registry import routes_for

    gate_up = next(c for c in cases27b if c.family == "linear" and c.match["n"] == 34816
                   and c.match["format"] == "Q4G64_F16S")
    assert generic_match("linear", gate_up.match, routes_for("linear")) == {"epilogue": "swiglu",
                                                                            "format": "Q4G64_F16S"}
    dec = next(c for c in cases27b if c.family == "attention" and c.match["phase"] == "decode")
    assert generic_match("attention", dec.match, routes_for("attention")) == {"kv_dtype": dec.match["kv_dtype"],
                                                                              "phase": "decode"}
    # candidates respect the declared domains: no gemv past T=4, no decode attention past 128 (verify extents)
    names5 = {r.name for r, _ in tcli.candidates_for(gate_up, 5, quick=False)}
    assert "q4_gemv" not in names5 and "q4_small_t_mma" in names5
    assert tcli.candidates_for(dec, 128, quick=False) and tcli.candidates_for(dec, 129, quick=False) == []
    assert len({tuple(sorted(p.items())) for r, p in tcli.candidates_for(gate_up, 1, quick=True)
                if r.name == "q4_gemv"}) == 2
