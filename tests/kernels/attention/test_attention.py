"""Gated GQA attention (decode split-KV and causal prefill) vs the fp32 reference."""

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels.attention import launch, reference
from ninfer_compile.kernels.kv_cache import reference as kv_reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _filled_cache(slots_n, ctx, Hkv, D, int8, seed):
    """A cache filled through the reference codec (kv_append itself is tested in kv_cache/)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(slots_n, ctx, Hkv, D, generator=g).bfloat16()
    v = torch.randn(slots_n, ctx, Hkv, D, generator=g).bfloat16()
    if not int8:
        return k.to(DEV), v.to(DEV), None, None
    kc, ks = kv_reference.quantize_g64(k)
    vc, vs = kv_reference.quantize_g64(v)
    return kc.to(DEV), vc.to(DEV), ks.to(DEV), vs.to(DEV)


def _qg(T, Hq, D, seed):
    g = torch.Generator().manual_seed(seed)
    fused = torch.randn(T, Hq, 2 * D, generator=g).bfloat16().to(DEV)
    return fused[:, :, :D], fused[:, :, D:]  # strided q / gate halves of one projection


def _ref(q, gate, kc, vc, ks, vs, pos, slots):
    c = lambda x: None if x is None else x.cpu()  # noqa: E731
    return reference.attention(q.cpu(), gate.cpu(), kc.cpu(), vc.cpu(), pos.cpu(), slots.cpu(),
                               q.shape[-1] ** -0.5, c(ks), c(vs))


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("T,Hq,Hkv,D,split", [(1, 6, 1, 64, 64), (3, 4, 2, 64, 512), (5, 6, 2, 128, 64)])
def test_decode(int8, T, Hq, Hkv, D, split):
    ctx = 150
    kc, vc, ks, vs = _filled_cache(4, ctx, Hkv, D, int8, seed=D + T)
    q, gate = _qg(T, Hq, D, seed=T)
    slots = torch.tensor([3, 0, 3, 1, 2][:T], dtype=torch.int32, device=DEV)
    pos = torch.tensor([149, 0, 63, 64, 100][:T], dtype=torch.int32, device=DEV)
    out = torch.empty(T, Hq * D, dtype=torch.bfloat16, device=DEV)
    ws = torch.empty(max(1, launch.decode_workspace_numel(T, Hq, D, ctx, split)), device=DEV)
    launch.attention_decode(q, gate, kc, vc, pos, slots, out, workspace=ws, k_scale=ks, v_scale=vs,
                            split_tokens=split)
    torch.testing.assert_close(out.float().cpu(), _ref(q, gate, kc, vc, ks, vs, pos, slots), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("int8", [False, True])
def test_decode_balanced_splits_at_every_depth(int8):
    """Columns far shallower than the cache: each column's ctx is spread over all NSPLIT splits
    (span = cdiv(cdiv(ctx, NSPLIT), BN) * BN), incl. a column of depth 1 and one in a partial block."""
    T, Hq, Hkv, D, cache = 5, 4, 2, 64, 300
    kc, vc, ks, vs = _filled_cache(3, cache, Hkv, D, int8, seed=11)
    q, gate = _qg(T, Hq, D, seed=12)
    slots = torch.tensor([0, 1, 2, 0, 1], dtype=torch.int32, device=DEV)
    pos = torch.tensor([0, 7, 70, 299, 130], dtype=torch.int32, device=DEV)
    out = torch.empty(T, Hq * D, dtype=torch.bfloat16, device=DEV)
    ws = torch.full((launch.decode_workspace_numel(T, Hq, D, cache, 64),), float("nan"), device=DEV)
    launch.attention_decode(q, gate, kc, vc, pos, slots, out, workspace=ws, k_scale=ks, v_scale=vs,
                            split_tokens=64, block_n=16, balance="ctx")
    torch.testing.assert_close(out.float().cpu(), _ref(q, gate, kc, vc, ks, vs, pos, slots), atol=2e-2, rtol=2e-2)


def test_decode_tiny_head_dim():
    T, Hq, Hkv, D = 2, 2, 1, 32
    kc, vc, ks, vs = _filled_cache(2, 20, Hkv, D, False, seed=1)
    q, gate = _qg(T, Hq, D, seed=2)
    slots = torch.tensor([1, 0], dtype=torch.int32, device=DEV)
    pos = torch.tensor([19, 5], dtype=torch.int32, device=DEV)
    out = torch.empty(T, Hq * D, dtype=torch.bfloat16, device=DEV)
    launch.attention_decode(q, gate, kc, vc, pos, slots, out)
    torch.testing.assert_close(out.float().cpu(), _ref(q, gate, kc, vc, ks, vs, pos, slots), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("T,p0,Hq,Hkv,D", [(1, 0, 2, 1, 64), (5, 7, 4, 2, 64), (17, 0, 6, 2, 64), (33, 40, 2, 1, 128)])
def test_prefill(int8, T, p0, Hq, Hkv, D):
    ctx = 80
    kc, vc, ks, vs = _filled_cache(2, ctx, Hkv, D, int8, seed=T)
    q, gate = _qg(T, Hq, D, seed=T + 1)
    slots = torch.full((T,), 1, dtype=torch.int32, device=DEV)
    pos = torch.arange(p0, p0 + T, dtype=torch.int32, device=DEV)
    out = torch.empty(T, Hq * D, dtype=torch.bfloat16, device=DEV)
    launch.attention_prefill(q, gate, kc, vc, pos, slots, out, k_scale=ks, v_scale=vs, block_m=16, block_n=16)
    torch.testing.assert_close(out.float().cpu(), _ref(q, gate, kc, vc, ks, vs, pos, slots), atol=2e-2, rtol=2e-2)


def test_decode_refuses_t_outside_domain():
    T = launch.DECODE_MAX_T + 1
    kc, vc, ks, vs = _filled_cache(1, 4, 1, 32, False, seed=0)
    q, gate = _qg(T, 1, 32, seed=0)
    z = torch.zeros(T, dtype=torch.int32, device=DEV)
    out = torch.empty(T, 32, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(RouteError, match=rf"attention_decode: T={T} outside the route domain \[1, {T - 1}\]"):
        launch.attention_decode(q, gate, kc, vc, z, z, out)


def test_decode_needs_workspace_when_split():
    kc, vc, ks, vs = _filled_cache(1, 200, 1, 32, False, seed=0)
    q, gate = _qg(1, 1, 32, seed=0)
    z = torch.zeros(1, dtype=torch.int32, device=DEV)
    with pytest.raises(RouteError, match="workspace"):
        launch.attention_decode(q, gate, kc, vc, z, z, torch.empty(1, 32, dtype=torch.bfloat16, device=DEV),
                                split_tokens=64)


@pytest.mark.gpu
@pytest.mark.parametrize("int8", [False, True])
def test_27b_shapes_gpu(int8):
    Hq, Hkv, D, ctx = 24, 4, 256, 1100
    kc, vc, ks, vs = _filled_cache(2, ctx, Hkv, D, int8, seed=3)
    q, gate = _qg(4, Hq, D, seed=4)
    slots = torch.tensor([1, 0, 1, 0], dtype=torch.int32, device=DEV)
    pos = torch.tensor([1099, 0, 600, 513], dtype=torch.int32, device=DEV)
    out = torch.empty(4, Hq * D, dtype=torch.bfloat16, device=DEV)
    ws = torch.empty(launch.decode_workspace_numel(4, Hq, D, ctx, 256), device=DEV)
    launch.attention_decode(q, gate, kc, vc, pos, slots, out, workspace=ws, k_scale=ks, v_scale=vs, split_tokens=256)
    torch.testing.assert_close(out.float().cpu(), _ref(q, gate, kc, vc, ks, vs, pos, slots), atol=2e-2, rtol=2e-2)
    T = 300
    q, gate = _qg(T, Hq, D, seed=5)
    slots = torch.zeros(T, dtype=torch.int32, device=DEV)
    pos = torch.arange(700, 700 + T, dtype=torch.int32, device=DEV)
    out = torch.empty(T, Hq * D, dtype=torch.bfloat16, device=DEV)
    launch.attention_prefill(q, gate, kc, vc, pos, slots, out, k_scale=ks, v_scale=vs)
    torch.testing.assert_close(out.float().cpu(), _ref(q, gate, kc, vc, ks, vs, pos, slots), atol=2e-2, rtol=2e-2)


# ------------------------------------------------------------------ every KV format (kv_cache/formats.py)

from ninfer_compile.kernels.kv_cache import formats as F  # noqa: E402


def _format_cache(name, slots_n, ctx, Hkv, D, seed, outlier=True):
    """A cache of format `name` filled through the reference codec from Gaussian K / V (K with an
    outlier channel), and the bf16 K / V it encodes."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(slots_n, ctx, Hkv, D, generator=g)
    if outlier:
        k[..., 3] *= 10.0
    k, v = k.bfloat16(), torch.randn(slots_n, ctx, Hkv, D, generator=g).bfloat16()
    fmt = F.FORMATS[name]
    kc, ks = kv_reference.encode(fmt.k, k)
    vc, vs = kv_reference.encode(fmt.v, v)
    dev = lambda x: None if x is None else x.to(DEV)  # noqa: E731
    return (dev(kc), dev(vc), dev(ks), dev(vs)), (k, v)


