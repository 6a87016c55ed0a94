"""CPU path of the RoPE families (`rope/torch_impl.py`) vs the fp32 references and the launchers."""

import pytest
import torch

from ninfer_compile.kernels.rope import reference, torch_impl


def _close(a, b, tol=2e-2):
    torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("T,heads,D,rot", [(1, 2, 32, 8), (3, 3, 80, 20), (5, 1, 64, 64), (17, 2, 256, 64)])
def test_rope(T, heads, D, rot):
    g = torch.Generator().manual_seed(D + T)
    x = torch.randn(T, heads, D, generator=g).bfloat16()
    pos = torch.randint(0, 3000, (T,), generator=g, dtype=torch.int32)
    want = reference.rope(x, pos, rot, 1e7)
    out = torch.full_like(x, float("nan"))
    torch_impl.rope(x, pos, out, rot, 1e7)
    _close(out, want)
    torch_impl.rope(x, pos, x, rotary_dim=rot, theta=1e7)  # in place
    _close(x, want)


@pytest.mark.parametrize("T,hq,hk,D,rot", [(1, 4, 2, 32, 8), (5, 6, 1, 96, 32), (3, 3, 1, 256, 64)])
def test_qk_norm_rope(T, hq, hk, D, rot):
    g = torch.Generator().manual_seed(11)
    fused = torch.randn(T, hq, 2 * D, generator=g).bfloat16()
    q = fused[:, :, :D]
    k = torch.randn(T, hk, D, generator=g).bfloat16()
    qw = (0.1 * torch.randn(D, generator=g)).bfloat16()
    kw = (0.1 * torch.randn(D, generator=g)).bfloat16()
    pos = torch.randint(0, 5000, (T,), generator=g, dtype=torch.int32)
    rq, rk = reference.qk_norm_rope(q, k, qw, kw, pos, 1e-6, rot, 1e7)
    torch_impl.qk_norm_rope(q, k, qw, kw, pos, q, k, eps=1e-6, rotary_dim=rot, theta=1e7)  # aliased outputs
    _close(q, rq)
    _close(k, rk)


@pytest.mark.parametrize("T", [1, 3, 5, 17])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_qk_norm_rope_matches_torch_ops(T, dtype, monkeypatch):
    """The fused C++ qk_norm_rope (rope/torch_fused.py) vs the torch ops: q a strided view of a wider
    row, outputs aliasing the inputs, int64 positions, D = 80 with a partial rotary 20."""
    from ninfer_compile.kernels.rope import torch_fused

    if torch_fused.kernel() is None:
        pytest.skip("no fused CPU kernel here (no compiler)")
    g = torch.Generator().manual_seed(T)
    row = torch.randn(T, 3, 2 * 80, generator=g).to(dtype)
    k0 = torch.randn(T, 1, 80, generator=g).to(dtype)
    qw, kw = ((0.1 * torch.randn(80, generator=g)).bfloat16() for _ in range(2))
    pos = torch.randint(0, 100000, (T,), generator=g)

    def run():
        r, k = row.clone(), k0.clone()
        q = r[:, :, 40:120]
        torch_impl.qk_norm_rope(q, k, qw, kw, pos, q, k, eps=1e-6, rotary_dim=20, theta=1e7)
        return r, k

    fr, fk = run()
    monkeypatch.setattr(torch_impl, "fused_qk_norm_rope", lambda *a: False)
    tr, tk = run()
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-5
    torch.testing.assert_close(fr, tr, atol=tol, rtol=tol)
    torch.testing.assert_close(fk, tk, atol=tol, rtol=tol)
    assert torch.equal(fr[:, :, :40], row[:, :, :40]) and torch.equal(fr[:, :, 120:], row[:, :, 120:])


def test_matches_launcher():
    from ninfer_compile.kernels.rope import launch

    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 2, 48, generator=g).bfloat16()
    pos = torch.tensor([0, 17, 2900], dtype=torch.int32)
    got, want = torch.empty_like(x), torch.empty_like(x)
    torch_impl.rope(x, pos, got, 16, 1e4)
    launch.rope(x, pos, want, 16, 1e4)
    _close(got, want, tol=1e-2)
