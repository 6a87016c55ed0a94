"""Low-register / packed decode-GEMV routes (q4_gemv_lowreg, q5_gemv_lowreg, q6_gemv_lowreg).

CPU (TRITON_INTERPRET=1): the plain-Triton path against the fp32 reference on T = 1..4 (T = 5 is
refused), K = 192 / 200 (partial group) / 320, N = 40 / 72, row views of a fused parent, every
epilogue, split-K; and the inline-PTX chunk program itself, run by a small PTX emulator (bit-exact
prmt / lop3 / bf16x2 FMA semantics) on random planes against the decoded codes, for every format,
T and CHAIN. GPU-marked tests: the asm path against the reference and against the plain path.
"""

import random
import zlib

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels import registry
from ninfer_compile.kernels.linear import gemv_lowreg as G
from ninfer_compile.kernels.linear import ptx

from _linear_helpers import assert_close_rel, random_weight, run_route
from ptx_emulator import bf, bf16_round, chunk_operands, emulate, f32

ROUTES = {"q4_gemv_lowreg": "Q4G64_F16S", "q5_gemv_lowreg": "Q5G64_F16S", "q6_gemv_lowreg": "Q6G64_F16S"}
SHAPES = [(40, 192), (72, 200), (40, 320), (72, 192)]
EPIS = ["none", "swiglu", "residual", "swiglu"]
SMALL = {"BLOCK_N": 16, "BLOCK_K": 128}


def _run(name, t, n, k, epi, params, seed, view=None, device="cpu", residual_in_place=False):
    return run_route(getattr(G, name), ROUTES[name], t, n, k, epi, params, seed, view, device, residual_in_place,
                     lambda p: G.linear_workspace_numel(name, t, n, k, epi, p))


def _cases():
    out = []
    for name in ROUTES:
        for i, t in enumerate([1, 2, 3, 4]):
            n, k = SHAPES[i]
            out.append(pytest.param(name, t, n, k, EPIS[i], SMALL, None, id=f"{name}-T{t}-{n}x{k}-{EPIS[i]}"))
        out.append(pytest.param(name, 3, 48, 200, "swiglu", {"BLOCK_N": 8, "BLOCK_K": 256}, (8, 72),
                                id=f"{name}-T3-view8+48x200-swiglu"))
        out.append(pytest.param(name, 2, 72, 320, "residual", {**SMALL, "SPLIT_K": 2}, None,
                                id=f"{name}-T2-72x320-residual-splitk2"))
    return out


@pytest.mark.parametrize("name,t,n,k,epi,params,view", _cases())
def test_plain_path_matches_reference(name, t, n, k, epi, params, view):
    out, expected = _run(name, t, n, k, epi, params, zlib.crc32(f"{name}{t}{n}{k}".encode()), view=view)
    assert_close_rel(out, expected, 1e-2, f"{name} T={t} {n}x{k} {epi}")


def test_residual_in_place_splitk4():
    out, expected = _run("q5_gemv_lowreg", 4, 40, 320, "residual", {"BLOCK_N": 8, "BLOCK_K": 128, "SPLIT_K": 4},
                         7, residual_in_place=True)
    assert_close_rel(out, expected, 1e-2, "q5 residual in place, split-K 4")


@pytest.mark.parametrize("name", list(ROUTES))
def test_t5_and_bad_params_are_refused(name):
    fmt = ROUTES[name]
    w = random_weight(fmt, 40, 192, torch.Generator().manual_seed(0))
    x = torch.randn(5, 192).bfloat16()
    out = torch.empty(5, 40, dtype=torch.bfloat16)
    with pytest.raises(RouteError, match=rf"route {name}: T=5 columns is outside its domain T in \[1, 4\]"):
        getattr(G, name)(x, w, out)
    with pytest.raises(RouteError, match="BLOCK_K"):
        getattr(G, name)(x[:1], w, out[:1], **{"BLOCK_K": 64})
    with pytest.raises(RouteError, match="workspace"):
        getattr(G, name)(x[:1], w, out[:1], **{"SPLIT_K": 2})
    with pytest.raises(RouteError, match="ASYNC=3 replaces the register prefetch"):
        getattr(G, name)(x[:1], w, out[:1], **{"ASYNC": 3, "PREFETCH": True})


