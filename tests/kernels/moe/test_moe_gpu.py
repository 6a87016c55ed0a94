"""GPU-only checks (run on the GPU machine): the MoE router and both expert routes compiled for the
device at the real qwen3.6-35b-a3b shapes (H 2048, E 256, top-8, I 512) against the fp32
references, uniform routing, T = 1, 3, 8, 17, 64; banks Q4 gate_up + Q5 down, Q4 + Q6 (three
layers) and W8G32 (the MTP layer). Tolerances: the interpreter tests' (test_moe_kernels.py)."""

import pytest
import torch

pytestmark = pytest.mark.gpu

H, E, K, I = 2048, 256, 8, 512
T_POINTS = (1, 3, 8, 17, 64)
BANKS = [("Q4G64_F16S", "Q5G64_F16S"), ("Q4G64_F16S", "Q6G64_F16S"), ("W8G32_F16S", "W8G32_F16S")]


def _compiled_kernels():
    """The MoE kernels as real JITFunctions (not the interpreter's), and the launch module."""
    from triton.runtime.jit import JITFunction

    from ninfer_compile.kernels.interpret import interpreting
    from ninfer_compile.kernels.moe import kernels as KN
    from ninfer_compile.kernels.moe import launch as L

    assert not interpreting(), "TRITON_INTERPRET is set: these tests must run the compiled kernels"
    for name in ("moe_router_split_kernel", "moe_group_kernel", "moe_gate_up_kernel", "moe_down_kernel",
                 "moe_combine_kernel"):
        assert isinstance(getattr(KN, name), JITFunction), name
    return L


def _gen(seed):
    return torch.Generator(device="cuda").manual_seed(seed)


@pytest.fixture(scope="module", params=BANKS, ids=lambda b: f"{b[0][:2]}+{b[1][:2]}")
def banks(request):
    """Random stored banks on the GPU and their fp32 dequantization (the reference's operands)."""
    from ninfer_compile.kernels.linear.reference import dequantize
    from ninfer_compile.tune.measure import random_linear_weight

    gu_fmt, dn_fmt = request.param
    gen = _gen(7)
    gu = random_linear_weight(gu_fmt, E * 2 * I, H, gen)
    dn = random_linear_weight(dn_fmt, E * H, I, gen)
    assert gu.base.is_cuda and dn.base.is_cuda
    yield gu, dn, dequantize(gu), dequantize(dn)
    torch.cuda.empty_cache()


def _rel_rms(out, ref):
    out, ref = out.double(), ref.double()
    return float((out - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30))


@pytest.mark.parametrize("route,params", [("moe_experts_gemv", {}),
                                          ("moe_experts_gemv", {"GROUP": False, "COMBINE": "fused"}),
                                          ("moe_experts_gemv", {"GROUP": True, "COMBINE": "fused"}),
                                          ("moe_experts_grouped_gemm", {})])
def test_expert_routes_match_the_reference_at_35b_shapes(banks, route, params):
    from ninfer_compile.kernels.moe import reference as R
    from ninfer_compile.kernels.moe.routes import GEMV_MAX_T, workspace_layout
    from ninfer_compile.kernels.moe.tune import routing_draw

    L = _compiled_kernels()
    gu, dn, gu32, dn32 = banks
    launcher = getattr(L, route)
    for t in T_POINTS:
        if route == "moe_experts_gemv" and t > GEMV_MAX_T:
            continue
        gen = _gen(t)
        x = torch.randn(t, H, device="cuda", generator=gen).bfloat16()
        ids, wts, gate = routing_draw(t, E, K, gen, "cuda")
        shared = (torch.randn(t, H, device="cuda", generator=gen) * 0.1).bfloat16()
        residual = (torch.randn(t, H, device="cuda", generator=gen) * 0.1).bfloat16()
        out = torch.full((t, H), float("nan"), dtype=torch.bfloat16, device="cuda")
        ws = torch.full((workspace_layout(E, I, H, t * K)["total"],), float("nan"), device="cuda")
        for _ in range(2 if params.get("COMBINE") == "fused" else 1):  # its counters must reset
            launcher(x, ids, wts, gu, dn, shared, gate, residual, out, workspace=ws, **params)
        torch.cuda.synchronize()
        ref = R.moe_experts(x, ids, wts, gu32, dn32, shared, gate, residual)
        err = _rel_rms(out.float(), ref)
        assert err < 1e-2, f"{route} {params} T={t} {gu.format}+{dn.format}: rel RMS {err:.2e}"
        assert _rel_rms(residual.float() + gate[:, None] * shared.float(), ref) > 0.1  # the routed sum counts
    if route == "moe_experts_grouped_gemm":  # a wider tile (several pairs of a hot expert per tile)
        t, hot = 64, K // 2
        ids[:, :hot] = torch.arange(hot, device="cuda", dtype=torch.int32)  # experts 0..hot-1 in every token
        ids[:, hot:] = routing_draw(t, E - hot, K - hot, gen, "cuda")[0] + hot
        launcher(x, ids, wts, gu, dn, shared, gate, residual, out, workspace=ws, BLOCK_T=32, BLOCK_N=128,
                 num_warps=8)
        torch.cuda.synchronize()
        ref = R.moe_experts(x, ids, wts, gu32, dn32, shared, gate, residual)
        assert _rel_rms(out.float(), ref) < 1e-2


@pytest.mark.parametrize("params", [{}, {"BLOCK_R": 16, "BLOCK_K": 256, "num_warps": 8}, {"BLOCK_R": 32}])
def test_router_matches_the_reference_at_35b_shapes(params):
    from ninfer_compile.kernels.moe import reference as R

    L = _compiled_kernels()
    gen = _gen(11)
    w = (torch.randn(E + 1, H, device="cuda", generator=gen) * 0.1).bfloat16()
    for t in T_POINTS:
        x = torch.randn(t, H, device="cuda", generator=gen).bfloat16()
        ids = torch.full((t, K), -1, dtype=torch.int32, device="cuda")
        wts = torch.full((t, K), float("nan"), device="cuda")
        gate = torch.full((t,), float("nan"), device="cuda")
        ws = torch.full((t * (E + 1),), float("nan"), device="cuda")
        for _ in range(2):  # twice: the arrival counters must be back at zero after a launch
            L.moe_router_split(x, w, ids, wts, gate, K, workspace=ws, **params)
        torch.cuda.synchronize()
        r_ids, r_w, r_gate = R.moe_router(x, w, K)
        # rows whose k-th and (k+1)-th logits are closer than fp32 summation-order noise may rank
        # either way; every other row must pick exactly the reference's experts
        top = (x.float() @ w.float().t())[:, :E].topk(K + 1, dim=-1).values
        clear = (top[:, K - 1] - top[:, K]) > 1e-3
        assert clear.any(), f"T={t}: every row is a near-tie"
        assert torch.equal(ids[clear], r_ids[clear]), f"T={t} {params}"
        assert torch.allclose(wts[clear], r_w[clear], atol=1e-5), f"T={t} {params}"
        assert torch.allclose(wts.sum(-1), torch.ones(t, device="cuda"), atol=1e-5)
        assert torch.allclose(gate, r_gate, atol=1e-5)
