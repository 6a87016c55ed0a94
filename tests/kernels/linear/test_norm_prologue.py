"""The RMSNorm prologue of the decode GEMVs (operand norm_weight, attribute norm_eps; prologue.py).

CPU (TRITON_INTERPRET=1): every route that declares prologue "rmsnorm" (q4/q5/q6/w8/bf16_gemv,
q4_gemv_lowreg, q5/q6_gemv_packed) against the fp32 reference rmsnorm -> linear on T = 1, 3, 4
(their domain ends at 4), K = 96 / 160 (not multiples of 128) and 320, every epilogue and split-K;
the reference prologue equals rmsnorm then linear; routes without the prologue refuse it.
GPU-marked: the inline-PTX paths (USE_ASM) against the reference.
"""

import zlib

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels import registry
from ninfer_compile.kernels.linear import gemv_lowreg as G
from ninfer_compile.kernels.linear import launch as L
from ninfer_compile.kernels.linear.reference import linear as ref_linear
from ninfer_compile.kernels.norms.reference import rmsnorm as ref_rmsnorm

from _linear_helpers import assert_close_rel, random_weight

EPS = 1e-6
GEMV = {"q4_gemv": "Q4G64_F16S", "q5_gemv": "Q5G64_F16S", "q6_gemv": "Q6G64_F16S", "w8_gemv": "W8G32_F16S",
        "bf16_gemv": "BF16"}
LOWREG = {"q4_gemv_lowreg": "Q4G64_F16S", "q5_gemv_packed": "Q5G64_F16S", "q6_gemv_packed": "Q6G64_F16S"}
SMALL = {"gemv": {"BLOCK_N": 8, "BLOCK_K": 64}, "lowreg": {"BLOCK_N": 8, "BLOCK_K": 128}}


def _launcher(name):
    return getattr(G, name) if name in LOWREG else getattr(L, name)


def _case(name, fmt, t, n, k, epi, params, seed, device="cpu"):
    """x bf16 [t, k] with a large, uneven scale per column (the norm must undo it), norm weight
    bf16 [k] around 0 (the (1 + w) convention); out NaN-filled. Returns (out, expected)."""
    gen = torch.Generator().manual_seed(seed)
    w = random_weight(fmt, n, k, gen)
    x = (torch.randn(t, k, generator=gen) * torch.tensor([3.0, 0.2, 40.0, 1.0][:t])[:, None]).bfloat16()
    nw = (torch.randn(k, generator=gen) * 0.3).bfloat16()
    n_out = n // 2 if epi == "swiglu" else n
    residual = torch.randn(t, n_out, generator=gen).bfloat16() if epi == "residual" else None
    expected = ref_linear(x, w, epi, residual, norm_weight=nw, norm_eps=EPS)
    if device != "cpu":
        w, x, nw = w.to(device), x.to(device), nw.to(device)
        residual = None if residual is None else residual.to(device)
    out = torch.full((t, n_out), float("nan"), dtype=torch.bfloat16, device=device)
    ws = None
    if params.get("SPLIT_K", 1) > 1:
        ws = torch.full((L.linear_workspace_numel(name, t, n, k, epi, params),), float("nan"), device=device)
    assert _launcher(name)(x, w, out, epilogue=epi, residual=residual, workspace=ws, norm_weight=nw,
                           norm_eps=EPS, **params) is None
    return out.cpu(), expected


def _cases():
    out = []
    shapes = [(1, 40, 96, "none"), (3, 72, 160, "swiglu"), (4, 40, 160, "residual")]
    for name, fmt in {**GEMV, **LOWREG}.items():
        small = SMALL["lowreg" if name in LOWREG else "gemv"]
        for t, n, k, epi in shapes:
            out.append(pytest.param(name, fmt, t, n, k, epi, small, id=f"{name}-T{t}-{n}x{k}-{epi}"))
        out.append(pytest.param(name, fmt, 3, 40, 320, "none", {**small, "SPLIT_K": 2},
                                id=f"{name}-T3-40x320-splitk2"))
    return out


@pytest.mark.parametrize("name,fmt,t,n,k,epi,params", _cases())
def test_prologue_matches_reference(name, fmt, t, n, k, epi, params):
    out, expected = _case(name, fmt, t, n, k, epi, params, zlib.crc32(f"{name}{t}{n}{k}{epi}".encode()))
    assert_close_rel(out, expected, 1e-2, f"{name} T={t} {n}x{k} {epi} + rmsnorm prologue")


