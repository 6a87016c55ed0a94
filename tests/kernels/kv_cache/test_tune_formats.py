"""The tuner's attention / kv_append bench builders for the KV formats (kernels/*/tune.py): caches
of the case's format, checked against the reference (CPU: the interpreter)."""

import pytest
import torch

from ninfer_compile.kernels.registry import get_route
from ninfer_compile.tune import measure as M
from ninfer_compile.tune.shapes import MatchCase


@pytest.fixture
def device(monkeypatch):
    monkeypatch.setattr(M, "DEVICE", None if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("kvd", ["nvfp4", "rk4v4", "k8v4"])
def test_builders_per_format(device, kvd):
    case = MatchCase("attention", {"format": "BF16", "kv_dtype": kvd, "head_dim": 64, "phase": "decode"},
                     {"q": (1, 4, 64), "k_cache": (1, 32, 2, 64)})
    bench = M.build(case, 2, ctx=40, copies=1)
    assert bench.check(get_route("attention_decode_splitkv"), {}) < 3e-2
    case = MatchCase("kv_append", {"kv_dtype": kvd, "head_dim": 64}, {"k": (1, 2, 64), "v": (1, 2, 64)})
    bench = M.build(case, 3, copies=1)
    assert bench.check(get_route("kv_append_rows"), {}) < 1e-3
