"""MAXABS_F16_RECIP_RNE_V1: bit-exact against a scalar struct-based oracle, and its boundaries."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from ninfer_compile.artifact.codecs import decode_row_split, encode_row_split
from ninfer_compile.artifact.formats import FORMATS
from ninfer_compile.artifact.quantize import quantize_maxabs
from ninfer_compile.errors import ArtifactError

GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]


def f32(x: float) -> float:
    """Round a double to binary32 (RNE) — struct packing rounds to nearest even."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f16_bits(x: float) -> int:
    """binary32 value -> binary16 bits, RNE with subnormals (OverflowError past the f16 range)."""
    return struct.unpack("<H", struct.pack("<e", x))[0]


def oracle_group(values: list[float], qmin: int, qmax: int) -> tuple[int, list[int]]:
    """Scalar reference of tensor-formats §7.2 for one group of binary32 values.

    Products/quotients of two binary32 values are computed exactly enough in binary64 that a
    single rounding to binary32 gives the correctly rounded binary32 result."""
    amax = max(abs(v) for v in values)
    if amax == 0:
        return 0, [0] * len(values)
    raw = f32(amax / qmax)
    bits = f16_bits(raw)  # raises OverflowError on f16 overflow
    if bits == 0:
        bits = 0x0001
    scale32 = struct.unpack("<e", struct.pack("<H", bits))[0]
    inv = f32(1.0 / scale32)
    codes = []
    for v in values:
        normalized = f32(v * inv)
        codes.append(max(qmin, min(qmax, round(normalized))))  # Python round(): half to even
    return bits, codes


