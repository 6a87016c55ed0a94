"""The PTX text of the linear family's inline-asm paths (pure Python: no torch / triton import).

Every instruction sequence the decode GEMVs hand to `tl.inline_asm_elementwise` is written here;
the kernel modules wrap the strings in `tl.constexpr` and pick one by their compile-time parameters:
- `q4_word_asm_source`     gemv.py (`q4_gemv`, USE_ASM): one 32-bit Q4 word of one row, all columns;
- `chunk_asm_source`       gemv_lowreg.py (`q4_gemv_lowreg`, `q5/q6_gemv_lowreg`): one 16-byte chunk
                           (4 words) of one row, Q4 / Q5 / Q6, from `chunk_setup_lines` /
                           `word_pair_lines` (the prmt / lop3 magic-number lane pairs);
- `tc_step_asm_source`     gemv_tc.py (`q4/q5/q6_gemv_tc`): one lane's 128-lane K step into
                           `mma.sync.m16n8k16`, from the same lane-pair lines;
- `tc_w8_step_asm_source`  gemv_tc_w8.py (`w8_gemv_tc`): that K step for W8 (`w8_pair_lines`);
- `dequant_asm_source` / `mma_asm_source`  gemm_tc.py (`<f>_gemm_tc`): the K step split in two
                           blocks, the dequant (Q4/5/6/W8 -> 32 A registers) and one column tile's mma;
- their operand constraint strings, and the one-instruction loads / stores (`LD_*`, `ST_*`).
The Triton interpreter does not run inline asm: the tests check these texts with a bit-level PTX
emulator (tests/kernels/linear/ptx_emulator.py); only a GPU run checks the kernels that inline them.
"""

from __future__ import annotations

# ---------------------------------------------------------------------------------------------
# one-instruction loads and stores (operand $N: the address as a 64-bit integer)
# ---------------------------------------------------------------------------------------------
LD_W = "ld.global.nc.L1::no_allocate.v4.b32 {$0, $1, $2, $3}, [$4];"   # 16 weight bytes, no L1 allocation
# the same with an L2 prefetch hint of the surrounding 256-byte block (a warp reads 512 contiguous
# bytes of a row per step; the hint lets L2 fetch whole DRAM bursts ahead of the next warp's touch)
LD_W_L2 = "ld.global.nc.L1::no_allocate.L2::256B.v4.b32 {$0, $1, $2, $3}, [$4];"
LD_X = "ld.global.nc.v4.b32 {$0, $1, $2, $3}, [$4];"                  # 16 activation bytes (8 bf16)
LD_1 = "ld.global.nc.b32 $0, [$1];"
LD_2 = "ld.global.nc.v2.b32 {$0, $1}, [$2];"
LD_F16 = "{ .reg .b16 h; ld.global.nc.b16 h, [$1]; cvt.f32.f16 $0, h; }"   # one f16 scale -> fp32
# SHFL_SCALES: lane (g, c) loads the two f16 group scales of K step kq + c of its row (4 bytes; the
# 4 lanes of a row read 16 contiguous bytes), and at step kq + j takes lane 4 g + j's word, half c // 2
SHFL_F16 = ("{ .reg .b32 t; .reg .b16 lo, hi; shfl.sync.idx.b32 t, $1, $2, 0x1f, 0xffffffff; "
            "shr.b32 t, t, $3; mov.b32 {lo, hi}, t; cvt.f32.f16 $0, lo; }")
LD_BF16 = "{ .reg .b16 h, z; mov.b16 z, 0; ld.global.b16 h, [$1]; mov.b32 $0, {z, h}; }"  # bf16 -> fp32
ST_16 = ("{ .reg .pred p; .reg .b16 lo, hi; setp.ne.b32 p, $2, 0; mov.b32 {lo, hi}, $3; "
         "@p st.global.b16 [$1], lo; mov.b32 $0, 0; }")
ST_32 = "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p st.global.b32 [$1], $3; mov.b32 $0, 0; }"


