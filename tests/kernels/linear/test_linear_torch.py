"""The CPU path of the linear family (`linear/torch_impl.py`) against the fp32 reference for every
weight format and epilogue on odd shapes, and against a Triton launcher (interpreter) on a few.

Quantized weights at up to `MAX_COLUMNS` columns take the fused kernel (`torch_fused`) or the
packed products (`torch_packed`), here from the first weight on, each path in turn (the packed
products' bf16 scales and products set the tolerance, that of the GPU's bf16-weight routes, 1e-2); bf16 weights and wider products the exact fp32 matrix (one rounding at the store, 4e-3)."""

import pytest
import torch

from ninfer_compile.kernels.linear import torch_impl
from ninfer_compile.kernels.linear.reference import linear as ref_linear
from ninfer_compile.kernels.linear import torch_fused, torch_packed
from ninfer_compile.kernels.torch_util import fp32_weight

from _linear_helpers import assert_close_rel, random_weight

FORMATS = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S", "BF16"]


def _case(fmt, t, n, k, epi, seed, view=None):
    gen = torch.Generator().manual_seed(seed)
    if view is None:
        w = random_weight(fmt, n, k, gen)
    else:
        w = random_weight(fmt, view[1], k, gen)
        w = w.rows(view[0], n) if fmt != "BF16" else w[view[0]:view[0] + n]
    x = torch.randn(t, k, generator=gen).bfloat16()
    n_out = n // 2 if epi == "swiglu" else n
    res = torch.randn(t, n_out, generator=gen).bfloat16() if epi == "residual" else None
    return w, x, res, n_out


@pytest.fixture(autouse=True, params=["fused", "native"])
def packed_from_the_first_weight(request, monkeypatch):
    """Few-column products from the first weight on, through the fused C++ kernel (where it builds
    here) and through torch's int4 / int8 matmuls (the fallback)."""
    monkeypatch.setattr(torch_packed, "MIN_PARAMS", 0)
    if request.param == "native":
        monkeypatch.setattr(torch_fused, "kernel", lambda: None)
    elif torch_fused.kernel() is None:
        pytest.skip("the fused CPU kernel does not build or run here")


def _tol(fmt: str, t: int) -> float:
    return 1e-2 if fmt != "BF16" and t <= torch_packed.MAX_COLUMNS else 4e-3


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("epi", ["none", "swiglu", "residual"])
@pytest.mark.parametrize("t", [1, 3, 17])
def test_matches_reference(fmt, epi, t):
    w, x, res, n_out = _case(fmt, t, 40, 200, epi, seed=t * 7 + len(epi))
    out = torch.full((t, n_out), float("nan"), dtype=torch.bfloat16)
    torch_impl.linear(x, w, out, residual=res, epilogue=epi, workspace=None, BLOCK_N=8, SPLIT_K=2)
    assert_close_rel(out, ref_linear(x, w, epi, res), tol=_tol(fmt, t), what=f"{fmt} {epi} T={t}")


@pytest.mark.parametrize("fmt", ["Q5G64_F16S", "BF16"])
def test_row_view_and_residual_alias(fmt):
    w, x, res, n_out = _case(fmt, 5, 24, 320, "residual", seed=3, view=(16, 72))
    expected = ref_linear(x, w, "residual", res)
    out = res.clone()
    torch_impl.linear(x, w, out, residual=out, epilogue="residual")
    assert_close_rel(out, expected, tol=_tol(fmt, 5), what=f"{fmt} view, residual aliasing out")


def test_weight_dequantized_once_per_object():
    gen = torch.Generator().manual_seed(1)
    w = random_weight("Q4G64_F16S", 16, 64, gen)
    first = fp32_weight(w)
    assert fp32_weight(w) is first
    assert fp32_weight(w.rows(0, 8)) is not first  # another object, its own entry
    torch.testing.assert_close(fp32_weight(w.rows(0, 8)), first[:8])


@pytest.mark.parametrize("fmt,epi", [("Q4G64_F16S", "swiglu"), ("W8G32_F16S", "residual")])
def test_matches_triton_launcher(fmt, epi):
    from ninfer_compile.kernels.linear import launch as L

    route = {"Q4G64_F16S": "q4_gemv", "W8G32_F16S": "w8_gemv"}[fmt]
    w, x, res, n_out = _case(fmt, 3, 40, 192, epi, seed=11)
    got = torch.empty(3, n_out, dtype=torch.bfloat16)
    want = torch.empty(3, n_out, dtype=torch.bfloat16)
    torch_impl.linear(x, w, got, residual=res, epilogue=epi)
    getattr(L, route)(x, w, want, residual=res, epilogue=epi, BLOCK_N=8, BLOCK_K=128)
    assert_close_rel(got, want, tol=_tol(fmt, 3), what=f"{route} {epi}")