def oracle(fmt: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    spec = FORMATS[fmt]
    n, k = x.shape
    groups = -(-k // spec.group)
    codes = np.zeros((n, k), dtype=np.int8)
    scales = np.zeros((n, groups), dtype=np.uint16)
    for r in range(n):
        for g in range(groups):
            cols = slice(g * spec.group, min(k, (g + 1) * spec.group))
            bits, group_codes = oracle_group([float(v) for v in x[r, cols]], spec.qmin, spec.qmax)
            scales[r, g] = bits
            codes[r, cols] = group_codes
    return codes, scales


def run(fmt: str, x) -> tuple[np.ndarray, np.ndarray]:
    codes, scales = quantize_maxabs(fmt, torch.as_tensor(x))
    return codes.numpy(), scales.view(torch.int16).numpy().view(np.uint16)


@pytest.mark.parametrize("fmt", GROUPED)
def test_matches_scalar_oracle_bit_exactly(fmt):
    rng = np.random.default_rng(len(fmt))
    n, k = 3, 200  # partial last group for both G64 and G32
    x = (rng.standard_normal((n, k)) * np.exp2(rng.integers(-30, 10, (n, 1)))).astype(np.float32)
    x[1, :64] = 0.0                                      # all-zero group
    x[2, 10] = np.float32(2.0**-140)                      # subnormal binary32 input
    x[0, 70:75] = np.float32([0.5, -1.5, 2.5, 3.5, -7.0])
    codes, scales = run(fmt, x)
    want_codes, want_scales = oracle(fmt, x)
    assert np.array_equal(scales, want_scales)
    assert np.array_equal(codes, want_codes)


def test_ties_round_half_to_even():
    # amax 7 -> raw 1.0 -> scale16 1.0 -> inv 1.0: normalized values are exactly x.
    x = torch.tensor([[7.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.5, -3.5]])
    codes, scales = quantize_maxabs("Q4G64_F16S", x)
    assert scales.view(torch.int16).tolist() == [[0x3C00]]
    assert codes.tolist() == [[7, 0, 0, 2, -2, 2, -2, 4, -4]]
    w = torch.tensor([[127.0, 0.5, -0.5, 126.5, -126.5, -127.0]])
    assert quantize_maxabs("W8G32_F16S", w)[0].tolist() == [[127, 0, 0, 126, -126, -127]]


def _reciprocal_and_division_codes(scale_bits: int, x: np.float32) -> tuple[int, int]:
    scale32 = np.array([scale_bits], dtype=np.uint16).view(np.float16).astype(np.float32)[0]
    inv = np.float32(1.0) / scale32
    by_reciprocal = int(np.rint(np.float32(x * inv)))
    by_division = int(np.rint(np.float32(x / scale32)))
    return by_reciprocal, by_division


def test_reciprocal_multiply_not_division():
    """Search for a value whose code differs between x*(1/s) and x/s; the encoder must follow
    the reciprocal (the profile's normative order)."""
    qmax = 7
    found = None
    for scale_bits in range(0x3C01, 0x3E00):  # scales in (1, 1.5): 1/s is rarely exact
        scale32 = np.array([scale_bits], dtype=np.uint16).view(np.float16).astype(np.float32)[0]
        for code in range(qmax):
            tie = np.float32((code + 0.5) * float(scale32))  # exact: 11-bit mantissa * small int
            for x in (tie, np.nextafter(tie, np.float32(0)), np.nextafter(tie, np.float32(100))):
                recip, div = _reciprocal_and_division_codes(scale_bits, x)
                if recip != div:
                    found = (scale_bits, scale32, x, recip, div)
                    break
            if found:
                break
        if found:
            break
    assert found is not None, "no reciprocal/division disagreement found in the search range"
    scale_bits, scale32, x, recip, div = found
    amax = np.float32(float(scale32) * qmax)  # exact; amax / 7 == scale32 -> scale16 == scale_bits
    codes, scales = run("Q4G64_F16S", np.array([[amax, x]], dtype=np.float32))
    assert scales.tolist() == [[scale_bits]]
    assert codes[0, 1] == recip != div


def test_min_subnormal_rescue():
    # raw scale 2^-26 rounds to binary16 +0 (below half the min subnormal): rescued to 0x0001.
    x = np.array([[7 * 2.0**-26, -3 * 2.0**-26, 0.0]], dtype=np.float32)
    codes, scales = run("Q4G64_F16S", x)
    assert scales.tolist() == [[0x0001]]
    assert codes.tolist() == [[2, -1, 0]]  # 1.75 -> 2, -0.75 -> -1 with inv = 2^24
    # Exactly half the min subnormal is a tie to even (0) -> rescued as well.
    assert run("Q4G64_F16S", np.array([[7 * 2.0**-25]], dtype=np.float32))[1].tolist() == [[1]]
    # Tiny but nonzero anywhere in a group is never a zero scale.
    assert run("W8G32_F16S", np.array([[1e-30]], dtype=np.float32))[1].tolist() == [[1]]


def test_all_zero_group_is_positive_zero_scale():
    x = torch.tensor([[0.0, -0.0] + [0.0] * 62 + [1.0] * 64])  # group 0 zeros incl -0; group 1 not
    codes, scales = quantize_maxabs("Q4G64_F16S", x)
    assert scales.view(torch.int16)[0, 0] == 0  # +0 bits, never -0
    assert codes[0, :64].abs().sum() == 0


def test_f16_overflow_fails_naming_the_group():
    ok = np.zeros((2, 192), dtype=np.float32)
    ok[1, 130] = np.float32(7 * 65504)  # scale exactly f16 max: fine
    assert run("Q4G64_F16S", ok)[1][1, 2] == 0x7BFF
    bad = ok.copy()
    bad[1, 130] = np.float32(7 * 65520)  # raw 65520 is the tie to +inf
    with pytest.raises(ArtifactError, match="row 1 group 2.*overflows binary16"):
        quantize_maxabs("Q4G64_F16S", torch.from_numpy(bad))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_input_rejected(value):
    x = torch.zeros(2, 70)
    x[1, 65] = value
    with pytest.raises(ArtifactError, match="row 1 column 65"):
        quantize_maxabs("Q5G64_F16S", x)


def test_binary64_source_that_overflows_binary32_rejected():
    with pytest.raises(ArtifactError, match="not a finite binary32"):
        quantize_maxabs("Q6G64_F16S", torch.tensor([[1e39, 1.0]], dtype=torch.float64))


def test_bf16_source_converts_exactly():
    x = torch.randn(4, 100).to(torch.bfloat16)
    a = quantize_maxabs("Q5G64_F16S", x)
    b = quantize_maxabs("Q5G64_F16S", x.float())
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_w8_never_emits_minus_128_and_clamps_after_rounding():
    # A normal binary16 scale is within 2^-12 relative of amax/127, so |x * inv| <= ~127.03. Only a
    # subnormal scale rounds far enough down (amax/127 = 1.4 * 2^-24 -> scale 2^-24) for -amax to
    # round past -127; the clamp after rounding must then give -127, never -128.
    candidates = np.float32(127 * 2.0**-24) * (1 + np.arange(1, 2000, dtype=np.float32) / 4096)
    clamped = None
    for amax in candidates:
        scale = np.float32(np.float16(np.float32(amax / np.float32(127))))
        if abs(np.rint(np.float32(-amax * (np.float32(1) / scale)))) > 127:
            clamped = amax
            break
    assert clamped is not None
    codes, _ = run("W8G32_F16S", np.array([[-clamped, clamped]], dtype=np.float32))
    assert codes.tolist() == [[-127, 127]]
    rng = np.random.default_rng(1)
    many, _ = run("W8G32_F16S", (rng.standard_normal((64, 256)) * 3).astype(np.float32))
    assert many.min() >= -127


@pytest.mark.parametrize("fmt", GROUPED)
@pytest.mark.parametrize("n,k", [(1, 1), (3, 64), (1, 130), (3, 200), (1, 64), (3, 1)])
def test_quantize_bytes_codes_round_trip(fmt, n, k):
    x = torch.randn(n, k, generator=torch.Generator().manual_seed(k))
    codes, scales = quantize_maxabs(fmt, x)
    spec = FORMATS[fmt]
    assert codes.shape == (n, k) and scales.shape == (n, -(-k // spec.group))
    assert int(codes.min()) >= spec.qmin and int(codes.max()) <= spec.qmax
    back = decode_row_split(fmt, (n, k), encode_row_split(fmt, codes, scales))
    assert torch.equal(back.codes, codes)
    assert torch.equal(back.scales.view(torch.int16), scales.view(torch.int16))
    # Reconstruction error is within half a step of each group's scale.
    err = (back.dequantize() - x).abs()
    step = scales.float().repeat_interleave(spec.group, dim=1)[:, :k]
    assert bool((err <= step * 0.5 + 1e-12).all())


def test_partial_group_scale_uses_only_logical_values():
    x = torch.zeros(1, 130)
    x[0, :128] = 100.0
    x[0, 128:] = torch.tensor([0.7, -0.35])
    codes, scales = quantize_maxabs("Q4G64_F16S", x)
    assert scales.shape == (1, 3)
    assert float(scales[0, 2]) == float(np.float16(np.float32(0.7) / np.float32(7)))
    assert codes[0, 128:].tolist() == [7, -4]  # -0.35 / 0.1 = -3.5 -> tie to even -4 (via inv)


@pytest.mark.parametrize("bad", [torch.zeros(4), torch.zeros(0, 3), torch.zeros(2, 2, 2),
                                 torch.zeros(2, 2, dtype=torch.int32)])
def test_rejects_non_matrix_or_non_float(bad):
    with pytest.raises(ArtifactError):
        quantize_maxabs("Q4G64_F16S", bad)
    with pytest.raises(ArtifactError, match="direct"):
        quantize_maxabs("BF16", torch.zeros(2, 2))
