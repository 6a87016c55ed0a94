"""The MoE families' CPU path (torch_impl.py) against the fp32 references: the same tokens' rows,
routing and sums (fp32 math, one rounding at the store), on odd shapes and every bank format; both
with the linear family's fused kernel on the banks' row ranges and with it off (the hit experts'
rows dequantized), and never an fp32 copy of a quantized bank."""

from __future__ import annotations

import pytest
import torch

from ninfer_compile.kernels import torch_util
from ninfer_compile.kernels.linear import torch_fused
from ninfer_compile.kernels.moe import reference as R
from ninfer_compile.kernels.moe import torch_impl as TI

from _moe_helpers import random_routing, random_weight, rel_rms

H, I = 96, 32


@pytest.fixture(params=["fused", "fallback"])
def cpu_path(request, monkeypatch):
    """The products through the fused kernel (skipped where it does not build) or with it off."""
    if request.param == "fused" and torch_fused.kernel() is None:
        pytest.skip("the fused CPU kernel does not build or run here")
    if request.param == "fallback":
        monkeypatch.setattr(torch_fused, "kernel", lambda: None)
    return request.param


@pytest.mark.parametrize("fmt,E,k,T", [("BF16", 8, 2, 1), ("W8G32_F16S", 12, 3, 17), ("Q4G64_F16S", 9, 4, 5)])
def test_torch_router_matches_reference(fmt, E, k, T, cpu_path):
    """The same experts; the weights and gate to fp32 rounding, or (a quantized router on the fused
    kernel) to its int16 x: 2^-16 of a group's largest |x| per lane, ~1e-4 of these logits (and a
    softmax moves at most 2 x the largest logit error)."""
    gen = torch.Generator().manual_seed(T)
    w = random_weight(fmt, E + 1, H, gen, scale=0.2)
    x = torch.randn(T, H, generator=gen).bfloat16()
    ids, wts, gate = torch.empty(T, k, dtype=torch.int32), torch.empty(T, k), torch.empty(T)
    TI.moe_router(x, w, ids, wts, gate, k, BLOCK_K=64)
    r_ids, r_w, r_gate = R.moe_router(x, w, k)
    tol = 3e-4 if cpu_path == "fused" and fmt != "BF16" else 1e-6
    assert torch.equal(ids, r_ids)
    assert (wts - r_w).abs().max() < tol and (gate - r_gate).abs().max() < tol


@pytest.mark.parametrize("T,E,k,gu,dn", [(1, 8, 2, "Q4G64_F16S", "Q5G64_F16S"), (5, 12, 3, "Q4G64_F16S", "Q6G64_F16S"),
                                         (17, 8, 8, "W8G32_F16S", "BF16")])
def test_torch_experts_match_reference(T, E, k, gu, dn, cpu_path):
    gen = torch.Generator().manual_seed(T + E)
    gate_up, down = random_weight(gu, E * 2 * I, H, gen), random_weight(dn, E * H, I, gen)
    x = torch.randn(T, H, generator=gen).bfloat16()
    ids, wts, gate = random_routing(T, E, k, gen)
    shared, residual = (torch.randn(T, H, generator=gen).bfloat16() * 0.1 for _ in range(2))
    out = torch.full((T, H), float("nan")).bfloat16()
    TI.moe_experts(x, ids, wts, gate_up, down, shared, gate, residual, out, workspace=None, BLOCK_N=32)
    ref = R.moe_experts(x, ids, wts, gate_up, down, shared, gate, residual)
    assert rel_rms(out.float(), ref) < 4e-3  # one bf16 rounding
    assert rel_rms(residual.float() + gate[:, None] * shared.float(), ref) > 0.1


@pytest.mark.parametrize("T,E,k,i,gu,dn", [(1, 6, 4, 40, "Q6G64_F16S", "W8G32_F16S"),
                                           (3, 5, 3, 24, "Q5G64_F16S", "Q4G64_F16S"),
                                           (17, 4, 3, 40, "Q4G64_F16S", "Q5G64_F16S")])
def test_torch_experts_fp32_sums_and_no_fp32_banks(T, E, k, i, gu, dn, cpu_path):
    """An fp32 `out` (no store rounding): the only error left is the fused kernel's int16 x (2^-16
    of a group's largest |x|; none on the fallback). Few experts for many pairs (each hit several
    times), K = I not a multiple of the group; the same again is bit-identical; no bank is
    dequantized whole (nothing cached for it)."""
    gen = torch.Generator().manual_seed(100 * T + i)
    gate_up, down = random_weight(gu, E * 2 * i, H, gen), random_weight(dn, E * H, i, gen)
    x = torch.randn(T, H, generator=gen).bfloat16()
    ids, wts, gate = random_routing(T, E, k, gen)
    shared, residual = torch.randn(T, H, generator=gen) * 0.1, torch.randn(T, H, generator=gen) * 0.1
    outs = []
    for _ in range(2):
        outs.append(torch.full((T, H), float("nan")))
        TI.moe_experts(x, ids, wts, gate_up, down, shared, gate, residual, outs[-1])
    ref = R.moe_experts(x, ids, wts, gate_up, down, shared, gate, residual)
    base = residual + gate[:, None] * shared  # the experts' sum is compared on its own
    assert rel_rms(outs[0] - base, ref - base) < (2e-4 if cpu_path == "fused" else 1e-6)
    assert torch.equal(outs[0], outs[1])
    assert torch_util.cached_fp32_weight(gate_up) is None and torch_util.cached_fp32_weight(down) is None
    moved = ids.clone()
    moved[0, 0] = (ids[0, 0] + 1) % E if (ids[0] != (ids[0, 0] + 1) % E).all() else (ids[0, 0] + 2) % E
    TI.moe_experts(x, moved, wts, gate_up, down, shared, gate, residual, outs[1])
    assert rel_rms(outs[1] - base, ref - base) > 1e-2  # the routing matters


def test_torch_experts_refuse_banks_that_disagree():
    gen = torch.Generator().manual_seed(0)
    gate_up, down = random_weight("Q4G64_F16S", 4 * 2 * I, H, gen), random_weight("Q4G64_F16S", 3 * H, I, gen)
    x, ids, wts, gate = torch.randn(1, H), torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, 1), torch.ones(1)
    with pytest.raises(Exception, match="do not describe E experts"):
        TI.moe_experts(x, ids, wts, gate_up, down, x, gate, x, torch.empty(1, H))
