"""The `<f>_dequant_gemm` prefill routes (dequantize once into a bf16 workspace, then a GEMM)
against the fp32 reference, under the Triton interpreter on CPU (torch.mm / addmm stand in for
cuBLAS). Odd shapes (K 192 / 200 / 320: partial groups and K-padding, N 40 / 72), row views of a
fused parent, every format x epilogue, the workspace contract and the launcher's refusals."""

from __future__ import annotations

import dataclasses
import zlib

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels import registry
from ninfer_compile.kernels.linear import dequant_gemm as D
from ninfer_compile.kernels.linear import launch as L
from ninfer_compile.kernels.linear import routes as R
from ninfer_compile.kernels.linear.reference import dequantize, linear as ref_linear

from _linear_helpers import PREFIX_FORMAT, assert_close_rel, random_weight

ROUTES = ["q4_dequant_gemm", "q5_dequant_gemm", "q6_dequant_gemm", "w8_dequant_gemm"]
EPIS = ["none", "swiglu", "residual"]
SHAPES = [(40, 192), (72, 200), (40, 320)]
TS = [17, 33, 70]
SMALL = {"BLOCK_N": 16, "BLOCK_K": 64}  # several dequant programs along N and K


def _fmt(name):
    return PREFIX_FORMAT[name.split("_", 1)[0]]


def _weight(name, n, k, view, gen):
    if view is None:
        return random_weight(_fmt(name), n, k, gen)
    begin, parent_n = view
    return random_weight(_fmt(name), parent_n, k, gen).rows(begin, n)


def _run(name, t, n, k, epi, view, params, gen, *, in_place=False, ws_pad=0):
    w = _weight(name, n, k, view, gen)
    x = torch.randn(t, k, generator=gen).bfloat16()
    n_out = n // 2 if epi == "swiglu" else n
    out = torch.full((t, n_out), float("nan"), dtype=torch.bfloat16)  # poisoned
    residual = torch.randn(t, n_out, generator=gen).bfloat16() if epi == "residual" else None
    expected = ref_linear(x, w, epi, residual)
    if in_place:
        out.copy_(residual)
        residual = out
    need = D.linear_workspace_numel(name, t, n, k, epi)
    ws = torch.full((need + ws_pad,), float("nan"))  # poisoned: every read byte must be written first
    assert getattr(D, name)(x, w, out, epilogue=epi, residual=residual, workspace=ws, **(params or {})) is None
    return w, out, expected, ws


def _cases():
    out = []
    for fi, name in enumerate(ROUTES):
        for ei, epi in enumerate(EPIS):
            i = fi + ei
            t, (n, k) = TS[i % 3], SHAPES[i % 3]
            out.append(pytest.param(name, t, n, k, epi, None, SMALL, id=f"{name}-T{t}-{n}x{k}-{epi}"))
        # a row view of a fused parent (rows 8..56 of 72): swiglu over the view, default params
        t = TS[fi % 3]
        out.append(pytest.param(name, t, 48, 200, "swiglu", (8, 72), {}, id=f"{name}-T{t}-view8+48x200-swiglu"))
        out.append(pytest.param(name, 17, 32, 320, "residual", (40, 72), {"BLOCK_N": 32, "BLOCK_K": 128},
                                id=f"{name}-T17-view40+32x320-residual"))
    return out


@pytest.mark.parametrize("name,t,n,k,epi,view,params", _cases())
def test_route_matches_reference(name, t, n, k, epi, view, params):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}/{t}/{n}/{k}/{epi}/{view}".encode()))
    w, out, expected, ws = _run(name, t, n, k, epi, view, params, gen)
    assert_close_rel(out, expected, 1e-2, f"{name} T={t} [{n},{k}] {epi} view={view}")
    # the workspace holds W_hat exactly: fp16 scale x code rounded once to bf16 (as the MMA routes)
    w_hat = ws.view(torch.bfloat16)[: n * w.k_pad].view(n, w.k_pad)[:, :k]
    assert torch.equal(w_hat, dequantize(w).bfloat16()), f"{name}: W_hat is not bf16(scale x code)"


@pytest.mark.parametrize("name", ["q4_dequant_gemm", "w8_dequant_gemm"])
def test_residual_in_place_and_generic_entry(name):
    gen = torch.Generator().manual_seed(11)
    _, out, expected, _ = _run(name, 33, 40, 192, "residual", None, SMALL, gen, in_place=True)
    assert_close_rel(out, expected, 1e-2, f"{name} residual in place")
    # launch.launch() forwards the route to dequant_gemm.py
    w = random_weight(_fmt(name), 40, 192, gen)
    x = torch.randn(17, 192, generator=gen).bfloat16()
    out = torch.full((17, 40), float("nan"), dtype=torch.bfloat16)
    ws = torch.empty(L.linear_workspace_numel(name, 17, 40, 192, "none"))
    L.launch(name, x, w, out, workspace=ws, params=SMALL)
    assert_close_rel(out, ref_linear(x, w), 1e-2, f"{name} via launch.launch")


