"""`ninfer-compile --kv-dtype NAME` for every KV format (kernels/kv_cache/formats.py): exact B/token
on the 27B, the buffers in the plan, bad names / head widths as one line, and --memory-budget's
context fit with --max-context auto (test route table, tiny synthetic artifact: head_dim 32)."""

from __future__ import annotations

import json
import os

import pytest

from ninfer_compile.cli import main
from ninfer_compile.contracts import load_contract
from ninfer_compile.ir.lower import LowerOptions, lower_all
from ninfer_compile.kernels.kv_cache import formats as F
from ninfer_compile.passes import bind_weights, plan_memory
from ninfer_compile.passes.context import PassContext
from ninfer_compile.plan.memory import GIB, context_fit, memory_report, report_text

from .support import tiny_artifact, write_table

BYTES_27B = {"bf16": 65_536, "int8": 33_792, "fp8": 33_024, "k8v4": 25_728, "rk8v4": 26_112,
             "nvfp4": 18_432, "rk4v4": 17_920}  # the table


@pytest.fixture(scope="module")
def spec27():
    return load_contract("qwen3.6-27b").resolve()


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    return tiny_artifact(tmp_path_factory.mktemp("art") / "tiny.ninfer")


@pytest.fixture
def table(tmp_path, test_registry):
    return write_table(tmp_path, 90)


@pytest.mark.parametrize("name", list(BYTES_27B))
def test_27b_memory_report_bytes_per_token(spec27, name):
    opts = LowerOptions(prefill_chunk=4, concurrency=(1, 2), max_context=256, kv_dtype=name, mtp=False)
    ctx = PassContext(spec=spec27, objects=None)
    graphs = [plan_memory.run(bind_weights.run(g, ctx), ctx) for g in lower_all(spec27, opts)]
    r = memory_report(graphs, None, spec27, slots=2, max_context=256, kv_dtype=name)
    assert r.kv_bytes_per_token == BYTES_27B[name] and r.kv == BYTES_27B[name] * 256 * 2
    txt = report_text(r, 40)
    assert f"{BYTES_27B[name]:,d} B/token" in txt
    fit = context_fit(r, 40)
    assert f"context fit {fit:>14,d} tokens per slot fit the budget (KV {name}" in txt
    assert fit == (40 * GIB - (r.total - r.kv)) // (2 * BYTES_27B[name])
    kv_bufs = {n: b for n, b in r.state_buffers.items() if b["kind"] == "kv"}
    assert len(kv_bufs) == 16 * (4 if F.FORMATS[name].has_scales() else 2)


def _compile(art, table, out, *extra):
    return main([str(art), "--sm", "90", "--routes", str(table), "-o", str(out), "--prefill-chunk", "16",
                 "--quiet", *extra])


@pytest.mark.parametrize("name", ["fp8", "k8v4", "nvfp4"])  # the formats a head width of 32 can hold
def test_plan_carries_the_format_buffers(art, table, tmp_path, capsys, name):
    out = tmp_path / "p.plan"
    assert _compile(art, table, out, "--max-context", "64", "--kv-dtype", name) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["options"]["kv_dtype"] == name
    want = {n: (list(s[1:]), d) for n, s, d in F.cache_buffers(F.FORMATS[name], 1, 64, 2, 32)}
    text = json.dumps(plan)
    for n, (per_slot, dtype) in want.items():
        assert f"/{n}" in text
    mem = (out / "memory.txt").read_text()
    assert f"KV {name}" in mem


def _bad(capsys, argv, needle, tmp_path):
    before = sorted(os.listdir(tmp_path))
    assert main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and needle in err and "\n" not in err, err
    assert sorted(os.listdir(tmp_path)) == before


def test_bad_kv_dtype_and_head_width(art, table, tmp_path, capsys):
    o = ["--sm", "90", "--routes", str(table), "-o", str(tmp_path / "p.plan"), "--max-context", "64",
         "--prefill-chunk", "16"]
    _bad(capsys, [str(art), *o, "--kv-dtype", "fp4"],
         "--kv-dtype must be one of bf16, int8, fp8, k8v4, rk8v4, nvfp4, rk4v4, got fp4", tmp_path)
    for name in ("int8", "rk8v4", "rk4v4"):  # 64-value groups / rotation blocks: the tiny model's D = 32
        _bad(capsys, [str(art), *o, "--kv-dtype", name],
             f"--kv-dtype {name} needs head_dim a multiple of 64 (its K codec", tmp_path)
        assert True
    _bad(capsys, [str(art), *o[:-4], "--max-context", "auto"], "--max-context auto needs --memory-budget", tmp_path)
    _bad(capsys, [str(art), *o[:-4], "--max-context", "lots"], "--max-context must be an integer or auto", tmp_path)


def test_max_context_auto_takes_the_largest_that_fits(art, table, tmp_path, capsys):
    out = tmp_path / "small.plan"
    assert _compile(art, table, out, "--max-context", "64", "--kv-dtype", "nvfp4", "--concurrency", "1,2") == 0
    plan = json.loads((out / "plan.json").read_text())
    total = plan["memory"]["total_bytes"]
    # the tiny model: 2 attention layers (+ none for MTP at K = 0) x 1 KV head x D = 32
    bpt = F.bytes_per_token(F.FORMATS["nvfp4"], 2, 1, 32)
    assert plan["memory"]["kv_bytes_per_token"] == bpt == 72
    assert f"{bpt:,d} B/token" in (out / "memory.txt").read_text()
    budget = (total + 1000 * 2 * bpt) / GIB  # 1000 positions x 2 slots above the 64-position plan
    auto = tmp_path / "auto.plan"
    assert _compile(art, table, auto, "--max-context", "auto", "--memory-budget", f"{budget:.12f}",
                    "--kv-dtype", "nvfp4", "--concurrency", "1,2") == 0
    p = json.loads((auto / "plan.json").read_text())
    ctx = p["options"]["max_context"]
    assert 64 + 900 <= ctx <= 64 + 1000
    assert p["memory"]["total_bytes"] <= int(budget * GIB)
    txt = (auto / "memory.txt").read_text()
    assert "tokens per slot fit the budget (KV nvfp4" in txt
    # one position more does not fit
    over = tmp_path / "over.plan"
    assert main([str(art), "--sm", "90", "--routes", str(table), "-o", str(over), "--prefill-chunk", "16", "--quiet",
                 "--max-context", str(ctx + 1), "--memory-budget", f"{budget:.12f}", "--kv-dtype", "nvfp4",
                 "--concurrency", "1,2"]) == 2
    capsys.readouterr()
