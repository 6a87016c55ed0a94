"""Tensor-core decode GEMV routes (q4_gemv_tc, q5_gemv_tc, q6_gemv_tc).

CPU: the inline-PTX K step of one warp, run by a bit-level warp emulation of its PTX (per-lane
prmt / lop3 / bf16x2 / cvt semantics, ptx_emulator.py; `mma.sync.m16n8k16` gathered over
the 32 lanes with the PTX fragment layouts) against the decoded codes, for every format and 1 / 2
column tiles: this checks the K permutation shared by the A and B fragments, the row pair per lane,
the group scales and the accumulator fragment. The launcher under the interpreter (its fallback
runs the small_t_mma kernel) on odd shapes, and the declared domain (T = 17 refused).
GPU-marked: the asm path against the reference on odd shapes, every epilogue, split-K, row views.
"""

import random

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels import registry
from ninfer_compile.kernels.linear import gemv_tc as TC
from ninfer_compile.kernels.linear import ptx

from _linear_helpers import assert_close_rel, run_route
from ptx_emulator import bf, bf16_round, chunk_operands, emulate_warp, f32, f32_round, u32

ROUTES = {"q4_gemv_tc": "Q4G64_F16S", "q5_gemv_tc": "Q5G64_F16S", "q6_gemv_tc": "Q6G64_F16S"}