def test_out_may_be_a_column_slice():
    """`out` with a row stride > N (a split view of a wider arena value) is written in place."""
    gen = torch.Generator().manual_seed(5)
    w = random_weight("Q6G64_F16S", 40, 200, gen)
    x = torch.randn(17, 200, generator=gen).bfloat16()
    wide = torch.full((17, 64), float("nan"), dtype=torch.bfloat16)
    out = wide[:, 8:48]
    ws = torch.empty(D.linear_workspace_numel("q6_dequant_gemm", 17, 40, 200, "none"))
    D.q6_dequant_gemm(x, w, out, workspace=ws, **(SMALL or {}))
    assert_close_rel(out, ref_linear(x, w), 1e-2, "column slice out")
    assert torch.isnan(wide[:, :8].float()).all() and torch.isnan(wide[:, 48:].float()).all()


def test_workspace_size_contract():
    k_pad, y_off, y_elems, total = R.dequant_gemm_layout(70, 72, 200, "swiglu")
    assert k_pad == 256 and y_off == 72 * 256 and y_elems == 70 * 72 and total == y_off + y_elems
    assert R.linear_workspace_numel("q4_dequant_gemm", 70, 72, 200, "swiglu") == (total + 1) // 2
    assert R.linear_workspace_numel("q4_dequant_gemm", 70, 72, 200, "none") == 72 * 256 // 2
    assert R.linear_workspace_numel("q4_dequant_gemm", 70, 72, 200, "residual") == 72 * 256 // 2
    # the same hook sizes the split-K routes, and agrees with the legacy helper
    assert R.linear_workspace_numel("q4_small_t_mma", 5, 72, 200, "swiglu", {"SPLIT_K": 4}) == \
        L.workspace_numel(5, 36, "swiglu", 4) == 4 * 5 * 72
    assert R.linear_workspace_numel("q4_small_t_mma", 5, 72, 200, "none", {}) == 0
    # both launcher modules export it (the runtime calls it on the launcher's module)
    assert D.linear_workspace_numel is R.linear_workspace_numel is L.linear_workspace_numel
    # gate_up of the 27B model at T=1024: bf16 W_hat 34816 x 5120 + bf16 y 1024 x 34816
    assert R.linear_workspace_numel("q4_dequant_gemm", 1024, 34816, 5120, "swiglu") * 4 == \
        2 * (34816 * 5120 + 1024 * 34816)


def test_workspace_errors():
    gen = torch.Generator().manual_seed(4)
    w = random_weight("Q5G64_F16S", 40, 200, gen)
    x = torch.randn(17, 200, generator=gen).bfloat16()
    out = torch.empty(17, 20, dtype=torch.bfloat16)
    need = D.linear_workspace_numel("q5_dequant_gemm", 17, 40, 200, "swiglu")
    with pytest.raises(RouteError, match=rf"q5_dequant_gemm: needs a contiguous float32 workspace of >= {need} "
                                         rf"elements .*got none"):
        D.q5_dequant_gemm(x, w, out, epilogue="swiglu")
    with pytest.raises(RouteError, match=rf">= {need} elements .*got torch.float32 with {need - 1} elements"):
        D.q5_dequant_gemm(x, w, out, epilogue="swiglu", workspace=torch.empty(need - 1))
    with pytest.raises(RouteError, match="float32 workspace"):
        D.q5_dequant_gemm(x, w, out, epilogue="swiglu", workspace=torch.empty(need, dtype=torch.bfloat16))
    with pytest.raises(RouteError, match="not contiguous"):
        D.q5_dequant_gemm(x, w, out, epilogue="swiglu", workspace=torch.empty(need, 2)[:, 0])
    # the swiglu scratch is part of the size: enough for `none` is too small for `swiglu`
    small = torch.empty(D.linear_workspace_numel("q5_dequant_gemm", 17, 40, 200, "none"))
    with pytest.raises(RouteError, match="swiglu scratch"):
        D.q5_dequant_gemm(x, w, out, epilogue="swiglu", workspace=small)


def test_launcher_refusals():
    gen = torch.Generator().manual_seed(6)
    w4 = random_weight("Q4G64_F16S", 16, 128, gen)
    w5 = random_weight("Q5G64_F16S", 16, 128, gen)
    x = torch.randn(17, 128).bfloat16()
    out = torch.empty(17, 16, dtype=torch.bfloat16)
    ws = torch.empty(D.linear_workspace_numel("q4_dequant_gemm", 17, 16, 128, "swiglu"))
    with pytest.raises(RouteError, match="q4_dequant_gemm: weight format Q5G64_F16S is not in its domain"):
        D.q4_dequant_gemm(x, w5, out, workspace=ws)
    with pytest.raises(RouteError, match="epilogue 'gelu'"):
        D.q4_dequant_gemm(x, w4, out, epilogue="gelu", workspace=ws)
    with pytest.raises(RouteError, match="BLOCK_K=100"):
        D.q4_dequant_gemm(x, w4, out, workspace=ws, **{"BLOCK_K": 100})
    with pytest.raises(RouteError, match="QuantWeight"):
        D.q4_dequant_gemm(x, torch.zeros(16, 128, dtype=torch.bfloat16), out, workspace=ws)
    with pytest.raises(RouteError, match="residual"):
        D.q4_dequant_gemm(x, w4, out, epilogue="residual", workspace=ws)
    with pytest.raises(RouteError, match="out must be bf16"):
        D.q4_dequant_gemm(x, w4, torch.empty(17, 8, dtype=torch.bfloat16), workspace=ws)
    big = torch.zeros(18, 16, dtype=torch.bfloat16)
    with pytest.raises(RouteError, match="partially overlaps"):
        D.q4_dequant_gemm(x, w4, big[1:], epilogue="residual", residual=big[:17], workspace=ws)