def test_reference_prologue_is_rmsnorm_then_linear():
    gen = torch.Generator().manual_seed(3)
    w = random_weight("Q5G64_F16S", 24, 160, gen)
    x = torch.randn(5, 160, generator=gen) * 7
    nw = torch.randn(160, generator=gen) * 0.3
    want = ref_linear(ref_rmsnorm(x, nw, EPS), w)
    got = ref_linear(x, w, norm_weight=nw, norm_eps=EPS)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ref_linear(x, w), want, rtol=1e-2, atol=1e-2)  # the prologue matters


def test_routes_without_the_prologue_refuse_it():
    gen = torch.Generator().manual_seed(4)
    w = random_weight("Q4G64_F16S", 16, 128, gen)
    x = torch.randn(2, 128, generator=gen).bfloat16()
    out = torch.empty(2, 16, dtype=torch.bfloat16)
    nw = torch.zeros(128, dtype=torch.bfloat16)
    for name in ("q4_small_t_mma", "q4_dequant_gemm"):
        with pytest.raises(RouteError, match="prologue rmsnorm is not in its domain"):
            registry.default_registry.get_route(name).load_launcher()(x, w, out, norm_weight=nw, norm_eps=EPS)
    with pytest.raises(RouteError, match="norm_eps without norm_weight"):
        L.q4_gemv(x, w, out, norm_eps=EPS)
    with pytest.raises(RouteError, match="norm_weight must be contiguous bf16"):
        L.q4_gemv(x, w, out, norm_weight=torch.zeros(96, dtype=torch.bfloat16), norm_eps=EPS)


def test_declared_routes():
    """The routes that take the prologue are exactly the decode GEMVs (T <= 4)."""
    got = sorted(r.name for r in registry.default_registry.routes_for("linear") if "rmsnorm" in r.domain.prologues)
    assert got == sorted({**GEMV, **LOWREG})


@pytest.mark.gpu
@pytest.mark.parametrize("name,fmt", list({**GEMV, **LOWREG}.items()))
@pytest.mark.parametrize("t,n,k,epi", [(1, 512, 5120, "none"), (2, 256, 1024, "swiglu"), (4, 256, 1536, "residual"),
                                       (1, 96, 160, "none")])
def test_prologue_gpu(name, fmt, t, n, k, epi):
    params = {"USE_ASM": True} if name in LOWREG or name == "q4_gemv" else {}  # the inline-PTX paths
    out, expected = _case(name, fmt, t, n, k, epi, params, 11, device="cuda")
    assert_close_rel(out, expected, 1e-2, f"{name} T={t} {n}x{k} {epi} + rmsnorm prologue (GPU)")


def test_scale_pair_asm_emulated():
    """The inline-PTX pair scaler (`prologue.SCALE_PAIR_ASM`, the asm paths' x * (1 + w)) on the
    lowreg tests' bit-exact PTX emulator: each bf16 half is x * (1 + w) rounded once."""
    import random
    import struct

    from ninfer_compile.kernels.linear.prologue import SCALE_PAIR_ASM
    from ptx_emulator import bf as _bf, bf16_round as _bf16_round, emulate as _emulate

    def bits(v: float) -> int:
        return _bf16_round(struct.unpack("<f", struct.pack("<f", v))[0])

    rng = random.Random(5)
    for _ in range(200):
        xs = [bits(rng.gauss(0, 30)), bits(rng.gauss(0, 0.01))]
        ws = [bits(rng.gauss(0, 0.3)), bits(rng.gauss(0, 2))]
        xp, wp = xs[0] | xs[1] << 16, ws[0] | ws[1] << 16
        regs = _emulate("{\n" + SCALE_PAIR_ASM.value + "\n}", [0, xp, wp])
        for h in range(2):
            got = _bf(regs["$0"] >> (16 * h))
            x, w = _bf(xs[h]), _bf(ws[h])
            assert got == _bf(_bf16_round(x * w + x)), (x, w, got)
            assert abs(got - x * (1 + w)) <= abs(x * (1 + w)) * 2 ** -8 + 1e-30
