"""The CPU path's packed products (`linear/torch_packed.py`): every row-split format repacked into
torch's int4 (and, for tall Q5 / Q6 / W8 weights, int8) CPU matmul operands gives the fp32
dequantized matmul up to its documented roundings.

Against the oracle with the scales rounded to bf16 (what the repack keeps) the only error left is
the ops' bf16 outputs: every element within a bf16 unit roundoff (2^-8) of |x| @ |W|^T (the codes
and the zero-points are exact). Odd K (pad lanes), N not a multiple of 16, a row view, the row
chunking of the repack, T = 1, 3, 17 (17 beyond the torch_impl's column limit)."""

import pytest
import torch

from ninfer_compile.kernels.linear import torch_impl, torch_packed
from ninfer_compile.kernels.linear.reference import decode_planes, dequantize
from ninfer_compile.kernels.torch_util import cached_fp32_weight, drop_fp32_weights

from _linear_helpers import assert_close_rel, random_weight

FORMATS = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]


def _bf16_scale_oracle(w) -> torch.Tensor:
    """fp32 [N, K]: code32 x bf16(scale), the matrix the packed operands hold exactly."""
    q, s = decode_planes(w)
    return q.float() * s.bfloat16().float().repeat_interleave(w.group, dim=1)[:, : w.k]


@pytest.fixture(params=["int4", "int8"])
def kind(request, monkeypatch):
    """Both operand kinds on small shapes (int8 from the first row on for Q5 / Q6 / W8)."""
    if request.param == "int8":
        monkeypatch.setattr(torch_packed, "INT8_MIN_ROWS", 1)
    return request.param


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("t", [1, 3, 17])
def test_products_are_the_bf16_scale_oracle_up_to_output_rounding(fmt, t, kind):
    gen = torch.Generator().manual_seed(t + len(fmt))
    n, k = 40, 200  # N not a multiple of 16, K not a multiple of 128 (pad lanes)
    w = random_weight(fmt, n, k, gen)
    x = torch.randn(t, k, generator=gen).bfloat16()
    got = torch_packed.packed_matmul(x, w)
    assert torch_packed.packed_operand(w).kind == ("int8" if kind == "int8" and fmt != "Q4G64_F16S" else "int4")
    wb = _bf16_scale_oracle(w)
    want = x.float() @ wb.t()
    assert got.shape == (t, n) and got.dtype == torch.float32
    bound = (x.float().abs() @ wb.abs().t()) * 2.0 ** -8 + 1e-5
    excess = (got - want).abs() - bound
    assert excess.max() <= 0, f"{fmt} {kind} T={t}: {excess.max():.3e} beyond the output roundings"
    assert_close_rel(got, x.float() @ dequantize(w).t(), tol=1e-2, what=f"{fmt} {kind} T={t} vs the fp32 oracle")


@pytest.mark.parametrize("fmt", ["Q6G64_F16S", "W8G32_F16S"])
def test_row_chunks_and_row_views(fmt, kind):
    """More rows than one repack chunk, and a row view across the chunk edge, agree with the oracle."""
    gen = torch.Generator().manual_seed(5)
    edge = torch_packed.ROWS_PER_CHUNK
    w = random_weight(fmt, edge + 40, 128, gen)
    x = torch.randn(2, 128, generator=gen).bfloat16()
    want = x.float() @ _bf16_scale_oracle(w).t()
    assert_close_rel(torch_packed.packed_matmul(x, w), want, tol=3e-3, what=f"{fmt} {kind} chunked")
    view = w.rows(edge - 8, 24)
    assert_close_rel(torch_packed.packed_matmul(x, view), want[:, edge - 8:edge + 16], tol=3e-3,
                     what=f"{fmt} {kind} row view across the chunk edge")


def test_torch_impl_takes_packed_for_few_columns_and_fp32_beyond(monkeypatch):
    drop_fp32_weights()
    gen = torch.Generator().manual_seed(2)
    w = random_weight("Q5G64_F16S", 48, 128, gen)
    small = random_weight("Q4G64_F16S", 16, 64, gen)
    assert not torch_packed.takes_packed(small, 1) and not torch_packed.takes_packed(w, 1)
    monkeypatch.setattr(torch_packed, "MIN_PARAMS", 48 * 128)
    assert torch_packed.takes_packed(w, 1) and not torch_packed.takes_packed(small, 1)
    out = torch.empty(torch_packed.MAX_COLUMNS + 1, 48, dtype=torch.bfloat16)
    x = torch.randn(out.shape[0], 128, generator=gen).bfloat16()
    torch_impl.linear(x[:1], w, out[:1])
    first = torch_packed.packed_operand(w)
    assert first.kind == "int4" and first.parts == 2 and torch_packed.packed_operand(w) is first  # made once
    assert cached_fp32_weight(w) is None
    torch_impl.linear(x, w, out)
    assert cached_fp32_weight(w) is not None
    assert_close_rel(out, x.float() @ dequantize(w).t(), tol=4e-3, what="fp32 path")
