"""CPU path of kv_append (`kv_cache/torch_impl.py`) for every KV format vs the reference append,
and against the Triton launcher (bf16, int8, and one codec format)."""

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels.kv_cache import formats as F
from ninfer_compile.kernels.kv_cache import reference, torch_impl

_DT = {"bf16": torch.bfloat16, "i8": torch.int8, "u8": torch.uint8, "f16": torch.float16}


def _caches(name, slots_n, ctx, Hkv, D):
    return [torch.zeros(shape, dtype=_DT[dt]) for _, shape, dt in
            F.cache_buffers(F.FORMATS[name], slots_n, ctx, Hkv, D)]


def _kv(T, Hkv, D, seed):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(T, Hkv, D, generator=g)
    k[..., 3] *= 10.0
    return k.bfloat16(), torch.randn(T, Hkv, D, generator=g).bfloat16()


@pytest.mark.parametrize("name", list(F.KV_DTYPES))
@pytest.mark.parametrize("T", [1, 5])
def test_every_format_matches_reference(name, T):
    Hkv, D = 2, 64
    k, v = _kv(T, Hkv, D, seed=T)
    slots = torch.tensor([2, 0, 2, 1, 0][:T], dtype=torch.int32)
    pos = torch.tensor([7, 0, 8, 3, 1][:T], dtype=torch.int32)
    bufs = _caches(name, 3, 10, Hkv, D)
    for b in bufs:  # recognisable old contents
        b.view(torch.uint8).fill_(0x11)
    want = reference.kv_append(k, v, pos, slots, *bufs)
    torch_impl.kv_append(k, v, pos, slots, *bufs)
    for got, exp in zip(bufs, want):
        assert torch.equal(got.view(torch.uint8), exp.view(torch.uint8)), name


@pytest.mark.parametrize("T", [1, 3, 5, 17])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_bf16_append_matches_torch_ops(T, dtype, monkeypatch):
    """The fused bf16 append (kv_cache/torch_fused.py) vs the torch ops: k / v strided views of one
    row, fp32 inputs rounded like `.to(bfloat16)`, repeated slots, the other rows untouched."""
    from ninfer_compile.kernels.kv_cache import torch_fused

    if torch_fused.kernel() is None:
        pytest.skip("no fused CPU kernel here (no compiler)")
    g = torch.Generator().manual_seed(T)
    row = torch.randn(T, 2, 2 * 48 + 8, generator=g).to(dtype)
    k, v = row[:, :, :48], row[:, :, 56:]
    slots = torch.randint(0, 3, (T,), generator=g, dtype=torch.int32)
    pos = torch.randperm(20, generator=g)[:T].to(torch.int32)

    def run():
        bufs = _caches("bf16", 3, 20, 2, 48)
        for b in bufs:
            b.view(torch.uint8).fill_(0x11)
        torch_impl.kv_append(k, v, pos, slots, *bufs)
        return bufs

    got = run()
    assert torch_fused.fused_append_bf16(k, v, pos, slots, *_caches("bf16", 3, 20, 2, 48))
    monkeypatch.setattr(torch_impl, "fused_append_bf16", lambda *a: False)
    for a, b in zip(got, run()):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_unknown_layout_is_one_line():
    k, v = _kv(1, 1, 48, seed=0)
    bufs = _caches("int8", 1, 2, 1, 64)
    with pytest.raises(RouteError, match="no KV format"):
        torch_impl.kv_append(k, v, torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), *bufs)


@pytest.mark.parametrize("name", ["bf16", "int8", "fp8"])
def test_matches_launcher(name):
    from ninfer_compile.kernels.kv_cache import launch

    k, v = _kv(3, 2, 64, seed=4)
    slots, pos = torch.tensor([1, 0, 1], dtype=torch.int32), torch.tensor([2, 5, 3], dtype=torch.int32)
    got, want = _caches(name, 2, 6, 2, 64), _caches(name, 2, 6, 2, 64)
    torch_impl.kv_append(k, v, pos, slots, *got)
    launch.kv_append(k, v, pos, slots, *want)
    for a, b in zip(got, want):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
