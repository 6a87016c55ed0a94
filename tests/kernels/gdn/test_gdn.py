"""Gated DeltaNet kernels vs the sequential fp32 reference."""

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels.gdn import launch, reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(T, Hk, Hv, Dk, Dv, slots_n, seed):
    g_ = torch.Generator().manual_seed(seed)
    q = torch.randn(T, Hk, Dk, generator=g_).bfloat16()
    k = torch.randn(T, Hk, Dk, generator=g_).bfloat16()
    v = torch.randn(T, Hv, Dv, generator=g_).bfloat16()
    a = torch.randn(T, Hv, generator=g_).bfloat16()
    b = torch.randn(T, Hv, generator=g_).bfloat16()
    a_log = torch.log(torch.rand(Hv, generator=g_) * 8 + 0.5)
    dt_bias = torch.randn(Hv, generator=g_)
    g, beta = reference.gdn_gating(a, b, a_log, dt_bias)
    state = 0.3 * torch.randn(slots_n, Hv, Dk, Dv, generator=g_)
    return q, k, v, a, b, a_log, dt_bias, g, beta, state


def test_gating():
    q, k, v, a, b, a_log, dt_bias, g, beta, _ = _inputs(5, 1, 6, 16, 16, 1, 0)
    a = a * 30  # exercise the softplus threshold branch
    g_ref, beta_ref = reference.gdn_gating(a, b, a_log, dt_bias)
    go = torch.empty(5, 6, device=DEV)
    bo = torch.empty(5, 6, device=DEV)
    launch.gdn_gating(a.to(DEV), b.to(DEV), a_log.to(DEV), dt_bias.to(DEV), go, bo)
    torch.testing.assert_close(go.cpu(), g_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(bo.cpu(), beta_ref, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("T,Hk,Hv,Dk,Dv", [(1, 2, 6, 16, 16), (3, 1, 2, 32, 48), (5, 2, 4, 128, 32)])
def test_decode_multi_slot(T, Hk, Hv, Dk, Dv):
    q, k, v, a, b, a_log, dt_bias, g, beta, state = _inputs(T, Hk, Hv, Dk, Dv, 7, T + Dk)
    slots = torch.tensor([5, 0, 3, 6, 1][:T], dtype=torch.int32)
    pos = torch.tensor([9, 0, 4, 1, 77][:T], dtype=torch.int32)
    o_ref, s_ref = reference.gated_delta_rule(q, k, v, g, beta, state, pos, slots)
    sd = state.clone().to(DEV)
    o = torch.empty(T, Hv, Dv, dtype=torch.bfloat16, device=DEV)
    launch.gated_delta_rule_decode(q.to(DEV), k.to(DEV), v.to(DEV), g.to(DEV), beta.to(DEV), sd,
                                   pos.to(DEV), slots.to(DEV), o)
    torch.testing.assert_close(o.float().cpu(), o_ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(sd.cpu(), s_ref, atol=1e-4, rtol=1e-4)


def _chunked(T, Hk, Hv, Dk, Dv, p0, seed, atol=2e-2, chunk=64):
    q, k, v, a, b, a_log, dt_bias, g, beta, state = _inputs(T, Hk, Hv, Dk, Dv, 3, seed)
    slots = torch.full((T,), 2, dtype=torch.int32)
    pos = torch.arange(p0, p0 + T, dtype=torch.int32)
    o_ref, s_ref = reference.gated_delta_rule(q, k, v, g, beta, state, pos, slots)
    sd = state.clone().to(DEV)
    o = torch.empty(T, Hv, Dv, dtype=torch.bfloat16, device=DEV)
    ws = torch.empty(launch.chunked_workspace_numel(T, Hv, Dk, Dv), device=DEV)
    launch.gated_delta_rule_chunked(q.to(DEV), k.to(DEV), v.to(DEV), g.to(DEV), beta.to(DEV), sd,
                                    pos.to(DEV), slots.to(DEV), o, ws, chunk=chunk)
    torch.testing.assert_close(o.float().cpu(), o_ref, atol=atol, rtol=2e-2)
    torch.testing.assert_close(sd.cpu(), s_ref, atol=2e-3 if DEV == "cpu" else 2e-2, rtol=1e-2)
    untouched = [i for i in range(3) if i != 2]
    torch.testing.assert_close(sd.cpu()[untouched], state[untouched])


@pytest.mark.parametrize("T", [1, 3, 5, 17, 33, 130])
def test_chunked_matches_recurrent(T):
    _chunked(T, 2, 6, 32, 16, p0=4, seed=T)


def test_chunked_smaller_chunks():
    _chunked(33, 1, 3, 16, 16, p0=2, seed=5, chunk=16)  # three chunks of 16 (the OutOfResources fallback)


@pytest.mark.parametrize("Dk,Dv", [(16, 128), (128, 24)])
def test_chunked_head_dims(Dk, Dv):
    _chunked(70, 1, 2, Dk, Dv, p0=0, seed=Dk)  # position 0: stale slot state ignored


def test_chunked_equals_decode_sequence():
    """Chunked prefill of 5 columns == five decode steps on the same slot."""
    T, Hk, Hv, Dk, Dv = 5, 1, 3, 16, 16
    q, k, v, a, b, a_log, dt_bias, g, beta, state = _inputs(T, Hk, Hv, Dk, Dv, 1, 42)
    s1 = state.clone().to(DEV)
    o1 = torch.empty(T, Hv, Dv, device=DEV)
    zero = torch.zeros(1, dtype=torch.int32, device=DEV)
    for t in range(T):
        launch.gated_delta_rule_decode(q[t:t + 1].to(DEV), k[t:t + 1].to(DEV), v[t:t + 1].to(DEV),
                                       g[t:t + 1].to(DEV), beta[t:t + 1].to(DEV), s1,
                                       torch.tensor([t + 3], dtype=torch.int32, device=DEV), zero, o1[t:t + 1])
    s2 = state.clone().to(DEV)
    o2 = torch.empty(T, Hv, Dv, device=DEV)
    ws = torch.empty(launch.chunked_workspace_numel(T, Hv, Dk, Dv), device=DEV)
    launch.gated_delta_rule_chunked(q.to(DEV), k.to(DEV), v.to(DEV), g.to(DEV), beta.to(DEV), s2,
                                    torch.arange(3, 3 + T, dtype=torch.int32, device=DEV),
                                    torch.zeros(T, dtype=torch.int32, device=DEV), o2, ws)
    torch.testing.assert_close(o1, o2, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(s1, s2, atol=2e-3, rtol=2e-3)


def test_decode_refuses_t_outside_domain():
    T = launch.DECODE_MAX_T + 1
    q, k, v, a, b, a_log, dt_bias, g, beta, state = _inputs(T, 1, 1, 16, 16, 1, 0)
    ids = torch.zeros(T, dtype=torch.int32)
    o = torch.empty(T, 1, 16)
    with pytest.raises(RouteError, match=r"gated_delta_rule_decode: T=65 outside the route domain"):
        launch.gated_delta_rule_decode(q, k, v, g, beta, state, ids, ids, o)


def test_bad_head_ratio():
    q, k, v, a, b, a_log, dt_bias, g, beta, state = _inputs(1, 2, 3, 16, 16, 1, 0)
    ids = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(RouteError, match="multiple of Hk"):
        launch.gated_delta_rule_decode(q, k, v, g, beta, state, ids, ids, torch.empty(1, 3, 16))


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 64, 300])
def test_chunked_27b_heads_gpu(T):
    _chunked(T, 16, 48, 128, 128, p0=1, seed=T, atol=3e-2)


@pytest.mark.gpu
def test_decode_27b_heads_gpu():
    T, Hk, Hv, Dk, Dv = 8, 16, 48, 128, 128
    q, k, v, a, b, a_log, dt_bias, g, beta, state = _inputs(T, Hk, Hv, Dk, Dv, 8, 5)
    slots = torch.arange(T, dtype=torch.int32).flip(0).contiguous()
    pos = torch.arange(T, dtype=torch.int32) * 100
    o_ref, s_ref = reference.gated_delta_rule(q, k, v, g, beta, state, pos, slots)
    sd = state.clone().cuda()
    o = torch.empty(T, Hv, Dv, dtype=torch.bfloat16, device="cuda")
    launch.gated_delta_rule_decode(q.cuda(), k.cuda(), v.cuda(), g.cuda(), beta.cuda(), sd,
                                   pos.cuda(), slots.cuda(), o)
    torch.testing.assert_close(o.float().cpu(), o_ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(sd.cpu(), s_ref, atol=1e-4, rtol=1e-4)
