"""GPU-only: programmatic dependent launch with the early trigger and the GEMVs' pre-wait weight
prefetch (kernels/pdl.py, linear/prefetch.py) leaves every result bit-identical.

A decoder-like chain per layer -- RMSNorm, Q4 gate/up GEMV (swiglu), Q5 down GEMV (+residual,
ping-pong residual buffers: write-after-read across layers; split-K with a reduce launch or the
in-launch fused reduce with its counters), a bf16 GEMV of the norm output three kernels later
(a read two launches past its writer), a W8 tensor-core GEMV -- is captured in a CUDA graph with
PDL (NINFER_PDL_EARLY 0 and 1, prefetch 16 KB per program) and replayed; it must equal the same
chain launched plainly, bit for bit (the PDL constexpr changes only the kernels' entry).
"""

from __future__ import annotations

import pytest
import torch

from ninfer_compile.kernels import pdl
from ninfer_compile.kernels.linear import gemv_lowreg as G
from ninfer_compile.kernels.linear import launch as L
from ninfer_compile.kernels.linear.gemv_tc_w8 import w8_gemv_tc
from ninfer_compile.kernels.norms.launch import rmsnorm

from _linear_helpers import random_weight

pytestmark = pytest.mark.gpu

H, F, LAYERS = 1024, 1536, 6
DEV = "cuda"
LOWREG = {"BLOCK_N": 2, "BLOCK_K": 1024, "num_warps": 1, "PREFETCH": True, "MAXNREG": 128,
          "PDL_PREFETCH_BYTES": 16384}


def _model(gen):
    layers = []
    for _ in range(LAYERS):
        layers.append({"norm": (torch.randn(H, generator=gen) * 0.1).bfloat16().to(DEV),
                       "gate_up": random_weight("Q4G64_F16S", 2 * F, H, gen, device=DEV),
                       "down": random_weight("Q5G64_F16S", H, F, gen, device=DEV),
                       "small": random_weight("BF16", 48, H, gen, device=DEV),
                       "w8": random_weight("W8G32_F16S", 256, H, gen, device=DEV)})
    return layers


def _buffers(x0, down):
    ws = torch.empty(max(1, G.linear_workspace_numel("q5_gemv_lowreg", 1, H, F, "residual", down)),
                     dtype=torch.float32, device=DEV)
    xs = [x0.clone(), torch.empty_like(x0)]
    return {"x": xs, "h": torch.empty_like(x0), "a": torch.empty(1, F, dtype=torch.bfloat16, device=DEV),
            "ws": ws, "small": torch.empty(LAYERS, 1, 48, dtype=torch.bfloat16, device=DEV),
            "w8": torch.empty(LAYERS, 1, 256, dtype=torch.bfloat16, device=DEV)}


def _chain(layers, b, down):
    for i, lw in enumerate(layers):
        x_in, x_out = b["x"][i % 2], b["x"][(i + 1) % 2]
        rmsnorm(x_in, lw["norm"], b["h"])
        G.q4_gemv_lowreg(b["h"], lw["gate_up"], b["a"], epilogue="swiglu", **LOWREG)
        G.q5_gemv_lowreg(b["a"], lw["down"], x_out, epilogue="residual", residual=x_in, workspace=b["ws"],
                         **{**LOWREG, **down})
        L.bf16_gemv(b["h"], lw["small"], b["small"][i], BLOCK_N=16, BLOCK_K=256, SPLIT_K=1,
                    PDL_PREFETCH_BYTES=16384)
        w8_gemv_tc(b["h"], lw["w8"], b["w8"][i], num_warps=4, PDL_PREFETCH_BYTES=16384)
    return [b["x"][LAYERS % 2], b["small"], b["w8"]]


@pytest.mark.parametrize("down", [{"SPLIT_K": 1}, {"SPLIT_K": 2, "REDUCE": "kernel"}, {"SPLIT_K": 2, "REDUCE": "fused"}],
                         ids=["one_split", "reduce_launch", "fused_reduce"])
@pytest.mark.parametrize("early", ["0", "1"])
def test_pdl_graph_matches_plain_launches_bitwise(monkeypatch, early, down):
    assert pdl.available(), "PDL needs sm_90+ outside the interpreter"
    gen = torch.Generator().manual_seed(0)
    layers = _model(gen)
    x0 = torch.randn(1, H, generator=gen).bfloat16().to(DEV)
    plain = _buffers(x0, down)
    want = [t.clone() for t in _chain(layers, plain, down)]
    torch.cuda.synchronize()

    monkeypatch.setenv("NINFER_PDL_EARLY", early)
    b = _buffers(x0, down)
    old = pdl.allow(True)
    try:
        _chain(layers, b, down)  # warm: compile the PDL specialisations outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = _chain(layers, b, down)
    finally:
        pdl.allow(old)
    for _ in range(3):
        b["x"][0].copy_(x0)
        for t in outs[1:]:
            t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for got, ref, what in zip(outs, want, ("residual stream", "bf16 GEMV", "W8 GEMV")):
            assert torch.equal(got, ref), f"NINFER_PDL_EARLY={early} {down}: {what} differs from plain launches"
