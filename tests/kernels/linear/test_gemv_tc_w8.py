"""Tensor-core decode GEMV for W8 G32 (w8_gemv_tc).

CPU: the inline-PTX K step of one warp, run by the bit-level warp emulation of ptx_emulator.py (per-lane
prmt / lop3 / bf16x2 / cvt semantics; `mma.sync.m16n8k16` gathered over the 32 lanes with the PTX
fragment layouts) against the decoded codes, for 1 / 2 column tiles: this checks the two chunks per
lane, the K permutation shared by the A and B fragments, the sign-split dequant (every code of
[-128, 127]), the two G32 scales per lane and the accumulator fragment. The launcher under the
interpreter (its fallback runs w8_small_t_mma) on odd shapes, every epilogue, T 1..32 (slices), the
declared domain; the Triton compile of the asm kernel for sm_90 (fragment layout, mma count).
GPU-marked: the asm path against the reference on odd shapes, every epilogue, split-K, row views, and
the 27B MTP shapes (34816x5120 swiglu, 5120x17408 residual).
"""

import random

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels import registry
from ninfer_compile.kernels.linear import gemv_tc_w8 as W8
from ninfer_compile.kernels.linear import ptx

from _linear_helpers import assert_close_rel, run_route
from ptx_emulator import bf, bf16_round, emulate_warp, f32, f32_round, step_line, u32

NAME = "w8_gemv_tc"
FMT = "W8G32_F16S"


def _lane_k(c: int, j: int) -> int:
    """First K lane (of the 128-lane step) of word j of lane c's two chunks."""
    return 16 * c + 4 * j if j < 4 else 64 + 16 * c + 4 * (j - 4)


def _word(codes: list, k0: int) -> int:
    return sum((codes[k0 + i] & 0xFF) << (8 * i) for i in range(4))


