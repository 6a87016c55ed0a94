"""GPU-only checks (run on the GPU machine): the inline-PTX dequant path (USE_ASM) against the
same fp32 reference, every route compiled for the real device at a moderate shape, and split-K
determinism (bitwise-equal reruns)."""

import pytest
import torch

from ninfer_compile.kernels import registry
from ninfer_compile.kernels.linear import launch as L
from ninfer_compile.kernels.linear.reference import linear as ref_linear

from _linear_helpers import PREFIX_FORMAT, assert_close_rel, random_weight

pytestmark = pytest.mark.gpu
# the `<f>_dequant_gemm` routes (own launcher module, always need a workspace): test_dequant_gemm.py
ROUTES = [r.name for r in registry.routes_for("linear") if not r.name.endswith(("_dequant_gemm", "_gemv_lowreg"))]
# (`*_gemv_lowreg`: own launcher module, tested in test_gemv_lowreg.py)


def _setup(fmt, n, k, t, epi, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = random_weight(fmt, n, k, gen, device="cuda")
    x = torch.randn(t, k, generator=gen).bfloat16().cuda()
    n_out = n // 2 if epi == "swiglu" else n
    res = torch.randn(t, n_out, generator=gen).bfloat16().cuda() if epi == "residual" else None
    out = torch.full((t, n_out), float("nan"), dtype=torch.bfloat16, device="cuda")
    return w, x, res, out


@pytest.mark.parametrize("route", ["q4_small_t_mma", "q4_wide_mma"])
@pytest.mark.parametrize("t", [1, 16, 37, 100])
@pytest.mark.parametrize("epi", ["none", "swiglu"])
def test_q4_asm_matches_reference(route, t, epi):
    if L.registry_domain_max(route) is not None and t > L.registry_domain_max(route):
        pytest.skip("outside domain")
    assert L.asm_supported(torch.device("cuda")), "USE_ASM path not available on this GPU"
    w, x, res, out = _setup("Q4G64_F16S", 1000, 1344, t, epi)
    expected = ref_linear(x, w, epi, res)
    outs = {}
    for asm in (True, False):
        out.fill_(float("nan"))
        getattr(L, route)(x, w, out, epilogue=epi, residual=res,
                          **{"USE_ASM": asm, "BLOCK_T": 32 if (t <= 32 or route == "q4_wide_mma") else 64})
        torch.cuda.synchronize()
        assert_close_rel(out, expected, 1e-2, f"{route} USE_ASM={asm} T={t}")
        outs[asm] = out.clone()
    # the asm path rounds the fp16 scale to bf16 before the packed multiply (plain: fp32 q*s,
    # one rounding), so the two differ by bf16 rounding, not more
    assert_close_rel(outs[True], outs[False].float(), 8e-3, "asm vs plain")


@pytest.mark.parametrize("name", ROUTES)
@pytest.mark.parametrize("epi", ["none", "swiglu", "residual"])
def test_route_on_gpu(name, epi):
    fmt = PREFIX_FORMAT[name.split("_", 1)[0]]
    dom = registry.get_route(name).domain
    for t in (1, 3, 17, 64, 300):
        if t < dom.min_t or (dom.max_t is not None and t > dom.max_t):
            continue
        w, x, res, out = _setup(fmt, 392, 1000, t, epi, seed=t)
        registry.get_route(name).load_launcher()(x, w, out, epilogue=epi, residual=res)
        torch.cuda.synchronize()
        assert_close_rel(out, ref_linear(x, w, epi, res), 1e-2, f"{name} T={t} {epi}")


@pytest.mark.parametrize("name", ["q4_gemv", "q5_small_t_mma"])
def test_splitk_deterministic(name):
    w, x, res, out = _setup(PREFIX_FORMAT[name[:2]], 512, 5120, 3, "residual")
    ws = torch.empty(L.workspace_numel(3, 512, "residual", 4), device="cuda")
    runs = []
    for _ in range(3):
        getattr(L, name)(x, w, out, epilogue="residual", residual=res, workspace=ws,
                         **{"SPLIT_K": 4})
        runs.append(out.clone())
    assert all(torch.equal(runs[0], r) for r in runs[1:])
    assert_close_rel(runs[0], ref_linear(x, w, "residual", res), 1e-2, f"{name} split-K")


@pytest.mark.parametrize("t", [1, 2, 3, 4])
@pytest.mark.parametrize("epi", ["none", "swiglu", "residual"])
@pytest.mark.parametrize("params", [{"BLOCK_N": 8, "BLOCK_K": 256}, {"BLOCK_N": 16, "BLOCK_K": 1024}])
def test_q4_gemv_asm_matches_reference(t, epi, params):
    """The packed bf16x2 GEMV path (USE_ASM) against the fp32 reference and the plain path, fresh
    random data per case, K with a padded tail (1344 = 10.5 groups of 128) and rows past N."""
    assert L.asm_supported(torch.device("cuda")), "USE_ASM path not available on this GPU"
    w, x, res, out = _setup("Q4G64_F16S", 1000, 1344, t, epi, seed=100 + t)
    x = x * 3.0  # realistic magnitudes (post-norm activations), not only unit variance
    expected = ref_linear(x, w, epi, res)
    outs = {}
    for asm in (True, False):
        out.fill_(float("nan"))
        L.q4_gemv(x, w, out, epilogue=epi, residual=res, **{**params, "USE_ASM": asm})
        torch.cuda.synchronize()
        assert_close_rel(out, expected, 1e-2, f"q4_gemv USE_ASM={asm} T={t} {epi}")
        outs[asm] = out.clone()
    assert_close_rel(outs[True], outs[False].float(), 1e-2, "asm vs plain")


def test_q4_gemv_asm_splitk_and_large_k():
    w, x, res, out = _setup("Q4G64_F16S", 512, 17408, 4, "residual", seed=7)
    ws = torch.empty(L.workspace_numel(4, 512, "residual", 4), device="cuda")
    out.fill_(float("nan"))
    L.q4_gemv(x, w, out, epilogue="residual", residual=res, workspace=ws,
              **{"SPLIT_K": 4, "USE_ASM": True, "BLOCK_N": 16, "BLOCK_K": 512})
    torch.cuda.synchronize()
    assert_close_rel(out, ref_linear(x, w, "residual", res), 1e-2, "q4_gemv asm split-K")
