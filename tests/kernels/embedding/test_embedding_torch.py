"""CPU path of the embedding family (`embedding/torch_impl.py`) vs the exact oracle and the launcher."""

import pytest
import torch

from ninfer_compile.artifact.codecs import decode_row_split, encode_row_split
from ninfer_compile.artifact.quantize import quantize_maxabs
from ninfer_compile.kernels.embedding import torch_impl
from ninfer_compile.kernels.linear.weights import from_payload
from ninfer_compile.kernels.torch_util import fp32_weight


def _table(fmt, V, H, seed):
    x = torch.randn(V, H, generator=torch.Generator().manual_seed(seed))
    codes, scales = quantize_maxabs(fmt, x)
    payload = encode_row_split(fmt, codes, scales)
    return from_payload(fmt, (V, H), payload), decode_row_split(fmt, (V, H), payload).dequantize()


@pytest.mark.parametrize("fmt", ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"])
@pytest.mark.parametrize("T,H", [(1, 200), (5, 130), (17, 64)])
@pytest.mark.parametrize("small_table", [0, 1 << 22])
def test_rowsplit_exact(fmt, T, H, small_table, monkeypatch):
    monkeypatch.setattr(torch_impl, "SMALL_TABLE", small_table)  # 0: decode the looked-up rows only
    qw, oracle = _table(fmt, 37, H, seed=T + H)
    ids = torch.randint(0, 37, (T,), dtype=torch.int32, generator=torch.Generator().manual_seed(T))
    ids[0] = 36
    out = torch.full((T, H), float("nan"), dtype=torch.bfloat16)
    torch_impl.embedding(ids, qw, out)
    assert torch.equal(out, oracle[ids.long()].bfloat16())


@pytest.mark.parametrize("fmt", ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"])
def test_fused_rows_are_the_oracle_in_fp32(fmt):
    """The fused row decode (linear/torch_fused.fused_rows): exact fp32 rows (K = 130: a ragged
    last group), a repeated id, a row view, an id outside the table refused in one line."""
    from ninfer_compile.kernels.linear import torch_fused

    if torch_fused.kernel() is None:
        pytest.skip("no fused CPU kernel here (no compiler / AVX2)")
    qw, oracle = _table(fmt, 23, 130, seed=4)
    rows = torch.tensor([20, 0, 5, 5, 1])  # of the view: table rows 2 .. 22
    out = torch.full((5, 130), float("nan"))
    assert torch_fused.fused_rows(qw.rows(2, 21), rows, out)
    assert torch.equal(out, oracle[2:23][rows])
    with pytest.raises(IndexError, match="outside"):
        torch_fused.fused_rows(qw, torch.tensor([23]), torch.empty(1, 130))


def test_row_view_cached_full_and_bf16_table(monkeypatch):
    monkeypatch.setattr(torch_impl, "SMALL_TABLE", 0)
    qw, oracle = _table("Q6G64_F16S", 20, 64, seed=1)
    view = qw.rows(5, 10)
    ids = torch.tensor([0, 9, 3, 3], dtype=torch.int32)
    out = torch.empty(4, 64, dtype=torch.bfloat16)
    torch_impl.embedding(ids, view, out)
    assert torch.equal(out, oracle[5:15][ids.long()].bfloat16())
    fp32_weight(view)  # a tied head made the fp32 matrix: it is indexed instead
    out2 = torch.empty_like(out)
    torch_impl.embedding(ids, view, out2)
    assert torch.equal(out2, out)
    table = torch.randn(11, 40).bfloat16()
    out3 = torch.empty(4, 40, dtype=torch.bfloat16)
    torch_impl.embedding(ids, table, out3)
    assert torch.equal(out3, table[ids.long()])


def test_matches_launcher():
    from ninfer_compile.kernels.embedding import launch

    qw, _ = _table("Q5G64_F16S", 13, 130, seed=4)
    ids = torch.tensor([12, 0, 7], dtype=torch.int32)
    got, want = torch.empty(3, 130, dtype=torch.bfloat16), torch.empty(3, 130, dtype=torch.bfloat16)
    torch_impl.embedding(ids, qw, got)
    launch.embedding(ids, qw, want)
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-30)


@pytest.mark.parametrize("small_table", [0, 1 << 22])
def test_vocabulary_slice_exact(small_table, monkeypatch):
    """A rank's slice (rows [20, 37) with vocab_begin 20): its rows exactly, zeros for other ids."""
    from ninfer_compile.kernels.embedding import reference

    monkeypatch.setattr(torch_impl, "SMALL_TABLE", small_table)
    qw, oracle = _table("Q6G64_F16S", 37, 128, seed=2)
    ids = torch.tensor([19, 20, 36, 0, 27], dtype=torch.int32)
    for table, part in ((qw.rows(20, 17), oracle[20:]), (oracle[20:].bfloat16(), oracle[20:].bfloat16().float())):
        out = torch.full((5, 128), float("nan"), dtype=torch.bfloat16)
        torch_impl.embedding(ids, table, out, vocab_begin=20)
        assert torch.equal(out, reference.embedding(ids, part, vocab_begin=20).bfloat16())
        assert bool((out[[0, 3]] == 0).all()) and torch.equal(out[[1, 2, 4]], part[[0, 16, 7]].bfloat16())
