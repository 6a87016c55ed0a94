"""Every linear route x format against the fp32 reference (TRITON_INTERPRET=1 on CPU).

Odd shapes: K not a multiple of 128 (192, 320) and with a partial group (200), N = 40 / 72,
row views of a fused parent, all epilogues, split-K, several T per route inside its domain,
and the domain edges (T = max_t runs, max_t + 1 is refused with a clear error).
"""

import zlib

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels import registry
from ninfer_compile.kernels.linear import launch as L
from ninfer_compile.kernels.linear.reference import linear as ref_linear

from _linear_helpers import PREFIX_FORMAT, assert_close_rel, random_weight

# the `<f>_dequant_gemm` routes (own launcher module, always need a workspace): test_dequant_gemm.py
ROUTES = [r.name for r in registry.routes_for("linear")
          if not r.name.endswith(("_dequant_gemm", "_gemv_lowreg", "_gemv_tc", "_gemm_tc"))]
# (`*_gemv_lowreg` / `*_gemv_tc` / `*_gemm_tc`: own launcher modules, tested in
# test_gemv_lowreg.py / test_gemv_tc.py / test_gemm_tc.py)
SHAPES = [(40, 192), (72, 200), (40, 320)]
EPIS = ["none", "swiglu", "residual"]
T_BY_KIND = {"gemv": [1, 3, 4], "small_t_mma": [1, 5, 17, 33], "wide_mma": [3, 33, 70],
             "tiled": [1, 17, 70]}
# small tiles keep the interpreter fast and exercise multiple N / T / K blocks
SMALL_PARAMS = {"gemv": {"BLOCK_N": 8, "BLOCK_K": 128},
                "small_t_mma": {"BLOCK_N": 32, "BLOCK_K": 64},
                "wide_mma": {"BLOCK_N": 32, "BLOCK_K": 64, "BLOCK_T": 32},
                "tiled": {"BLOCK_N": 32, "BLOCK_K": 64, "BLOCK_T": 32}}


def _kind(name):
    return name.split("_", 1)[1]


def _fmt(name):
    return PREFIX_FORMAT[name.split("_", 1)[0]]


def _cases():
    out = []
    for name in ROUTES:
        kind = _kind(name)
        for i, t in enumerate(T_BY_KIND[kind]):
            n, k = SHAPES[i % 3]
            out.append(pytest.param(name, t, n, k, EPIS[i % 3], None, SMALL_PARAMS[kind],
                                    id=f"{name}-T{t}-{n}x{k}-{EPIS[i % 3]}"))
        # a row view of a fused parent (rows 8..56 of 72) with the swiglu epilogue, default params
        t = T_BY_KIND[kind][-1]
        out.append(pytest.param(name, t, 48, 200, "swiglu", (8, 72), {},
                                id=f"{name}-T{t}-view8+48x200-swiglu"))
        if kind in ("gemv", "small_t_mma"):
            t = T_BY_KIND[kind][1]
            out.append(pytest.param(name, t, 72, 320, "residual", None,
                                    {**SMALL_PARAMS[kind], "SPLIT_K": 2},
                                    id=f"{name}-T{t}-72x320-residual-splitk2"))
    return out


def _run(name, t, n, k, epi, view, params, gen, residual_in_place=False):
    fmt = _fmt(name)
    if view is None:
        w = random_weight(fmt, n, k, gen)
    else:
        begin, parent_n = view
        parent = random_weight(fmt, parent_n, k, gen)
        w = parent.rows(begin, n) if fmt != "BF16" else parent[begin:begin + n]
    x = torch.randn(t, k, generator=gen).bfloat16()
    n_out = n // 2 if epi == "swiglu" else n
    out = torch.full((t, n_out), float("nan"), dtype=torch.bfloat16)   # poisoned
    residual = None
    if epi == "residual":
        residual = torch.randn(t, n_out, generator=gen).bfloat16()
    expected = ref_linear(x, w, epi, residual)
    if residual_in_place:
        out.copy_(residual)
        residual = out
    split = params.get("SPLIT_K", 1)
    ws = torch.full((L.workspace_numel(t, n_out, epi, split),), float("nan")) if split > 1 else None
    ret = getattr(L, name)(x, w, out, epilogue=epi, residual=residual, workspace=ws, **(params or {}))
    assert ret is None
    return out, expected