@pytest.mark.parametrize("fmt", [4, 5, 6])
@pytest.mark.parametrize("n_tiles", [1, 2])
def test_tc_step_emulated(fmt, n_tiles):
    rng = random.Random(fmt * 10 + n_tiles)
    src = ptx.tc_step_asm_source(fmt, n_tiles)
    lo, hi = -(1 << (fmt - 1)), (1 << (fmt - 1)) - 1
    codes = [[rng.randint(lo, hi) for _ in range(128)] for _ in range(16)]
    codes[0] = [lo if i % 2 else hi for i in range(128)]                  # extremes
    scales = [[rng.choice([0.0078125, 0.01171875, 0.0234375, 0.003]) for _ in range(2)] for _ in range(16)]
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
            words, highs = chunk_operands(fmt, codes[row][32 * c:32 * c + 32])
            ops += words + highs
        ops += [u32(scales[g][c // 2]), u32(scales[g + 8][c // 2])]
        for t in range(n_tiles):
            col = g + 8 * t
            for j in range(4):
                for p in range(4):
                    k = 32 * c + 8 * j + 2 * p
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
                w = [bf(bf16_round(codes[row][k] * bf(bf16_round(scales[row][k // 64])))) for k in range(128)]
                exact = acc0[row][col] + sum(w[k] * bf(xs[col][k]) for k in range(128))
                mag = abs(acc0[row][col]) + sum(abs(w[k] * bf(xs[col][k])) for k in range(128))
                assert abs(got - exact) <= mag * 2.0 ** -20 + 1e-30, (fmt, n_tiles, row, col, got, exact)


def test_registered_with_launchers_and_domains():
    for name, fmt in ROUTES.items():
        r = registry.get_route(name)
        assert r.family == "linear" and r.domain.formats == (fmt,) and (r.domain.min_t, r.domain.max_t) == (1, 32)
        assert set(r.domain.epilogues) == {"none", "swiglu", "residual"}
        assert r.load_launcher() is getattr(TC, name)


def _run(name, t, n, k, epi, params, seed, view=None, device="cpu"):
    return run_route(getattr(TC, name), ROUTES[name], t, n, k, epi, params, seed, view, device,
                     workspace_numel=lambda p: TC.linear_workspace_numel(name, t, n, k, epi, p))


@pytest.mark.parametrize("name", list(ROUTES))
@pytest.mark.parametrize("t,n,k,epi", [(1, 40, 200, "swiglu"), (3, 72, 192, "residual"), (5, 40, 320, "none")])
def test_fallback_path_matches_reference(name, t, n, k, epi):
    out, expected = _run(name, t, n, k, epi, {"USE_ASM": False}, 7 + t)
    assert_close_rel(out, expected, 1e-2, f"{name} T={t} {epi}")


@pytest.mark.parametrize("name", list(ROUTES))
@pytest.mark.parametrize("t,epi", [(17, "residual"), (24, "swiglu"), (32, "none")])
def test_wide_t_runs_in_16_column_slices(name, t, epi):
    """T 17..32: one launch per 16 columns over row views of x / out / residual."""
    out, expected = _run(name, t, 40, 192, epi, {"USE_ASM": False, "SPLIT_K": 2}, 30 + t)
    assert_close_rel(out, expected, 1e-2, f"{name} T={t} {epi}")


@pytest.mark.parametrize("name", list(ROUTES))
def test_t33_and_bad_params_are_refused(name):
    with pytest.raises(RouteError, match="T=33|domain|33"):
        _run(name, 33, 40, 192, "none", {}, 1)
    with pytest.raises(RouteError):
        _run(name, 2, 40, 192, "none", {"num_warps": 3}, 1)
    with pytest.raises(RouteError, match="SCALES"):
        _run(name, 2, 40, 192, "none", {"SCALES": "warp"}, 1)
    with pytest.raises(RouteError, match="ASYNC=3 replaces the register prefetch"):
        _run(name, 2, 40, 192, "none", {"ASYNC": 3, "PREFETCH": True}, 1)


# ---------------------------------------------------------------------------------------------
# GPU: the inline-PTX path
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("name", list(ROUTES))
@pytest.mark.parametrize("t", [1, 2, 3, 5, 8, 9, 16, 17, 32])
@pytest.mark.parametrize("epi", ["none", "swiglu", "residual"])
def test_asm_path_on_gpu(name, t, epi):
    for params, (n, k) in (({"USE_ASM": True}, (264, 1088)), ({"USE_ASM": True, "num_warps": 2}, (72, 200)),
                           ({"USE_ASM": True, "PREFETCH": True, "MAXNREG": 128, "SPLIT_K": 2}, (264, 1088)),
                           ({"USE_ASM": True, "SCALES": "shfl"}, (264, 1088)),
                           ({"USE_ASM": True, "SCALES": "shfl", "PREFETCH": True, "SPLIT_K": 2}, (72, 200))):
        out, expected = _run(name, t, n, k, epi, params, 11 + t, device="cuda")
        assert_close_rel(out, expected, 1e-2, f"{name} asm T={t} {epi} {params}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(ROUTES))
def test_asm_splitk_view_large_k_on_gpu(name):
    for t in (4, 16):
        p = {"USE_ASM": True, "SPLIT_K": 4, "PREFETCH": t == 16}
        out, expected = _run(name, t, 512, 5120, "swiglu", p, 5, view=(64, 1024), device="cuda")
        assert_close_rel(out, expected, 1e-2, f"{name} asm split-K view T={t}")
        again, _ = _run(name, t, 512, 5120, "swiglu", p, 5, view=(64, 1024), device="cuda")
        assert torch.equal(out, again), "split-K must be deterministic"
        out, expected = _run(name, t, 512, 17408, "residual", {"USE_ASM": True, "MAXNREG": 128}, 6, device="cuda")
        assert_close_rel(out, expected, 1e-2, f"{name} asm K=17408 T={t}")


@pytest.mark.gpu
@pytest.mark.parametrize("name,n,k,epi", [("q4_gemv_tc", 34816, 5120, "swiglu"), ("q5_gemv_tc", 5120, 17408, "residual")])
def test_fused_splitk_reduce_on_gpu_at_27b_shapes(name, n, k, epi):
    """The fused split-K reduce (fence + ticket + last-split sum) equals the two-launch reduce bit for
    bit at the 27B shapes, every time, for one and two column tiles and the 16-column slices."""
    for t in (2, 8, 16, 24):
        p = {"USE_ASM": True, "SPLIT_K": 8}
        ref, expected = _run(name, t, n, k, epi, {**p, "REDUCE": "kernel"}, 9, device="cuda")
        assert_close_rel(ref, expected, 1e-2, f"{name} T={t} two-phase")
        for _ in range(4):
            out, _ = _run(name, t, n, k, epi, {**p, "REDUCE": "fused"}, 9, device="cuda")
            assert torch.equal(out, ref), f"{name} T={t}: fused split-K reduce differs from the reduce kernel"


@pytest.mark.gpu
@pytest.mark.parametrize("name,n,k,epi", [("q4_gemv_tc", 34816, 5120, "swiglu"), ("q5_gemv_tc", 5120, 17408, "residual"),
                                          ("q6_gemv_tc", 1000, 1088, "none"), ("q5_gemv_tc", 264, 200, "swiglu")])
def test_shuffled_scales_equal_lane_scales_on_gpu(name, n, k, epi):
    """SCALES=shfl (a coalesced scale word per 4 K steps, a shuffle per step) hands the mma the same
    scales as the per-step loads: bit-identical outputs, with and without the prefetch, at splits
    that leave 1..4 steps in a split's last group of 4 (27B shapes, odd K). ASYNC (the same words
    through a cp.async ring) too."""
    for t in (1, 3, 8, 16):
        for p in ({"SPLIT_K": 8}, {"SPLIT_K": 4, "PREFETCH": True, "MAXNREG": 128}, {"SPLIT_K": 1},
                  {"SPLIT_K": 16, "PREFETCH": True}, {"SPLIT_K": 8, "REDUCE": "fused", "num_warps": 2}):
            p = {"USE_ASM": True, **p}
            ref, expected = _run(name, t, n, k, epi, p, 3 + t, device="cuda")
            assert_close_rel(ref, expected, 1e-2, f"{name} T={t} {p}")
            out, _ = _run(name, t, n, k, epi, {**p, "SCALES": "shfl"}, 3 + t, device="cuda")
            assert torch.equal(out, ref), f"{name} T={t} {p}: shuffled scales differ from the per-step loads"
            if not p.get("PREFETCH"):
                for stages in (2, 4):
                    out, _ = _run(name, t, n, k, epi, {**p, "ASYNC": stages}, 3 + t, device="cuda")
                    assert torch.equal(out, ref), f"{name} T={t} {p} ASYNC={stages}: differs from the asm loads"


_LAYOUT_CHILD = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ninfer_compile.kernels.linear.gemv_tc import gemv_tc_kernel as fn
ptrs = {'x_ptr': '*bf16', 'base_ptr': '*i32', 'high_ptr': '*i32', 'scale_ptr': '*fp16', 'out_ptr': '*bf16',
        'res_ptr': '*bf16', 'ws_ptr': '*fp32'}
mode = sys.argv[1]
consts = dict(FMT=5, EPI=1, N_TILES=2, SPLIT_K=1, NW=4, PREFETCH=mode != "async", SHFL_SCALES=mode == "shfl",
              ASYNC=3 if mode == "async" else 0, PDL=False)
names = fn.arg_names
sig = {n: ptrs.get(n, 'constexpr' if n in consts else 'i32') for n in names}
# the integer arguments a 27B launch passes as multiples of 16 (Triton specialises them so)
div16 = list(ptrs) + ['K', 'KB_TOTAL', 'base_row', 'high_row', 'scale_row', 'sx', 'so', 'sr', 'N_OUT', 'up_off']
src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                attrs={(names.index(n),): [['tt.divisibility', 16]] for n in div16})
k = triton.compile(src, target=GPUTarget('cuda', 90, 32), options={'num_warps': 4, 'num_stages': 1, 'maxnreg': 128})
tt = k.asm['ttgir']
print(json.dumps({"convert": tt.count('convert_layout'),
                  "layouts": dict(re.findall(r'^(#blocked\d*) = ([^\n]*)', tt, re.M)),
                  "asm": sorted(set(re.findall(r'elementwise_inline_asm.*?(tensor<[0-9x]+\w+, #\w+>)', tt))),
                  "hmma": k.asm['ptx'].count('mma.sync.aligned.m16n8k16'),
                  "shfl": k.asm['ptx'].count('shfl.sync.idx'), "ld16": k.asm['ptx'].count('ld.global.nc.b16'),
                  "cp16": k.asm['ptx'].count('cp.async.cg.shared.global'),
                  "asm_w_loads": k.asm['ptx'].count('L1::no_allocate')}))
"""


@pytest.mark.parametrize("mode", ["lane", "shfl", "async"])
def test_asm_lanes_keep_the_mma_fragment_layout(mode):
    """The asm path assumes lane = 4 g + c and warp = axis 0 of every [NW, 8, 4] tensor, with no
    layout conversion anywhere (a conversion could move an element to another lane; SHFL_SCALES
    also takes step j's scale from lane 4 g + j). Compile the kernel for sm_90 with the installed
    Triton (a child process: the suite runs the interpreter) and check its TTGIR and PTX."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _LAYOUT_CHILD, mode], capture_output=True, text=True, env=env, cwd=repo,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info["convert"] == 0
    # every inline asm (loads, the mma step, stores) runs on [4, 8, 4] tensors of one layout ...
    assert info["asm"] and all(a.startswith("tensor<4x8x4x") for a in info["asm"]), info["asm"]
    names = {a.rsplit("#", 1)[1].rstrip(">") for a in info["asm"]}
    assert len(names) == 1, names
    # ... whose lanes are (g, c) = (lane // 4, lane % 4) and whose warps are axis 0
    layout = info["layouts"]["#" + names.pop()]
    assert "sizePerThread = [1, 1, 1]" in layout and "threadsPerWarp = [1, 8, 4]" in layout \
        and "warpsPerCTA = [4, 1, 1]" in layout and "order = [2, 1, 0]" in layout, layout
    if mode == "lane":
        assert info["hmma"] == 2 * 2 * 4 * 2   # rows g/up x tiles x words x halves per K step
        assert info["ld16"] == 2 * 4            # a scale load per row (g, g+8, up g, up g+8): prologue + step
    elif mode == "shfl":  # the K loop unrolled by the 4 steps that share a scale word; no 2-byte scale load left
        assert info["hmma"] == 4 * 2 * 2 * 4 * 2 and info["shfl"] == 4 * 4 and info["ld16"] == 0, info
    else:  # ASYNC: the weights by 16-byte cp.async into shared memory, no inline-asm weight load left
        assert info["hmma"] == 2 * 2 * 4 * 2 and info["cp16"] > 0 and info["asm_w_loads"] == 0, info
