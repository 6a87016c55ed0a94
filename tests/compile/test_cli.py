"""`ninfer-compile ARTIFACT --sm N` end to end on a tiny synthetic artifact (test route table)."""

from __future__ import annotations

import json
import os

import pytest

from ninfer_compile.cli import main

from .support import tiny_artifact, write_table


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    return tiny_artifact(tmp_path_factory.mktemp("art") / "tiny.ninfer")


@pytest.fixture
def table(tmp_path, test_registry):
    return write_table(tmp_path, 90)


def _compile(art, table, out, *extra):
    return main([str(art), "--sm", "90", "--routes", str(table), "-o", str(out), "--max-context", "64",
                 "--prefill-chunk", "16", *extra])


def test_mtp_head_lowered_only_with_a_draft_window(art, table, tmp_path, capsys):
    out = tmp_path / "k1.plan"
    assert _compile(art, table, out, "--concurrency", "1", "--draft-tokens", "1") == 0, capsys.readouterr().err
    ext = json.loads((out / "plan.json").read_text())["extents"]
    assert {"mtp_prefill_t16", "mtp_decode_c1_k0", "mtp_verify_c1_k1"} <= set(ext)
    assert ext["verify_c1_k1"]["t"] == 2 and ext["decode_c1_k0"]["t"] == 1


def test_compile_writes_plan(art, table, tmp_path, capsys):
    out = tmp_path / "p.plan"
    assert _compile(art, table, out, "--concurrency", "1,2,4") == 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["model_id"] == "tiny-qwen3.5-mtp" and plan["sm"] == 90
    assert plan["artifact"]["file"] == "tiny.ninfer" and len(plan["artifact"]["directory_sha256"]) == 64
    assert plan["routes"]["table"] == "sm90.yaml (--routes)" and len(plan["routes"]["sha256"]) == 64
    assert plan["routes"]["source"] == "unmeasured"
    assert plan["options"]["concurrency"] == [1, 2, 4] and plan["options"]["kv_dtype"] == "bf16"
    ext = plan["extents"]
    # no draft window: the MTP head is not lowered (its extents would never run)
    assert set(ext) == {"prefill_t16", "decode_c1_k0", "decode_c2_k0", "decode_c4_k0"}
    assert ext["decode_c4_k0"]["cuda_graph"]["capture"] and not ext["prefill_t16"]["cuda_graph"]["capture"]
    launch = next(L for L in ext["decode_c2_k0"]["launches"] if L["op"] == "l3.attn.query_key")
    assert launch["route"] == "t_gemv" and launch["t"] == 2 and launch["source"].startswith("sm90.yaml:")
    assert launch["args"]["weight"] == {"weight": "text/layers/3/attention/query_key", "format": "Q4G64_F16S"}
    gate = next(L for L in ext["decode_c2_k0"]["launches"] if L["op"] == "l3.attn.gate_value")
    assert "staged_input" not in gate["attrs"]
    down = next(L for L in ext["prefill_t16"]["launches"] if L["op"] == "l0.mlp.down_proj")
    assert down["attrs"]["epilogue"] == "residual" and down["route"] == "t_wide" and down["t"] == 16
    head = next(L for L in ext["prefill_t16"]["launches"] if L["op"] == "lm_head")
    assert head["t"] == 1  # the prefill head evaluates only the selected row
    # every buffer a launch names has an arena slot or is a view of one
    for e in ext.values():
        for L in e["launches"]:
            for ref in [*L["args"].values(), *L["outs"].values()]:
                if "buffer" in ref:
                    t = e["tensors"][ref["buffer"]]
                    assert "offset" in t or "view_of" in t
                elif "state" in ref:
                    assert ref["state"] in plan["buffers"]["state"]
    assert plan["buffers"]["arena"]["bytes"] == max(e["arena_bytes"] for e in ext.values())
    assert plan["buffers"]["state"]["kv/3/k_cache"]["shape"] == [4, 64, 1, 32]
    assert "weights   W" in (out / "memory.txt").read_text()
    assert json.loads((out / "kernels" / "routes.json").read_text())["routes"] == plan["used_routes"]
    assert "wrote" in capsys.readouterr().err


