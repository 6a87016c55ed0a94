"""bench/bench_e2e.py's decode-step breakdown on CPU: the aggregation and its report (the profiler
itself needs the GPU)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_e2e as be  # noqa: E402


def test_kernel_breakdown_per_step():
    k = [("gemv_lowreg_kernel", 30.0), ("rmsnorm_rows_kernel", 2.0), ("rmsnorm_rows_kernel", 3.0),
         ("void at::native::elementwise_kernel<128, 2, Foo>(int, Bar)", 1.0)] * 2  # two steps
    b = be.kernel_breakdown(k, steps=2, step_us=50.0)
    assert b["kernel_us_per_step"] == pytest.approx(36.0) and b["idle_us_per_step"] == pytest.approx(14.0)
    assert b["launches_per_step"] == 4
    assert [r["kernel"] for r in b["rows"]] == ["gemv_lowreg_kernel", "rmsnorm_rows_kernel",
                                                "void at::native::elementwise_kernel"]
    norm = b["rows"][1]
    assert norm["launches_per_step"] == 2 and norm["us_per_step"] == pytest.approx(5.0)
    assert norm["mean_us"] == pytest.approx(2.5) and norm["pct_of_step"] == pytest.approx(10.0)
    assert be.kernel_breakdown(k, 2, 50.0, top=1)["other_kernels"] == 2


def test_report_lists_the_breakdown():
    res = {"provenance": {"gpu": "G", "date": "d", "driver": "1", "torch": "t", "triton": "3"}, "label": "x",
           "read_bandwidth_gbs": 3000.0, "weights_bytes_per_step": 15e9, "load_times_s": {"total": 1.0},
           "load_to_first_token_s": 2.0, "prefill": {}, "decode": {1: {"tok_s": 100.0, "step_ms": 10.0}},
           "decode_profile": {1: be.kernel_breakdown([("a_kernel", 4.0)], 1, 10.0)}}
    md = be.render_md(res)
    assert "Decode step at C=1, 1 steps under torch.profiler: wall 10 µs/step" in md
    assert "| a_kernel | 1 | 4.0 | 4.00 | 40.0% |" in md


def test_critical_path_charges_overlapped_kernels_only_their_own_time():
    # b starts inside a (PDL: launched early, waits) and ends 3 µs after it; c starts after a gap
    ev = [("a", 0.0, 10.0), ("b", 4.0, 13.0), ("c", 15.0, 16.0)]
    charged, idle, busy = be.critical_path(ev)
    assert charged == [("a", 10.0), ("b", 3.0), ("c", 1.0)]
    assert idle == 2.0 and busy == 20.0
    assert sum(us for _, us in charged) + idle == 16.0  # the span


def test_per_op_aligns_kernels_with_launches_across_layers():
    launches = [{"op": "l0.input_norm", "route": "norm"}, {"op": "l0.mlp.gate_up", "route": "gemv", "w": 100},
                {"op": "l1.input_norm", "route": "norm"}, {"op": "l1.mlp.gate_up", "route": "gemv", "w": 100}]
    routes = {"norm": ["rms_kernel"], "gemv": ["gemv_kernel", "reduce_kernel"]}
    charged = [("rms_kernel", 1.0), ("gemv_kernel", 10.0), ("reduce_kernel", 2.0), ("copy", 0.5),
               ("rms_kernel", 1.0), ("gemv_kernel", 12.0)]
    rows = be.per_op(charged, launches, routes, lambda L: L.get("w", 0), steps=1, step_us=30.0, stream_gbs=1.0)
    by = {r["op"]: r for r in rows}
    assert by["mlp.gate_up"]["launches_per_step"] == 2 and by["mlp.gate_up"]["us_per_step"] == 24.0
    assert by["mlp.gate_up"]["floor_us"] == 200 / 1e3 and by["input_norm"]["launches_per_step"] == 2
    assert by["(copy)"]["us_per_step"] == 0.5 and by["(copy)"]["route"] == "-"
    assert [r["op"] for r in rows][0] == "mlp.gate_up"