# ---------------------------------------------------------------------------------------------
# q4_gemv (gemv.py, USE_ASM: Q4, sm_90+, not under the interpreter): packed bf16x2 dot product
# per 32-bit word.
# One asm instance = one word (8 lanes) of one row, for all BLOCK_T columns at once:
#   w4 = w >> 4                                   1 op
#   pair p (lanes 2p, 2p+1): prmt byte p of w / w4 into bytes 0 / 2           4 ops
#   lop3 (. & 0x000F000F) ^ 0x43084308 -> bf16x2 (128 + (u ^ 8)) = q + 136   4 ops
#   fma.rn.bf16x2 (m * 1 - 136) -> exact q in bf16x2                          4 ops
#   per column: 4 fma.rn.bf16x2 with the natural bf16 pairs (x[2p], x[2p+1])
#   (each half accumulates 4 products in bf16), then both halves are widened
#   to fp32 (shl / and) and added: 7 ops; the group scale is applied outside
#   (one fp32 FMA per word and column).
# => (13 + 8 T) / 8 instructions per weight (T=1: 2.6, T=4: 5.6) versus ~5 T for the fp32 path.
# ---------------------------------------------------------------------------------------------
def q4_word_asm_source(n_t: int) -> str:
    """PTX of one Q4 word (8 lanes) of one row for `n_t` columns."""
    # operands: $0..$(n_t-1) fp32 outputs, $n_t the word, $(n_t+1+4t+p) column t's natural bf16
    # pair p (x[8w+2p], x[8w+2p+1]) of this word
    w = f"${n_t}"
    lines = ["{", ".reg .b32 w4, p0, p1, p2, p3, m0, m1, m2, m3, q0, q1, q2, q3, a, lo, hi, one, k136, nz;",
             "mov.b32 one, 0x3F803F80;", "mov.b32 k136, 0xC308C308;", "mov.b32 nz, 0x80008000;",
             f"shr.u32 w4, {w}, 4;"]
    for p in range(4):
        lines.append(f"prmt.b32 p{p}, {w}, w4, 0x{4 + p}{4 + p}{p}{p};")
    for p in range(4):
        lines.append(f"lop3.b32 m{p}, p{p}, 0x000F000F, 0x43084308, 0x6A;")
    for p in range(4):
        lines.append(f"fma.rn.bf16x2 q{p}, m{p}, one, k136;")
    for t in range(n_t):
        for p in range(4):
            acc = "nz" if p == 0 else "a"
            lines.append(f"fma.rn.bf16x2 a, q{p}, ${n_t + 1 + 4 * t + p}, {acc};")
        lines.append("shl.b32 lo, a, 16;")
        lines.append("and.b32 hi, a, 0xFFFF0000;")
        lines.append(f"add.f32 ${t}, lo, hi;")
    lines.append("}")
    return "\n".join(lines)


def q4_word_constraints(n_t: int) -> str:
    return ",".join(["=f"] * n_t + ["r"] * (1 + 4 * n_t))


# ---------------------------------------------------------------------------------------------
# q4_gemv_lowreg / q5_gemv_lowreg / q6_gemv_lowreg (gemv_lowreg.py): one 16-byte chunk of one row
# ---------------------------------------------------------------------------------------------
BIAS = {4: "0xC308C308", 5: "0xC310C310", 6: "0xC320C320"}     # bf16x2 -136 / -144 / -160
_MASK = {4: "0x000F000F", 5: "0x001F001F", 6: "0x003F003F"}
_MAGIC = {4: "0x43084308", 5: "0x43104310", 6: "0x43204320"}    # 128.0 | flip of bit (b-1)
_SEL = "0xD8"   # lop3 select: c ? b : a
HIGH_WORDS = {4: 0, 5: 1, 6: 2}   # high-bit words per 16-byte chunk


def chunk_regs(fmt: int, pfx: str = "") -> list[str]:
    """Temporaries of `chunk_setup_lines` / `word_pair_lines` (prefixed, so that several chunks can
    be dequantized in one asm block)."""
    regs = ["w4", "A", "B", "pp"]
    if fmt == 5:
        regs += ["h0", "h1", "h2", "h3", "ya", "yb", "y", "y1"]
    if fmt == 6:
        regs += ["s0", "s1", "x", "x2"]
    return [pfx + r for r in regs]


def chunk_setup_lines(fmt: int, highs: list[str], pfx: str = "") -> list[str]:
    """Per-chunk preparation of the high words (Q5: 1, Q6: 2 operands in `highs`)."""
    if fmt == 5:
        h = highs[0]
        return [f"shl.b32 {pfx}h0, {h}, 4;", f"shl.b32 {pfx}h1, {h}, 2;", f"mov.b32 {pfx}h2, {h};",
                f"shr.u32 {pfx}h3, {h}, 2;"]
    if fmt == 6:
        return [f"shl.b32 {pfx}s0, {highs[0]}, 4;", f"shl.b32 {pfx}s1, {highs[1]}, 4;"]
    return []


