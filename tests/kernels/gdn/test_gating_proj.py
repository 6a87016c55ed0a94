"""gdn_gating_proj (a/b projections + gating, one launch) vs the composed fp32 reference."""

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels.gdn import launch, reference
from ninfer_compile.kernels.registry import default_registry

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(T, Hv, K, seed, a_scale=1.0):
    g_ = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K, generator=g_).bfloat16()
    wa = (a_scale * torch.randn(Hv, K, generator=g_) / K ** 0.5).bfloat16()
    wb = (torch.randn(Hv, K, generator=g_) / K ** 0.5).bfloat16()
    a_log = torch.log(torch.rand(Hv, generator=g_) * 8 + 0.5)
    dt_bias = torch.randn(Hv, generator=g_)
    return x, wa, wb, a_log, dt_bias


def _run(x, wa, wb, a_log, dt_bias, dev=DEV, **params):
    T, Hv = x.shape[0], wa.shape[0]
    g = torch.full((T, Hv), float("nan"), device=dev)
    beta = torch.full((T, Hv), float("nan"), device=dev)
    launch.gdn_gating_proj(x.to(dev), wa.to(dev), wb.to(dev), a_log.to(dev), dt_bias.to(dev), g, beta, **params)
    return g.cpu(), beta.cpu()


def _check(T, Hv, K, seed, params, a_scale=1.0, dev=DEV):
    x, wa, wb, a_log, dt_bias = _inputs(T, Hv, K, seed, a_scale)
    g, beta = _run(x, wa, wb, a_log, dt_bias, dev=dev, **params)
    rg, rb = reference.gdn_gating_proj(x, wa, wb, a_log, dt_bias)
    assert g.dtype == torch.float32 and beta.dtype == torch.float32 and g.shape == (T, Hv)
    # fp32 accumulation in another order: a few ulp of |a| ~ 1..30, times exp(A_log) <= 8.5
    torch.testing.assert_close(g, rg, atol=2e-4 * a_scale, rtol=2e-5)
    torch.testing.assert_close(beta, rb, atol=2e-6, rtol=2e-6)
    # the reference is the existing gating of the linear references
    from ninfer_compile.kernels.linear.reference import linear

    eg, eb = reference.gdn_gating(linear(x, wa), linear(x, wb), a_log, dt_bias)
    assert torch.equal(eg, rg) and torch.equal(eb, rb)


# (T, Hv, K, params): odd T, K not a multiple of 128, Hv 6 / 48; params keep the interpreter's
# program count small where the shape is large, and exercise partial head / token / K blocks.
CASES = [
    (1, 6, 200, {}),
    (1, 48, 5120, {}),
    (3, 6, 200, {}),
    (3, 48, 200, {"BLOCK_H": 8, "BLOCK_T": 2, "BLOCK_K": 256, "num_warps": 4}),
    (5, 48, 200, {"BLOCK_H": 4, "BLOCK_T": 2}),
    (5, 6, 5120, {"BLOCK_H": 4, "BLOCK_T": 4, "BLOCK_K": 1024}),
    (17, 6, 5120, {"BLOCK_H": 2, "BLOCK_T": 4, "BLOCK_K": 1024}),
    (17, 48, 200, {"BLOCK_H": 8, "BLOCK_T": 8, "BLOCK_K": 512}),
    (33, 6, 200, {}),
    (3, 6, 5120, {"BLOCK_K": 8192}),  # one K step wider than K
    (33, 48, 5120, {"BLOCK_H": 8, "BLOCK_T": 8, "BLOCK_K": 1024}),
]


@pytest.mark.parametrize("T,Hv,K,params", CASES, ids=lambda v: str(v))
def test_gating_proj_matches_reference(T, Hv, K, params):
    _check(T, Hv, K, T * 7 + Hv + K, params)


def test_gating_proj_softplus_threshold():
    # large |a| exercises softplus' linear branch (a + dt_bias > 20) and saturated sigmoid
    _check(4, 6, 200, 3, {"BLOCK_H": 2}, a_scale=60.0)


def test_gating_proj_strided_x():
    x, wa, wb, a_log, dt_bias = _inputs(3, 6, 200, 1)
    wide = torch.zeros(3, 256, dtype=torch.bfloat16)
    wide[:, :200] = x
    g, beta = _run(wide[:, :200], wa, wb, a_log, dt_bias)
    rg, rb = reference.gdn_gating_proj(x, wa, wb, a_log, dt_bias)
    torch.testing.assert_close(g, rg, atol=2e-4, rtol=2e-5)
    torch.testing.assert_close(beta, rb, atol=2e-6, rtol=2e-6)


def test_gating_proj_refuses_t_outside_domain_and_bad_shapes():
    x, wa, wb, a_log, dt_bias = _inputs(launch.GATING_PROJ_MAX_T + 1, 6, 200, 0)
    with pytest.raises(RouteError, match=f"T={launch.GATING_PROJ_MAX_T + 1} outside the route domain"):
        _run(x, wa, wb, a_log, dt_bias)
    with pytest.raises(RouteError, match="T=0 outside"):
        _run(x[:0], wa, wb, a_log, dt_bias)
    x = x[:2]
    with pytest.raises(RouteError, match="shapes"):
        _run(x, wa, wb[:5], a_log, dt_bias)
    with pytest.raises(RouteError, match="shapes"):
        _run(x[:, :100], wa, wb, a_log, dt_bias)
    with pytest.raises(RouteError, match="must be bf16"):
        _run(x, wa.float(), wb, a_log, dt_bias)
    g = torch.empty(2, 6, dtype=torch.bfloat16)
    with pytest.raises(RouteError, match="contiguous float32"):
        launch.gdn_gating_proj(x, wa, wb, a_log, dt_bias, g, torch.empty(2, 6))


def test_route_domain_is_decode_verify_t128():
    (r,) = default_registry.routes_for("gdn_gating_proj")
    assert r.name == "gdn_gating_proj_rows" and r.domain.max_t == launch.GATING_PROJ_MAX_T == 128
    m = {"format": "BF16", "n": 48, "k": 5120, "phase": "decode"}
    assert r.covers(1, 128, m) is None
    assert r.covers(1, 72, {**m, "phase": "verify"}) is None  # a verify extent: C*W = 8*9 columns
    assert "exceeds" in r.covers(1, 129, m)
    assert "phase" in r.covers(1, 8, {**m, "phase": "prefill"})
    assert "format" in r.covers(1, 8, {**m, "format": "Q4G64_F16S"})
    assert callable(r.load_reference()) and callable(r.load_launcher())


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 4])
def test_gating_proj_27b_shape_gpu(T):
    """The 27B shape (Hv 48, hidden 5120) on the GPU, default params and a few tuning points."""
    for params in ({}, {"BLOCK_H": 2, "BLOCK_K": 1024, "num_warps": 4}, {"BLOCK_T": 4, "BLOCK_K": 512},
                   {"BLOCK_K": 8192, "num_warps": 16}, {"BLOCK_K": 8192, "BLOCK_T": 2, "num_warps": 16}):
        _check(T, 48, 5120, 11 + T, params, dev="cuda")
