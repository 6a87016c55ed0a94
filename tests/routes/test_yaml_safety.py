"""Hostile YAML (issue 10 §3): route tables, contracts and fusion rules go through one bounded reader
(`ninfer_compile/yaml_lines.py`) that refuses aliases, oversized files and too many / too deeply
nested nodes, in one line naming the file and line."""

from __future__ import annotations

import resource

import pytest

import ninfer_compile.cli as cli_mod
from ninfer_compile import yaml_lines
from ninfer_compile.errors import CompileError, ContractError, RouteError
from ninfer_compile.yaml_lines import YamlInputError, parse_yaml_with_lines, safe_load

from .conftest import GOOD_BODY, HEADER


def billion_laughs() -> str:
    """The issue's alias bomb shape: 9 levels of 9 aliases each (9^9 leaves if expanded)."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_bomb_is_small_and_refused_at_the_first_alias():
    text = billion_laughs()
    assert len(text) < 500
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(YamlInputError) as exc:
        parse_yaml_with_lines(text, "bomb.yaml")
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert exc.value.line == 2 and "alias *a0" in exc.value.problem and "not allowed" in exc.value.problem
    assert str(exc.value).startswith("bomb.yaml:2: ")
    assert after - before < 50 * 1024  # KiB: no expansion happened (the issue saw > 5 GB)


def test_bomb_as_route_table_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli_mod, "SUBCOMMANDS", {"routes": cli_mod.SUBCOMMANDS["routes"]})
    p = tmp_path / "sm90.yaml"
    p.write_text(HEADER % "error" + billion_laughs())
    assert cli_mod.main(["routes", "validate", str(p)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("error: sm90.yaml:") and "aliases are not allowed" in err[0]
    assert err[1] == f"{p}: 1 error(s)"


def test_bomb_as_contract_is_one_line(tmp_path):
    from ninfer_compile.contracts import load_contract

    p = tmp_path / "bomb.contract.yaml"
    p.write_text("model_id: x\n" + billion_laughs())
    with pytest.raises(ContractError) as exc:
        load_contract(p)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{p}:3: YAML: alias *a0") and "not allowed" in msg


def test_anchor_without_alias_is_fine():
    doc = parse_yaml_with_lines("a: &x 1\nb: [2, 3]\n", "ok.yaml")
    assert doc.data == {"a": 1, "b": [2, 3]} and doc.line_of(("b", 1)) == 2


def test_size_limit_refuses_before_reading(tmp_path):
    assert yaml_lines.MAX_YAML_BYTES == 2**20
    p = tmp_path / "big.yaml"
    with open(p, "wb") as fh:  # a sparse 5 MiB file: refused from its size, never read
        fh.truncate(5 * 2**20)
    with pytest.raises(YamlInputError) as exc:
        yaml_lines.read_yaml_bytes(p)
    assert "5242880 bytes" in exc.value.problem and "the 1 MiB limit" in exc.value.problem
    from ninfer_compile.routes.table import load_table

    with pytest.raises(RouteError) as rexc:
        load_table(p)
    assert str(rexc.value).startswith(f"{p}: route table refused: 5242880 bytes")
    from ninfer_compile.contracts import load_contract

    with pytest.raises(ContractError) as cexc:
        load_contract(p)
    assert str(cexc.value).startswith(f"{p}: contract refused: 5242880 bytes")


def test_text_size_limit(monkeypatch):
    with pytest.raises(YamlInputError) as exc:
        parse_yaml_with_lines("a: " + "x" * 2000 + "\n", "t.yaml", max_bytes=1000)
    assert "more than the 1000 bytes limit" in exc.value.problem
    monkeypatch.setattr(yaml_lines, "MAX_YAML_BYTES", 100)  # the module's bound is read at each call
    with pytest.raises(YamlInputError):
        parse_yaml_with_lines("a: " + "x" * 200 + "\n", "t.yaml")


def test_node_bound_refuses_a_long_flat_list_early(monkeypatch):
    # the real bound (100 000) is 2 bytes a node below the size limit: a flat list of 1-byte items
    # under 1 MiB is refused by it; scaled down here so the test stays fast
    assert 2 * yaml_lines.MAX_YAML_NODES < yaml_lines.MAX_YAML_BYTES
    monkeypatch.setattr(yaml_lines, "MAX_YAML_NODES", 1000)
    text = "x: [" + ",".join(["1"] * 1010) + "]\n"
    with pytest.raises(YamlInputError) as exc:
        parse_yaml_with_lines(text, "flat.yaml")
    assert f"more than {yaml_lines.MAX_YAML_NODES} YAML nodes" in exc.value.problem


def test_node_count_and_depth_bounds():
    flat = "[" + ",".join(["1"] * 200) + "]"
    assert len(parse_yaml_with_lines(flat, "f.yaml").data) == 200
    with pytest.raises(YamlInputError) as exc:
        parse_yaml_with_lines(flat, "f.yaml", max_nodes=100)
    assert "more than 100 YAML nodes" in exc.value.problem
    deep = "[" * 100 + "]" * 100
    with pytest.raises(YamlInputError) as exc:
        parse_yaml_with_lines(deep, "d.yaml")
    assert "nesting deeper than" in exc.value.problem and exc.value.line == 1


def test_python_tags_and_syntax_errors_name_the_line():
    with pytest.raises(YamlInputError) as exc:
        parse_yaml_with_lines("a: 1\nb: !!python/object/apply:os.system [ls]\n", "t.yaml")
    assert exc.value.line == 2 and "python/object/apply:os.system" in exc.value.problem
    with pytest.raises(YamlInputError) as exc:
        parse_yaml_with_lines("a: !!python/name:os.system\n", "t.yaml")
    assert exc.value.line == 1 and "constructor" in exc.value.problem
    with pytest.raises(YamlInputError) as exc:
        parse_yaml_with_lines("a: 1\nb: [1, 2\n", "t.yaml")
    assert exc.value.syntax and exc.value.line >= 2


def test_duplicates_and_non_scalar_keys():
    doc = parse_yaml_with_lines("a: 1\nb: 2\na: 3\n", "t.yaml")
    assert doc.data == {"a": 1, "b": 2} and doc.duplicates == [(3, ("a",), 1)]
    with pytest.raises(YamlInputError) as exc:
        safe_load("a: 1\na: 3\n", "t.yaml")
    assert str(exc.value) == "t.yaml:2: duplicate key 'a' (first at line 1)"
    with pytest.raises(YamlInputError) as exc:
        parse_yaml_with_lines("x: 1\n? [1, 2]\n: 3\n", "t.yaml")
    assert "mapping keys must be scalars" in exc.value.problem


def test_route_table_alias_in_a_row(write, monkeypatch):
    from ninfer_compile.routes import table as table_mod

    from .conftest import make_registry

    monkeypatch.setattr(table_mod, "default_registry", make_registry())
    body = GOOD_BODY.replace("params: {BLOCK_N: 128}", "params: &p {BLOCK_N: 128}", 1)
    body = body.replace("{t: [5, 32], route: f_small}", "{t: [5, 32], route: f_small, params: *p}", 1)
    p = write(body)
    with pytest.raises(RouteError) as exc:
        table_mod.load_table(p)
    assert "sm90.yaml:8: yaml: alias *p: YAML aliases are not allowed" in str(exc.value)


def test_fuse_rules_go_through_the_bounded_reader(tmp_path):
    from ninfer_compile.passes.fuse import RULES_PATH, load_rules

    assert load_rules(RULES_PATH)  # the shipped rules load
    p = tmp_path / "rules.yaml"
    p.write_text("- &r {name: a, kind: epilogue}\n- *r\n")
    with pytest.raises(CompileError) as exc:
        load_rules(p)
    assert str(exc.value).startswith("rules.yaml:2: alias *r")


def test_shipped_files_parse_without_aliases():
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    files = sorted((repo / "routes").glob("sm*.yaml")) + sorted((repo / "graphs").glob("*.yaml"))
    assert len(files) >= 6
    for f in files:
        assert parse_yaml_with_lines(f.read_text(), f.name).data
