"""The MoE families' CPU path (torch_impl.py) against the fp32 references: the same tokens' rows,
routing and sums (fp32 math, one rounding at the store), on odd shapes and every bank format."""

from __future__ import annotations

import pytest
import torch

from ninfer_compile.kernels.moe import reference as R
from ninfer_compile.kernels.moe import torch_impl as TI

from _moe_helpers import random_routing, random_weight, rel_rms

H, I = 96, 32


@pytest.mark.parametrize("fmt,E,k,T", [("BF16", 8, 2, 1), ("W8G32_F16S", 12, 3, 17)])
def test_torch_router_matches_reference(fmt, E, k, T):
    gen = torch.Generator().manual_seed(T)
    w = random_weight(fmt, E + 1, H, gen, scale=0.2)
    x = torch.randn(T, H, generator=gen).bfloat16()
    ids, wts, gate = torch.empty(T, k, dtype=torch.int32), torch.empty(T, k), torch.empty(T)
    TI.moe_router(x, w, ids, wts, gate, k, BLOCK_K=64)
    r_ids, r_w, r_gate = R.moe_router(x, w, k)
    assert torch.equal(ids, r_ids) and torch.allclose(wts, r_w, atol=1e-6) and torch.allclose(gate, r_gate)


@pytest.mark.parametrize("T,E,k,gu,dn", [(1, 8, 2, "Q4G64_F16S", "Q5G64_F16S"), (5, 12, 3, "Q4G64_F16S", "Q6G64_F16S"),
                                         (17, 8, 8, "W8G32_F16S", "BF16")])
def test_torch_experts_match_reference(T, E, k, gu, dn):
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
