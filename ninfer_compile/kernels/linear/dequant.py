"""Triton dequant helpers over the stored row-split planes (no repack).

Formats are a constexpr `FMT`: 4, 5, 6 (G64 nibble base plane + high-bit plane), 8 (W8 G32,
one byte per lane), 16 (bf16 weights, pass-through).

Bit tricks (cheap dequant, no I2F — the int→float convert runs at a quarter rate on sm_90):
- 32-bit word loads: one word = 8 nibble lanes (Q4/5/6) or 4 byte lanes (W8).
- Codes are made offset-binary by one XOR (`u ^ 2^(b-1)` = q + 2^(b-1); for Q4 the whole word is
  XORed with 0x88888888 once for 8 lanes) and converted with the magic number 2^23:
  `bitcast_f32(v | 0x4B000000) - (2^23 + 2^(b-1))` = q exactly (an integer OR + one FADD).
- `USE_ASM` (Q4, sm_90 only; the interpreter cannot run inline asm): 2 words at a time, `prmt`
  pairs bytes of the two words, `lop3` drops a nibble pair into the mantissa of a bf16x2 magic
  (0x4300 = 128.0), then `fma.rn.bf16x2` subtracts 136 (exact) and multiplies by the group
  scale — about 1.1 instructions per weight in packed bf16x2 math.
"""

from __future__ import annotations

import triton
import triton.language as tl

# 0x88888888 / 0x80808080 as signed int32 (the XOR that turns two's complement lanes into
# offset binary).
XOR_Q4 = tl.constexpr(-2004318072)
XOR_W8 = tl.constexpr(-2139062144)


@triton.jit
def magic_f32(v, OFF: tl.constexpr):
    """Exact fp32 of (v - OFF) for an int32 0 <= v < 2^23 without an I2F."""
    return (v | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + OFF)


# ---------------------------------------------------------------------------------------------
# 2-D dequant for the tensor-core schedules: bf16 W_hat tile [BN, BK] (lane order k0..k0+BK).
# Each lane l of a word is its own [BN, KW] tensor; a fixed join tree interleaves them.
# ---------------------------------------------------------------------------------------------
@triton.jit
def to_bf16(v, INTERP: tl.constexpr):
    """fp32 -> bf16, round to nearest even. The Triton interpreter (3.9) truncates fp32 -> bf16,
    so under it the rounding is done on the bits first (then the conversion is exact)."""
    if INTERP:
        b = v.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        v = b.to(tl.float32, bitcast=True)
    return v.to(tl.bfloat16)


@triton.jit
def _join8(l0, l1, l2, l3, l4, l5, l6, l7, BN: tl.constexpr, BK: tl.constexpr):
    # join adds a minor dim; the flat index of the tree below is 8w + 4a + 2b + c with the outer
    # join selecting c (even / odd lane), the middle b, the inner a.
    r = tl.join(tl.join(tl.join(l0, l4), tl.join(l2, l6)), tl.join(tl.join(l1, l5), tl.join(l3, l7)))
    return tl.reshape(r, (BN, BK))


@triton.jit
def _join4(l0, l1, l2, l3, BN: tl.constexpr, BK: tl.constexpr):
    r = tl.join(tl.join(l0, l2), tl.join(l1, l3))
    return tl.reshape(r, (BN, BK))


@triton.jit
def _q4_lane(wx, s, J: tl.constexpr):
    return (magic_f32((wx >> (4 * J)) & 0xF, 8) * s)


@triton.jit
def _q5_lane(w, h, hsh, s, J: tl.constexpr):
    v = (((w >> (4 * J)) & 0xF) | (((h >> (hsh + J)) & 1) << 4)) ^ 16
    return (magic_f32(v, 16) * s)


@triton.jit
def _q6_lane(w, h, hsh, s, J: tl.constexpr):
    v = (((w >> (4 * J)) & 0xF) | (((h >> (hsh + 2 * J)) & 3) << 4)) ^ 32
    return (magic_f32(v, 32) * s)


@triton.jit
def _w8_lane(wx, s, J: tl.constexpr):
    return (magic_f32((wx >> (8 * J)) & 0xFF, 128) * s)


def _q4_asm_source() -> str:
    lines = [
        "{",
        ".reg .b32 p0, p1, p2, p3, t0, t1, t2, t3, r0, r1, r2, r3, r4, r5, r6, r7, sc, one, k136, nz;",
        "mov.b32 one, 0x3F803F80;",   # bf16x2 (1, 1)
        "mov.b32 k136, 0xC308C308;",  # bf16x2 (-136, -136)
        "mov.b32 nz, 0x80008000;",    # bf16x2 (-0, -0)
        "mov.b32 sc, $10;",
    ]
    # byte i of word a -> byte 0, byte i of word b -> byte 2 (all inputs read before any output)
    for i in range(4):
        lines.append(f"prmt.b32 p{i}, $8, $9, 0x0{4 + i}0{i};")
    for i in range(4):
        lines.append(f"shr.u32 t{i}, p{i}, 4;")
        lines.append(f"lop3.b32 r{2 * i}, p{i}, 0x000F000F, 0x43004300, 0xEA;")
        lines.append(f"lop3.b32 r{2 * i + 1}, t{i}, 0x000F000F, 0x43004300, 0xEA;")
    for lane in range(8):
        lines.append(f"fma.rn.bf16x2 r{lane}, r{lane}, one, k136;")
        lines.append(f"fma.rn.bf16x2 ${lane}, r{lane}, sc, nz;")
    lines.append("}")
    return "\n".join(lines)


Q4_ASM = tl.constexpr(_q4_asm_source())


