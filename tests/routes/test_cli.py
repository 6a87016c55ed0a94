"""`ninfer-compile routes validate|show|diff`."""

from __future__ import annotations

import pytest

import ninfer_compile.cli as cli_mod
from ninfer_compile.routes import table as table_mod

from .conftest import GOOD_BODY, HEADER


def main(argv):
    return cli_mod.main(argv)


@pytest.fixture(autouse=True)
def only_routes_subcommand(monkeypatch):
    # cli.main imports every available subcommand module to build its parser; keep these tests
    # independent of packages other engineers are still writing.
    monkeypatch.setattr(cli_mod, "SUBCOMMANDS", {"routes": cli_mod.SUBCOMMANDS["routes"]})


@pytest.fixture
def fake_registry(monkeypatch, reg):
    monkeypatch.setattr(table_mod, "default_registry", reg)
    return reg


def test_validate_ok(write, fake_registry, capsys):
    p = write(GOOD_BODY)
    assert main(["routes", "validate", str(p)]) == 0
    out = capsys.readouterr().out
    assert f"ok: {p}" in out and "sm 90, miss error, source unmeasured, 3 families, 13 rows" in out
    assert "linear: 4 match(es), 9 row(s); routes: f_gemv, f_small, f_wide" in out


def test_validate_errors(write, fake_registry, capsys):
    bad = GOOD_BODY.replace("{t: [5, 32], route: f_small}", "{t: [6, 32], route: f_small}")
    bad = bad.replace("route: f_rms}", "route: f_wide}")
    p = write(bad)
    assert main(["routes", "validate", str(p)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("error: sm90.yaml:8: linear[0].routes[1].t: gap")
    assert err[1].startswith("error: sm90.yaml:25: rmsnorm[0].routes[0].route: route f_wide belongs to family linear")
    assert err[2] == f"{p}: 2 error(s)"


def test_validate_missing_file(tmp_path, capsys):
    assert main(["routes", "validate", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read route table" in capsys.readouterr().err


def test_show(write, fake_registry, capsys):
    p = write(GOOD_BODY)
    assert main(["routes", "show", "--sm", "90", "--routes", str(p)]) == 0
    out = capsys.readouterr().out
    assert "provenance: source unmeasured" in out and "reason: test table" in out
    assert "match {epilogue: none, format: Q4G64_F16S}" in out
    line = next(x for x in out.splitlines() if "sm90.yaml:7" in x)
    assert "T 1..4" in line and "f_gemv" in line and "BLOCK_N=128 SPLIT_K=1*" in line
    assert any("T 33..max" in x and "f_wide" in x for x in out.splitlines())
    assert "evidence T=3: f_wide 11us, f_gemv 12.5us" in out


def test_show_wrong_sm(write, fake_registry, capsys):
    p = write(GOOD_BODY)
    assert main(["routes", "show", "--sm", "86", "--routes", str(p)]) == 2
    assert "error: sm90.yaml: table is for sm 90, not the requested sm 86" in capsys.readouterr().err


def _two_tables(write):
    a = write(GOOD_BODY, name="a.yaml")
    body = GOOD_BODY.replace("{t: [1, 4], route: f_gemv, params: {BLOCK_N: 128}}\n      - {t: [5, 32], route: f_small}",
                             "{t: [1, 2], route: f_gemv, params: {BLOCK_N: 128}}\n      - {t: [3, 32], route: f_small}")
    body = body.replace("- {t: [1, max], route: f_rms}", "- {t: [1, max], route: f_rms, params: {BLOCK: 256}}")
    b = write(body, name="b.yaml")
    return a, b


def test_diff_rowwise(write, fake_registry, capsys):
    a, b = _two_tables(write)
    assert main(["routes", "diff", str(a), str(b)]) == 1  # the tables choose differently
    out = capsys.readouterr().out.splitlines()
    i = out.index("linear {epilogue: none, format: Q4G64_F16S}")
    assert out[i + 1].split() == ["T", "3..4", "A:", "f_gemv", "BLOCK_N=128", "SPLIT_K=1"]
    assert out[i + 2].split() == ["B:", "f_small", "BLOCK_T=16"]
    assert "rmsnorm {} (every op)" in out
    assert out[-1] == "2 of 7 match group(s) choose differently"
    assert main(["routes", "diff", str(a), str(a)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "no differences (7 match group(s) compared)"


def test_diff_with_artifact(tmp_path, write, fake_registry, capsys):
    from ninfer_compile.artifact.writer import ArtifactWriter, ResourceSpec, TensorSpec
    from ninfer_compile.contracts import load_contract

    spec = load_contract("tiny-qwen3.5").resolve()
    specs = [ResourceSpec(o.name, 4) if o.kind == "resource" else TensorSpec(o.name, o.shape, o.format)
             for o in spec.objects.values()]
    art = tmp_path / "tiny.ninfer"
    ArtifactWriter(art, spec.model_id, specs).write_sparse()
    a, b = _two_tables(write)
    assert main(["routes", "diff", str(a), str(b), "--artifact", str(art)]) == 1
    out = capsys.readouterr().out
    # tiny-qwen3.5: Q4 query_key [192, 96] and gate_up [320, 96]; gdn query_key [64, 96]
    assert "linear {epilogue: none, format: Q4G64_F16S, k: 96, n: 192}" in out
    assert "linear {epilogue: none, format: Q4G64_F16S, k: 96, n: 320}" in out
    assert "text/layers/3/attention/query_key" in out
    assert "format: Q5G64_F16S" not in out  # unchanged between the tables
    assert "rmsnorm {} (every op)" in out
    assert out.splitlines()[-1].endswith("op shape(s) of the model choose differently")
    assert main(["routes", "diff", str(a), str(a), "--artifact", str(art)]) == 0
    assert "op shape(s) of the model compared" in capsys.readouterr().out.splitlines()[-1]


def test_every_routes_option_has_help(capsys):
    import argparse

    parser = argparse.ArgumentParser(prog="routes")
    from ninfer_compile.routes import cli as routes_cli

    routes_cli.configure(parser)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == {"validate", "show", "diff"}
    for name, p in sub.choices.items():
        for action in p._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"routes {name}: {action.option_strings or action.dest} has no help text"
    with pytest.raises(SystemExit) as exc:
        main(["routes", "diff", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Exit 0: same choices" in out and "1: some differ" in out


def test_diff_contract_needs_artifact(write, fake_registry, capsys):
    a, b = _two_tables(write)
    assert main(["routes", "diff", str(a), str(b), "--contract", "x.yaml"]) == 2
    assert "--contract needs --artifact" in capsys.readouterr().err
