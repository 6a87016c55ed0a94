"""CPU path of attention (`attention/torch_impl.py`) vs the fp32 reference: decode columns (shared
and distinct slots), verify rows, prefill (several query blocks), every KV format, GQA; and against
the Triton decode launcher on one shape."""

import pytest
import torch

from ninfer_compile.kernels.attention import reference, torch_impl
from ninfer_compile.kernels.kv_cache import formats as F
from ninfer_compile.kernels.kv_cache import reference as kv_reference


def _cache(name, slots_n, ctx, Hkv, D, seed):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(slots_n, ctx, Hkv, D, generator=g)
    k[..., 3] *= 10.0
    k, v = k.bfloat16(), torch.randn(slots_n, ctx, Hkv, D, generator=g).bfloat16()
    fmt = F.FORMATS[name]
    kc, ks = kv_reference.encode(fmt.k, k)
    vc, vs = kv_reference.encode(fmt.v, v)
    return kc, vc, ks, vs


def _qg(T, Hq, D, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, Hq, D, generator=g).bfloat16(), torch.randn(T, Hq, D, generator=g).bfloat16()


def _run_both(name, T, Hq, Hkv, D, slots, pos, ctx=70, n_slots=4, seed=0, **kw):
    kc, vc, ks, vs = _cache(name, n_slots, ctx, Hkv, D, seed)
    q, gate = _qg(T, Hq, D, seed + 1)
    slots, pos = torch.tensor(slots, dtype=torch.int32), torch.tensor(pos, dtype=torch.int32)
    out = torch.full((T, Hq * D), float("nan"), dtype=torch.bfloat16)
    torch_impl.attention(q, gate, kc, vc, pos, slots, out, k_scale=ks, v_scale=vs, **kw)
    want = reference.attention(q, gate, kc, vc, pos, slots, kw.get("scale") or D ** -0.5, ks, vs)
    return out, want


def _close(out, want):
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("name", list(F.KV_DTYPES))
def test_decode_every_format(name):
    out, want = _run_both(name, 3, 4, 2, 64, slots=[3, 0, 1], pos=[69, 0, 33], seed=2,
                          split_tokens=64, workspace=None)
    _close(out, want)


@pytest.mark.parametrize("name,pos", [("bf16", 0), ("rk4v4", 41), ("k8v4", 69)])
def test_single_column(name, pos):
    out, want = _run_both(name, 1, 6, 2, 64, slots=[2], pos=[pos], seed=pos)
    _close(out, want)


def test_decode_shared_slot_and_scale():
    out, want = _run_both("bf16", 5, 6, 2, 32, slots=[2, 2, 0, 2, 1], pos=[10, 11, 3, 12, 0], scale=0.3)
    _close(out, want)


def test_verify_rows():
    W = 3
    out, want = _run_both("int8", 2 * W, 4, 1, 64, slots=[1] * W + [3] * W, pos=[5, 6, 7, 40, 41, 42],
                          window=W, block_n=32)
    _close(out, want)


@pytest.mark.parametrize("T,p0", [(17, 0), (40, 9)])
def test_prefill_query_blocks(T, p0, monkeypatch):
    monkeypatch.setattr(torch_impl, "QUERY_BLOCK", 16)
    out, want = _run_both("fp8", T, 4, 2, 64, slots=[2] * T, pos=list(range(p0, p0 + T)), ctx=64, block_m=64)
    _close(out, want)


def test_matches_decode_launcher():
    from ninfer_compile.kernels.attention import launch

    kc, vc, ks, vs = _cache("bf16", 2, 20, 1, 32, seed=7)
    q, gate = _qg(2, 2, 32, seed=8)
    slots, pos = torch.tensor([1, 0], dtype=torch.int32), torch.tensor([19, 4], dtype=torch.int32)
    got, want = torch.empty(2, 64, dtype=torch.bfloat16), torch.empty(2, 64, dtype=torch.bfloat16)
    torch_impl.attention(q, gate, kc, vc, pos, slots, got)
    launch.attention_decode(q, gate, kc, vc, pos, slots, want)
    torch.testing.assert_close(got.float(), want.float(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("T,slots,pos", [(1, [2], [0]), (1, [1], [69]), (3, [0, 0, 0], [4, 5, 6]),
                                         (5, [3, 1, 0, 2, 1], [9, 0, 33, 69, 12])])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_fused_bf16_cache_matches_torch_ops(T, slots, pos, out_dtype, monkeypatch):
    """The fused C++ attention (attention/torch_fused.py) vs the torch ops over a bf16 cache: GQA 6 / 2,
    D = 84 (ragged 8- / 16-lane tails), strided q / gate views, shared and distinct slots, position 0
    and the cache's last row."""
    from ninfer_compile.kernels.attention import torch_fused

    if torch_fused.kernel() is None:
        pytest.skip("no fused CPU kernel here (no compiler)")
    kc, vc, ks, vs = _cache("bf16", 4, 70, 2, 84, seed=T)
    g = torch.Generator().manual_seed(T + 1)
    row = torch.randn(T, 6, 2 * 84 + 4, generator=g).bfloat16()
    q, gate = row[:, :, :84], row[:, :, 88:]
    slots_t, pos_t = torch.tensor(slots, dtype=torch.int32), torch.tensor(pos, dtype=torch.int32)

    def run():
        out = torch.full((T, 6 * 84), float("nan"), dtype=out_dtype)
        torch_impl.attention(q, gate, kc, vc, pos_t, slots_t, out, k_scale=ks, v_scale=vs, scale=0.09)
        return out

    got = run()
    assert torch_fused.fused_attention(q, gate, kc, vc, pos_t, slots_t, torch.empty(T, 6 * 84), 0.09)
    monkeypatch.setattr(torch_impl, "fused_attention", lambda *a: False)
    tol = 1e-2 if out_dtype == torch.bfloat16 else 2e-5
    torch.testing.assert_close(got, run(), atol=tol, rtol=tol)
    assert not torch_fused.fused_attention(q, gate, kc, vc, pos_t + 70, slots_t, torch.empty(T, 6 * 84), 0.09)
