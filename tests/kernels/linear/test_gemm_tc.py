"""Tensor-core small-T GEMM routes (q4/q5/q6/w8_gemm_tc): one pass for T = 1..64.

CPU: the two PTX blocks of a K step (the dequant block -> 32 A registers, then the mma block once per
n8 column tile) run by the bit-level warp emulator against the decoded codes, for every format and
three column tiles fed from ONE dequant; the whole asm kernel under the interpreter with its inline
PTX emulated (asm_interpreter.py: loads / stores at their addresses, dequant / mma per warp) against
the reference on odd shapes (column blocks, split-K with both reduces, every epilogue) and bit for
bit against the gemv_tc asm kernel emulated the same way; the launcher's USE_ASM=False fallback
(small_t_mma) on odd shapes; the declared domain; an sm_90 compile of the kernel (lane layout, mma
count, no local memory). GPU-marked: the asm path against the fp32 reference on odd shapes, every
epilogue, split-K (kernel and fused reduce, deterministic), and bit equality with the gemv_tc routes
(same dequant, same mma order per column) at every T <= 64.
"""

import random

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels import registry
from ninfer_compile.kernels.linear import gemm_tc as G
from ninfer_compile.kernels.linear import ptx

from _linear_helpers import assert_close_rel, run_route
from asm_interpreter import emulated_inline_asm
from ptx_emulator import bf, bf16_round, chunk_operands, emulate_warp, f32, f32_round, u32
from test_gemv_tc_w8 import _lane_k, _word

ROUTES = {"q4_gemm_tc": "Q4G64_F16S", "q5_gemm_tc": "Q5G64_F16S", "q6_gemm_tc": "Q6G64_F16S",
          "w8_gemm_tc": "W8G32_F16S"}
_FRAG = lambda g, c: ((g, 2 * c), (g, 2 * c + 1), (g + 8, 2 * c), (g + 8, 2 * c + 1))  # noqa: E731


def _x_regs(fmt, xs, col, c):
    """The 16 x registers of column `col` for lane chunk c (the kernel's 4 x 16-byte loads)."""
    starts = (16 * c, 16 * c + 8, 64 + 16 * c, 64 + 16 * c + 8) if fmt == 8 else tuple(32 * c + 8 * j for j in range(4))
    return [xs[col][k0 + 2 * p] | (xs[col][k0 + 2 * p + 1] << 16) for k0 in starts for p in range(4)]


