"""The MoE routes' Triton kernels under the interpreter against the fp32 references, on odd shapes:
T = 1, 3, 5, 17, hidden 96 and expert width 32 (K not a multiple of 128: the row-split padding),
a non-power-of-two expert count, every bank format the contracts use (Q4 gate_up, Q5 / Q6 / W8
down, BF16 / W8 router)."""

from __future__ import annotations

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels.moe import launch as L
from ninfer_compile.kernels.moe import reference as R
from ninfer_compile.kernels.moe.routes import moe_experts_workspace

from _moe_helpers import random_routing, random_weight, rel_rms

H, I = 96, 32


@pytest.mark.parametrize("fmt,E,k,T", [("BF16", 8, 2, 1), ("W8G32_F16S", 8, 2, 16), ("BF16", 8, 8, 3),
                                       ("W8G32_F16S", 40, 4, 1), ("BF16", 20, 3, 37)])
def test_router_matches_reference(fmt, E, k, T):
    """4 rows per program at T = 1 (a GEMV; E + 1 = 9 or 41 rows: a partial last row block), 16 above
    (tl.dot; E + 1 = 21: two row blocks, T = 37: three token blocks, the last partial; top_k = E),
    each launch run twice (its arrival counters must be back at zero)."""
    gen = torch.Generator().manual_seed(E * 100 + T)
    w = random_weight(fmt, E + 1, H, gen, scale=0.2)
    for rep in range(2):
        x = torch.randn(T, H, generator=gen).bfloat16()
        ids = torch.full((T, k), -1, dtype=torch.int32)
        wts = torch.full((T, k), float("nan"))
        gate = torch.full((T,), float("nan"))
        ws = torch.full((T * (E + 1),), float("nan"))
        L.moe_router_split(x, w, ids, wts, gate, k, BLOCK_R=4 if T == 1 else 16, BLOCK_K=32, workspace=ws)
        r_ids, r_w, r_gate = R.moe_router(x, w, k)
        assert torch.equal(ids, r_ids), (ids, r_ids)
        tol = 1e-5 if fmt == "BF16" else 1e-2  # quantized rows are dequantized into bf16 tiles
        assert torch.allclose(wts, r_w, atol=tol) and torch.allclose(wts.sum(-1), torch.ones(T), atol=1e-5)
        assert torch.allclose(gate, r_gate, atol=tol)


def test_router_refuses_small_workspaces_and_narrow_dot_tiles():
    gen = torch.Generator().manual_seed(0)
    w = random_weight("BF16", 9, H, gen)
    out = (torch.zeros(2, 2, dtype=torch.int32), torch.zeros(2, 2), torch.zeros(2))
    with pytest.raises(RouteError, match=">= 18 elements"):
        L.moe_router_split(torch.zeros(2, H).bfloat16(), w, *out, 2, workspace=torch.zeros(5))
    with pytest.raises(RouteError, match="BLOCK_R >= 16"):
        L.moe_router_split(torch.zeros(2, H).bfloat16(), w, *out, 2, BLOCK_R=8, workspace=torch.zeros(18))


class _WS:
    """A view with the operand shapes the workspace hook reads."""

    def __init__(self, **shapes):
        self.shapes = shapes

    def shape(self, name, out=False):
        return self.shapes[name]


def _run_experts(launcher, T, E, k, gu_fmt, down_fmt, seed, **params):
    gen = torch.Generator().manual_seed(seed)
    gate_up = random_weight(gu_fmt, E * 2 * I, H, gen)
    down = random_weight(down_fmt, E * H, I, gen)
    x = torch.randn(T, H, generator=gen).bfloat16()
    ids, wts, gate = random_routing(T, E, k, gen)
    shared = torch.randn(T, H, generator=gen).bfloat16() * 0.1
    residual = torch.randn(T, H, generator=gen).bfloat16() * 0.1  # the routed sum's size: bf16 out keeps it
    out = torch.full((T, H), float("nan")).bfloat16()
    numel = moe_experts_workspace(_WS(gate_up=(E * 2 * I, H), down=(E * H, I), expert_ids=(T, k)), {})
    ws = torch.full((numel,), float("nan"))
    launcher(x, ids, wts, gate_up, down, shared, gate, residual, out, workspace=ws, **params)
    ref = R.moe_experts(x, ids, wts, gate_up, down, shared, gate, residual)
    return out, ref, residual.float() + gate[:, None] * shared.float()


