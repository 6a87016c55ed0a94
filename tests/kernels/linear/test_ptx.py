"""The PTX text of `q4_gemv`'s USE_ASM path (ptx.q4_word_asm_source), run by the bit-level emulator
(ptx_emulator.py) on random Q4 words against the decoded codes; the interpreter never runs it.
(The chunk / tensor-core K-step texts have their emulated tests next to their routes' tests.)"""

import random

import pytest

from ninfer_compile.kernels.linear import ptx

from ptx_emulator import bf, bf16_round, emulate, f32


@pytest.mark.parametrize("n_t", [1, 2, 4])
def test_q4_word_asm_emulated(n_t):
    rng = random.Random(40 + n_t)
    src = ptx.q4_word_asm_source(n_t)
    assert len(ptx.q4_word_constraints(n_t).split(",")) == n_t + 1 + 4 * n_t
    for trial in range(8):
        codes = [rng.randint(-8, 7) for _ in range(8)]
        if trial == 0:
            codes = [-8 if i % 2 else 7 for i in range(8)]
        word = sum((c & 0xF) << (4 * i) for i, c in enumerate(codes))   # lane i: two's complement nibble
        xs = [[bf16_round(rng.gauss(0.0, 1.0)) for _ in range(8)] for _ in range(n_t)]
        ops = [0] * n_t + [word] + [xs[t][2 * p] | (xs[t][2 * p + 1] << 16) for t in range(n_t) for p in range(4)]
        regs = emulate(src, ops)
        for t in range(n_t):
            exact = sum(codes[i] * bf(xs[t][i]) for i in range(8))
            mag = sum(abs(codes[i] * bf(xs[t][i])) for i in range(8))
            assert abs(f32(regs[f"${t}"]) - exact) <= mag * 2.0 ** -7, (n_t, t, codes)