def _rel_rms(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("name", [n for n in F.KV_DTYPES if n not in ("bf16", "int8")])
@pytest.mark.parametrize("T,Hq,Hkv,D,split", [(1, 6, 1, 64, 64), (3, 4, 2, 128, 512), (5, 6, 2, 64, 64)])
def test_decode_every_format(name, T, Hq, Hkv, D, split):
    ctx = 130
    (kc, vc, ks, vs), _ = _format_cache(name, 4, ctx, Hkv, D, seed=D + T)
    q, gate = _qg(T, Hq, D, seed=T)
    slots = torch.tensor([3, 0, 3, 1, 2][:T], dtype=torch.int32, device=DEV)
    pos = torch.tensor([129, 0, 63, 64, 100][:T], dtype=torch.int32, device=DEV)
    out = torch.empty(T, Hq * D, dtype=torch.bfloat16, device=DEV)
    ws = torch.empty(max(1, launch.decode_workspace_numel(T, Hq, D, ctx, split)), device=DEV)
    launch.attention_decode(q, gate, kc, vc, pos, slots, out, workspace=ws, k_scale=ks, v_scale=vs,
                            split_tokens=split, block_n=32)
    assert _rel_rms(out.cpu(), _ref(q, gate, kc, vc, ks, vs, pos, slots)) < 3e-2  # int8 itself: 1.6%


@pytest.mark.parametrize("name", [n for n in F.KV_DTYPES if n not in ("bf16", "int8")])
@pytest.mark.parametrize("T,p0,Hq,Hkv,D", [(1, 0, 2, 1, 64), (17, 5, 4, 2, 64), (33, 40, 2, 1, 128)])
def test_prefill_every_format(name, T, p0, Hq, Hkv, D):
    ctx = 80
    (kc, vc, ks, vs), _ = _format_cache(name, 2, ctx, Hkv, D, seed=T)
    q, gate = _qg(T, Hq, D, seed=T + 1)
    slots = torch.full((T,), 1, dtype=torch.int32, device=DEV)
    pos = torch.arange(p0, p0 + T, dtype=torch.int32, device=DEV)
    out = torch.empty(T, Hq * D, dtype=torch.bfloat16, device=DEV)
    launch.attention_prefill(q, gate, kc, vc, pos, slots, out, k_scale=ks, v_scale=vs, block_m=16, block_n=16)
    assert _rel_rms(out.cpu(), _ref(q, gate, kc, vc, ks, vs, pos, slots)) < 3e-2  # int8 itself: 1.6%


@pytest.mark.parametrize("name", ["fp8", "k8v4", "nvfp4"])
def test_tiny_head_dim_formats(name):
    """D = 32 (the tiny test models): the formats whose groups divide it, the row Hadamard at 32."""
    T, Hq, Hkv, D, ctx = 2, 2, 1, 32, 20
    (kc, vc, ks, vs), _ = _format_cache(name, 2, ctx, Hkv, D, seed=5)
    q, gate = _qg(T, Hq, D, seed=6)
    slots = torch.tensor([1, 0], dtype=torch.int32, device=DEV)
    pos = torch.tensor([19, 5], dtype=torch.int32, device=DEV)
    out = torch.empty(T, Hq * D, dtype=torch.bfloat16, device=DEV)
    launch.attention_decode(q, gate, kc, vc, pos, slots, out, k_scale=ks, v_scale=vs)
    assert _rel_rms(out.cpu(), _ref(q, gate, kc, vc, ks, vs, pos, slots)) < 3e-2  # int8 itself: 1.6%


@pytest.mark.gpu
@pytest.mark.parametrize("name", [n for n in F.KV_DTYPES if n != "bf16"])
def test_27b_shapes_every_format_gpu(name):
    """The 27B head shape on the GPU (triton 3.6 there): caches written by kv_append, decode at a
    split depth and a prefill chunk, vs quantize -> dequantize -> attention."""
    from ninfer_compile.kernels.kv_cache import launch as kv_launch

    Hq, Hkv, D, ctx = 24, 4, 256, 1100
    g = torch.Generator().manual_seed(9)
    k = torch.randn(ctx, Hkv, D, generator=g)
    k[..., [3, 100]] *= 15.0
    k, v = k.bfloat16().to(DEV), torch.randn(ctx, Hkv, D, generator=g).bfloat16().to(DEV)
    bufs = [torch.zeros(s, dtype=kv_reference._TORCH[d], device=DEV)
            for _, s, d in F.cache_buffers(F.FORMATS[name], 2, ctx, Hkv, D)]
    kc, vc, ks, vs = bufs
    for s in (0, 1):
        for a in range(0, ctx, 512):
            b = min(ctx, a + 512)
            kv_launch.kv_append(k[a:b], v[a:b], torch.arange(a, b, dtype=torch.int32, device=DEV),
                                torch.full((b - a,), s, dtype=torch.int32, device=DEV), kc, vc, ks, vs)
    ref_caches = kv_reference.kv_append(k.cpu(), v.cpu(), torch.arange(ctx, dtype=torch.int32),
                                        torch.zeros(ctx, dtype=torch.int32), *[c.cpu().zero_() for c in bufs])
    rk, rv = kv_reference.kv_as_float(*ref_caches, D)
    gk, gv = kv_reference.kv_as_float(*[c.cpu() for c in bufs], D)
    assert _rel_rms(gk[0], rk[0]) < 2e-2 and _rel_rms(gv[0], rv[0]) < 2e-2  # GPU rounding at code boundaries
    q, gate = _qg(4, Hq, D, seed=4)
    slots = torch.tensor([1, 0, 1, 0], dtype=torch.int32, device=DEV)
    pos = torch.tensor([1099, 0, 600, 513], dtype=torch.int32, device=DEV)
    out = torch.empty(4, Hq * D, dtype=torch.bfloat16, device=DEV)
    ws = torch.empty(launch.decode_workspace_numel(4, Hq, D, ctx, 256), device=DEV)
    launch.attention_decode(q, gate, kc, vc, pos, slots, out, workspace=ws, k_scale=ks, v_scale=vs, split_tokens=256)
    assert _rel_rms(out.cpu(), _ref(q, gate, kc, vc, ks, vs, pos, slots)) < 3e-2
    T = 300
    q, gate = _qg(T, Hq, D, seed=5)
    slots = torch.zeros(T, dtype=torch.int32, device=DEV)
    pos = torch.arange(700, 700 + T, dtype=torch.int32, device=DEV)
    out = torch.empty(T, Hq * D, dtype=torch.bfloat16, device=DEV)
    launch.attention_prefill(q, gate, kc, vc, pos, slots, out, k_scale=ks, v_scale=vs)
    assert _rel_rms(out.cpu(), _ref(q, gate, kc, vc, ks, vs, pos, slots)) < 3e-2