def test_plan_is_deterministic(art, table, tmp_path):
    a, b = tmp_path / "a.plan", tmp_path / "b.plan"
    assert _compile(art, table, a, "--concurrency", "1,8") == 0
    assert _compile(art, table, b, "--concurrency", "8,1") == 0
    for name in ("plan.json", "memory.txt", "kernels/routes.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert str(tmp_path) not in (a / "plan.json").read_text()


def test_default_output_path_and_explain(art, table, tmp_path, capsys):
    link = tmp_path / "m.ninfer"
    os.symlink(art, link)
    assert main([str(link), "--sm", "90", "--routes", str(table), "--prefill-chunk", "8", "--max-context", "32",
                 "--explain"]) == 0
    assert (tmp_path / "m.ninfer.sm90.plan" / "plan.json").is_file()
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("decode_c1_k0\tl0.mlp.gate_up\t"))
    assert "linear+swiglu" in line and "T=1" in line and "t_wide" in line and "BLOCK_T=16" in line
    assert line.split("\t")[-1].startswith("sm90.yaml:")
    assert "# extent prefill_t8" in out


def test_dump_ir_and_disable_pass(art, table, tmp_path):
    dump = tmp_path / "ir"
    assert _compile(art, table, tmp_path / "p.plan", "--dump-ir", str(dump), "--disable-pass", "fuse") == 0
    names = sorted(p.name for p in (dump / "decode_c1_k0").iterdir())
    assert "00-lower.txt" in names and "01-bind_weights.dot" in names and "02-fuse.txt" not in names
    assert "05-plan_cuda_graphs.yaml" in names
    plan = json.loads((tmp_path / "p.plan" / "plan.json").read_text())
    assert plan["passes"]["disabled"] == ["fuse"]
    assert any(L.get("builtin") == "add" for L in plan["extents"]["decode_c1_k0"]["launches"])


def _bad(capsys, argv, needle, tmp_path):
    before = sorted(os.listdir(tmp_path))
    assert main([*argv, "--quiet"]) == 2  # no progress lines: stderr is the error alone
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and needle in err and "\n" not in err, err
    assert sorted(os.listdir(tmp_path)) == before  # nothing written


def test_bad_inputs(art, table, tmp_path, capsys):
    o = ["-o", str(tmp_path / "p.plan")]
    _bad(capsys, [str(art), "--sm", "75", *o], "no route table for sm75", tmp_path)
    _bad(capsys, [str(art), "--sm", "86", "--routes", str(table), *o], "table is for sm 90, not the requested sm 86",
         tmp_path)
    _bad(capsys, [str(tmp_path / "nope.ninfer"), "--sm", "90", "--routes", str(table), *o], "nope.ninfer", tmp_path)
    _bad(capsys, [str(art), "--sm", "90", "--routes", str(table), "--contract", "graphs/tiny-qwen3.5.yaml", *o],
         "tiny-qwen3.5", tmp_path)
    _bad(capsys, [str(art), "--sm", "90", "--routes", str(table), "--concurrency", "0", *o],
         "--concurrency values must be >= 1", tmp_path)
    _bad(capsys, [str(art), "--sm", "90", "--routes", str(table), "--concurrency", "4", "--draft-tokens", "3",
                  "--prefill-chunk", "8", *o], "exceeds the prefill chunk 8", tmp_path)
    _bad(capsys, [str(art), "--sm", "90", "--routes", str(table), "--concurrency", "one", *o],
         "--concurrency must be comma-separated integers", tmp_path)
    _bad(capsys, [str(art), "--sm", "90", "--routes", str(table), "--memory-budget", "0.001",
                  "--dump-ir", str(tmp_path / "ir"), *o], "budget 1073741", tmp_path)
    _bad(capsys, [str(art), "--sm", "90", "--routes", str(table), "--disable-pass", "nope", *o],
         "unknown pass nope", tmp_path)
    _bad(capsys, [str(art), "--sm", "90", "--routes", str(table), "--disable-pass", "select_routes", *o],
         "has no route (select_routes disabled?)", tmp_path)
    _bad(capsys, [str(art), "--sm", "90", "--routes", str(table), "--kv-dtype", "fp6", *o],
         "--kv-dtype must be one of bf16, int8", tmp_path)


def test_route_miss_is_one_line(art, tmp_path, capsys, test_registry):
    table = write_table(tmp_path, 90, skip=("conv1d",))
    _bad(capsys, [str(art), "--sm", "90", "--routes", str(table), "-o", str(tmp_path / "p.plan")],
         "no section for family 'conv1d'", tmp_path)
