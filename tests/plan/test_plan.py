"""Memory report / budget, the deterministic renderer and the atomic writer."""

from __future__ import annotations

import json
import os

import pytest

from ninfer_compile.contracts import load_contract
from ninfer_compile.errors import CompileError
from ninfer_compile.ir.lower import LowerOptions, lower_all
from ninfer_compile.passes import bind_weights, plan_memory
from ninfer_compile.passes.context import PassContext
from ninfer_compile.plan.memory import GIB, check_budget, memory_report, report_text
from ninfer_compile.plan.writer import render_json, write_plan


@pytest.fixture(scope="module")
def spec27():
    return load_contract("qwen3.6-27b").resolve()


def _planned(spec, opts):
    ctx = PassContext(spec=spec, objects=None)
    return [plan_memory.run(bind_weights.run(g, ctx), ctx) for g in lower_all(spec, opts)]


def test_memory_report_27b_numbers(spec27):
    opts = LowerOptions(prefill_chunk=8, concurrency=(1, 2), max_context=1024, mtp=False)
    r = memory_report(_planned(spec27, opts), None, spec27, slots=2, max_context=1024, kv_dtype="bf16")
    # KV: 16 attention layers x (K + V) x 4 heads x 256 x 2 bytes = 65,536 B/token (the seed's bf16 row)
    assert r.kv_bytes_per_token == 65536 and r.kv == 65536 * 1024 * 2
    # GDN: 48 layers x slots x (3 x 10240 bf16 conv + 48 x 128 x 128 f32 recurrent)
    assert r.state == 48 * 2 * (3 * 10240 * 2 + 48 * 128 * 128 * 4)
    assert r.weights > 15 * GIB and r.workspace > 0
    txt = report_text(r, 24)
    assert "weights   W" in txt and "65,536 B/token" in txt and "budget" in txt


def test_int8_kv_bytes_per_token(spec27):
    opts = LowerOptions(prefill_chunk=4, concurrency=(1,), max_context=256, kv_dtype="int8", mtp=False)
    r = memory_report(_planned(spec27, opts), None, spec27, slots=1, max_context=256, kv_dtype="int8")
    # 1 byte per value + one fp16 scale per 64 values: 16 x 2 x 1024 x (1 + 2/64) = 33,792 (the seed's int8 row)
    assert r.kv_bytes_per_token == 33792


def test_budget_error_names_every_part(spec27):
    opts = LowerOptions(prefill_chunk=4, concurrency=(1,), max_context=256, mtp=False)
    r = memory_report(_planned(spec27, opts), None, spec27, slots=1, max_context=256, kv_dtype="bf16")
    check_budget(r, 64)
    with pytest.raises(CompileError) as e:
        check_budget(r, 8)
    msg = str(e.value)
    assert msg.startswith(f"needs {r.total} bytes (weights {r.weights}, KV {r.kv}, state {r.state}, "
                          f"workspace {r.workspace}), budget {8 * GIB}")
    assert "\n" not in msg


def test_render_json_is_valid_sorted_and_compact():
    obj = {"b": [1, 2.5, None, True], "a": {"z": "x" * 300, "y": "é"}, "c": {}}
    text = render_json(obj, width=60)
    assert json.loads(text) == obj
    assert text.index('"a"') < text.index('"b"') < text.index('"c"')
    assert '"b": [1, 2.5, null, true]' in text and "\\u00e9" in text


def test_write_plan_atomic_and_replaces(tmp_path):
    out = tmp_path / "x.plan"
    owner = {"format": "ninfer-plan-v1", "compiler": {"name": "ninfer-compile"}}  # a plan may replace a plan
    write_plan(out, {"a": 1, **owner}, "mem\n")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "kernels", "kernels/routes.json", "memory.txt", "plan.json"]
    first = (out / "plan.json").read_bytes()
    write_plan(out, {"a": 2, **owner}, "mem\n")
    assert (out / "plan.json").read_bytes() != first
    assert sorted(os.listdir(tmp_path)) == ["x.plan"]  # no temp or old directories left
    with pytest.raises(ValueError):
        write_plan(out, {"a": float("nan")}, "mem\n")  # rendering fails before anything is written
    got = json.loads((out / "plan.json").read_text())
    assert got.pop("integrity")["format"] == "ninfer-integrity-v1" and got == {"a": 2, **owner}
    assert sorted(os.listdir(tmp_path)) == ["x.plan"]
    with pytest.raises(CompileError, match="parent directory"):
        write_plan(tmp_path / "missing" / "y.plan", {}, "")
