"""RoPE family kernels vs the fp32 references."""

import pytest
import torch

from ninfer_compile.kernels.rope import launch, reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _close(a, b, tol=2e-2):
    torch.testing.assert_close(a.float().cpu(), b.float().cpu(), atol=tol, rtol=tol)


@pytest.mark.parametrize("T,heads,D,rot", [(1, 2, 32, 8), (3, 3, 80, 20), (5, 1, 64, 64), (17, 2, 256, 64)])
def test_rope(T, heads, D, rot):
    g = torch.Generator().manual_seed(D + T)
    x = torch.randn(T, heads, D, generator=g).bfloat16().to(DEV)
    pos = torch.randint(0, 3000, (T,), generator=g, dtype=torch.int32).to(DEV)
    out = torch.empty_like(x)
    launch.rope(x, pos, out, rot, 1e7)
    _close(out, reference.rope(x.cpu(), pos.cpu(), rot, 1e7))


def test_rope_in_place():
    x = torch.randn(5, 2, 48).bfloat16().to(DEV)
    pos = torch.tensor([0, 1, 2, 900, 4000], dtype=torch.int32, device=DEV)
    ref = reference.rope(x.cpu(), pos.cpu(), 16, 1e4)
    launch.rope(x, pos, x, 16, 1e4)
    _close(x, ref)


@pytest.mark.parametrize("T,hq,hk,D,rot", [(1, 4, 2, 32, 8), (5, 6, 1, 96, 32), (3, 3, 1, 256, 64)])
def test_qk_norm_rope(T, hq, hk, D, rot):
    g = torch.Generator().manual_seed(11)
    fused = torch.randn(T, hq, 2 * D, generator=g).bfloat16().to(DEV)
    q = fused[:, :, :D]  # strided: q half of a [q | gate] projection
    k = torch.randn(T, hk, D, generator=g).bfloat16().to(DEV)
    qw = (0.1 * torch.randn(D, generator=g)).bfloat16().to(DEV)
    kw = (0.1 * torch.randn(D, generator=g)).bfloat16().to(DEV)
    pos = torch.randint(0, 500, (T,), generator=g, dtype=torch.int32).to(DEV)
    qo = torch.empty(T, hq, D, dtype=torch.bfloat16, device=DEV)
    ko = torch.empty(T, hk, D, dtype=torch.bfloat16, device=DEV)
    launch.qk_norm_rope(q, k, qw, kw, pos, qo, ko, 1e-6, rot, 1e7)
    rq, rk = reference.qk_norm_rope(q.cpu(), k.cpu(), qw.cpu(), kw.cpu(), pos.cpu(), 1e-6, rot, 1e7)
    _close(qo, rq)
    _close(ko, rk)


def test_bad_rotary_dim():
    from ninfer_compile.errors import RouteError

    x = torch.zeros(1, 1, 32, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(RouteError, match="rotary_dim"):
        launch.rope(x, torch.zeros(1, dtype=torch.int32, device=DEV), x, 33, 1e4)