@pytest.mark.parametrize("name,t,n,k,epi,view,params", _cases())
def test_route_matches_reference(name, t, n, k, epi, view, params):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}/{t}/{n}/{k}/{epi}".encode()))
    out, expected = _run(name, t, n, k, epi, view, params, gen)
    assert_close_rel(out, expected, 1e-2, f"{name} T={t} [{n},{k}] {epi}")


@pytest.mark.parametrize("name", ["q4_gemv", "q6_small_t_mma", "w8_wide_mma", "bf16_gemv"])
def test_residual_in_place(name):
    gen = torch.Generator().manual_seed(7)
    kind = _kind(name)
    out, expected = _run(name, 3, 40, 192, "residual", None, SMALL_PARAMS[kind], gen,
                         residual_in_place=True)
    assert_close_rel(out, expected, 1e-2, f"{name} residual in place")


@pytest.mark.parametrize("name", [n for n in ROUTES if registry.get_route(n).domain.max_t is not None])
def test_domain_edge(name):
    route = registry.get_route(name)
    max_t = route.domain.max_t
    gen = torch.Generator().manual_seed(3)
    fmt = _fmt(name)
    w = random_weight(fmt, 16, 128, gen)
    params = {**SMALL_PARAMS[_kind(name)], "BLOCK_N": 16} if "gemv" not in name else {"BLOCK_N": 16}
    if "BLOCK_T" in route.params:
        params["BLOCK_T"] = 64
    x = torch.randn(max_t, 128, generator=gen).bfloat16()
    out = torch.full((max_t, 16), float("nan"), dtype=torch.bfloat16)
    getattr(L, name)(x, w, out, **(params or {}))
    assert_close_rel(out, ref_linear(x, w), 1e-2, f"{name} T=max_t={max_t}")
    x2 = torch.randn(max_t + 1, 128).bfloat16()
    out2 = torch.empty(max_t + 1, 16, dtype=torch.bfloat16)
    with pytest.raises(RouteError, match=rf"{name}: T={max_t + 1} columns is outside its domain"):
        getattr(L, name)(x2, w, out2, **(params or {}))


def test_domains_declared():
    for name in ROUTES:
        r = registry.get_route(name)
        assert r.family == "linear" and r.domain.formats == (_fmt(name),)
        assert set(r.domain.epilogues) == set(EPIS)
        assert {"BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages"} <= set(r.params)
        assert r.load_launcher() is getattr(L, name)
        assert r.check_params(r.resolve_params()) is None
    kinds = {}
    for name in ROUTES:
        kinds.setdefault(_fmt(name), set()).add(_kind(name))
    for fmt in ("Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"):
        assert kinds[fmt] == {"gemv", "small_t_mma", "wide_mma"}
    assert kinds["BF16"] == {"gemv", "tiled"}


def test_launcher_errors():
    gen = torch.Generator().manual_seed(4)
    w4 = random_weight("Q4G64_F16S", 16, 128, gen)
    w5 = random_weight("Q5G64_F16S", 16, 128, gen)
    x = torch.randn(2, 128).bfloat16()
    out = torch.empty(2, 16, dtype=torch.bfloat16)
    with pytest.raises(RouteError, match="format Q5G64_F16S is not in its domain"):
        L.q4_gemv(x, w5, out)
    with pytest.raises(RouteError, match="epilogue 'gelu'"):
        L.q4_gemv(x, w4, out, epilogue="gelu")
    with pytest.raises(RouteError, match="BLOCK_N=3"):
        L.q4_gemv(x, w4, out, **{"BLOCK_N": 3})
    with pytest.raises(RouteError, match="workspace"):
        L.q4_gemv(x, w4, out, **{"SPLIT_K": 2})
    with pytest.raises(RouteError, match="out must be bf16"):
        L.q4_gemv(x, w4, torch.empty(2, 8, dtype=torch.bfloat16))
    with pytest.raises(RouteError, match="residual"):
        L.q4_small_t_mma(x, w4, out, epilogue="residual")
    with pytest.raises(RouteError, match="outside its domain"):
        L.q4_wide_mma(torch.empty(0, 128, dtype=torch.bfloat16), w4, torch.empty(0, 16, dtype=torch.bfloat16))
    with pytest.raises(RouteError, match="USE_ASM=True"):
        L.q4_small_t_mma(x, w4, out, **{"USE_ASM": True})
