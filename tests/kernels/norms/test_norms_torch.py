"""CPU path of the norm families (`norms/torch_impl.py`) vs the fp32 references and the launchers."""

import pytest
import torch

from ninfer_compile.kernels.norms import reference as ref
from ninfer_compile.kernels.norms import torch_impl as ti


def _close(got, want, tol=8e-3):
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("T,H", [(1, 64), (3, 130), (17, 200), (70, 48)])  # 70 rows: torch ops
def test_rmsnorm(T, H):
    g = torch.Generator().manual_seed(T * H)
    x = (torch.randn(T, 2 * H, generator=g) * 3).bfloat16()[:, :H]  # strided rows
    w = (0.2 * torch.randn(H, generator=g)).bfloat16()
    out = torch.full((T, H), float("nan"), dtype=torch.bfloat16)
    ti.rmsnorm(x, w, out, eps=1e-6, num_warps="auto")
    _close(out, ref.rmsnorm(x, w, 1e-6))


@pytest.mark.parametrize("T,heads,D", [(1, 2, 32), (5, 3, 80)])
def test_head_and_gated(T, heads, D):
    g = torch.Generator().manual_seed(D)
    fused = torch.randn(T, heads, 2 * D, generator=g).bfloat16()
    x, z = fused[..., :D], fused[..., D:]
    w = (0.3 * torch.randn(D, generator=g)).bfloat16()
    out = torch.full((T, heads, D), float("nan"), dtype=torch.bfloat16)
    ti.head_rmsnorm(x, w, out, eps=1e-5)
    _close(out, ref.head_rmsnorm(x, w, 1e-5))
    gout = torch.full((T, heads * D), float("nan"), dtype=torch.bfloat16)
    ti.gated_rmsnorm(x, z, w, gout, eps=1e-5)
    _close(gout, ref.gated_rmsnorm(x, z, w, 1e-5))


def test_matches_launchers():
    from ninfer_compile.kernels.norms import launch

    g = torch.Generator().manual_seed(5)
    x, z = torch.randn(2, 3, 3, 48, generator=g).bfloat16()
    w = (0.3 * torch.randn(48, generator=g)).bfloat16()
    for fn, args, shape in ((("rmsnorm", (x.reshape(3, 144)[:, :48],), (3, 48))),
                            ("head_rmsnorm", (x,), (3, 3, 48)), ("gated_rmsnorm", (x, z), (3, 144))):
        got, want = torch.empty(shape, dtype=torch.bfloat16), torch.empty(shape, dtype=torch.bfloat16)
        getattr(ti, fn)(*args, w, got, eps=1e-6)
        getattr(launch, fn)(*args, w, want, eps=1e-6)
        _close(got, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_rows_match_torch_ops(dtype, monkeypatch):
    """The fused C++ rows (norms/torch_fused.py) vs the torch ops: strided inputs, bf16 / fp32."""
    from ninfer_compile.kernels.norms import torch_fused

    if torch_fused.kernel() is None:
        pytest.skip("no fused CPU kernel here (no compiler)")
    g = torch.Generator().manual_seed(3)
    fused = (torch.randn(3, 5, 2 * 72, generator=g) * 2).to(dtype)
    x, z = fused[..., :72], fused[..., 72:]
    w = (0.3 * torch.randn(72, generator=g)).bfloat16()
    flat = (torch.randn(2, 3 * 100, generator=g) * 4).to(dtype)[:, 50:150]

    def run():
        outs = [torch.full((3, 5, 72), float("nan"), dtype=dtype), torch.full((3, 5 * 72), float("nan"), dtype=dtype),
                torch.full((2, 100), float("nan"), dtype=dtype)]
        ti.head_rmsnorm(x, w, outs[0], eps=1e-5)
        ti.gated_rmsnorm(x, z, w, outs[1], eps=1e-5)
        ti.rmsnorm(flat, w.repeat(2)[:100], outs[2], eps=1e-6)
        return outs

    got = run()
    assert torch_fused.fused_rmsnorm(x, torch.ones(72), torch.empty(3, 5, 72), 1e-5)
    monkeypatch.setattr(ti, "fused_rmsnorm", lambda *a, **k: False)
    want = run()
    for a, b in zip(got, want):
        _close(a, b, tol=1e-2 if dtype == torch.bfloat16 else 1e-5)


def test_fused_gate_silu_over_the_whole_range(monkeypatch):
    """The fused gate's vectorised exp (torch_util.EXP_CPP) vs torch's SiLU: z from -120 to 120
    (beyond exp's fp32 range both ways), rows of 67 (a ragged tail of the 8-wide loop), fp32."""
    from ninfer_compile.kernels.norms import torch_fused

    if torch_fused.kernel() is None:
        pytest.skip("no fused CPU kernel here (no compiler)")
    z = torch.linspace(-120, 120, 9 * 67).view(9, 1, 67)
    x = torch.ones(9, 1, 67)
    w = torch.ones(67).bfloat16()

    def run():
        out = torch.full((9, 67), float("nan"))
        ti.gated_rmsnorm(x, z, w, out, eps=0.0)
        return out

    got = run()
    monkeypatch.setattr(ti, "fused_rmsnorm", lambda *a, **k: False)
    torch.testing.assert_close(got, run(), atol=1e-30, rtol=1e-6)