def test_domain_and_refusal_below_min_t(monkeypatch):
    for name in ROUTES:
        r = registry.get_route(name)
        assert r.family == "linear" and r.domain.formats == (_fmt(name),)
        assert set(r.domain.epilogues) == set(EPIS) and r.domain.max_t is None
        # min_t 1: the runtime narrows a prefill extent's launches to a short tail chunk
        assert r.domain.min_t == R.DEQUANT_GEMM_MIN_T == 1
        assert set(r.params) == {"BLOCK_N", "BLOCK_K", "num_warps"}
        assert r.load_launcher() is getattr(D, name)
        assert not hasattr(L, name)  # launch.py exposes only its own launchers
    gen = torch.Generator().manual_seed(9)
    w = random_weight("W8G32_F16S", 16, 128, gen)
    ws = torch.empty(D.linear_workspace_numel("w8_dequant_gemm", 16, 16, 128, "none"))
    with pytest.raises(RouteError, match=r"w8_dequant_gemm: T=0 columns is outside its domain T in \[1, max\]"):
        D.w8_dequant_gemm(torch.empty(0, 128, dtype=torch.bfloat16), w, torch.empty(0, 16, dtype=torch.bfloat16),
                          workspace=ws)
    # the launcher enforces whatever min_t the registration declares
    route = R.LINEAR_ROUTES["w8_dequant_gemm"]
    monkeypatch.setitem(R.LINEAR_ROUTES, "w8_dequant_gemm",
                        dataclasses.replace(route, domain=dataclasses.replace(route.domain, min_t=16)))
    x = torch.randn(15, 128, generator=gen).bfloat16()
    with pytest.raises(RouteError, match=r"T=15 columns is outside its domain T in \[16, max\]"):
        D.w8_dequant_gemm(x, w, torch.empty(15, 16, dtype=torch.bfloat16), workspace=ws)
    x16 = torch.randn(16, 128, generator=gen).bfloat16()
    out = torch.full((16, 16), float("nan"), dtype=torch.bfloat16)
    D.w8_dequant_gemm(x16, w, out, workspace=ws)
    assert_close_rel(out, ref_linear(x16, w), 1e-2, "T = min_t")


def test_tune_candidates_and_bench_workspace(monkeypatch):
    """tune times the route with a workspace sized by the route-aware hook and checks it."""
    from ninfer_compile.tune import measure as M
    from ninfer_compile.tune.shapes import MatchCase

    r = registry.get_route("q4_dequant_gemm")
    cands = M.param_candidates(r, 1024, quick=False)
    assert cands[0] == {} and len(cands) >= 3 and all(r.check_params(p) is None for p in cands)
    monkeypatch.setattr(M, "DEVICE", "cpu")
    case = MatchCase("linear", {"format": "Q4G64_F16S", "n": 64, "k": 128, "epilogue": "swiglu"},
                     {"x": (17, 128), "weight": (64, 128)})
    bench = M.build(case, 17, copies=1)
    assert bench.check(r, {"BLOCK_N": 32, "BLOCK_K": 128}) < 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("name", ROUTES)
@pytest.mark.parametrize("epi", EPIS)
def test_route_on_gpu_and_graph_capture(name, epi):
    """Real cuBLAS: matches the reference at prefill shapes, and replays from a CUDA graph."""
    gen = torch.Generator().manual_seed(1)
    n, k = (2048, 1536) if epi == "swiglu" else (1000, 1344)
    for t in (1, 16, 300, 1024):
        w = random_weight(_fmt(name), n, k, gen, device="cuda")
        x = torch.randn(t, k, generator=gen).bfloat16().cuda()
        n_out = n // 2 if epi == "swiglu" else n
        res = torch.randn(t, n_out, generator=gen).bfloat16().cuda() if epi == "residual" else None
        out = torch.full((t, n_out), float("nan"), dtype=torch.bfloat16, device="cuda")
        ws = torch.empty(D.linear_workspace_numel(name, t, n, k, epi), device="cuda")
        getattr(D, name)(x, w, out, epilogue=epi, residual=res, workspace=ws)
        torch.cuda.synchronize()
        expected = ref_linear(x, w, epi, res)
        assert_close_rel(out, expected, 1e-2, f"{name} T={t} {epi}")
        if t == 300:
            first = out.clone()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                getattr(D, name)(x, w, out, epilogue=epi, residual=res, workspace=ws)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                getattr(D, name)(x, w, out, epilogue=epi, residual=res, workspace=ws)
            out.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            if epi != "residual":
                assert torch.equal(out, first), f"{name} {epi}: graph replay differs"
