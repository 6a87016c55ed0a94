"""Norm family kernels vs the fp32 references (TRITON_INTERPRET=1 on CPU)."""

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels.norms import launch, reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _close(a, b, tol=2e-2):
    torch.testing.assert_close(a.float().cpu(), b.float().cpu(), atol=tol, rtol=tol)


@pytest.mark.parametrize("T,H", [(1, 40), (3, 96), (5, 200), (17, 5120 // 16)])
def test_rmsnorm(T, H):
    g = torch.Generator().manual_seed(T * H)
    x = torch.randn(T, H, generator=g).bfloat16().to(DEV)
    w = (0.1 * torch.randn(H, generator=g)).bfloat16().to(DEV)
    out = torch.empty(T, H, dtype=torch.bfloat16, device=DEV)
    assert launch.rmsnorm(x, w, out, 1e-6) is None
    _close(out, reference.rmsnorm(x.cpu(), w.cpu(), 1e-6))


@pytest.mark.parametrize("T,heads,D", [(1, 3, 24), (5, 2, 80), (33, 1, 256)])
def test_head_rmsnorm_strided(T, heads, D):
    g = torch.Generator().manual_seed(7)
    big = torch.randn(T, heads, 2 * D, generator=g).bfloat16().to(DEV)
    x = big[:, :, :D]  # strided view, as a slice of a fused [q | gate] projection
    w = (0.1 * torch.randn(D, generator=g)).bfloat16().to(DEV)
    out = torch.empty(T, heads, D, dtype=torch.bfloat16, device=DEV)
    launch.head_rmsnorm(x, w, out, 1e-6)
    _close(out, reference.head_rmsnorm(x.cpu(), w.cpu(), 1e-6))


@pytest.mark.parametrize("T,heads,D", [(1, 6, 32), (5, 3, 80), (3, 2, 128)])
def test_gated_rmsnorm(T, heads, D):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(T, heads, D, generator=g).bfloat16().to(DEV)
    z = torch.randn(T, heads, D, generator=g).bfloat16().to(DEV)
    w = (1 + 0.1 * torch.randn(D, generator=g)).bfloat16().to(DEV)
    out = torch.empty(T, heads * D, dtype=torch.bfloat16, device=DEV)
    launch.gated_rmsnorm(x, z, w, out, 1e-6)
    _close(out, reference.gated_rmsnorm(x.cpu(), z.cpu(), w.cpu(), 1e-6))


def test_shape_error():
    from ninfer_compile.errors import RouteError

    x = torch.zeros(2, 8, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(RouteError, match="rmsnorm"):
        launch.rmsnorm(x, torch.zeros(4, device=DEV), torch.empty_like(x))


@pytest.mark.gpu
def test_rmsnorm_27b_shape_gpu():
    x = torch.randn(64, 5120, device="cuda").bfloat16()
    w = (0.1 * torch.randn(5120, device="cuda")).bfloat16()
    for nw in ("auto", 1, 4, 16):   # the tuner's num_warps choices
        out = torch.empty_like(x)
        launch.rmsnorm(x, w, out, 1e-6, num_warps=nw)
        _close(out, reference.rmsnorm(x.cpu(), w.cpu(), 1e-6))


def test_rmsnorm_num_warps_param():
    x = torch.randn(3, 200).bfloat16().to(DEV)
    w = (0.1 * torch.randn(200)).bfloat16().to(DEV)
    out = torch.empty_like(x)
    launch.rmsnorm(x, w, out, 1e-6, num_warps=2)
    _close(out, reference.rmsnorm(x.cpu(), w.cpu(), 1e-6))
    with pytest.raises(RouteError, match="num_warps"):
        launch.rmsnorm(x, w, out, 1e-6, num_warps=3)