def test_registered_with_launchers_and_domains():
    for name, fmt in ROUTES.items():
        r = registry.get_route(name)
        assert r.family == "linear" and r.domain.formats == (fmt,) and (r.domain.min_t, r.domain.max_t) == (1, 4)
        assert set(r.domain.epilogues) == {"none", "swiglu", "residual"}
        assert r.load_launcher() is getattr(G, name)
        assert G.linear_workspace_numel(name, 3, 80, 192, "swiglu", {"SPLIT_K": 4}) == 4 * 3 * 80


# ---------------------------------------------------------------------------------------------
# the inline-PTX chunk program, emulated bit-exactly on the CPU
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", [4, 5, 6])
@pytest.mark.parametrize("n_t,chain", [(1, 1), (2, 2), (4, 1), (4, 4)])
def test_chunk_asm_emulated(fmt, n_t, chain):
    rng = random.Random(fmt * 100 + n_t * 10 + chain)
    src = ptx.chunk_asm_source(fmt, n_t, chain)
    lo, hi = -(1 << (fmt - 1)), (1 << (fmt - 1)) - 1
    for trial in range(6):
        codes = [rng.randint(lo, hi) for _ in range(32)]
        if trial == 0:
            codes = [lo if i % 2 else hi for i in range(32)]       # extremes in both halves
        words, highs = chunk_operands(fmt, codes)
        xs = [[bf16_round(rng.gauss(0.0, 1.0)) for _ in range(32)] for _ in range(n_t)]
        ops = [0] * n_t + words + highs
        for t in range(n_t):
            for j in range(4):
                for p in range(4):
                    ops.append(xs[t][8 * j + 2 * p] | (xs[t][8 * j + 2 * p + 1] << 16))
        regs = emulate(src, ops)
        for t in range(n_t):
            got = f32(regs[f"${t}"])
            exact = sum(codes[i] * bf(xs[t][i]) for i in range(32))
            mag = sum(abs(codes[i] * bf(xs[t][i])) for i in range(32))
            # bf16 accumulation of 4 * chain products per half: |err| <= ~ chain-length ulps of the
            # partial magnitudes
            assert abs(got - exact) <= mag * 2.0 ** -8 * (2 + chain), (fmt, n_t, chain, t, got, exact)


def test_chunk_asm_dequant_exact():
    """x = one-hot pairs: the chunk program returns exactly each code (dequant is exact)."""
    rng = random.Random(3)
    for fmt in (4, 5, 6):
        src = ptx.chunk_asm_source(fmt, 1, 1)
        lo, hi = -(1 << (fmt - 1)), (1 << (fmt - 1)) - 1
        codes = [rng.randint(lo, hi) for _ in range(32)]
        words, highs = chunk_operands(fmt, codes)
        for i in range(32):
            xs = [0x3F80 if li == i else 0 for li in range(32)]
            ops = [0] + words + highs + [xs[2 * q] | (xs[2 * q + 1] << 16) for q in range(16)]
            assert f32(emulate(src, ops)["$0"]) == codes[i], (fmt, i)


# ---------------------------------------------------------------------------------------------
# GPU: the inline-PTX path
# ---------------------------------------------------------------------------------------------
GPU_PARAMS = [{"BLOCK_N": 8, "BLOCK_K": 1024, "num_warps": 4},
              {"BLOCK_N": 16, "BLOCK_K": 512, "num_warps": 4, "CHAIN": 2},
              {"BLOCK_N": 4, "BLOCK_K": 256, "num_warps": 2, "CHAIN": 4},
              {"BLOCK_N": 8, "BLOCK_K": 512, "num_warps": 4, "CHAIN": 2, "PREFETCH": True, "MAXNREG": 128,
               "L2_HINT": True}]


