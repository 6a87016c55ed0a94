"""Layout codecs: direct words, row-split planes (hand-built byte fixtures), geometry, row views."""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest
import torch

from ninfer_compile.artifact.codecs import (
    QuantizedTensor,
    decode_direct,
    decode_row_split,
    encode_direct,
    encode_row_split,
    row_view_spans,
    slice_row_split,
)
from ninfer_compile.artifact.formats import FORMATS, encoded_size, row_split_geometry
from ninfer_compile.errors import ArtifactError

GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]


def f16(*values: float) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.float16)


def f16_bits(bits: list[int]) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.int32).to(torch.int16).view(torch.float16)


# -- geometry ----------------------------------------------------------------------------------

def test_storage_layouts_example_q5_2x130():
    geom = row_split_geometry("Q5G64_F16S", 2, 130)
    assert (geom.k_pad, geom.groups_per_row, geom.logical_groups) == (256, 4, 3)
    assert (geom.base_bytes, geom.high_bytes, geom.scale_bytes) == (256, 64, 16)
    assert (geom.base_offset, geom.high_offset, geom.scale_offset) == (0, 256, 512)
    assert geom.total == 528 == encoded_size("Q5G64_F16S", [2, 130])
    assert (geom.base_row_bytes, geom.high_row_bytes, geom.scale_row_bytes) == (128, 32, 8)


@pytest.mark.parametrize("fmt,shape,expected", [
    ("Q4G64_F16S", (1, 1), 256 + 4),            # K_pad 128: 2 groups, base 64 -> scale at 256
    ("W8G32_F16S", (1, 1), 256 + 8),            # 4 G32 groups, base 128
    ("W8G32_F16S", (3, 128), 512 + 24),         # base 384 -> scale at 512
    ("Q6G64_F16S", (1, 64), 256 + 256 + 4),
    ("Q4G64_F16S", (34816, 5120), 89128960 + 34816 * 80 * 2),
    ("BF16", (), 2), ("FP32", (5, 7), 140), ("I32", [1] * 16, 4),
])
def test_encoded_size(fmt, shape, expected):
    assert encoded_size(fmt, shape) == expected


@pytest.mark.parametrize("fmt,shape,needle", [
    ("FP16", (4,), "not registered"),
    ("Q4G64_F16S", (4,), "rank 1"),
    ("Q4G64_F16S", (2, 2, 2), "rank 3"),
    ("BF16", [1] * 17, "rank 17"),
    ("BF16", (0,), "not positive"),
    ("FP32", (True, 2), "boolean"),
    ("I32", (2**40, 2**40), r"2\^63-1"),
])
def test_encoded_size_rejects(fmt, shape, needle):
    with pytest.raises(ArtifactError, match=needle):
        encoded_size(fmt, shape)


# -- direct formats ----------------------------------------------------------------------------

def test_bf16_every_word_round_trips():
    words = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)  # all 65536 words
    tensor = words.view(torch.bfloat16).reshape(256, 256)
    payload = encode_direct("BF16", tensor)
    assert payload == np.arange(-32768, 32768, dtype="<i4").astype("<i2").tobytes()
    back = decode_direct("BF16", (256, 256), payload)
    assert back.dtype == torch.bfloat16 and back.shape == (256, 256)
    assert torch.equal(back.view(torch.int16), words.reshape(256, 256))


def test_fp32_special_words_keep_their_bits():
    words = [0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x3F800000, 0x7F7FFFFF,
             0x7F800000, 0xFF800000, 0x7FC00000, 0x7FC00001, 0x7F800001, 0xFFBADBAD, 0x7FFFFFFF]
    tensor = torch.tensor(np.array(words, dtype=np.uint32).view(np.int32)).view(torch.float32)
    payload = encode_direct("FP32", tensor)
    assert payload == struct.pack("<13I", *words)  # little-endian words, nothing canonicalised
    back = decode_direct("FP32", (13,), payload)
    assert back.view(torch.int32).numpy().view(np.uint32).tolist() == words
    assert encode_direct("FP32", torch.tensor(1.0)) == bytes([0, 0, 0x80, 0x3F])


def test_i32_extrema_and_scalar():
    values = torch.tensor([[-2**31, -1, 0], [1, 2**31 - 1, 12345]], dtype=torch.int32)
    payload = encode_direct("I32", values)
    assert payload[:4] == b"\x00\x00\x00\x80" and payload[4:8] == b"\xff\xff\xff\xff"
    assert torch.equal(decode_direct("I32", (2, 3), payload), values)
    scalar = decode_direct("I32", (), encode_direct("I32", torch.tensor(-7, dtype=torch.int32)))
    assert scalar.shape == () and int(scalar) == -7