def word_pair_lines(fmt: int, j: int, w: str, highs: list[str], q: list[str], pfx: str = "",
                    one: str = "one", kb: str = "kb") -> list[str]:
    """Word j of a chunk (operand `w`) -> its 4 lane pairs (2p, 2p+1) as exact bf16x2 codes in the
    registers `q` (prmt/lop3 magic-number conversion, one fma.rn.bf16x2 removes the bias)."""
    lines = [f"shr.u32 {pfx}w4, {w}, 4;"]
    if fmt == 4:
        a, b = w, f"{pfx}w4"
    elif fmt == 5:
        lines.append(f"prmt.b32 {pfx}ya, {pfx}h0, {pfx}h1, 0x{j:x}{j:x}{4 + j:x}{j:x};")    # b0 <- h0.j, b1 <- h1.j
        lines.append(f"prmt.b32 {pfx}yb, {pfx}h2, {pfx}h3, 0x{4 + j:x}{j:x}{4 + j:x}{j:x};")  # b2 <- h2.j, b3 <- h3.j
        lines.append(f"lop3.b32 {pfx}y, {pfx}ya, {pfx}yb, 0xFFFF0000, {_SEL};")
        lines.append(f"shr.u32 {pfx}y1, {pfx}y, 1;")
        lines.append(f"lop3.b32 {pfx}A, {w}, {pfx}y, 0x10101010, {_SEL};")
        lines.append(f"lop3.b32 {pfx}B, {pfx}w4, {pfx}y1, 0x10101010, {_SEL};")
        a, b = f"{pfx}A", f"{pfx}B"
    else:
        hh = j % 2
        src_s = f"{pfx}s0" if j < 2 else f"{pfx}s1"
        src_h = highs[j // 2]
        sel = ((4 + 2 * hh + 1) << 12) | ((2 * hh + 1) << 8) | ((4 + 2 * hh) << 4) | (2 * hh)
        lines.append(f"prmt.b32 {pfx}x, {src_s}, {src_h}, 0x{sel:04x};")
        lines.append(f"shr.u32 {pfx}x2, {pfx}x, 2;")
        lines.append(f"lop3.b32 {pfx}A, {w}, {pfx}x, 0x30303030, {_SEL};")
        lines.append(f"lop3.b32 {pfx}B, {pfx}w4, {pfx}x2, 0x30303030, {_SEL};")
        a, b = f"{pfx}A", f"{pfx}B"
    for p in range(4):
        lines.append(f"prmt.b32 {pfx}pp, {a}, {b}, 0x{4 + p}{4 + p}{p}{p};")
        lines.append(f"lop3.b32 {pfx}pp, {pfx}pp, {_MASK[fmt]}, {_MAGIC[fmt]}, 0x6A;")
        lines.append(f"fma.rn.bf16x2 {q[p]}, {pfx}pp, {one}, {kb};")
    return lines


def chunk_asm_source(fmt: int, n_t: int, chain: int) -> str:
    """PTX of one (row, chunk) instance. Operands: $0..$(n_t-1) fp32 outputs; then the 4 words;
    then the high words (Q5: 1, Q6: 2); then column t's 16 bf16x2 x pairs (word j, pair p at
    16 t + 4 j + p)."""
    nh = HIGH_WORDS[fmt]
    iw = n_t
    ih = n_t + 4
    ix = n_t + 4 + nh
    highs = [f"${ih + i}" for i in range(nh)]
    regs = chunk_regs(fmt) + ["q0", "q1", "q2", "q3", "lo", "hi", "one", "kb", "nz"]
    regs += [f"a{t}" for t in range(n_t)]
    lines = ["{", f".reg .b32 {', '.join(regs)};", "mov.b32 one, 0x3F803F80;",
             f"mov.b32 kb, {BIAS[fmt]};", "mov.b32 nz, 0x80008000;"]
    lines += chunk_setup_lines(fmt, highs)
    for j in range(4):
        lines += word_pair_lines(fmt, j, f"${iw + j}", highs, ["q0", "q1", "q2", "q3"])
        first_in_chain = j % chain == 0
        last_in_chain = j % chain == chain - 1 or j == 3
        for t in range(n_t):
            for p in range(4):
                acc = "nz" if (first_in_chain and p == 0) else f"a{t}"
                lines.append(f"fma.rn.bf16x2 a{t}, q{p}, ${ix + 16 * t + 4 * j + p}, {acc};")
            if last_in_chain:
                lines.append(f"shl.b32 lo, a{t}, 16;")
                lines.append(f"and.b32 hi, a{t}, 0xFFFF0000;")
                if j < chain:   # first chain of the chunk
                    lines.append(f"add.f32 ${t}, lo, hi;")
                else:
                    lines.append(f"add.f32 ${t}, ${t}, lo;")
                    lines.append(f"add.f32 ${t}, ${t}, hi;")
    lines.append("}")
    return "\n".join(lines)


def chunk_constraints(fmt: int, n_t: int) -> str:
    nh = HIGH_WORDS[fmt]
    return ",".join(["=f"] * n_t + ["r"] * (4 + nh + 16 * n_t))


# ---------------------------------------------------------------------------------------------
# q4_gemv_tc / q5_gemv_tc / q6_gemv_tc (gemv_tc.py): one lane's K step into mma.sync
# ---------------------------------------------------------------------------------------------
def tc_step_asm_source(fmt: int, n_tiles: int) -> str:
    """PTX of one lane's 128-lane K step for rows g and g+8 and `n_tiles` 8-column tiles.
    Operands: $0..$(4n-1) fp32 accumulators out; then 4n accumulators in; row g's 4 words and
    high words; row g+8's 4 words and high words; the fp32 scales of rows g, g+8; then tile t's
    16 x registers (load j, pair p at 16 t + 4 j + p)."""
    nh = HIGH_WORDS[fmt]
    n_acc = 4 * n_tiles
    i_in = n_acc
    i_wg = i_in + n_acc
    i_hg = i_wg + 4
    i_wh = i_hg + nh
    i_hh = i_wh + 4
    i_s = i_hh + nh
    i_x = i_s + 2
    hg = [f"${i_hg + i}" for i in range(nh)]
    hh = [f"${i_hh + i}" for i in range(nh)]
    P = ["P0", "P1", "P2", "P3"]
    Q = ["Q0", "Q1", "Q2", "Q3"]
    regs = chunk_regs(fmt, "g_") + chunk_regs(fmt, "h_") + P + Q + ["one", "kb", "nz", "sg", "sh"]
    lines = ["{", f".reg .b32 {', '.join(regs)};", "mov.b32 one, 0x3F803F80;", f"mov.b32 kb, {BIAS[fmt]};",
             "mov.b32 nz, 0x80008000;",
             f"cvt.rn.bf16x2.f32 sg, ${i_s}, ${i_s};", f"cvt.rn.bf16x2.f32 sh, ${i_s + 1}, ${i_s + 1};"]
    for a in range(n_acc):
        lines.append(f"mov.f32 ${a}, ${i_in + a};")
    lines += chunk_setup_lines(fmt, hg, "g_") + chunk_setup_lines(fmt, hh, "h_")
    for j in range(4):
        lines += word_pair_lines(fmt, j, f"${i_wg + j}", hg, P, "g_")
        lines += [f"fma.rn.bf16x2 {p}, {p}, sg, nz;" for p in P]
        lines += word_pair_lines(fmt, j, f"${i_wh + j}", hh, Q, "h_")
        lines += [f"fma.rn.bf16x2 {q}, {q}, sh, nz;" for q in Q]
        for t in range(n_tiles):
            d = ", ".join(f"${4 * t + i}" for i in range(4))
            for h in range(2):
                b0 = f"${i_x + 16 * t + 4 * j + 2 * h}"
                b1 = f"${i_x + 16 * t + 4 * j + 2 * h + 1}"
                lines.append(f"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{d}}}, "
                             f"{{{P[2 * h]}, {Q[2 * h]}, {P[2 * h + 1]}, {Q[2 * h + 1]}}}, {{{b0}, {b1}}}, {{{d}}};")
    lines.append("}")
    return "\n".join(lines)


def tc_step_constraints(fmt: int, n_tiles: int) -> str:
    n_acc = 4 * n_tiles
    nh = HIGH_WORDS[fmt]
    return ",".join(["=f"] * n_acc + ["f"] * n_acc + ["r"] * (8 + 2 * nh) + ["f", "f"] + ["r"] * (16 * n_tiles))


# ---------------------------------------------------------------------------------------------
# w8_gemv_tc (gemv_tc_w8.py): the K step for the W8 G32 planes
# ---------------------------------------------------------------------------------------------
_PAIR_SEL = ("0x4140", "0x4342")   # bytes (0, 1) / (2, 3) of the word into the low bytes of each half


def w8_pair_lines(w: str, p: int, dst: str, scale: str) -> list[str]:
    """Lanes 2p, 2p+1 of word `w` (two's complement bytes) -> `dst` = bf16x2 (q * scale)."""
    return [f"prmt.b32 pp, {w}, zr, {_PAIR_SEL[p]};",
            "lop3.b32 pv, pp, 0x007F007F, 0x43004300, 0xEA;",    # (a & b) | c: 128 + low 7 bits
            "lop3.b32 pb, pp, 0x00800080, 0xC300C300, 0xEA;",    # -128, or -256 when the sign bit is set
            f"fma.rn.bf16x2 {dst}, pv, one, pb;",                  # q, exact
            f"fma.rn.bf16x2 {dst}, {dst}, {scale}, nz;"]


def tc_w8_step_asm_source(n_tiles: int) -> str:
    """PTX of one lane's 128-lane K step for rows g and g+8 and `n_tiles` 8-column tiles.
    Operands: $0..$(4n-1) fp32 accumulators out; then 4n accumulators in; row g's 8 words; row g+8's
    8 words; the fp32 scales of (row g, chunk 0), (g, 1), (g+8, 0), (g+8, 1); then tile t's 16 x
    registers (load L, pair p at 16 t + 4 L + p)."""
    n_acc = 4 * n_tiles
    i_in = n_acc
    i_wg = i_in + n_acc
    i_wh = i_wg + 8
    i_s = i_wh + 8
    i_x = i_s + 4
    regs = ["pp", "pv", "pb", "P0", "P1", "Q0", "Q1", "one", "zr", "nz", "sg0", "sg1", "sh0", "sh1"]
    lines = ["{", f".reg .b32 {', '.join(regs)};", "mov.b32 one, 0x3F803F80;", "mov.b32 zr, 0;",
             "mov.b32 nz, 0x80008000;"]
    for i, r in enumerate(("sg0", "sg1", "sh0", "sh1")):
        lines.append(f"cvt.rn.bf16x2.f32 {r}, ${i_s + i}, ${i_s + i};")
    for a in range(n_acc):
        lines.append(f"mov.f32 ${a}, ${i_in + a};")
    for j in range(8):
        sg, sh = ("sg0", "sh0") if j < 4 else ("sg1", "sh1")
        for p in range(2):
            lines += w8_pair_lines(f"${i_wg + j}", p, f"P{p}", sg)
            lines += w8_pair_lines(f"${i_wh + j}", p, f"Q{p}", sh)
        for t in range(n_tiles):
            d = ", ".join(f"${4 * t + i}" for i in range(4))
            b0 = f"${i_x + 16 * t + 2 * j}"
            b1 = f"${i_x + 16 * t + 2 * j + 1}"
            lines.append(f"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{d}}}, "
                         f"{{P0, Q0, P1, Q1}}, {{{b0}, {b1}}}, {{{d}}};")
    lines.append("}")
    return "\n".join(lines)


def tc_w8_step_constraints(n_tiles: int) -> str:
    n_acc = 4 * n_tiles
    return ",".join(["=f"] * n_acc + ["f"] * n_acc + ["r"] * 16 + ["f"] * 4 + ["r"] * (16 * n_tiles))


# ---------------------------------------------------------------------------------------------
# gemm_tc: the K step in two blocks (dequant once, then one mma block per n8 column tile)
# ---------------------------------------------------------------------------------------------
W8 = 8   # the FMT code of W8 G32


def dequant_asm_source(fmt: int) -> str:
    """PTX: one lane's raw words of K step kb -> the 32 A-fragment registers $0..$31 (mma i takes
    $4i .. $4i+3). Inputs from $32: Q4/5/6: row g's 4 words + high words, row g+8's, the fp32 scales
    of rows g, g+8; W8: row g's 8 words, row g+8's 8 words, scales (g, chunk 0), (g, 1), (g+8, 0),
    (g+8, 1)."""
    i0 = 32
    if fmt == W8:
        regs = ["pp", "pv", "pb", "P0", "P1", "Q0", "Q1", "one", "zr", "nz", "sg0", "sg1", "sh0", "sh1"]
        lines = ["{", f".reg .b32 {', '.join(regs)};", "mov.b32 one, 0x3F803F80;", "mov.b32 zr, 0;",
                 "mov.b32 nz, 0x80008000;"]
        for i, r in enumerate(("sg0", "sg1", "sh0", "sh1")):
            lines.append(f"cvt.rn.bf16x2.f32 {r}, ${i0 + 16 + i}, ${i0 + 16 + i};")
        for j in range(8):
            sg, sh = ("sg0", "sh0") if j < 4 else ("sg1", "sh1")
            for p in range(2):
                lines += w8_pair_lines(f"${i0 + j}", p, f"P{p}", sg)
                lines += w8_pair_lines(f"${i0 + 8 + j}", p, f"Q{p}", sh)
            lines += [f"mov.b32 ${4 * j}, P0;", f"mov.b32 ${4 * j + 1}, Q0;", f"mov.b32 ${4 * j + 2}, P1;",
                      f"mov.b32 ${4 * j + 3}, Q1;"]
        lines.append("}")
        return "\n".join(lines)
    nh = HIGH_WORDS[fmt]
    i_wg = i0
    i_hg = i_wg + 4
    i_wh = i_hg + nh
    i_hh = i_wh + 4
    i_s = i_hh + nh
    hg = [f"${i_hg + i}" for i in range(nh)]
    hh = [f"${i_hh + i}" for i in range(nh)]
    P = ["P0", "P1", "P2", "P3"]
    Q = ["Q0", "Q1", "Q2", "Q3"]
    regs = chunk_regs(fmt, "g_") + chunk_regs(fmt, "h_") + P + Q + ["one", "kb", "nz", "sg", "sh"]
    lines = ["{", f".reg .b32 {', '.join(regs)};", "mov.b32 one, 0x3F803F80;", f"mov.b32 kb, {BIAS[fmt]};",
             "mov.b32 nz, 0x80008000;",
             f"cvt.rn.bf16x2.f32 sg, ${i_s}, ${i_s};", f"cvt.rn.bf16x2.f32 sh, ${i_s + 1}, ${i_s + 1};"]
    lines += chunk_setup_lines(fmt, hg, "g_") + chunk_setup_lines(fmt, hh, "h_")
    for j in range(4):
        lines += word_pair_lines(fmt, j, f"${i_wg + j}", hg, P, "g_")
        lines += [f"fma.rn.bf16x2 {p}, {p}, sg, nz;" for p in P]
        lines += word_pair_lines(fmt, j, f"${i_wh + j}", hh, Q, "h_")
        lines += [f"fma.rn.bf16x2 {q}, {q}, sh, nz;" for q in Q]
        for h in range(2):
            o = 4 * (2 * j + h)
            lines += [f"mov.b32 ${o}, {P[2 * h]};", f"mov.b32 ${o + 1}, {Q[2 * h]};",
                      f"mov.b32 ${o + 2}, {P[2 * h + 1]};", f"mov.b32 ${o + 3}, {Q[2 * h + 1]};"]
    lines.append("}")
    return "\n".join(lines)


def dequant_constraints(fmt: int) -> str:
    ins = ["r"] * 16 + ["f"] * 4 if fmt == W8 else ["r"] * (8 + 2 * HIGH_WORDS[fmt]) + ["f", "f"]
    return ",".join(["=r"] * 32 + ins)


def mma_asm_source() -> str:
    """PTX: one n8 column tile's K step: $0..$3 (fp32 accumulators out) = $52..$55 (in) + the 8 mma
    m16n8k16 of A registers $4.. (mma i: $4+4i .. $4+4i+3) and the tile's x registers $36..
    (mma i: $36+2i, $37+2i). (The kernel concatenates its A tuple, the x tuple, then the accumulators.)"""
    lines = ["{"] + [f"mov.f32 ${a}, ${52 + a};" for a in range(4)]
    for i in range(8):
        a = ", ".join(f"${4 + 4 * i + r}" for r in range(4))
        lines.append(f"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{$0, $1, $2, $3}}, {{{a}}}, "
                     f"{{${36 + 2 * i}, ${37 + 2 * i}}}, {{$0, $1, $2, $3}};")
    lines.append("}")
    return "\n".join(lines)


def mma_constraints() -> str:
    return ",".join(["=f"] * 4 + ["r"] * 48 + ["f"] * 4)