# every epilogue with the default-like and the prefetch schedule; the other tilings once (each
# combination is a separate ~1 s compile on the GPU machine)
_GPU_GRID = [(epi, pi) for epi in ("none", "swiglu", "residual") for pi in (0, 3)] + [("none", 1), ("none", 2)]


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(ROUTES))
@pytest.mark.parametrize("t", [1, 2, 3, 4])
@pytest.mark.parametrize("epi,pi", _GPU_GRID)
def test_asm_path_on_gpu(name, t, epi, pi):
    params = {**GPU_PARAMS[pi], "USE_ASM": True}
    n, k = (72, 200) if pi == 2 else (264, 1088)
    out, expected = _run(name, t, n, k, epi, params, 11 + t, device="cuda")
    assert_close_rel(out, expected, 1e-2, f"{name} asm T={t} {epi} {params}")
    plain, _ = _run(name, t, n, k, epi, {**params, "USE_ASM": False}, 11 + t, device="cuda")
    assert_close_rel(out, plain.float(), 1e-2, f"{name} asm vs plain T={t} {epi} {params}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(ROUTES))
def test_asm_splitk_view_large_k_on_gpu(name):
    for t, p in ((1, {"BLOCK_N": 16, "BLOCK_K": 1024, "SPLIT_K": 4, "USE_ASM": True}),
                 (4, {"BLOCK_N": 16, "BLOCK_K": 1024, "SPLIT_K": 4, "USE_ASM": True}),
                 (2, {"BLOCK_N": 8, "BLOCK_K": 1024, "SPLIT_K": 4, "USE_ASM": True, "PREFETCH": True})):
        out, expected = _run(name, t, 512, 5120, "swiglu", p, 5, view=(64, 1024), device="cuda")
        assert_close_rel(out, expected, 1e-2, f"{name} asm split-K view T={t} {p}")
        again, _ = _run(name, t, 512, 5120, "swiglu", p, 5, view=(64, 1024), device="cuda")
        assert torch.equal(out, again), "split-K must be deterministic"
        out, expected = _run(name, t, 512, 17408, "residual", {"USE_ASM": True}, 6, device="cuda")
        assert_close_rel(out, expected, 1e-2, f"{name} asm K=17408 T={t}")


@pytest.mark.gpu
@pytest.mark.parametrize("name,n,k,epi", [("q4_gemv_lowreg", 34816, 5120, "swiglu"),
                                          ("q5_gemv_lowreg", 5120, 17408, "residual"),
                                          ("q6_gemv_lowreg", 4096, 5120, "none"), ("q5_gemv_lowreg", 264, 1088, "swiglu"),
                                          ("q4_gemv_lowreg", 72, 200, "residual")])
def test_async_ring_equals_the_asm_loads_on_gpu(name, n, k, epi):
    """ASYNC (the weight chunks through a cp.async ring in shared memory) feeds the same words, scales and
    high words to the same asm as the inline-asm loads: bit-identical outputs, with split-K and tails."""
    for t in (1, 2, 4):
        for p in ({"BLOCK_N": 2, "BLOCK_K": 1024, "num_warps": 1, "MAXNREG": 128},
                  {"BLOCK_N": 4, "BLOCK_K": 512, "num_warps": 2, "SPLIT_K": 2},
                  {"BLOCK_N": 8, "BLOCK_K": 2048, "num_warps": 4, "CHAIN": 2}):
            p = {**p, "USE_ASM": True}
            ref, expected = _run(name, t, n, k, epi, p, 21 + t, device="cuda")
            assert_close_rel(ref, expected, 1e-2, f"{name} T={t} {p}")
            for stages in (2, 3, 6):
                out, _ = _run(name, t, n, k, epi, {**p, "ASYNC": stages}, 21 + t, device="cuda")
                assert torch.equal(out, ref), f"{name} T={t} {p} ASYNC={stages}: differs from the asm loads"


_ASYNC_CHILD = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ninfer_compile.kernels.linear.gemv_lowreg import gemv_lowreg_kernel as fn
fmt, epi = int(sys.argv[1]), int(sys.argv[2])
ptrs = {'x_ptr': '*bf16', 'base_ptr': '*i32', 'high_ptr': '*i32', 'scale_ptr': '*fp16', 'out_ptr': '*bf16',
        'res_ptr': '*bf16', 'ws_ptr': '*fp32', 'cnt_ptr': '*i32'}
consts = dict(FMT=fmt, EPI=epi, BLOCK_N=2, BLOCK_K=1024, BLOCK_T=1, SPLIT_K=1, CHAIN=1, INTERP=False, USE_ASM=True,
              PREFETCH=False, L2_HINT=False, FUSED_REDUCE=False, ASYNC=3, PDL=False)
names = fn.arg_names
sig = {n: ptrs.get(n, 'constexpr' if n in consts else 'i32') for n in names}
# the integer arguments a 27B launch passes as multiples of 16 (Triton specialises them so)
div16 = list(ptrs) + ['K', 'KC_TOTAL', 'base_row', 'high_row', 'scale_row', 'sx', 'so', 'sr', 'N_OUT', 'up_off']
src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                attrs={(names.index(n),): [['tt.divisibility', 16]] for n in div16})
k = triton.compile(src, target=GPUTarget('cuda', 90, 32), options={'num_warps': 1, 'num_stages': 2, 'maxnreg': 128})
tt, ptx = k.asm['ttgir'], k.asm['ptx']
print(json.dumps({"cp16": ptx.count("cp.async.cg.shared.global"), "wait": ptx.count("cp.async.wait_group"),
                  "asm_w_loads": ptx.count("L1::no_allocate"),
                  "converts": sorted({tuple(int(d) for d in re.findall(r"(\d+)x", shape)) for shape in
                                      re.findall(r"convert_layout %\S+ : tensor<([0-9x]+)", tt)})}))
