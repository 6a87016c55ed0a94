"""gdn_gating_proj with the RMSNorm prologue (operand norm_weight, attribute norm_eps) vs the fp32
reference rmsnorm -> a / b projections -> gating: odd T (1, 3, 5, 17), K = 96 / 160 (not multiples
of 128) and K larger than one BLOCK_K step (the squares are summed across steps)."""

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels.gdn import launch, reference
from ninfer_compile.kernels.norms.reference import rmsnorm

DEV = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6


def _inputs(T, Hv, K, seed):
    g_ = torch.Generator().manual_seed(seed)
    x = (torch.randn(T, K, generator=g_) * (1 + 20 * torch.rand(T, 1, generator=g_))).bfloat16()
    wa = (torch.randn(Hv, K, generator=g_) / K ** 0.5).bfloat16()
    wb = (torch.randn(Hv, K, generator=g_) / K ** 0.5).bfloat16()
    a_log = torch.log(torch.rand(Hv, generator=g_) * 8 + 0.5)
    dt_bias = torch.randn(Hv, generator=g_)
    nw = (0.3 * torch.randn(K, generator=g_)).bfloat16()
    return x, wa, wb, a_log, dt_bias, nw


CASES = [
    (1, 6, 96, {}),
    (3, 48, 160, {"BLOCK_H": 8, "BLOCK_T": 2, "BLOCK_K": 128, "num_warps": 4}),  # K over two steps
    (5, 6, 160, {"BLOCK_H": 4, "BLOCK_T": 4}),
    (17, 6, 96, {"BLOCK_H": 2, "BLOCK_T": 8, "BLOCK_K": 256}),
    (5, 48, 1100, {"BLOCK_H": 8, "BLOCK_T": 2, "BLOCK_K": 512}),
]


@pytest.mark.parametrize("T,Hv,K,params", CASES, ids=[f"T{c[0]}-Hv{c[1]}-K{c[2]}" for c in CASES])
def test_prologue_matches_reference(T, Hv, K, params):
    x, wa, wb, a_log, dt_bias, nw = _inputs(T, Hv, K, T * 1000 + K)
    g = torch.full((T, Hv), float("nan"), device=DEV)
    beta = torch.full((T, Hv), float("nan"), device=DEV)
    launch.gdn_gating_proj(x.to(DEV), wa.to(DEV), wb.to(DEV), a_log.to(DEV), dt_bias.to(DEV), g, beta,
                           norm_weight=nw.to(DEV), norm_eps=EPS, **params)
    rg, rb = reference.gdn_gating_proj(x, wa, wb, a_log, dt_bias, norm_weight=nw, norm_eps=EPS)
    # the reference is rmsnorm followed by the unnormalised gating projection
    eg, eb = reference.gdn_gating_proj(rmsnorm(x, nw, EPS), wa, wb, a_log, dt_bias)
    torch.testing.assert_close(rg, eg, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rb, eb, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(g.cpu(), rg, atol=2e-4, rtol=2e-5)
    torch.testing.assert_close(beta.cpu(), rb, atol=2e-6, rtol=2e-6)
    # and without the prologue the result differs (the test can fail)
    ug, _ = reference.gdn_gating_proj(x, wa, wb, a_log, dt_bias)
    assert not torch.allclose(ug, rg, atol=1e-3, rtol=1e-3)


def test_prologue_operands_checked():
    x, wa, wb, a_log, dt_bias, nw = _inputs(2, 6, 96, 1)
    g = torch.empty(2, 6)
    beta = torch.empty(2, 6)
    with pytest.raises(RouteError, match="norm_weight and norm_eps come together"):
        launch.gdn_gating_proj(x, wa, wb, a_log, dt_bias, g, beta, norm_weight=nw)
    with pytest.raises(RouteError, match=r"norm_weight must be contiguous bf16 \[96\]"):
        launch.gdn_gating_proj(x, wa, wb, a_log, dt_bias, g, beta, norm_weight=nw.float(), norm_eps=EPS)
    with pytest.raises(RouteError, match="norm_eps must be a finite number"):
        launch.gdn_gating_proj(x, wa, wb, a_log, dt_bias, g, beta, norm_weight=nw, norm_eps=float("nan"))


@pytest.mark.gpu
@pytest.mark.parametrize("T,params", [(1, {"BLOCK_K": 8192, "num_warps": 16}), (3, {}), (8, {"BLOCK_T": 2})])
def test_prologue_gpu_27b_shape(T, params):
    """The 27B's gating projection (Hv 48, K 5120) with the folded input_norm, on the GPU."""
    x, wa, wb, a_log, dt_bias, nw = _inputs(T, 48, 5120, T)
    g = torch.full((T, 48), float("nan"), device="cuda")
    beta = torch.full((T, 48), float("nan"), device="cuda")
    launch.gdn_gating_proj(x.cuda(), wa.cuda(), wb.cuda(), a_log.cuda(), dt_bias.cuda(), g, beta,
                           norm_weight=nw.cuda(), norm_eps=EPS, **params)
    rg, rb = reference.gdn_gating_proj(x, wa, wb, a_log, dt_bias, norm_weight=nw, norm_eps=EPS)
    torch.testing.assert_close(g.cpu(), rg, atol=5e-4, rtol=5e-5)
    torch.testing.assert_close(beta.cpu(), rb, atol=5e-6, rtol=5e-6)