# H 96 / I 32: padded K; BF16 gate_up: FMT 16 tiles; the shipped decode params (ungrouped, fused
# combine) on every shape and format pair, the other tilings / combines on two
@pytest.mark.parametrize("T,E,k,gu,dn,group,combine", [
    (1, 8, 2, "Q4G64_F16S", "Q5G64_F16S", False, "fused"), (3, 8, 2, "Q4G64_F16S", "Q6G64_F16S", False, "fused"),
    (5, 12, 3, "W8G32_F16S", "W8G32_F16S", False, "fused"), (16, 8, 2, "BF16", "Q5G64_F16S", False, "fused"),
    (3, 8, 2, "Q4G64_F16S", "Q6G64_F16S", True, "kernel"), (5, 12, 3, "W8G32_F16S", "W8G32_F16S", True, "fused"),
    (1, 8, 2, "Q4G64_F16S", "Q5G64_F16S", False, "kernel")])
def test_experts_gemv_matches_reference(T, E, k, gu, dn, group, combine):
    """Every tiling (grouped by expert or one pair per tile) and combine (launch or fused into the
    down launch's last arrivals, BLOCK_N 32: three h-blocks of H 96, each with its own counter)."""
    out, ref, no_experts = _run_experts(L.moe_experts_gemv, T, E, k, gu, dn, seed=T, BLOCK_N=32, BLOCK_K=64,
                                        GROUP=group, COMBINE=combine)
    assert rel_rms(out.float(), ref) < 1e-2
    assert rel_rms(no_experts, ref) > 0.1  # the routed sum is a large part of the output


def test_fused_combine_equals_the_combine_launch_and_resets_its_counters():
    """The same inputs through COMBINE kernel and fused, the fused one twice in a row (its arrival
    counters must be back at zero): equal outputs up to fp32 rounding of the weighted sums."""
    outs = [_run_experts(L.moe_experts_gemv, 5, 12, 3, "Q4G64_F16S", "Q5G64_F16S", seed=7, BLOCK_N=32,
                         GROUP=False, COMBINE=c)[0] for c in ("kernel", "fused", "fused")]
    assert (outs[0].float() - outs[1].float()).abs().max() <= 2 ** -7 * outs[0].float().abs().max()
    assert torch.equal(outs[1], outs[2])


@pytest.mark.parametrize("T,E,k,gu,dn,bt", [(1, 8, 2, "Q4G64_F16S", "Q5G64_F16S", 16),
                                            (17, 8, 2, "Q4G64_F16S", "Q6G64_F16S", 16),
                                            (17, 12, 3, "Q4G64_F16S", "Q5G64_F16S", 32)])
def test_experts_grouped_gemm_matches_reference(T, E, k, gu, dn, bt):
    out, ref, no_experts = _run_experts(L.moe_experts_grouped_gemm, T, E, k, gu, dn, seed=T + bt, BLOCK_T=bt,
                                      BLOCK_N=64, BLOCK_K=64)
    assert rel_rms(out.float(), ref) < 1e-2 and rel_rms(no_experts, ref) > 0.1


def test_the_decode_route_refuses_wide_steps_and_small_workspaces():
    with pytest.raises(RouteError, match=r"T=17 columns is outside"):
        _run_experts(L.moe_experts_gemv, 17, 8, 2, "Q4G64_F16S", "Q5G64_F16S", seed=0)
    gen = torch.Generator().manual_seed(0)
    gate_up, down = random_weight("Q4G64_F16S", 8 * 2 * I, H, gen), random_weight("Q5G64_F16S", 8 * H, I, gen)
    x = torch.zeros(1, H).bfloat16()
    ids, wts, gate = random_routing(1, 8, 2, gen)
    with pytest.raises(RouteError, match="workspace"):
        L.moe_experts_gemv(x, ids, wts, gate_up, down, x, gate, x, x.clone(), workspace=torch.zeros(10))
    ws = torch.zeros(moe_experts_workspace(_WS(gate_up=(8 * 2 * I, H), down=(8 * H, I), expert_ids=(1, 2)), {}))
    with pytest.raises(RouteError, match="COMBINE must be"):
        L.moe_experts_gemv(x, ids, wts, gate_up, down, x, gate, x, x.clone(), workspace=ws, COMBINE="atomic")


def test_tile_slots_bound_the_tiles_of_any_routing():
    """The grid covers the worst case: every expert hit (min(E, P)) plus the full tiles."""
    for E, P, bt in ((8, 2, 1), (8, 34, 16), (256, 8192, 64), (256, 8, 8)):
        worst = min(E, P) + P // bt
        counts = [P // min(E, P)] * min(E, P)
        counts[0] += P - sum(counts)
        assert sum(-(-c // bt) for c in counts) <= worst == L.tile_slots(E, P, bt)