@pytest.mark.parametrize("fmt,tensor", [
    ("BF16", torch.zeros(2, dtype=torch.float32)),
    ("BF16", torch.zeros(2, dtype=torch.float16)),
    ("FP32", torch.zeros(2, dtype=torch.float64)),
    ("FP32", torch.zeros(2, dtype=torch.bfloat16)),
    ("I32", torch.zeros(2, dtype=torch.int64)),
    ("I32", torch.zeros(2, dtype=torch.float32)),
])
def test_direct_encode_rejects_implicit_conversion(fmt, tensor):
    with pytest.raises(ArtifactError, match="convert it explicitly"):
        encode_direct(fmt, tensor)


def test_direct_decode_checks_length_and_detaches_from_buffer():
    with pytest.raises(ArtifactError, match="needs 12 bytes"):
        decode_direct("FP32", (3,), bytes(8))
    buf = bytearray(encode_direct("FP32", torch.tensor([1.0, 2.0])))
    out = decode_direct("FP32", (2,), memoryview(buf))
    buf[:] = bytes(8)  # the tensor owns its memory
    assert out.tolist() == [1.0, 2.0]


# -- row-split: hand-built byte fixtures --------------------------------------------------------

def test_q4_bytes_match_hand_computed_fixture():
    codes = torch.zeros(1, 128, dtype=torch.int8)
    codes[0, :4] = torch.tensor([1, -1, 7, -8])
    codes[0, 127] = -2
    scales = f16(1.0, 0.5)
    payload = encode_row_split("Q4G64_F16S", codes, scales)
    expected = bytearray(260)
    expected[0] = 0xF1   # lane0 u=0x1 low nibble, lane1 u=0xF high nibble
    expected[1] = 0x87   # lane2 u=0x7 low, lane3 (-8) u=0x8 high
    expected[63] = 0xE0  # lane127 (-2) u=0xE in the high nibble of the last base byte
    expected[256:260] = b"\x00\x3c\x00\x38"  # 1.0 = 0x3C00, 0.5 = 0x3800, little-endian
    assert payload == bytes(expected)
    q = decode_row_split("Q4G64_F16S", (1, 128), payload)
    assert torch.equal(q.codes, codes)
    assert q.scales.view(torch.int16).tolist() == [[0x3C00, 0x3800]]


def test_q6_bytes_match_hand_computed_fixture():
    codes = torch.zeros(1, 64, dtype=torch.int8)
    codes[0, :5] = torch.tensor([-32, 31, -1, 16, -17])
    scales = f16_bits([0x0001]).reshape(1, 1)
    payload = encode_row_split("Q6G64_F16S", codes, scales)
    # K=64 -> K_pad 128: 2 groups; base 64 B, high 32 B at 256, scales 4 B at 512.
    expected = bytearray(516)
    # u: -32=0b100000, 31=0b011111, -1=0b111111, 16=0b010000, -17=0b101111
    expected[0] = 0xF0        # lane0 nibble 0x0, lane1 nibble 0xF
    expected[1] = 0x0F        # lane2 nibble 0xF, lane3 nibble 0x0
    expected[2] = 0x0F        # lane4 nibble 0xF
    # High stream, lane-major, bit4 then bit5: lane0 (0,1) lane1 (1,0) lane2 (1,1) lane3 (1,0)
    expected[256] = 0b01110110
    expected[257] = 0b00000010  # lane4 (0,1)
    expected[512:516] = b"\x01\x00\x00\x00"  # 0x0001 then the wholly physical group's 0x0000
    assert payload == bytes(expected)
    assert torch.equal(decode_row_split("Q6G64_F16S", (1, 64), payload).codes, codes)


def test_q5_high_bits_are_one_bit_per_lane():
    codes = torch.zeros(1, 128, dtype=torch.int8)
    codes[0, 0], codes[0, 7], codes[0, 8], codes[0, 64] = -16, 15, -1, 1
    payload = encode_row_split("Q5G64_F16S", codes, f16(2.0, 1.0))
    # base 64 B, high 16 B at 256, scales at 512
    assert len(payload) == 516
    assert payload[0] == 0x00 and payload[3] == 0xF0 and payload[4] == 0x0F and payload[32] == 0x01
    assert payload[256] == 0x01   # lane0 (-16 = 0b10000) high bit -> bit 0 of byte 0
    assert payload[257] == 0x01   # lane8 (-1 = 0b11111) -> bit 0 of byte 1; lane7 (15) has none
    assert payload[264] == 0x00   # group 1 stream starts at byte 8
    assert payload[512:516] == b"\x00\x40\x00\x3c"
    assert torch.equal(decode_row_split("Q5G64_F16S", (1, 128), payload).codes, codes)


