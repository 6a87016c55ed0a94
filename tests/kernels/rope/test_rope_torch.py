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


def test_matches_launcher():
    from ninfer_compile.kernels.rope import launch

    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 2, 48, generator=g).bfloat16()
    pos = torch.tensor([0, 17, 2900], dtype=torch.int32)
    got, want = torch.empty_like(x), torch.empty_like(x)
    torch_impl.rope(x, pos, got, 16, 1e4)
    launch.rope(x, pos, want, 16, 1e4)
    _close(got, want, tol=1e-2)
