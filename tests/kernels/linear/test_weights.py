import pytest
import torch

from ninfer_compile.artifact.codecs import decode_row_split, encode_row_split
from ninfer_compile.errors import ArtifactError, RouteError
from ninfer_compile.kernels.linear.reference import decode_planes, dequantize
from ninfer_compile.kernels.linear.weights import QuantWeight, from_payload

from _linear_helpers import GROUP, QRANGE, random_weight

FORMATS = list(QRANGE)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("k", [200, 256])
def test_planes_decode_matches_codec(fmt, k):
    gen = torch.Generator().manual_seed(1)
    lo, hi = QRANGE[fmt]
    n = 10
    codes = torch.randint(lo, hi + 1, (n, k), generator=gen, dtype=torch.int8)
    scales = (torch.rand(n, -(-k // GROUP[fmt]), generator=gen) + 0.1).half()
    payload = encode_row_split(fmt, codes, scales)
    w = from_payload(fmt, (n, k), payload)
    assert isinstance(w, QuantWeight) and (w.n, w.k, w.k_pad) == (n, k, 256)
    q, s = decode_planes(w)
    assert torch.equal(q, codes.int())
    assert torch.equal(s[:, : scales.shape[1]], scales)
    # row view: zero-copy slices, same values as the codec's row-range decode
    view = from_payload(fmt, (n, k), payload, rows=(3, 4))
    ref = decode_row_split(fmt, (n, k), payload, rows=(3, 4))
    assert view.row_begin == 3 and view.parent_n == n
    assert torch.equal(dequantize(view), ref.dequantize())
    assert torch.equal(dequantize(w)[3:7], ref.dequantize())


def test_row_view_shares_storage():
    gen = torch.Generator().manual_seed(2)
    w = random_weight("Q5G64_F16S", 12, 320, gen)
    v = w.rows(4, 5)
    assert v.base.data_ptr() == w.base.data_ptr() + 4 * w.base_row_bytes
    assert v.high.data_ptr() == w.high.data_ptr() + 4 * w.high_row_bytes
    assert v.scale.data_ptr() == w.scale.data_ptr() + 4 * w.scale_row_bytes
    vv = v.rows(1, 2)
    assert vv.row_begin == 5 and torch.equal(dequantize(vv), dequantize(w)[5:7])
    with pytest.raises(RouteError, match="row view"):
        w.rows(10, 3)


def test_bf16_pass_through_and_errors():
    t = torch.randn(6, 10).bfloat16()
    payload = t.view(torch.uint8).reshape(-1).numpy().tobytes()
    w = from_payload("BF16", (6, 10), payload)
    assert w.dtype == torch.bfloat16 and torch.equal(w, t)
    assert torch.equal(from_payload("BF16", (6, 10), payload, rows=(2, 3)), t[2:5])
    with pytest.raises(ArtifactError, match="expected"):
        from_payload("Q4G64_F16S", (6, 10), payload)
    with pytest.raises(ArtifactError):
        from_payload("FP32", (6, 10), payload)