"""


@pytest.mark.parametrize("fmt,epi", [(4, 1), (5, 2)])
def test_async_ring_is_pipelined_for_sm90(fmt, epi):
    """ASYNC=3 compiles for sm_90 (installed Triton; a child process: the suite runs the interpreter) into
    16-byte cp.async copies into shared memory with a wait per stage, no inline-asm weight load left,
    and no layout conversion of a weight tile (only of 1-D / 1 x N index vectors, as without ASYNC)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _ASYNC_CHILD, str(fmt), str(epi)], capture_output=True, text=True,
                       env=env, cwd=repo, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info["cp16"] > 0 and info["wait"] > 0 and info["asm_w_loads"] == 0, info
    assert all(len(d) == 1 or (len(d) == 2 and d[0] == 1) for d in info["converts"]), info["converts"]


@pytest.mark.gpu
def test_auto_selects_asm_on_sm90():
    from ninfer_compile.kernels.linear.launch import asm_supported
    x = torch.zeros(1, 256, dtype=torch.bfloat16, device="cuda")
    w = random_weight("Q4G64_F16S", 8, 256, torch.Generator().manual_seed(0)).to("cuda")
    assert G.resolve_use_asm("auto", 4, x, w, 256) == asm_supported(x.device)
    assert G.resolve_use_asm(True, 4, x[:, 1:], w, 255) is False     # unaligned x -> plain path


# ---------------------------------------------------------------------------------------------
# split-K second phase inside the launch (REDUCE=fused) vs the separate reduce kernel
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,t,n,k,epi,split", [
    ("q4_gemv_lowreg", 1, 72, 320, "swiglu", 2), ("q5_gemv_lowreg", 3, 40, 200, "residual", 4),
    ("q6_gemv_lowreg", 4, 72, 192, "none", 2), ("q4_gemv_lowreg", 2, 40, 320, "none", 4)])
def test_fused_splitk_reduce_is_bit_identical_and_leaves_counters_zero(name, t, n, k, epi, split):
    from ninfer_compile.kernels.linear.epilogue import fixup_counters

    seed = zlib.crc32(f"fused{name}{t}".encode())
    base = {"BLOCK_N": 8, "BLOCK_K": 128, "SPLIT_K": split}
    fused, expected = _run(name, t, n, k, epi, {**base, "REDUCE": "fused"}, seed)
    two_phase, _ = _run(name, t, n, k, epi, {**base, "REDUCE": "kernel"}, seed)
    assert torch.equal(fused, two_phase), f"{name}: fused split-K reduce differs from the reduce kernel"
    assert_close_rel(fused, expected, 1e-2, f"{name} fused split-K {split}")
    assert int(fixup_counters(fused).abs().sum()) == 0, "the last split must reset its tile's counter"
    again, _ = _run(name, t, n, k, epi, {**base, "REDUCE": "fused"}, seed)  # counters reused: same result
    assert torch.equal(again, fused)


@pytest.mark.gpu
@pytest.mark.parametrize("name,n,k,epi", [("q4_gemv_lowreg", 34816, 5120, "swiglu"),
                                           ("q5_gemv_lowreg", 5120, 17408, "residual")])
def test_fused_splitk_reduce_on_gpu_at_27b_shapes(name, n, k, epi):
    """Thousands of tiles arriving concurrently: the fused reduce (fence + ticket + last-split sum)
    equals the two-launch reduce bit for bit, every time (a missing fence shows up as a mismatch)."""
    for t in (1, 3):
        p = {"BLOCK_N": 16, "BLOCK_K": 1024, "SPLIT_K": 4, "USE_ASM": True}
        ref, expected = _run(name, t, n, k, epi, {**p, "REDUCE": "kernel"}, 9, device="cuda")
        assert_close_rel(ref, expected, 1e-2, f"{name} T={t} two-phase")
        for _ in range(5):
            out, _ = _run(name, t, n, k, epi, {**p, "REDUCE": "fused"}, 9, device="cuda")
            assert torch.equal(out, ref), f"{name} T={t}: fused split-K reduce differs from the reduce kernel"
