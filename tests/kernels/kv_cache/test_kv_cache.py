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
