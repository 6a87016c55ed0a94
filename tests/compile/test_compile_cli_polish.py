"""Issue 10 §5, compiler side: --version, help on every option, the compile form in --help, --quiet
and progress lines, one-line refusals of bad flag values, memory-size warnings, the prefill chunk
clamped to --max-context, DOT labels that render."""

from __future__ import annotations

import argparse
import json
import os
import re

import pytest

from ninfer_compile import __version__
from ninfer_compile.cli import build_parser, main
from ninfer_compile.plan.memory import GIB, MemoryReport, fit_warnings



def _args(art, table, out, *extra):
    return [str(art), "--sm", "90", "--routes", str(table), "-o", str(out), "--max-context", "64",
            "--prefill-chunk", "16", *extra]


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"ninfer-compile {__version__}"


def test_help_shows_the_compile_form(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "ninfer-compile ARTIFACT --sm N" in out.split("options:")[0]  # in the usage itself
    assert "same as `ninfer-compile compile ARTIFACT --sm N`" in out


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser(name)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


@pytest.mark.parametrize("command", ["compile", "pack", "tune"])
def test_every_option_has_help(command):
    p = _subparser(command)
    missing = [a.option_strings or a.dest for a in p._actions
               if not isinstance(a, argparse._HelpAction) and (not a.help or a.help == argparse.SUPPRESS)]
    assert missing == []
    assert any("--quiet" in a.option_strings for a in p._actions)


def test_pack_no_progress_is_an_alias_of_quiet():
    p = _subparser("pack")
    assert p.parse_args(["--synthetic", "x", "-o", "y", "--no-progress"]).quiet is True
    assert p.parse_args(["--synthetic", "x", "-o", "y", "-q"]).quiet is True
    assert p.parse_args(["--synthetic", "x", "-o", "y"]).quiet is False


def test_usage_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["compile", "a.ninfer", "--sm", "abc"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "\n" not in err
    assert err.startswith("error: ninfer-compile compile: argument --sm: invalid int value") and "--help" in err


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "0", "-inf"])
def test_memory_budget_must_be_finite_and_positive(art, table, tmp_path, capsys, value):
    out = tmp_path / "p.plan"
    assert main(_args(art, table, out, f"--memory-budget={value}")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --memory-budget must be a finite positive number of GiB") and "\n" not in err
    assert not out.exists()


def test_progress_lines_and_quiet(art, table, tmp_path, capsys):
    assert main(_args(art, table, tmp_path / "a.plan", "--concurrency", "1,2")) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "lowering 3 extents"
    assert [ln for ln in err if ln.startswith("passes: extent ")] == [
        "passes: extent 1/3 (prefill_t16)", "passes: extent 2/3 (decode_c1_k0)", "passes: extent 3/3 (decode_c2_k0)"]
    assert any(ln.startswith("writing ") for ln in err) and err[-1].startswith("wrote ")
    assert main([*_args(art, table, tmp_path / "b.plan", "--concurrency", "1,2"), "--quiet"]) == 0
    quiet = capsys.readouterr().err.splitlines()
    assert len(quiet) == 1 and quiet[0].startswith("wrote ")  # the summary stays


def test_errors_after_progress_are_still_one_error_line(art, table, tmp_path, capsys):
    assert main(_args(art, table, tmp_path / "p.plan", "--memory-budget", "0.0001")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert [ln for ln in err if ln.startswith("error: ")] == [err[-1]] and "budget" in err[-1]
    assert not any("Traceback" in ln for ln in err)


def test_prefill_chunk_clamped_to_max_context(art, table, tmp_path, capsys):
    out = tmp_path / "p.plan"
    assert main([str(art), "--sm", "90", "--routes", str(table), "-o", str(out), "--max-context", "8", "-q"]) == 0
    err = capsys.readouterr().err
    assert "note: --prefill-chunk 1024 clamped to --max-context 8" in err
    plan = json.loads((out / "plan.json").read_text())
    assert plan["options"]["prefill_chunk"] == 8 and "prefill_t8" in plan["extents"]


def _report(total: int) -> MemoryReport:
    return MemoryReport(weights=total, kv=0, state=0, workspace=0, kv_bytes_per_token=0, slots=8, max_context=262144,
                        kv_dtype="bf16", weight_objects=1, state_buffers={}, arena_by_extent={})


def test_fit_warnings():
    assert fit_warnings(_report(100 * GIB), 90, local=None) == []
    w = fit_warnings(_report(145 * GIB), 90, local=None)
    assert len(w) == 1 and "145.0 GiB" in w[0] and "largest single sm90 GPU" in w[0] and "144 GiB" in w[0]
    w = fit_warnings(_report(100 * GIB), 90, local=(80 * GIB, "NVIDIA H100"))
    assert len(w) == 1 and "this machine's NVIDIA H100" in w[0]
    assert fit_warnings(_report(2000 * GIB), 75, local=None)[0].count("48 GiB") == 1
    assert "any single GPU" in fit_warnings(_report(1025 * GIB), 61, local=None)[0]


def test_an_absurd_plan_is_written_with_a_warning(art, table, tmp_path, capsys):
    out = tmp_path / "p.plan"
    assert main([*_args(art, table, out), "--max-context", "1000000000000", "-q"]) == 0
    err = capsys.readouterr().err.splitlines()
    warn = [ln for ln in err if ln.startswith("warning: ")]
    assert len(warn) == 1 and "more than the largest single sm90 GPU has (144 GiB)" in warn[0], err
    assert (out / "plan.json").is_file()


def _dot_labels(text: str) -> dict[str, list[str]]:
    """Node name -> the label's lines as Graphviz renders them (DOT escapes: \\n newline, \\" quote,
    \\\\ backslash); no graphviz binary needed."""
    out = {}
    q = r'"((?:[^"\\]|\\.)*)"'
    for m in re.finditer(rf"^\s*{q} \[label={q}\];$", text, re.M):
        raw = m.group(2)
        lines, cur, i = [], "", 0
        while i < len(raw):
            c = raw[i]
            if c == "\\" and i + 1 < len(raw):
                n = raw[i + 1]
                if n == "n":
                    lines.append(cur)
                    cur = ""
                else:
                    cur += n
                i += 2
                continue
            cur += c
            i += 1
        lines.append(cur)
        out[m.group(1)] = lines
    return out


def test_dot_labels_render_as_lines(art, table, tmp_path):
    dump = tmp_path / "ir"
    assert main(_args(art, table, tmp_path / "p.plan", "--dump-ir", str(dump), "-q")) == 0
    text = (dump / "decode_c1_k0" / "03-select_routes.dot").read_text()
    labels = _dot_labels(text)
    assert len(labels) > 10
    gate_up = labels["l0.mlp.gate_up"]
    assert gate_up == ["l0.mlp.gate_up", "linear", "t_wide"], gate_up
    for name, lines in labels.items():
        assert lines[0] == name and all("\\" not in ln for ln in lines), (name, lines)
    lowered = _dot_labels((dump / "decode_c1_k0" / "00-lower.txt").with_suffix(".dot").read_text())
    assert lowered["l0.mlp.down_proj"] == ["l0.mlp.down_proj", "linear"]  # no route before select_routes
    assert os.path.isfile(dump / ".ninfer-ir-dump")


def test_tune_refuses_a_directory_as_output_before_any_work(tmp_path, capsys):
    replay = tmp_path / "never-read.json"  # not created: the refusal comes first
    assert main(["tune", "--sm", "90", "--replay", str(replay), "-o", str(tmp_path), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: -o {tmp_path}: is a directory (or a dangling link); give the file to write"
    assert os.listdir(tmp_path) == []