def test_w8_bytes_and_wholly_physical_groups():
    codes = torch.zeros(1, 32, dtype=torch.int8)
    codes[0, :3] = torch.tensor([-127, 127, -1])
    payload = encode_row_split("W8G32_F16S", codes, f16(0.25))
    expected = bytearray(264)
    expected[0:3] = b"\x81\x7f\xff"
    expected[256:258] = b"\x00\x34"  # 0.25 = 0x3400; groups 1..3 are wholly physical: 0x0000
    assert payload == bytes(expected)


def test_partial_group_padding_lanes_are_zero():
    codes = torch.full((2, 3), -1, dtype=torch.int8)  # Q4 u = 0xF in every logical lane
    payload = encode_row_split("Q4G64_F16S", codes, f16_bits([0x3C00, 0x3C00]).reshape(2, 1))
    geom = row_split_geometry("Q4G64_F16S", 2, 3)
    base = payload[:geom.base_bytes]
    assert base[0] == 0xFF and base[1] == 0x0F and set(base[2:64]) == {0}  # lane 3+ zero
    assert base[64] == 0xFF and base[65] == 0x0F and set(base[66:128]) == {0}
    assert set(payload[geom.base_bytes:geom.scale_offset]) == {0}  # plane gap
    scale_words = struct.unpack("<4H", payload[geom.scale_offset:])
    assert scale_words == (0x3C00, 0, 0x3C00, 0)