@pytest.mark.parametrize("fmt", [4, 5, 6, 8])
def test_dequant_once_then_mma_per_tile_emulated(fmt):
    rng = random.Random(300 + fmt)
    lo, hi = (-128, 127) if fmt == 8 else (-(1 << (fmt - 1)), (1 << (fmt - 1)) - 1)
    group = 32 if fmt == 8 else 64
    codes = [[rng.randint(lo, hi) for _ in range(128)] for _ in range(16)]
    codes[0] = [lo if i % 2 else hi for i in range(128)]                  # extremes
    scales = [[rng.choice([0.0078125, 0.01171875, 0.0234375, 0.003, 0.0]) for _ in range(128 // group)]
              for _ in range(16)]
    n_tiles = 3
    xs = [[bf16_round(rng.gauss(0.0, 1.0)) for _ in range(128)] for _ in range(8 * n_tiles)]
    acc0 = [[rng.gauss(0.0, 0.5) for _ in range(8 * n_tiles)] for _ in range(16)]
    raw = []
    for lane in range(32):
        g, c = lane // 4, lane % 4
        ops = [0] * 32
        if fmt == 8:
            for row in (g, g + 8):
                ops += [_word(codes[row], _lane_k(c, j)) for j in range(8)]
            ops += [u32(scales[r][grp]) for r in (g, g + 8) for grp in (c // 2, 2 + c // 2)]
        else:
            for row in (g, g + 8):
                words, highs = chunk_operands(fmt, codes[row][32 * c:32 * c + 32])
                ops += words + highs
            ops += [u32(scales[g][c // 2]), u32(scales[g + 8][c // 2])]
        raw.append(ops)
    dq = emulate_warp(ptx.dequant_asm_source(fmt), raw)
    a_regs = [[dq[lane][f"${i}"] for i in range(32)] for lane in range(32)]
    mma = ptx.mma_asm_source()
    for t in range(n_tiles):
        lanes = []
        for lane in range(32):
            g, c = lane // 4, lane % 4
            frag = [f32_round(acc0[row][8 * t + col]) for row, col in _FRAG(g, c)]
            lanes.append([0] * 4 + a_regs[lane] + _x_regs(fmt, xs, 8 * t + g, c) + frag)
        regs = emulate_warp(mma, lanes)
        for lane in range(32):
            g, c = lane // 4, lane % 4
            for i, (row, col) in enumerate(_FRAG(g, c)):
                col += 8 * t
                got = f32(regs[lane][f"${i}"])
                # the kernel's weight: bf16(q * bf16(scale)); products exact, fp32 accumulation
                w = [bf(bf16_round(codes[row][k] * bf(bf16_round(scales[row][k // group])))) for k in range(128)]
                exact = acc0[row][col] + sum(w[k] * bf(xs[col][k]) for k in range(128))
                mag = abs(acc0[row][col]) + sum(abs(w[k] * bf(xs[col][k])) for k in range(128))
                assert abs(got - exact) <= mag * 2.0 ** -20 + 1e-30, (fmt, t, row, col, got, exact)


def test_registered_with_launchers_domains_and_column_blocks():
    for name, fmt in ROUTES.items():
        r = registry.get_route(name)
        assert r.family == "linear" and r.domain.formats == (fmt,) and (r.domain.min_t, r.domain.max_t) == (1, 64)
        assert set(r.domain.epilogues) == {"none", "swiglu", "residual"}
        assert r.load_launcher() is getattr(G, name)
    # (n8 tiles per program, column blocks): one pass up to BLOCK_T, T pads to 8, not 16
    assert G.column_blocks(1, 64) == (1, 1) and G.column_blocks(3, 64) == (1, 1)
    assert G.column_blocks(17, 64) == (3, 1) and G.column_blocks(64, 64) == (8, 1)
    assert G.column_blocks(33, 32) == (4, 2) and G.column_blocks(64, 16) == (2, 4) and G.column_blocks(9, 8) == (1, 2)


def _run(name, t, n, k, epi, params, seed, view=None, device="cpu"):
    return run_route(getattr(G, name), ROUTES[name], t, n, k, epi, params, seed, view, device,
                     workspace_numel=lambda p: G.linear_workspace_numel(name, t, n, k, epi, p))


@pytest.mark.parametrize("name", list(ROUTES))
@pytest.mark.parametrize("t,n,k,epi,split", [(1, 40, 200, "swiglu", 1), (3, 72, 192, "residual", 2),
                                             (5, 40, 320, "none", 1), (17, 40, 200, "residual", 1),
                                             (33, 24, 136, "swiglu", 2), (64, 40, 200, "none", 1)])
def test_fallback_path_matches_reference(name, t, n, k, epi, split):
    out, expected = _run(name, t, n, k, epi, {"USE_ASM": False, "SPLIT_K": split}, 7 + t)
    assert_close_rel(out, expected, 1e-2, f"{name} T={t} {epi} split {split}")


@pytest.fixture
def asm_on_cpu(monkeypatch):
    """The asm path of gemm_tc / gemv_tc / gemv_tc_w8 under the interpreter, its PTX emulated."""
    from ninfer_compile.kernels.linear import gemv_tc, gemv_tc_w8

    for mod in (G, gemv_tc, gemv_tc_w8):
        monkeypatch.setattr(mod, "asm_supported", lambda device: True)
    with emulated_inline_asm():
        yield


@pytest.mark.parametrize("name,t,n,k,epi,params", [
    ("q4_gemm_tc", 3, 40, 200, "none", {}),
    ("q5_gemm_tc", 17, 40, 200, "swiglu", {"num_warps": 2}),
    ("q6_gemm_tc", 33, 40, 136, "residual", {"BLOCK_T": 16, "PREFETCH": True}),
    ("w8_gemm_tc", 9, 24, 136, "residual", {"SPLIT_K": 2, "REDUCE": "fused", "BLOCK_T": 8}),
    ("q4_gemm_tc", 64, 24, 200, "swiglu", {"SPLIT_K": 2, "num_warps": 1}),
    ("w8_gemm_tc", 5, 40, 200, "swiglu", {"PREFETCH": True, "SPLIT_K": 2})])
def test_asm_kernel_emulated_matches_reference(asm_on_cpu, name, t, n, k, epi, params):
    out, expected = _run(name, t, n, k, epi, {"USE_ASM": True, **params}, 21 + t)
    assert_close_rel(out, expected, 1e-2, f"{name} emulated asm T={t} {epi} {params}")


@pytest.mark.parametrize("name,t,epi", [("q4_gemm_tc", 17, "swiglu"), ("q5_gemm_tc", 3, "residual"),
                                        ("w8_gemm_tc", 9, "none")])
def test_asm_kernel_emulated_equals_gemv_tc_bit_for_bit(asm_on_cpu, name, t, epi):
    """Same dequant, same mma order per column: the gemm_tc kernel equals the gemv_tc kernel (its
    16-column passes) bit for bit, both run with their PTX emulated."""
    from ninfer_compile.kernels.linear import gemv_tc, gemv_tc_w8

    tc = getattr(gemv_tc_w8 if name.startswith("w8") else gemv_tc, name.replace("gemm_tc", "gemv_tc"))
    out, _ = _run(name, t, 40, 200, epi, {"USE_ASM": True, "num_warps": 2}, 4)
    ref, _ = run_route(tc, ROUTES[name], t, 40, 200, epi, {"USE_ASM": True, "num_warps": 2}, 4)
    assert torch.equal(out, ref), f"{name} T={t}: differs from gemv_tc"


@pytest.mark.parametrize("name", list(ROUTES))
def test_t65_and_bad_params_are_refused(name):
    with pytest.raises(RouteError, match="T=65|domain|65"):
        _run(name, 65, 40, 192, "none", {}, 1)
    with pytest.raises(RouteError):
        _run(name, 2, 40, 192, "none", {"BLOCK_T": 24}, 1)
    with pytest.raises(RouteError):
        _run(name, 2, 40, 192, "none", {"ASYNC": 3}, 1)


_COMPILE_CHILD = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ninfer_compile.kernels.linear.gemm_tc import gemm_tc_kernel as fn
fmt, epi, nt, nw = map(int, sys.argv[1:5])
mode = sys.argv[5]
ptrs = {'x_ptr': '*bf16', 'base_ptr': '*i32', 'high_ptr': '*i32', 'scale_ptr': '*fp16', 'out_ptr': '*bf16',
        'res_ptr': '*bf16', 'ws_ptr': '*fp32', 'cnt_ptr': '*i32'}
consts = dict(FMT=fmt, EPI=epi, NT=nt, SPLIT_K=2 if mode == "fused" else 1, NW=nw, PREFETCH=mode == "prefetch",
              FUSED_REDUCE=mode == "fused", FIX_T=max(16, triton.next_power_of_2(8 * nt)), PDL=False)
names = fn.arg_names
sig = {n: ptrs.get(n, 'constexpr' if n in consts else 'i32') for n in names}
div16 = list(ptrs) + ['K', 'KB_TOTAL', 'base_row', 'high_row', 'scale_row', 'sx', 'so', 'sr', 'N_OUT', 'up_off']
src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                attrs={(names.index(n),): [['tt.divisibility', 16]] for n in div16})
k = triton.compile(src, target=GPUTarget('cuda', 90, 32), options={'num_warps': nw, 'num_stages': 1})
tt, p = k.asm['ttgir'], k.asm['ptx']
print(json.dumps({"convert": tt.count('convert_layout'),
                  "layouts": dict(re.findall(r'^(#blocked\d*) = ([^\n]*)', tt, re.M)),
                  "asm": sorted(set(re.findall(r'elementwise_inline_asm.*?(tensor<[0-9x]+\w+, #\w+>)', tt))),
                  "hmma": p.count('mma.sync.aligned.m16n8k16'), "local": p.count('ld.local') + p.count('st.local')}))
"""


@pytest.mark.parametrize("fmt,epi,nt,nw,mode", [(4, 1, 8, 4, "plain"), (8, 0, 3, 2, "fused"), (5, 2, 2, 4, "prefetch")])
def test_sm90_compile_keeps_the_mma_lane_layout(fmt, epi, nt, nw, mode):
    """The asm path assumes lane = 4 g + c and warp = axis 0 of every [NW, 8, 4] tensor, with no layout
    conversion; one dequant serves NT column tiles: 8 mma per tile and K step (x2 for the swiglu up
    rows), none in local memory. Compiled for sm_90 by the installed Triton in a child process."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE_CHILD, str(fmt), str(epi), str(nt), str(nw), mode],
                       capture_output=True, text=True, env=env, cwd=repo, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info["convert"] == 0 and info["local"] == 0, info
    lane_asm = [a for a in info["asm"] if "x8x4x" in a]   # (the fused reduce's fence runs on a 1-D anchor)
    assert lane_asm and len(lane_asm) == len(info["asm"]) - (mode == "fused"), info["asm"]
    assert all(a.startswith(f"tensor<{nw}x8x4x") for a in lane_asm), lane_asm
    names = {a.rsplit("#", 1)[1].rstrip(">") for a in lane_asm}
    assert len(names) == 1, names
    layout = info["layouts"]["#" + names.pop()]
    assert "sizePerThread = [1, 1, 1]" in layout and "threadsPerWarp = [1, 8, 4]" in layout \
        and f"warpsPerCTA = [{nw}, 1, 1]" in layout and "order = [2, 1, 0]" in layout, layout
    assert info["hmma"] == 8 * nt * (2 if epi == 1 else 1), info


# ---------------------------------------------------------------------------------------------
# GPU: the inline-PTX path
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("name", list(ROUTES))
@pytest.mark.parametrize("t", [1, 3, 9, 17, 33, 64])
@pytest.mark.parametrize("epi", ["none", "swiglu", "residual"])
def test_asm_path_on_gpu(name, t, epi):
    for params, (n, k) in (({"USE_ASM": True}, (264, 1088)),
                           ({"USE_ASM": True, "num_warps": 2, "PREFETCH": True, "MAXNREG": 168, "SPLIT_K": 2}, (72, 200)),
                           ({"USE_ASM": True, "BLOCK_T": 16, "num_warps": 8, "SPLIT_K": 4, "REDUCE": "fused"},
                            (264, 1088))):
        out, expected = _run(name, t, n, k, epi, params, 11 + t, device="cuda")
        assert_close_rel(out, expected, 1e-2, f"{name} asm T={t} {epi} {params}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(ROUTES))
def test_asm_equals_gemv_tc_bit_for_bit_on_gpu(name):
    """Same dequant, same mma order per column: the output equals the gemv_tc route's bit for bit (its
    domain: T <= 32), at a 27B-like K, for one pass and for column blocks; T = 64 against the reference."""
    from ninfer_compile.kernels.linear import gemv_tc, gemv_tc_w8

    tc = getattr(gemv_tc_w8 if name.startswith("w8") else gemv_tc, name.replace("gemm_tc", "gemv_tc"))
    for t in (1, 3, 16, 17, 32, 64):
        for p in ({}, {"BLOCK_T": 16, "PREFETCH": True}):
            out, expected = _run(name, t, 512, 5120, "swiglu", {"USE_ASM": True, **p}, 5, view=(64, 1024),
                                 device="cuda")
            assert_close_rel(out, expected, 1e-2, f"{name} T={t} {p}")
            if t <= 32:
                ref, _ = run_route(tc, ROUTES[name], t, 512, 5120, "swiglu", {"USE_ASM": True}, 5, (64, 1024), "cuda")
                assert torch.equal(out, ref), f"{name} T={t} {p}: differs from gemv_tc"


@pytest.mark.gpu
@pytest.mark.parametrize("name,n,k,epi", [("q4_gemm_tc", 34816, 5120, "swiglu"), ("q5_gemm_tc", 5120, 17408, "residual"),
                                          ("w8_gemm_tc", 1000, 1088, "none")])
def test_splitk_deterministic_and_fused_equals_kernel_reduce_on_gpu(name, n, k, epi):
    for t in (2, 17, 64):
        p = {"USE_ASM": True, "SPLIT_K": 4}
        ref, expected = _run(name, t, n, k, epi, {**p, "REDUCE": "kernel"}, 9, device="cuda")
        assert_close_rel(ref, expected, 1e-2, f"{name} T={t} two-phase")
        for _ in range(3):
            out, _ = _run(name, t, n, k, epi, {**p, "REDUCE": "fused"}, 9, device="cuda")
            assert torch.equal(out, ref), f"{name} T={t}: fused split-K reduce differs from the reduce kernel"
