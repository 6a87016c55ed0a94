"""Triton helpers of the KV formats' codecs (formats.py), shared by the kv_append kernel (encode)
and the attention kernels (decode on load, Q rotation).

Codec kinds (formats.py): 0 bf16, 1 int8_g64, 2 e4m3, 3 e2m1, 4 int4, 5 lloyd4. The float
encoders work on the fp32 bit pattern (exponent field, power-of-two construction) so that they
are exact and identical under the interpreter, triton 3.6 and the newest triton: no division, no
exp2 / log2 approximation, no float8 dtype support needed.
"""

import triton
import triton.language as tl


@triton.jit
def pow2(e):
    """2**e as float32 for int32 e in [-126, 127]."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def exponent(a):
    """floor(log2 a) of a float32 a > 0 in the normal range (-127 for 0)."""
    return ((a.to(tl.int32, bitcast=True) >> 23) & 255) - 127


@triton.jit
def rne(q):
    """Round q >= 0 to the nearest integer, ties to even."""
    r = tl.floor(q + 0.5)
    tie = (r - q) == 0.5
    odd = (r - 2.0 * tl.floor(r * 0.5)) == 1.0
    return tl.where(tie & odd, r - 1.0, r)


@triton.jit
def round_away(y):
    return tl.where(y >= 0, tl.floor(y + 0.5), -tl.floor(-y + 0.5))


@triton.jit
def e4m3_encode(y):
    """float32 -> e4m3fn byte (int32 0..255): nearest even, saturated to ±448 (never NaN)."""
    a = tl.minimum(tl.abs(y), 448.0)
    e = tl.maximum(exponent(a), -6)
    r = rne(a * pow2(3 - e))
    v = r * pow2(e - 3)
    vb = v.to(tl.int32, bitcast=True)
    code = tl.where(v < 0.015625, r.to(tl.int32), ((((vb >> 23) & 255) - 120) << 3) | ((vb >> 20) & 7))
    return tl.where(y < 0, code | 128, code)


@triton.jit
def e4m3_decode(b):
    """e4m3fn byte (int32) -> float32."""
    e = (b >> 3) & 15
    m = b & 7
    v = tl.where(e == 0, m.to(tl.float32) * 0.001953125, (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True))
    return tl.where((b & 128) != 0, -v, v)


@triton.jit
def e2m1_encode(y):
    """float32 -> e2m1 nibble (int32 0..15): nearest even on 0, .5, 1, 1.5, 2, 3, 4, 6; saturated."""
    a = tl.minimum(tl.abs(y), 6.0)
    e = tl.maximum(exponent(a), 0)
    r = rne(a * pow2(1 - e))
    v = r * pow2(e - 1)
    vb = v.to(tl.int32, bitcast=True)
    code = tl.where(v < 1.0, r.to(tl.int32), ((((vb >> 23) & 255) - 126) << 1) | ((vb >> 22) & 1))
    return tl.where(y < 0, code | 8, code)


@triton.jit
def e2m1_decode(n):
    e = (n >> 1) & 3
    m = n & 1
    v = tl.where(e == 0, m.to(tl.float32) * 0.5, (2 + m).to(tl.float32) * (1 << e).to(tl.float32) * 0.25)
    return tl.where((n & 8) != 0, -v, v)


@triton.jit
def lloyd4_decode(n):
    """Nibble -> ±LLOYD4_CODES[n & 7] (formats.py) as float32."""
    i = n & 7
    c = tl.where(i == 0, 6.0, tl.where(i == 1, 18.0, tl.where(i == 2, 31.0, tl.where(i == 3, 44.0,
        tl.where(i == 4, 58.0, tl.where(i == 5, 75.0, tl.where(i == 6, 96.0, 127.0)))))))
    return tl.where((n & 8) != 0, -c, c)


@triton.jit
def lloyd4_index(z):
    """|x| / rms -> the magnitude index 0..7 (formats.LLOYD4_BOUNDARIES)."""
    return ((z >= 0.25825).to(tl.int32) + (z >= 0.52245).to(tl.int32) + (z >= 0.79960).to(tl.int32)
            + (z >= 1.09930).to(tl.int32) + (z >= 1.43715).to(tl.int32) + (z >= 1.84355).to(tl.int32)
            + (z >= 2.40080).to(tl.int32))


@triton.jit
def _wht_stage(x, R: tl.constexpr, BD: tl.constexpr, S: tl.constexpr):
    x4 = tl.permute(tl.reshape(x, [R, BD // (2 * S), 2, S]), (0, 1, 3, 2))
    a, b = tl.split(x4)
    return tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2)), [R, BD])


@triton.jit
def wht(x, R: tl.constexpr, BD: tl.constexpr, NB: tl.constexpr):
    """Unnormalised Walsh-Hadamard transform (Sylvester order) of each NB-lane block of the rows of
    x [R, BD] (NB a power of two dividing BD); multiply by 1/sqrt(NB) for the orthonormal one."""
    if NB > 1:
        x = _wht_stage(x, R, BD, 1)
    if NB > 2:
        x = _wht_stage(x, R, BD, 2)
    if NB > 4:
        x = _wht_stage(x, R, BD, 4)
    if NB > 8:
        x = _wht_stage(x, R, BD, 8)
    if NB > 16:
        x = _wht_stage(x, R, BD, 16)
    if NB > 32:
        x = _wht_stage(x, R, BD, 32)
    if NB > 64:
        x = _wht_stage(x, R, BD, 64)
    if NB > 128:
        x = _wht_stage(x, R, BD, 128)
    if NB > 256:
        x = _wht_stage(x, R, BD, 256)
    if NB > 512:
        x = _wht_stage(x, R, BD, 512)
    return x


@triton.jit
def load_rows(c_ptr, sc_ptr, row, nmask, od, D, NSC, KIND: tl.constexpr, GROUP: tl.constexpr):
    """Cache rows `row` ([BN] int64 row indices (slot * max_ctx + n) * Hkv + h) of a codec of kind
    2..5 -> [BN, BD] float32 values in the stored basis (dequantized: code value x scale)."""
    m = nmask[:, None] & (od < D)[None, :]
    if KIND == 2:
        b = tl.load(c_ptr + row[:, None] * D + od[None, :], mask=m, other=0).to(tl.int32) & 255
        vals = e4m3_decode(b)
    else:
        b = tl.load(c_ptr + row[:, None] * (D // 2) + (od // 2)[None, :], mask=m, other=0).to(tl.int32) & 255
        n = (b >> ((od & 1) * 4)[None, :]) & 15
        if KIND == 3:
            vals = e2m1_decode(n)
        elif KIND == 4:
            vals = ((n ^ 8) - 8).to(tl.float32)
        else:
            vals = lloyd4_decode(n)
    s = tl.load(sc_ptr + row[:, None] * NSC + (od // GROUP)[None, :], mask=m, other=0)
    if KIND == 3:
        sf = e4m3_decode(s.to(tl.int32) & 255)
    else:
        sf = s.to(tl.float32)
    return vals * sf
