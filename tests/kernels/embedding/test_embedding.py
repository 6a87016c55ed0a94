"""Embedding lookup over the stored row-split planes (and a bf16 table) vs the exact oracle."""

import pytest
import torch

from ninfer_compile.artifact.codecs import decode_row_split, encode_row_split
from ninfer_compile.artifact.quantize import quantize_maxabs
from ninfer_compile.errors import RouteError
from ninfer_compile.kernels.embedding import launch, reference
from ninfer_compile.kernels.linear.weights import from_payload

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _same_bf16(got, want_f32):
    """Exact on the GPU (RNE); the CPU interpreter truncates float32 -> bf16, so allow one bf16 ulp."""
    if DEV == "cuda":
        assert torch.equal(got.cpu(), want_f32.bfloat16())
    else:
        torch.testing.assert_close(got.cpu().float(), want_f32, rtol=2 ** -7, atol=1e-30)


def _table(fmt, V, H, seed):
    x = torch.randn(V, H, generator=torch.Generator().manual_seed(seed))
    codes, scales = quantize_maxabs(fmt, x)
    payload = encode_row_split(fmt, codes, scales)
    oracle = decode_row_split(fmt, (V, H), payload).dequantize()  # float32 [V, H]
    return from_payload(fmt, (V, H), payload, device=DEV), oracle


@pytest.mark.parametrize("fmt", ["Q6G64_F16S", "Q4G64_F16S", "Q5G64_F16S", "W8G32_F16S"])
@pytest.mark.parametrize("T,H", [(1, 200), (5, 130), (17, 256)])
def test_rowsplit_lookup(fmt, T, H):
    V = 37
    qw, oracle = _table(fmt, V, H, seed=T + H)
    ids = torch.randint(0, V, (T,), dtype=torch.int32)
    ids[0] = V - 1
    out = torch.empty(T, H, dtype=torch.bfloat16, device=DEV)
    launch.embedding(ids.to(DEV), qw, out)
    _same_bf16(out, reference.embedding(ids, oracle))


def test_row_view_table():
    qw, oracle = _table("Q6G64_F16S", 20, 64, seed=1)
    view = qw.rows(5, 10)
    ids = torch.tensor([0, 9, 3], dtype=torch.int32)
    out = torch.empty(3, 64, dtype=torch.bfloat16, device=DEV)
    launch.embedding(ids.to(DEV), view, out)
    _same_bf16(out, reference.embedding(ids, oracle[5:15]))


def test_bf16_table():
    table = torch.randn(50, 96).bfloat16().to(DEV)
    ids = torch.tensor([49, 0, 7, 7, 3], dtype=torch.int32, device=DEV)
    out = torch.empty(5, 96, dtype=torch.bfloat16, device=DEV)
    launch.embedding(ids, table, out)
    assert torch.equal(out.cpu(), reference.embedding(ids.cpu(), table.cpu()).bfloat16())


def test_bad_ids_dtype():
    with pytest.raises(RouteError, match="int32"):
        launch.embedding(torch.zeros(2, dtype=torch.int64), torch.zeros(4, 8, dtype=torch.bfloat16),
                         torch.empty(2, 8, dtype=torch.bfloat16))


@pytest.mark.parametrize("fmt", ["Q4G64_F16S", "W8G32_F16S", "BF16"])
def test_vocabulary_slice_gives_zero_rows_outside(fmt):
    """A vocabulary-parallel rank's table (rows [13, 26) of 37): ids of other ranks give zero rows, so
    the ranks' outputs sum to the whole table's rows."""
    H = 130
    if fmt == "BF16":
        full = torch.randn(37, H).bfloat16()
        oracle, parts = full.float(), [full[b:b + 13].to(DEV) for b in (0, 13, 26)]
    else:
        qw, oracle = _table(fmt, 37, H, seed=3)
        parts = [qw.rows(b, min(13, 37 - b)) for b in (0, 13, 26)]
    ids = torch.tensor([0, 12, 13, 25, 26, 36, 20], dtype=torch.int32)
    total = torch.zeros(len(ids), H)
    for b, part in zip((0, 13, 26), parts):
        out = torch.full((len(ids), H), float("nan"), dtype=torch.bfloat16, device=DEV)
        launch.embedding(ids.to(DEV), part, out, vocab_begin=b)
        want = reference.embedding(ids, oracle[b:b + 13], vocab_begin=b)
        inside = (ids >= b) & (ids < b + 13)
        assert bool((want[~inside] == 0).all()) and bool((out.cpu()[~inside] == 0).all())
        _same_bf16(out, want)
        total += out.cpu().float()
    _same_bf16(total.bfloat16(), reference.embedding(ids, oracle))