@pytest.mark.parametrize("n_tiles", [1, 2])
def test_tc_w8_step_emulated(n_tiles):
    rng = random.Random(80 + n_tiles)
    src = ptx.tc_w8_step_asm_source(n_tiles)
    codes = [[rng.randint(-128, 127) for _ in range(128)] for _ in range(16)]
    codes[0] = [-128 if i % 2 else 127 for i in range(128)]                 # extremes
    codes[1] = [(i % 256) - 128 for i in range(128)]                       # -128 .. -1
    codes[9] = [i for i in range(128)]                                     # 0 .. 127
    scales = [[rng.choice([0.0078125, 0.01171875, 0.0234375, 0.003, 0.0]) for _ in range(4)] for _ in range(16)]
    n_cols = 8 * n_tiles
    xs = [[bf16_round(rng.gauss(0.0, 1.0)) for _ in range(128)] for _ in range(n_cols)]
    acc0 = [[rng.gauss(0.0, 0.5) for _ in range(n_cols)] for _ in range(16)]
    n_acc = 4 * n_tiles
    lanes = []
    for lane in range(32):
        g, c = lane // 4, lane % 4
        frag = []
        for t in range(n_tiles):
            for row, col in ((g, 2 * c), (g, 2 * c + 1), (g + 8, 2 * c), (g + 8, 2 * c + 1)):
                frag.append(f32_round(acc0[row][8 * t + col]))
        ops = [0] * n_acc + frag
        for row in (g, g + 8):
            ops += [_word(codes[row], _lane_k(c, j)) for j in range(8)]
        # scales of (g, chunk 0), (g, chunk 1), (g+8, chunk 0), (g+8, chunk 1): groups c // 2, 2 + c // 2
        ops += [u32(scales[r][grp]) for r in (g, g + 8) for grp in (c // 2, 2 + c // 2)]
        for t in range(n_tiles):
            col = g + 8 * t
            for k0 in (16 * c, 16 * c + 8, 64 + 16 * c, 64 + 16 * c + 8):      # the 4 x loads
                for p in range(4):
                    k = k0 + 2 * p
                    ops.append(xs[col][k] | (xs[col][k + 1] << 16))
        lanes.append(ops)
    regs = emulate_warp(src, lanes)
    for lane in range(32):
        g, c = lane // 4, lane % 4
        for t in range(n_tiles):
            for i, (row, col) in enumerate(((g, 2 * c), (g, 2 * c + 1), (g + 8, 2 * c), (g + 8, 2 * c + 1))):
                col += 8 * t
                got = f32(regs[lane][f"${4 * t + i}"])
                # the kernel's weight: bf16(q * bf16(scale)); products exact, fp32 accumulation
                w = [bf(bf16_round(codes[row][k] * bf(bf16_round(scales[row][k // 32])))) for k in range(128)]
                exact = acc0[row][col] + sum(w[k] * bf(xs[col][k]) for k in range(128))
                mag = abs(acc0[row][col]) + sum(abs(w[k] * bf(xs[col][k])) for k in range(128))
                assert abs(got - exact) <= mag * 2.0 ** -20 + 1e-30, (n_tiles, row, col, got, exact)


def test_w8_dequant_is_exact_for_every_code():
    """The per-pair dequant (prmt, two lop3, one fma) gives every two's complement byte exactly, at
    both pair positions, times the scale rounded once."""
    for p in (0, 1):
        for code in range(-128, 128):
            other = (-code - 1) & 0xFF
            w = ((code & 0xFF) << (16 * p)) | (other << (16 * p + 8)) | (0x5A << (16 * (1 - p)))
            regs = {"$0": w, "one": 0x3F803F80, "zr": 0, "nz": 0x80008000, "sc": 0x3F803F80}
            for line in ptx.w8_pair_lines("$0", p, "d", "sc"):
                step_line(regs, line)
            assert bf(regs["d"]) == float(code) and bf(regs["d"] >> 16) == float(-code - 1), (p, code)


def test_registered_with_launcher_and_domain():
    r = registry.get_route(NAME)
    assert r.family == "linear" and r.domain.formats == (FMT,) and (r.domain.min_t, r.domain.max_t) == (1, 32)
    assert set(r.domain.epilogues) == {"none", "swiglu", "residual"}
    assert r.load_launcher() is W8.w8_gemv_tc
    assert r.kernels == ("ninfer_compile.kernels.linear.gemv_tc_w8:gemv_tc_w8_kernel",)
    # the Q4 / Q5 / Q6 tensor-core routes are unchanged
    for f in ("q4", "q5", "q6"):
        assert registry.get_route(f"{f}_gemv_tc").kernels == ("ninfer_compile.kernels.linear.gemv_tc:gemv_tc_kernel",)


def _run(t, n, k, epi, params, seed, view=None, device="cpu"):
    return run_route(W8.w8_gemv_tc, FMT, t, n, k, epi, params, seed, view, device,
                     workspace_numel=lambda p: W8.linear_workspace_numel(NAME, t, n, k, epi, p))


# K = 160 and 96: not multiples of 128 (the row-split padding of the last K step)
@pytest.mark.parametrize("t,n,k,epi", [(1, 40, 160, "swiglu"), (2, 24, 96, "residual"), (3, 72, 160, "none"),
                                       (5, 40, 96, "swiglu"), (17, 24, 160, "residual"), (32, 40, 96, "none")])
def test_fallback_path_matches_reference(t, n, k, epi):
    out, expected = _run(t, n, k, epi, {"USE_ASM": False}, 7 + t)
    assert_close_rel(out, expected, 1e-2, f"{NAME} T={t} {epi}")


def test_split_k_and_row_view_fallback():
    out, expected = _run(24, 40, 288, "swiglu", {"USE_ASM": False, "SPLIT_K": 2}, 3, view=(8, 64))
    assert_close_rel(out, expected, 1e-2, f"{NAME} split-K view")


def test_t33_and_bad_params_are_refused():
    with pytest.raises(RouteError, match="T=33"):
        _run(33, 40, 96, "none", {}, 1)
    with pytest.raises(RouteError):
        _run(2, 40, 96, "none", {"num_warps": 3}, 1)
    with pytest.raises(RouteError, match="format"):
        run_route(W8.w8_gemv_tc, "Q4G64_F16S", 2, 40, 128, "none", {}, 1)


_LAYOUT_CHILD = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ninfer_compile.kernels.linear.gemv_tc_w8 import gemv_tc_w8_kernel as fn
ptrs = {'x_ptr': '*bf16', 'base_ptr': '*i32', 'scale_ptr': '*fp16', 'out_ptr': '*bf16',
        'res_ptr': '*bf16', 'ws_ptr': '*fp32', 'cnt_ptr': '*i32'}
consts = dict(EPI=1, N_TILES=2, SPLIT_K=1, NW=4, PREFETCH=True, FUSED_REDUCE=False, PDL=False)
names = fn.arg_names
sig = {n: ptrs.get(n, 'constexpr' if n in consts else 'i32') for n in names}
src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                attrs={(names.index(n),): [['tt.divisibility', 16]] for n in ptrs})
k = triton.compile(src, target=GPUTarget('cuda', 90, 32), options={'num_warps': 4, 'num_stages': 1, 'maxnreg': 168})
tt = k.asm['ttgir']
print(json.dumps({"convert": tt.count('convert_layout'),
                  "layouts": dict(re.findall(r'^(#blocked\d*) = ([^\n]*)', tt, re.M)),
                  "asm": sorted(set(re.findall(r'elementwise_inline_asm.*?(tensor<[0-9x]+\w+, #\w+>)', tt))),
                  "hmma": k.asm['ptx'].count('mma.sync.aligned.m16n8k16')}))
"""


def test_asm_lanes_keep_the_mma_fragment_layout():
    """As test_gemv_tc: the asm path assumes lane = 4 g + c and warp = axis 0 of every [NW, 8, 4]
    tensor with no layout conversion; compile the W8 kernel for sm_90 with the installed Triton (a
    child process: the suite runs the interpreter) and check its TTGIR and mma count."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _LAYOUT_CHILD], capture_output=True, text=True, env=env, cwd=repo,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info["convert"] == 0
    assert info["asm"] and all(a.startswith("tensor<4x8x4x") for a in info["asm"]), info["asm"]
    names = {a.rsplit("#", 1)[1].rstrip(">") for a in info["asm"]}
    assert len(names) == 1, names
    layout = info["layouts"]["#" + names.pop()]
    assert "sizePerThread = [1, 1, 1]" in layout and "threadsPerWarp = [1, 8, 4]" in layout \
        and "warpsPerCTA = [4, 1, 1]" in layout and "order = [2, 1, 0]" in layout, layout
    assert info["hmma"] == 2 * 2 * 8   # rows g/up x tiles x words per K step


# ---------------------------------------------------------------------------------------------
# GPU: the inline-PTX path
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 2, 3, 5, 8, 9, 16, 17, 32])
@pytest.mark.parametrize("epi", ["none", "swiglu", "residual"])
def test_asm_path_on_gpu(t, epi):
    for params, (n, k) in (({"USE_ASM": True}, (264, 1184)), ({"USE_ASM": True, "num_warps": 2}, (72, 160)),
                           ({"USE_ASM": True, "num_warps": 1}, (40, 96)),
                           ({"USE_ASM": True, "PREFETCH": True, "MAXNREG": 168, "SPLIT_K": 2}, (264, 1184)),
                           ({"USE_ASM": True, "SPLIT_K": 4, "REDUCE": "fused"}, (264, 1184))):
        out, expected = _run(t, n, k, epi, params, 11 + t, device="cuda")
        assert_close_rel(out, expected, 1e-2, f"{NAME} asm T={t} {epi} {params}")


@pytest.mark.gpu
def test_asm_splitk_view_deterministic_on_gpu():
    for t in (4, 16):
        p = {"USE_ASM": True, "SPLIT_K": 4, "PREFETCH": t == 16}
        out, expected = _run(t, 512, 5120, "swiglu", p, 5, view=(64, 1024), device="cuda")
        assert_close_rel(out, expected, 1e-2, f"{NAME} asm split-K view T={t}")
        again, _ = _run(t, 512, 5120, "swiglu", p, 5, view=(64, 1024), device="cuda")
        assert torch.equal(out, again), "split-K must be deterministic"


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,epi", [(34816, 5120, "swiglu"), (5120, 17408, "residual")])
def test_asm_at_27b_mtp_shapes_on_gpu(n, k, epi):
    """mtp.mlp.gate_up / mtp.mlp.down_proj of the 27B at the verify widths (one random weight and one
    fp32 reference per shape, sliced per T): plain, prefetch + split-K, and split-K 8 with both
    reduces, which must agree bit for bit."""
    from ninfer_compile.kernels.linear.reference import linear as ref_linear
    from _linear_helpers import random_weight

    gen = torch.Generator().manual_seed(9)
    w = random_weight(FMT, n, k, gen)
    n_out = n // 2 if epi == "swiglu" else n
    x = torch.randn(32, k, generator=gen).bfloat16()                                   # [32, K]
    res = torch.randn(32, n_out, generator=gen).bfloat16() if epi == "residual" else None   # [32, N_out]
    expected = ref_linear(x, w, epi, res)                                             # [32, N_out] fp32
    w, x = w.to("cuda"), x.to("cuda")
    res = None if res is None else res.to("cuda")

    def run(t, params):
        out = torch.full((t, n_out), float("nan"), dtype=torch.bfloat16, device="cuda")
        split = params.get("SPLIT_K", 1)
        ws = torch.full((W8.linear_workspace_numel(NAME, t, n, k, epi, params),), float("nan"), device="cuda") \
            if split > 1 else None
        W8.w8_gemv_tc(x[:t], w, out, epilogue=epi, residual=None if res is None else res[:t], workspace=ws, **params)
        return out.cpu()

    for t in (2, 4, 8, 16, 32):
        for p in ({"USE_ASM": True}, {"USE_ASM": True, "PREFETCH": True, "MAXNREG": 168, "SPLIT_K": 4}):
            assert_close_rel(run(t, p), expected[:t], 1e-2, f"{NAME} T={t} {n}x{k} {epi} {p}")
        p = {"USE_ASM": True, "SPLIT_K": 8}
        ref = run(t, {**p, "REDUCE": "kernel"})
        assert_close_rel(ref, expected[:t], 1e-2, f"{NAME} T={t} {n}x{k} two-phase")
        for _ in range(2):
            assert torch.equal(run(t, {**p, "REDUCE": "fused"}), ref), \
                f"{NAME} T={t}: fused split-K reduce differs from the reduce kernel"
