"""CPU path of the Gated DeltaNet families (`gdn/torch_impl.py`) vs the sequential fp32 reference:
gating, gating + projections (with the norm prologue), decode columns, chunked prefill runs
(several chunks, from position 0 and mid-sequence, two runs in one launch), verify rows with state
columns; and against the Triton decode launcher on one shape."""

import pytest
import torch

from ninfer_compile.kernels.gdn import reference, torch_impl


def _inputs(T, Hk, Hv, Dk, Dv, n_slots, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(T, Hk, Dk, generator=gen).bfloat16() for _ in range(2))
    v = torch.randn(T, Hv, Dv, generator=gen).bfloat16()
    a, b = (torch.randn(T, Hv, generator=gen).bfloat16() for _ in range(2))
    a_log = torch.log(torch.rand(Hv, generator=gen) * 8 + 0.5)
    dt_bias = torch.randn(Hv, generator=gen)
    g, beta = reference.gdn_gating(a, b, a_log, dt_bias)
    state = 0.3 * torch.randn(n_slots, Hv, Dk, Dv, generator=gen)
    return q, k, v, a, b, a_log, dt_bias, g, beta, state


def _run(q, k, v, g, beta, state, pos, slots, W=0, **kw):
    st = state.clone()
    out = torch.full(v.shape, float("nan"), dtype=torch.bfloat16)
    cols = torch.full((q.shape[0] // W, W - 1, *state.shape[1:]), float("nan")) if W else None
    torch_impl.gated_delta_rule(q, k, v, g, beta, st, pos, slots, out, state_columns=cols, **kw)
    return out, st, cols


def _check(got, ref, tol=2e-2):
    torch.testing.assert_close(got[0].float(), ref[0], atol=tol, rtol=tol)
    torch.testing.assert_close(got[1], ref[1], atol=1e-4, rtol=1e-4)
    if got[2] is not None:
        torch.testing.assert_close(got[2], ref[2], atol=1e-4, rtol=1e-4)


def test_gating_and_proj():
    _, _, _, a, b, a_log, dt_bias, g_ref, beta_ref, _ = _inputs(5, 1, 6, 16, 16, 1, 0)
    g, beta = torch.empty(5, 6), torch.empty(5, 6)
    torch_impl.gdn_gating(a * 30, b, a_log, dt_bias, g, beta)
    rg, rb = reference.gdn_gating(a * 30, b, a_log, dt_bias)
    torch.testing.assert_close(g, rg)
    torch.testing.assert_close(beta, rb)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 130, generator=gen).bfloat16()
    aw, bw = ((0.1 * torch.randn(6, 130, generator=gen)).bfloat16() for _ in range(2))
    g, beta = torch.empty(3, 6), torch.empty(3, 6)
    torch_impl.gdn_gating_proj(x, aw, bw, a_log, dt_bias, g, beta, BLOCK_K=2048)
    rg, rb = reference.gdn_gating_proj(x, aw, bw, a_log, dt_bias)
    torch.testing.assert_close(g, rg, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(beta, rb, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("T", [1, 3, 5, 17])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_gating_proj_matches_torch_ops(T, dtype, monkeypatch):
    """The fused gating projection (gdn/torch_fused.py) vs the torch ops: K = 130 (a ragged tail),
    strided x / g / beta rows, pre-activations on both sides of softplus's threshold."""
    from ninfer_compile.kernels.gdn import torch_fused

    if torch_fused.kernel() is None:
        pytest.skip("no fused CPU kernel here (no compiler / AVX2)")
    gen = torch.Generator().manual_seed(T)
    x = torch.randn(T, 140, generator=gen).to(dtype)[:, 3:133]
    aw, bw = ((0.3 * torch.randn(6, 130, generator=gen)).bfloat16() for _ in range(2))
    a_log, dt_bias = torch.randn(6, generator=gen), torch.tensor([0.0, 25.0, -3.0, 1.0, 19.9, -0.5])

    def run():
        g, beta = torch.full((T, 9), float("nan"))[:, :6], torch.full((T, 8), float("nan"))[:, 1:7]
        torch_impl.gdn_gating_proj(x, aw, bw, a_log, dt_bias, g, beta)
        return g, beta

    fg, fb = run()
    monkeypatch.setattr(torch_impl, "fused_gating_proj", lambda *a: False)
    tg, tb = run()
    torch.testing.assert_close(fg, tg, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fb, tb, atol=1e-6, rtol=1e-5)
    monkeypatch.undo()
    assert not torch_fused.fused_gating_proj(x, aw.float(), bw.float(), -a_log.exp(), dt_bias,
                                             torch.empty(T, 6, dtype=torch.float64), torch.empty(T, 6))


@pytest.mark.parametrize("T,Hk,Hv,Dk,Dv", [(1, 2, 6, 16, 16), (3, 1, 2, 32, 48), (5, 2, 4, 128, 32)])
def test_decode_columns(T, Hk, Hv, Dk, Dv):
    q, k, v, _, _, _, _, g, beta, state = _inputs(T, Hk, Hv, Dk, Dv, 7, T + Dk)
    slots = torch.tensor([5, 0, 3, 6, 1][:T], dtype=torch.int32)
    pos = torch.tensor([9, 0, 4, 1, 77][:T], dtype=torch.int32)
    _check(_run(q, k, v, g, beta, state, pos, slots, scale=0.3, l2_eps=1e-5),
           reference.gated_delta_rule(q, k, v, g, beta, state, pos, slots, scale=0.3, l2_eps=1e-5))


@pytest.mark.parametrize("T,p0", [(17, 0), (150, 5)])
def test_chunked_prefill(T, p0):
    q, k, v, _, _, _, _, g, beta, state = _inputs(T, 1, 2, 32, 16, 3, T)
    slots = torch.full((T,), 2, dtype=torch.int32)
    pos = torch.arange(p0, p0 + T, dtype=torch.int32)
    _check(_run(q, k, v, g, beta, state, pos, slots, chunk=64),
           reference.gated_delta_rule(q, k, v, g, beta, state, pos, slots), tol=3e-2)


def test_two_runs_in_one_launch():
    q, k, v, _, _, _, _, g, beta, state = _inputs(9, 2, 2, 16, 16, 4, 3)
    slots = torch.tensor([1] * 4 + [3] * 5, dtype=torch.int32)
    pos = torch.tensor([0, 1, 2, 3, 6, 7, 8, 9, 10], dtype=torch.int32)
    _check(_run(q, k, v, g, beta, state, pos, slots), reference.gated_delta_rule(q, k, v, g, beta, state, pos, slots))


@pytest.mark.parametrize("R,W", [(1, 2), (3, 4)])
def test_verify_rows(R, W):
    T = R * W
    q, k, v, _, _, _, _, g, beta, state = _inputs(T, 1, 2, 16, 32, 5, R * W)
    slots = torch.tensor([4, 0, 2][:R], dtype=torch.int32).repeat_interleave(W)
    pos = (torch.tensor([0, 3, 50][:R]).repeat_interleave(W) + torch.arange(W).repeat(R)).to(torch.int32)
    _check(_run(q, k, v, g, beta, state, pos, slots, W=W),
           reference.gated_delta_rule(q, k, v, g, beta, state, pos, slots, window=W))


def test_matches_decode_launcher():
    from ninfer_compile.kernels.gdn import launch

    q, k, v, _, _, _, _, g, beta, state = _inputs(2, 1, 2, 16, 16, 3, 8)
    slots, pos = torch.tensor([2, 0], dtype=torch.int32), torch.tensor([4, 9], dtype=torch.int32)
    got = _run(q, k, v, g, beta, state, pos, slots)
    st, out = state.clone(), torch.empty(v.shape, dtype=torch.bfloat16)
    launch.gated_delta_rule_decode(q, k, v, g, beta, st, pos, slots, out)
    torch.testing.assert_close(got[0].float(), out.float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(got[1], st, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_decode_matches_torch_ops(dtype, monkeypatch):
    """The fused C++ decode step (gdn/torch_fused.py) vs the torch ops on strided q / k / v views of
    one projection row (as the plan binds them), a slot at position 0, bf16 and fp32 in / out."""
    from ninfer_compile.kernels.gdn import torch_fused

    if torch_fused.kernel() is None:
        pytest.skip("no fused CPU kernel here (no compiler / AVX2)")
    T, Hk, Hv, Dk, Dv = 3, 2, 4, 48, 40
    gen = torch.Generator().manual_seed(5)
    row = torch.randn(T, 2 * Hk * Dk + Hv * Dv + 8, generator=gen).to(dtype)
    q = row[:, :Hk * Dk].view(T, Hk, Dk)
    k = row[:, Hk * Dk:2 * Hk * Dk].view(T, Hk, Dk)
    v = row[:, 2 * Hk * Dk:2 * Hk * Dk + Hv * Dv].view(T, Hv, Dv)
    g, beta = -torch.rand(T, Hv, generator=gen), torch.rand(T, Hv, generator=gen)
    state = 0.3 * torch.randn(6, Hv, Dk, Dv, generator=gen)
    slots, pos = torch.tensor([4, 1, 2], dtype=torch.int32), torch.tensor([7, 0, 3], dtype=torch.int32)

    def run(fused: bool):
        st, out = state.clone(), torch.full((T, Hv, Dv), float("nan"), dtype=dtype)
        if not fused:
            monkeypatch.setattr(torch_impl, "fused_decode", lambda *a: False)
        else:
            assert torch_fused.fused_decode(q, k, v, g, beta, st.clone(), pos, slots, out.clone(), 0.2, 1e-6)
        torch_impl.gated_delta_rule(q, k, v, g, beta, st, pos, slots, out, scale=0.2)
        monkeypatch.undo()
        return out, st

    (fo, fs), (to, ts) = run(True), run(False)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(fo.float(), to.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(fs, ts, atol=1e-5, rtol=1e-5)
    assert torch.equal(fs[[0, 3, 5]], state[[0, 3, 5]])  # other slots untouched
    dup = torch.tensor([1, 1, 2], dtype=torch.int32)  # a slot twice: not a decode step; torch ops
    assert not torch_fused.fused_decode(q, k, v, g, beta, state.clone(), pos, dup, torch.empty(T, Hv, Dv), 0.2, 1e-6)
