"""bench/limits.py: the byte floors (CPU, from plan.json) and the streaming-read kernel (interpreter)."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import limits  # noqa: E402


def _plan():
    state = {
        "gdn/0/recurrent_state": {"bytes": 2 * 4 * 8 * 8 * 4, "dtype": "f32", "kind": "gdn", "per_slot_shape": [4, 8, 8],
                                  "shape": [2, 4, 8, 8]},
        "gdn/0/conv_state": {"bytes": 2 * 3 * 16 * 2, "dtype": "bf16", "kind": "gdn", "per_slot_shape": [3, 16],
                             "shape": [2, 3, 16]},
        "kv/1/k_cache": {"bytes": 2 * 64 * 2 * 32 * 2, "dtype": "bf16", "kind": "kv", "per_slot_shape": [64, 2, 32],
                         "shape": [2, 64, 2, 32]},
        "kv/1/v_cache": {"bytes": 2 * 64 * 2 * 32 * 2, "dtype": "bf16", "kind": "kv", "per_slot_shape": [64, 2, 32],
                         "shape": [2, 64, 2, 32]},
    }
    kv = {"k_cache": {"state": "kv/1/k_cache"}, "v_cache": {"state": "kv/1/v_cache"}}
    launches = [
        {"kind": "embedding", "route": "emb", "t": 2, "match": {"n": 100},
         "args": {"ids": {"buffer": "ids"}, "table": {"weight": "embed"}}},
        {"kind": "linear", "route": "gemv", "t": 2, "args": {"x": {"buffer": "a"}, "weight": {"weight": "w1"}}},
        {"kind": "linear", "route": "gemv", "t": 2, "args": {"x": {"buffer": "a"}, "weight": {"weight": "w1"}}},
        {"kind": "gated_delta_rule", "route": "gdn", "t": 2,
         "args": {"q": {"buffer": "q"}, "state": {"state": "gdn/0/recurrent_state"}}},
        {"kind": "conv1d", "route": "conv", "t": 2, "args": {"conv_state": {"state": "gdn/0/conv_state"}}},
        {"kind": "kv_append", "route": "kva", "t": 2, "args": dict(kv)},
        {"kind": "attention", "route": "attn", "t": 2, "args": {"q": {"buffer": "q"}, **kv}},
    ]
    plan = {"buffers": {"state": state}, "extents": {
        "decode_c2_k0": {"phase": "decode", "concurrency": 2, "launches": launches},
        "prefill_t8": {"phase": "prefill", "concurrency": 1, "launches": []}}}
    sizes = {"embed": 100 * 40, "w1": 1000}
    return plan, sizes.__getitem__


def test_step_floor_counts_weights_once_state_twice_and_kv_at_context():
    plan, nbytes = _plan()
    name, ext = limits.decode_extent(plan, 2)
    assert name == "decode_c2_k0"
    f = limits.step_floor_bytes(plan, ext, nbytes, context=10)
    assert f["weights"] == 2 * 40 + 1000  # embedding: one 40-byte row per column; w1 once though bound twice
    assert f["state"] == 2 * 2 * (4 * 8 * 8 * 4) + 2 * 2 * (3 * 16 * 2)  # r + w, per active slot
    per_pos = 2 * 32 * 2  # one cache position of one of K / V
    # attention reads 10 positions of K and of V per slot; kv_append writes one row of each per slot
    assert f["kv"] == 2 * (2 * per_pos * 10) + 2 * (2 * per_pos * 1)
    assert f["total"] == f["weights"] + f["state"] + f["kv"]
    with pytest.raises(KeyError, match="C=4"):
        limits.decode_extent(plan, 4)


def test_floors_by_kernel_assign_each_launch_to_its_main_kernel():
    plan, nbytes = _plan()
    _, ext = limits.decode_extent(plan, 2)
    names = {"gemv": ["gemv_kernel", "splitk_reduce_kernel"], "attn": ["attn_kernel", "attn_reduce"]}
    f = limits.floors_by_kernel(plan, ext, nbytes, names, context=10)
    assert f["gemv_kernel"] == 2 * 1000  # per launch: both launches bind the weight
    assert f["splitk_reduce_kernel"] == 0 and f["attn_reduce"] == 0
    assert f["attn_kernel"] == 2 * 2 * (2 * 32 * 2) * 10
    assert f["(emb)"] == 80  # a route without a manifest entry is named by its route


def test_moe_banks_count_the_experts_a_step_hits():
    """An expert bank's floor is the expected distinct experts hit at T columns (uniform top-k),
    E and k from the router that writes the same expert_ids: exactly k of E at T = 1."""
    router = {"kind": "moe_router", "route": "r", "t": 3, "match": {"n": 17}, "attrs": {"top_k": 4},
              "args": {"weight": {"weight": "router"}}, "outs": {"expert_ids": {"buffer": "ids"}}}
    experts = {"kind": "moe_experts", "route": "x", "t": 3,
               "args": {"expert_ids": {"buffer": "ids"}, "gate_up": {"weight": "gu"}, "down": {"weight": "dn"}}}
    plan = {"buffers": {"state": {}}, "extents": {"decode_c3_k0": {"phase": "decode", "concurrency": 3,
                                                                   "launches": [router, experts]}}}
    sizes = {"router": 170, "gu": 16000, "dn": 32000}.__getitem__
    hit = 16 * (1 - (1 - 4 / 16) ** 3)
    assert limits.expected_experts_hit(16, 4, 1) == 4
    assert abs(limits.expected_experts_hit(16, 4, 3) - hit) < 1e-12
    f = limits.step_floor_bytes(plan, plan["extents"]["decode_c3_k0"], sizes, context=1)
    assert f["weights"] == 170 + int(-(-16000 * hit // 16)) + int(-(-32000 * hit // 16))
    assert limits.launch_floor_bytes({**experts, "t": 1}, plan, sizes, slots=1, context=1) == (16000 + 32000) // 4
    del router["outs"]
    with pytest.raises(KeyError, match="no router"):
        limits.launch_floor_bytes(experts, plan, sizes, slots=1, context=1)


def test_full_size_27b_floor(tmp_path):
    """On the sparse 27B artifact: the step floor's state part is exactly 48 GDN layers' recurrent
    (48 x 128 x 128 fp32) + conv (3 x 10240 bf16) state read and written; weights are ~15.4 GB."""
    from ninfer_compile.cli import main as cli

    art = tmp_path / "q27.ninfer"
    assert cli(["pack", "--synthetic", "qwen3.6-27b", "--sparse", "-o", str(art)]) == 0
    out = tmp_path / "q27.plan"
    assert cli([str(art), "--sm", "90", "--concurrency", "1", "--max-context", "4096", "--no-binaries",
                "-o", str(out)]) == 0
    import json

    from ninfer_runtime.artifact_view import ArtifactView

    plan = json.loads((out / "plan.json").read_text())
    with ArtifactView.open(art) as view:
        sizes = {n: e.bytes for n, e in view.objects.items()}
    _, ext = limits.decode_extent(plan, 1)
    f = limits.step_floor_bytes(plan, ext, sizes.__getitem__, context=4096)
    assert f["state"] == 48 * 2 * (48 * 128 * 128 * 4 + 3 * 10240 * 2)
    assert 15.0e9 < f["weights"] < 15.6e9
    assert f["kv"] == 16 * 4096 * 2 * 4 * 256 * 2 + 16 * 2 * 4 * 256 * 2


def test_streaming_read_kernel_reads_every_word():
    """The kernel's per-program xor covers every word exactly once (interpreter), masks included."""
    n = 3000  # not a multiple of BLOCK * ITERS
    x = torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32)
    block, iters = 64, 4
    progs = -(-n // (block * iters))
    out = torch.zeros(progs, dtype=torch.int32)
    limits._stream_read_kernel[(progs,)](x, out, n, BLOCK=block, ITERS=iters)
    want = np.bitwise_xor.reduce(x.numpy())
    assert np.bitwise_xor.reduce(out.numpy()) == want
    x[n - 1] ^= 1  # the masked tail is read too
    limits._stream_read_kernel[(progs,)](x, out, n, BLOCK=block, ITERS=iters)
    assert np.bitwise_xor.reduce(out.numpy()) == want ^ 1