@triton.jit
def _q4_lanes_asm(wx, sb):
    """wx: [BN, KW] int32 words already XORed with 0x88888888; sb: [BN, KW] bf16 scales.
    Returns 8 bf16 [BN, KW] lane tensors (lane j of each word, times its scale)."""
    return tl.inline_asm_elementwise(
        Q4_ASM,
        "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r",
        [wx, sb],
        dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16,
               tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16),
        is_pure=True,
        pack=2,
    )


@triton.jit
def dequant_tile(base_ptr, high_ptr, scale_ptr, rows, rmask, k0, K, KW_TOTAL,
                 base_row, high_row, scale_row,
                 FMT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 USE_ASM: tl.constexpr, INTERP: tl.constexpr = False):
    """bf16 W_hat[rows, k0:k0+BLOCK_K] as a [BLOCK_N, BLOCK_K] tile (zero outside the matrix).

    FMT 16: `base_ptr` is the bf16 weight, `base_row` its row stride in elements, `K` masks."""
    if FMT == 16:
        kk = k0 + tl.arange(0, BLOCK_K)
        m = rmask[:, None] & (kk < K)[None, :]
        tile = tl.load(base_ptr + rows[:, None] * base_row + kk[None, :], mask=m, other=0.0)
    else:
        LPW: tl.constexpr = 4 if FMT == 8 else 8
        KW: tl.constexpr = BLOCK_K // LPW
        wi = k0 // LPW + tl.arange(0, KW)
        wmask = wi < KW_TOTAL
        m = rmask[:, None] & wmask[None, :]
        w = tl.load(base_ptr + rows[:, None] * base_row + wi[None, :], mask=m, other=0)
        s = tl.load(scale_ptr + rows[:, None] * scale_row + (wi // 8)[None, :], mask=m, other=0.0)
        if FMT == 4:
            wx = w ^ XOR_Q4
            if USE_ASM:
                l0, l1, l2, l3, l4, l5, l6, l7 = _q4_lanes_asm(wx, s.to(tl.bfloat16))
            else:
                sf = s.to(tl.float32)
                l0 = to_bf16(_q4_lane(wx, sf, 0), INTERP)
                l1 = to_bf16(_q4_lane(wx, sf, 1), INTERP)
                l2 = to_bf16(_q4_lane(wx, sf, 2), INTERP)
                l3 = to_bf16(_q4_lane(wx, sf, 3), INTERP)
                l4 = to_bf16(_q4_lane(wx, sf, 4), INTERP)
                l5 = to_bf16(_q4_lane(wx, sf, 5), INTERP)
                l6 = to_bf16(_q4_lane(wx, sf, 6), INTERP)
                l7 = to_bf16(_q4_lane(wx, sf, 7), INTERP)
            tile = _join8(l0, l1, l2, l3, l4, l5, l6, l7, BLOCK_N, BLOCK_K)
        elif FMT == 8:
            wx = w ^ XOR_W8
            sf = s.to(tl.float32)
            l0 = to_bf16(_w8_lane(wx, sf, 0), INTERP)
            l1 = to_bf16(_w8_lane(wx, sf, 1), INTERP)
            l2 = to_bf16(_w8_lane(wx, sf, 2), INTERP)
            l3 = to_bf16(_w8_lane(wx, sf, 3), INTERP)
            tile = _join4(l0, l1, l2, l3, BLOCK_N, BLOCK_K)
        elif FMT == 5:
            sf = s.to(tl.float32)
            h = tl.load(high_ptr + rows[:, None] * high_row + (wi // 4)[None, :], mask=m, other=0)
            hsh = ((wi % 4) * 8)[None, :]
            l0 = to_bf16(_q5_lane(w, h, hsh, sf, 0), INTERP)
            l1 = to_bf16(_q5_lane(w, h, hsh, sf, 1), INTERP)
            l2 = to_bf16(_q5_lane(w, h, hsh, sf, 2), INTERP)
            l3 = to_bf16(_q5_lane(w, h, hsh, sf, 3), INTERP)
            l4 = to_bf16(_q5_lane(w, h, hsh, sf, 4), INTERP)
            l5 = to_bf16(_q5_lane(w, h, hsh, sf, 5), INTERP)
            l6 = to_bf16(_q5_lane(w, h, hsh, sf, 6), INTERP)
            l7 = to_bf16(_q5_lane(w, h, hsh, sf, 7), INTERP)
            tile = _join8(l0, l1, l2, l3, l4, l5, l6, l7, BLOCK_N, BLOCK_K)
        else:  # FMT == 6
            sf = s.to(tl.float32)
            h = tl.load(high_ptr + rows[:, None] * high_row + (wi // 2)[None, :], mask=m, other=0)
            hsh = ((wi % 2) * 16)[None, :]
            l0 = to_bf16(_q6_lane(w, h, hsh, sf, 0), INTERP)
            l1 = to_bf16(_q6_lane(w, h, hsh, sf, 1), INTERP)
            l2 = to_bf16(_q6_lane(w, h, hsh, sf, 2), INTERP)
            l3 = to_bf16(_q6_lane(w, h, hsh, sf, 3), INTERP)
            l4 = to_bf16(_q6_lane(w, h, hsh, sf, 4), INTERP)
            l5 = to_bf16(_q6_lane(w, h, hsh, sf, 5), INTERP)
            l6 = to_bf16(_q6_lane(w, h, hsh, sf, 6), INTERP)
            l7 = to_bf16(_q6_lane(w, h, hsh, sf, 7), INTERP)
            tile = _join8(l0, l1, l2, l3, l4, l5, l6, l7, BLOCK_N, BLOCK_K)
    return tile
