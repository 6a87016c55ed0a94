"""KV-cache append (bf16 and int8-g64) vs the reference codec."""

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels.kv_cache import launch, reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _caches(slots_n, ctx, Hkv, D, int8):
    if int8:
        kc = torch.zeros(slots_n, ctx, Hkv, D, dtype=torch.int8)
        vc = torch.zeros_like(kc)
        ks = torch.zeros(slots_n, ctx, Hkv, D // 64, dtype=torch.float16)
        return kc, vc, ks, ks.clone()
    kc = torch.zeros(slots_n, ctx, Hkv, D, dtype=torch.bfloat16)
    return kc, kc.clone(), None, None


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("T,Hkv,D", [(1, 1, 64), (5, 2, 128), (17, 1, 256)])
def test_kv_append(int8, T, Hkv, D):
    g = torch.Generator().manual_seed(T + D)
    k = (3 * torch.randn(T, Hkv, D, generator=g)).bfloat16()
    v = torch.randn(T, Hkv, D, generator=g).bfloat16()
    if T > 1:
        k[1, 0, :64] = 0.0  # an all-zero group: scale 0, codes 0
    slots = torch.randint(0, 3, (T,), generator=g, dtype=torch.int32)
    pos = torch.randperm(40, generator=g)[:T].to(torch.int32)
    caches = _caches(3, 40, Hkv, D, int8)
    ref = reference.kv_append(k, v, pos, slots, *caches)
    dev = [None if c is None else c.clone().to(DEV) for c in caches]
    launch.kv_append(k.to(DEV), v.to(DEV), pos.to(DEV), slots.to(DEV), *dev)
    for got, want in zip(dev, ref):
        if want is None:
            continue
        if int8 and want.dtype == torch.int8 and DEV == "cuda":
            assert (got.cpu().int() - want.int()).abs().max() <= 1
        else:
            assert torch.equal(got.cpu(), want)


def test_codec_round_trip_error():
    x = torch.randn(4, 256).bfloat16()
    c, s = reference.quantize_g64(x)
    err = (reference.dequantize_g64(c, s) - x.float()).abs()
    bound = s.float().repeat_interleave(64, -1) * 0.5 + 1e-6
    assert (err <= bound * 1.01).all()


def test_int8_needs_d_multiple_of_64():
    k = torch.zeros(1, 1, 32, dtype=torch.bfloat16)
    kc, vc, ks, vs = _caches(1, 4, 1, 64, True)
    kc = kc[..., :32].contiguous()
    with pytest.raises(RouteError, match="D % 64"):
        launch.kv_append(k, k, torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
                         kc, kc.clone(), ks, vs)


# ------------------------------------------------------------------ every KV format (formats.py)

from ninfer_compile.kernels.kv_cache import formats as F  # noqa: E402


def format_caches(name, slots_n, ctx, Hkv, D, device="cpu"):
    """Zeroed caches of format `name`: [k_cache, v_cache, k_scale, v_scale] (scales None for bf16)."""
    bufs = [torch.zeros(s, dtype=reference._TORCH[d], device=device)
            for _, s, d in F.cache_buffers(F.FORMATS[name], slots_n, ctx, Hkv, D)]
    return bufs + [None] * (4 - len(bufs))


def _rel(a, b):
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


def _kv(k, v, g, outlier=True):
    if outlier:
        k[..., 5] *= 12.0  # an outlier channel
    if k.shape[0] > 1:
        k[1, 0, :32] = 0.0  # zero groups: zero scales, zero codes
    return k.bfloat16(), v.bfloat16()


@pytest.mark.parametrize("name", list(F.KV_DTYPES))
@pytest.mark.parametrize("T,Hkv,D", [(1, 1, 64), (3, 2, 128), (17, 1, 256), (5, 2, 32)])
def test_kv_append_every_format(name, T, Hkv, D):
    if F.FORMATS[name].head_dim_problem(D):
        pytest.skip(f"{name} cannot store D={D}")
    g = torch.Generator().manual_seed(T * 7 + D)
    k, v = _kv(3 * torch.randn(T, Hkv, D, generator=g), torch.randn(T, Hkv, D, generator=g), g)
    slots = torch.randint(0, 3, (T,), generator=g, dtype=torch.int32)
    pos = torch.randperm(40, generator=g)[:T].to(torch.int32)
    caches = format_caches(name, 3, 40, Hkv, D)
    ref = reference.kv_append(k, v, pos, slots, *caches)
    dev = [None if c is None else c.clone().to(DEV) for c in caches]
    launch.kv_append(k.to(DEV), v.to(DEV), pos.to(DEV), slots.to(DEV), *dev)
    got = [None if c is None else c.cpu() for c in dev]
    gk, gv = reference.kv_as_float(*got, D)
    rk, rv = reference.kv_as_float(*ref, D)
    tol = 1e-6 if DEV == "cpu" else 2e-2  # GPU division / rounding may move a code at a boundary
    assert _rel(gk, rk) <= tol and _rel(gv, rv) <= tol
    untouched = torch.ones(3, 40, dtype=torch.bool)
    untouched[slots.long(), pos.long()] = False
    assert torch.all(gk[untouched] == 0) and torch.all(gv[untouched] == 0)  # only the written rows


@pytest.mark.parametrize("name", ["fp8", "nvfp4", "rk4v4"])
def test_kv_append_in_chunks_equals_one_call(name):
    T, Hkv, D = 9, 2, 64
    g = torch.Generator().manual_seed(3)
    k, v = _kv(torch.randn(T, Hkv, D, generator=g), torch.randn(T, Hkv, D, generator=g), g)
    pos = torch.arange(4, 4 + T, dtype=torch.int32)
    slots = torch.ones(T, dtype=torch.int32)
    whole = [None if c is None else c.to(DEV) for c in format_caches(name, 2, 16, Hkv, D)]
    parts = [None if c is None else c.clone() for c in whole]
    launch.kv_append(k.to(DEV), v.to(DEV), pos.to(DEV), slots.to(DEV), *whole)
    for a, b in ((0, 4), (4, 5), (5, 9)):  # chunk boundaries at 4 and 5
        launch.kv_append(k[a:b].to(DEV), v[a:b].to(DEV), pos[a:b].to(DEV), slots[a:b].to(DEV), *parts)
    for x, y in zip(whole, parts):
        if x is not None:
            assert torch.equal(x, y)


def test_kv_append_refuses_a_layout_of_no_format():
    k = torch.zeros(1, 1, 64, dtype=torch.bfloat16)
    kc, vc, ks, vs = format_caches("nvfp4", 1, 4, 1, 64)
    z = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(RouteError, match="no KV format stores head width 64"):
        launch.kv_append(k, k, z, z, kc, vc, ks.half(), vs)  # an f16 K scale plane of width 4: no format
    with pytest.raises(RouteError, match="k_scale and v_scale come together"):
        launch.kv_append(k, k, z, z, kc, vc, ks, None)
