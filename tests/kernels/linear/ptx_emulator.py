"""A bit-level emulator of the linear family's inline PTX (ninfer_compile/kernels/linear/ptx.py).

The Triton interpreter does not run inline asm, so the tests run the generated PTX text here: one
lane's registers (`step_line`, `emulate`: mov / shl / shr / and / prmt / lop3 / bf16x2 FMA / cvt /
fp32 add, bit-exact, round to nearest even), and a warp of 32 lanes in lockstep (`emulate_warp`,
`mma.sync.m16n8k16` gathered over the lanes with the PTX fragment layouts). Plus the bf16 / fp32 bit
helpers and the storage-layout encoder of one 16-byte chunk (`chunk_operands`).
"""

from __future__ import annotations

import math
import re
import struct

_BRACES = re.compile(r"\{([^}]*)\}")


def bf16_round(v: float) -> int:
    """float (exact in fp64: a bf16 product plus a bf16) -> bf16 bits, round to nearest even."""
    if v == 0.0:
        return 0x8000 if math.copysign(1.0, v) < 0 else 0
    m, e = math.frexp(abs(v))            # v = m * 2^e, 0.5 <= m < 1
    q = m * 256.0                          # 8 significant bits
    r = math.floor(q)
    rem = q - r
    if rem > 0.5 or (rem == 0.5 and r % 2 == 1):
        r += 1
    val = r / 256.0 * 2.0 ** e
    b = struct.unpack("<I", struct.pack("<f", math.copysign(val, v)))[0]
    assert b & 0xFFFF == 0
    return b >> 16


def bf(h: int) -> float:
    return struct.unpack("<f", struct.pack("<I", (h & 0xFFFF) << 16))[0]


def f32(u: int) -> float:
    return struct.unpack("<f", struct.pack("<I", u & 0xFFFFFFFF))[0]


def u32(f: float) -> int:
    return struct.unpack("<I", struct.pack("<f", f))[0]


def _val(regs: dict, tok: str) -> int:
    tok = tok.strip()
    if tok in regs:
        return regs[tok]
    return int(tok, 0) & 0xFFFFFFFF


def f32_round(v: float) -> int:
    """float -> fp32 bits, round to nearest even (struct rounds that way)."""
    return u32(struct.unpack("<f", struct.pack("<f", v))[0])


def step_line(regs: dict, line: str) -> None:
    """Execute one PTX line of the asm programs on one lane's registers (bit-exact)."""
    line = line.strip().rstrip(";")
    if not line or line in "{}" or line.startswith(".reg"):
        return
    op, rest = line.split(None, 1)
    args = [a.strip() for a in rest.split(",")]
    d = args[0]

    def val(tok):
        return _val(regs, tok)

    if op in ("mov.b32", "mov.f32"):
        r = val(args[1])
    elif op == "shr.u32":
        r = val(args[1]) >> int(args[2])
    elif op == "shl.b32":
        r = (val(args[1]) << int(args[2])) & 0xFFFFFFFF
    elif op == "and.b32":
        r = val(args[1]) & val(args[2])
    elif op == "prmt.b32":
        a, b, sel = val(args[1]), val(args[2]), val(args[3])
        by = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
        r = sum(by[(sel >> (4 * i)) & 7] << (8 * i) for i in range(4))
        assert not sel & 0x8888
    elif op == "lop3.b32":
        a, b, c, lut = val(args[1]), val(args[2]), val(args[3]), int(args[4], 0)
        r = 0
        for bit in range(32):
            idx = (((a >> bit) & 1) << 2) | (((b >> bit) & 1) << 1) | ((c >> bit) & 1)
            r |= ((lut >> idx) & 1) << bit
    elif op == "fma.rn.bf16x2":
        a, b, c = val(args[1]), val(args[2]), val(args[3])
        halves = []
        for h in range(2):
            x = bf(a >> (16 * h)) * bf(b >> (16 * h)) + bf(c >> (16 * h))   # exact in fp64
            halves.append(bf16_round(x))
        r = halves[0] | (halves[1] << 16)
    elif op == "cvt.rn.bf16x2.f32":   # a -> upper half, b -> lower half
        r = (bf16_round(f32(val(args[1]))) << 16) | bf16_round(f32(val(args[2])))
    elif op == "add.f32":
        r = f32_round(f32(val(args[1])) + f32(val(args[2])))
    else:
        raise AssertionError(f"emulator: unknown op {op}")
    regs[d] = r & 0xFFFFFFFF


def emulate(src: str, operands: list) -> list:
    """Run the chunk asm: operands[i] is the 32-bit value of $i (outputs ignored on input)."""
    regs = {f"${i}": v for i, v in enumerate(operands)}
    for line in src.splitlines():
        step_line(regs, line)
    return regs


def chunk_operands(fmt: int, codes: list):
    """Encode 32 signed codes as the 4 base words + high words of one chunk (storage layout §3)."""
    b = fmt
    u = [c & ((1 << b) - 1) for c in codes]
    words = []
    for j in range(4):
        wv = 0
        for lane in range(8):
            wv |= (u[8 * j + lane] & 0xF) << (4 * lane)
        words.append(wv)
    highs = []
    if fmt == 5:
        hv = 0
        for i in range(32):
            hv |= ((u[i] >> 4) & 1) << i
        highs = [hv]
    elif fmt == 6:
        bits = 0
        for i in range(32):
            bits |= ((u[i] >> 4) & 3) << (2 * i)
        highs = [bits & 0xFFFFFFFF, bits >> 32]
    return words, highs


def emulate_warp(src: str, lanes: list) -> list:
    """Run the asm on 32 lanes in lockstep; lanes[L] = operand values ($i) of lane L."""
    regs = [{f"${i}": v for i, v in enumerate(ops)} for ops in lanes]
    for line in src.splitlines():
        s = line.strip()
        if not s.startswith("mma.sync"):
            for r in regs:
                step_line(r, s)
            continue
        d, a, b, c = [[t.strip() for t in grp.split(",")] for grp in _BRACES.findall(s)]
        A = [[0.0] * 16 for _ in range(16)]
        B = [[0.0] * 8 for _ in range(16)]
        C = [[0.0] * 8 for _ in range(16)]
        for lane, r in enumerate(regs):
            g, q = lane // 4, lane % 4
            for i, (row, col) in enumerate(((g, 2 * q), (g + 8, 2 * q), (g, 2 * q + 8), (g + 8, 2 * q + 8))):
                v = r[a[i]]
                A[row][col], A[row][col + 1] = bf(v), bf(v >> 16)
            for i, k in enumerate((2 * q, 2 * q + 8)):
                v = r[b[i]]
                B[k][g], B[k + 1][g] = bf(v), bf(v >> 16)
            for i, (row, col) in enumerate(((g, 2 * q), (g, 2 * q + 1), (g + 8, 2 * q), (g + 8, 2 * q + 1))):
                C[row][col] = f32(r[c[i]])
        out = [[f32_round(C[m][n] + sum(A[m][k] * B[k][n] for k in range(16))) for n in range(8)] for m in range(16)]
        for lane, r in enumerate(regs):
            g, q = lane // 4, lane % 4
            for i, (row, col) in enumerate(((g, 2 * q), (g, 2 * q + 1), (g + 8, 2 * q), (g + 8, 2 * q + 1))):
                r[d[i]] = out[row][col]
    return regs