@pytest.mark.parametrize("fmt", GROUPED)
@pytest.mark.parametrize("n,k", [(1, 1), (3, 64), (1, 130), (3, 200), (2, 128), (1, 257), (3, 33)])
def test_row_split_round_trip_random(fmt, n, k):
    spec = FORMATS[fmt]
    g = torch.Generator().manual_seed(n * 1000 + k)
    codes = torch.randint(spec.qmin, spec.qmax + 1, (n, k), generator=g, dtype=torch.int8)
    groups = -(-k // spec.group)
    scales = (torch.rand(n, groups, generator=g) * 4).to(torch.float16)
    scales[0, 0] = 0.0
    codes[0, :spec.group] = 0  # a zero scale owns all-zero codes
    codes[-1, -1] = spec.qmin  # legal interval endpoints
    codes[0, -1] = spec.qmax if k > spec.group else 0
    payload = encode_row_split(fmt, codes, scales)
    assert len(payload) == encoded_size(fmt, (n, k))
    q = decode_row_split(fmt, (n, k), payload)
    assert q.codes.dtype == torch.int8 and q.scales.dtype == torch.float16
    assert torch.equal(q.codes, codes)
    assert torch.equal(q.scales.view(torch.int16), scales.view(torch.int16))
    assert encode_row_split(fmt, q.codes, q.scales) == payload
    deq = q.dequantize()
    expect = codes.float() * scales.float().repeat_interleave(spec.group, dim=1)[:, :k]
    assert deq.dtype == torch.float32 and torch.equal(deq, expect)


@pytest.mark.parametrize("fmt,codes,needle", [
    ("W8G32_F16S", [[-128]], "outside"), ("Q4G64_F16S", [[8]], "outside"),
    ("Q5G64_F16S", [[-17]], "outside"), ("Q6G64_F16S", [[32]], "outside"),
])
def test_encode_rejects_illegal_codes(fmt, codes, needle):
    with pytest.raises(ArtifactError, match=needle):
        encode_row_split(fmt, torch.tensor(codes, dtype=torch.int8), f16(1.0))


@pytest.mark.parametrize("scale_bits,needle", [
    (0x8000, "not \\+0"), (0xBC00, "not \\+0"), (0x7C00, "not \\+0"), (0x7E00, "not \\+0"),
])
def test_encode_rejects_invalid_scales(scale_bits, needle):
    with pytest.raises(ArtifactError, match=needle):
        encode_row_split("Q4G64_F16S", torch.zeros(1, 4, dtype=torch.int8),
                         f16_bits([scale_bits]).reshape(1, 1))


def test_encode_rejects_zero_scale_with_codes_and_bad_shapes():
    with pytest.raises(ArtifactError, match="scale \\+0 but nonzero codes"):
        encode_row_split("Q4G64_F16S", torch.ones(1, 4, dtype=torch.int8), f16(0.0))
    with pytest.raises(ArtifactError, match="scales must be"):
        encode_row_split("Q4G64_F16S", torch.ones(1, 65, dtype=torch.int8), f16(1.0))
    with pytest.raises(ArtifactError, match="int8"):
        encode_row_split("Q4G64_F16S", torch.ones(1, 4, dtype=torch.int16), f16(1.0))
    with pytest.raises(ArtifactError, match="needs 260 bytes"):
        decode_row_split("Q4G64_F16S", (1, 4), bytes(259))


# -- row views --------------------------------------------------------------------------------

def _random_tensor(fmt: str, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    spec = FORMATS[fmt]
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(spec.qmin, spec.qmax + 1, (n, k), generator=g, dtype=torch.int8)
    scales = (torch.rand(n, -(-k // spec.group), generator=g) + 0.01).to(torch.float16)
    return codes, scales


@pytest.mark.parametrize("fmt", GROUPED)
def test_row_views_read_only_their_spans(fmt):
    n, k = 7, 200
    codes, scales = _random_tensor(fmt, n, k)
    payload = encode_row_split(fmt, codes, scales)
    geom = row_split_geometry(fmt, n, k)
    spans = row_view_spans(fmt, (n, k), 2, 3)
    assert spans["base"] == (2 * geom.base_row_bytes, 3 * geom.base_row_bytes)
    assert spans["scale"] == (geom.scale_offset + 2 * geom.scale_row_bytes, 3 * geom.scale_row_bytes)
    assert ("high" in spans) == (FORMATS[fmt].high_bytes_per_group > 0)
    # Poison every byte outside the requested rows' spans: a row decode must not notice.
    poisoned = bytearray(b"\xa5" * len(payload))
    for off, nbytes in spans.values():
        poisoned[off:off + nbytes] = payload[off:off + nbytes]
    view = decode_row_split(fmt, (n, k), bytes(poisoned), rows=(2, 3))
    assert torch.equal(view.codes, codes[2:5]) and torch.equal(view.scales, scales[2:5])
    # Arbitrary gathers: rows decoded one by one match the full decode.
    order = [6, 0, 3, 3, 5]
    rows = [decode_row_split(fmt, (n, k), payload, rows=(r, 1)) for r in order]
    assert torch.equal(torch.cat([r.codes for r in rows]), codes[order])
    # A materialised slice is a valid standalone payload of the sub-matrix.
    assert slice_row_split(fmt, (n, k), payload, 2, 3) == encode_row_split(fmt, codes[2:5], scales[2:5])


@pytest.mark.parametrize("rows", [(-1, 2), (0, 0), (6, 2), (0, 8)])
def test_row_view_rejects_out_of_range(rows):
    codes, scales = _random_tensor("Q4G64_F16S", 7, 64)
    payload = encode_row_split("Q4G64_F16S", codes, scales)
    with pytest.raises(ArtifactError, match="row range"):
        decode_row_split("Q4G64_F16S", (7, 64), payload, rows=rows)


def test_full_size_q4_decode_takes_seconds():
    n, k = 34816, 5120
    geom = row_split_geometry("Q4G64_F16S", n, k)
    payload = bytearray(np.random.default_rng(0).bytes(geom.total))
    payload[geom.scale_offset:] = np.full(geom.scale_bytes // 2, 0x3C00, dtype="<u2").tobytes()
    start = time.perf_counter()
    q = decode_row_split("Q4G64_F16S", (n, k), payload)
    elapsed = time.perf_counter() - start
    assert q.codes.shape == (n, k) and q.scales.shape == (n, 80)
    assert elapsed < 15.0, f"Q4 [34816,5120] decode took {elapsed:.1f}s"
    # Spot-check one byte against the nibble rule.
    byte = payload[12345]
    row, col = divmod(12345 * 2, k)
    lo, hi = byte & 0xF, byte >> 4
    assert q.codes[row, col] == (lo - 16 if lo >= 8 else lo)
    assert q.codes[row, col + 1] == (hi - 16 if hi >= 8 else hi)


def test_quantized_tensor_dequantize_exact_partial_group():
    q = QuantizedTensor("Q4G64_F16S", torch.tensor([[1, -2, 7]], dtype=torch.int8),
                        f16_bits([0x0001]).reshape(1, 1))
    assert q.dequantize().tolist() == [[2.0**-24, -2 * 2.0**-24, 7 * 2.0**-24]]
