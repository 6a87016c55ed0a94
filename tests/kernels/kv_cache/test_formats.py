"""The KV formats as data (kernels/kv_cache/formats.py) and their fp32 codec references."""

import math

import pytest
import torch

from ninfer_compile.kernels.kv_cache import formats as F
from ninfer_compile.kernels.kv_cache import reference as R

# the table: qwen3.6-27b, 16 attention layers x 4 KV heads x D = 256
BYTES_27B = {"bf16": 65_536, "int8": 33_792, "fp8": 33_024, "k8v4": 25_728, "rk8v4": 26_112,
             "nvfp4": 18_432, "rk4v4": 17_920}


def test_every_format_and_its_27b_bytes_per_token():
    assert set(F.KV_DTYPES) == set(BYTES_27B)
    for name, want in BYTES_27B.items():
        assert F.bytes_per_token(F.FORMATS[name], 16, 4, 256) == want, name
        bufs = F.cache_buffers(F.FORMATS[name], 1, 1, 4, 256)
        esz = {"bf16": 2, "f16": 2, "i8": 1, "u8": 1}
        assert 16 * sum(math.prod(s) * esz[d] for _, s, d in bufs) == want


@pytest.mark.parametrize("d", [32, 64, 128, 192, 256])
def test_layouts_identify_their_format_uniquely(d):
    seen = {}
    for f in F.FORMATS.values():
        if f.head_dim_problem(d):
            continue
        lay = F.layout(f, d)
        assert lay not in seen, (f.name, seen.get(lay))
        seen[lay] = f.name
        assert F.identify(d, *lay) is f


def test_head_width_problems_name_format_and_width():
    assert F.format_problem("rk8v4", 32, "tiny") == (
        "--kv-dtype rk8v4 needs head_dim a multiple of 64 (its K codec int8_g64_wht64 has 64-value scale "
        "groups); tiny has head_dim 32")
    assert F.format_problem("fp8", 192).startswith("--kv-dtype fp8 needs head_dim a power of two")
    assert "int8 needs head_dim a multiple of 64" in F.format_problem("int8", 32)
    assert F.format_problem("nvfp4", 48) is None and F.format_problem("rk4v4", 192) is None
    assert F.format_problem("fp4", 64).startswith("--kv-dtype must be one of bf16, int8, fp8")


@pytest.mark.parametrize("block", [256, 64])
def test_rotation_keeps_q_dot_k_float64(block):
    g = torch.Generator().manual_seed(block)
    q = torch.randn(24, 256, generator=g, dtype=torch.float64)
    k = torch.randn(40, 256, generator=g, dtype=torch.float64)
    k[:, 3] *= 50.0  # an outlier channel
    qr, kr = R.rotate(q, block), R.rotate(k, block)
    ref = q @ k.T
    assert ((qr @ kr.T - ref).abs().max() / ref.abs().max()).item() < 1e-13
    assert torch.allclose(R.rotate(qr, block), q, atol=1e-12)  # its own inverse
    h = R.hadamard(block, torch.float64)
    assert torch.allclose(h @ h.T, torch.eye(block, dtype=torch.float64), atol=1e-12)


def test_e4m3_and_e2m1_grids():
    every = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    vals = R.e4m3_decode(every)
    finite = ~vals.isnan()
    assert torch.equal(R.e4m3_encode(vals[finite]), every[finite])  # encode is exact on the grid
    assert float(vals[finite].abs().max()) == 448.0
    nib = torch.arange(16)
    assert torch.equal(R.e2m1_encode(R.e2m1_decode(nib))[nib != 8], nib[nib != 8].to(torch.uint8))
    # ties to even: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4; saturation at 6
    y = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 9.0, -5.0])
    assert R.e2m1_decode(R.e2m1_encode(y)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -4.0]


# relative RMS error bound of quantize -> dequantize on Gaussian rows with an outlier channel
BOUND = {"bf16": 0.0, "int8": 0.03, "fp8": 0.04, "k8v4": 0.12, "rk8v4": 0.2, "nvfp4": 0.12, "rk4v4": 0.2}


@pytest.mark.parametrize("name", list(F.KV_DTYPES))
def test_round_trip_error(name):
    fmt = F.FORMATS[name]
    g = torch.Generator().manual_seed(7)
    x = torch.randn(33, 4, 256, generator=g)
    x[..., 11] *= 25.0
    x[3, 1] = 0.0  # an all-zero row: zero scales, zero codes
    x = x.bfloat16()
    k, v = R.roundtrip(fmt, x, x)
    for out in (k, v):
        assert torch.all(out[3, 1] == 0)
        err = ((out - x.float()).norm() / x.float().norm()).item()
        assert err <= BOUND[name] + 1e-7, (name, err)
    # K's codec is exact on the stored grid: encoding the decoded (rotated) values changes nothing
    codes, scales = R.encode(fmt.k, x)
    stored = R.decode(fmt.k, codes, scales, 256, unrotate=False)
    if fmt.k.kind in (F.E4M3, F.INT8):
        c2, s2 = R.encode(F.Codec("t", fmt.k.kind, fmt.k.bits, fmt.k.code_dtype, fmt.k.group, fmt.k.scale_dtype), stored)
        assert torch.equal(R.decode(fmt.k, c2, s2, 256, unrotate=False), stored)


def test_lloyd4_codebook_is_the_scaled_lloyd_max_points():
    pts = (0.1284, 0.3881, 0.6568, 0.9424, 1.2562, 1.6181, 2.0690, 2.7326)
    assert F.LLOYD4_CODES == tuple(round(p * 127 / pts[-1]) for p in pts)
    assert F.LLOYD4_BOUNDARIES == tuple(round((a + b) / 2, 5) for a, b in zip(pts, pts[1:]))
