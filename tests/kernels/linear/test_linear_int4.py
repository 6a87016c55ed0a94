"""The CPU path's int4 products (`linear/torch_int4.py`): every row-split format repacked into
torch's int4 CPU matmul operand gives the fp32 dequantized matmul up to its documented roundings.

Against the oracle with the scales rounded to bf16 (what the repack keeps) the only error left is
each product's bf16 output: every element within one bf16 rounding of each partial product (the
codes and the zero-points are exact). Odd K (pad lanes), N not a multiple of 16, a row view, the
row chunking of the repack, T = 1, 3, 17 (17 beside the torch_impl's column limit)."""

import pytest
import torch

from ninfer_compile.kernels.linear import torch_impl, torch_int4
from ninfer_compile.kernels.linear.reference import decode_planes, dequantize
from ninfer_compile.kernels.torch_util import drop_fp32_weights

from _linear_helpers import assert_close_rel, random_weight

FORMATS = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]


def _bf16_scale_oracle(w) -> torch.Tensor:
    """fp32 [N, K]: code32 x bf16(scale) — the matrix the int4 products hold exactly."""
    q, s = decode_planes(w)
    return q.float() * s.bfloat16().float().repeat_interleave(w.group, dim=1)[:, : w.k]


def _partial_bound(x: torch.Tensor, w) -> torch.Tensor:
    """Per element: the sum over the products of a bf16 unit roundoff (2^-8) of |x| @ |part|^T,
    a bound on each product's output rounding (the parts as the module doc splits the codes)."""
    q, s = decode_planes(w)
    sb = s.bfloat16().float().repeat_interleave(w.group, dim=1)[:, : w.k]
    if w.bits == 4:
        parts = [q]
    elif w.bits == 8:
        u = q + 128
        parts = [u & 15, (u >> 4) * 16 - 128]
    else:
        a = ((q + 8) & 15) - 8
        parts = [a, q - a]
    xa = x.float().abs()
    return sum(xa @ (p.float().abs() * sb).t() for p in parts) * 2.0 ** -8 + 1e-5


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("t", [1, 3, 17])
def test_products_are_the_bf16_scale_oracle_up_to_output_rounding(fmt, t):
    gen = torch.Generator().manual_seed(t + len(fmt))
    n, k = 40, 200  # N not a multiple of 16, K not a multiple of 128 (pad lanes)
    w = random_weight(fmt, n, k, gen)
    x = torch.randn(t, k, generator=gen).bfloat16()
    got = torch_int4.int4_matmul(x, w)
    want = x.float() @ _bf16_scale_oracle(w).t()
    assert got.shape == (t, n) and got.dtype == torch.float32
    excess = (got - want).abs() - _partial_bound(x, w)
    assert excess.max() <= 0, f"{fmt} T={t}: {excess.max():.3e} beyond the output roundings"
    assert_close_rel(got, x.float() @ dequantize(w).t(), tol=1e-2, what=f"{fmt} T={t} vs the fp32 oracle")


@pytest.mark.parametrize("fmt", ["Q6G64_F16S", "W8G32_F16S"])
def test_row_chunks_and_row_views(fmt):
    """More rows than one repack chunk, and a row view of them, agree with the oracle row for row."""
    gen = torch.Generator().manual_seed(5)
    n = torch_int4.ROWS_PER_CHUNK + 40
    w = random_weight(fmt, n, 128, gen)
    x = torch.randn(2, 128, generator=gen).bfloat16()
    want = x.float() @ _bf16_scale_oracle(w).t()
    assert_close_rel(torch_int4.int4_matmul(x, w), want, tol=3e-3, what=f"{fmt} chunked")
    view = w.rows(torch_int4.ROWS_PER_CHUNK - 8, 24)
    assert_close_rel(torch_int4.int4_matmul(x, view), want[:, torch_int4.ROWS_PER_CHUNK - 8:][:, :24],
                     tol=3e-3, what=f"{fmt} row view across the chunk edge")


def test_torch_impl_takes_int4_for_few_columns_and_fp32_beyond():
    drop_fp32_weights()
    gen = torch.Generator().manual_seed(2)
    w = random_weight("Q5G64_F16S", 48, 128, gen)
    out = torch.empty(torch_int4.MAX_COLUMNS + 1, 48, dtype=torch.bfloat16)
    x = torch.randn(out.shape[0], 128, generator=gen).bfloat16()
    torch_impl.linear(x[:1], w, out[:1])
    first = torch_int4.int4_operand(w)
    assert len(first.packed) == 2 and torch_int4.int4_operand(w) is first  # made once per object
    from ninfer_compile.kernels.torch_util import cached_fp32_weight

    assert cached_fp32_weight(w) is None
    torch_impl.linear(x, w, out)
    assert cached_fp32_weight(w) is not None
    assert_close_rel(out, x.float() @ dequantize(w).t(), tol=4e-3, what="fp32 path")
