"""attention_verify_packed (verify rows: W columns of one slot share one pass over the cache) vs the
fp32 reference and vs attention_decode on the same columns; odd shapes, every split mode."""

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels.attention import launch
from ninfer_compile.kernels.kv_cache import reference as kv_reference
from ninfer_compile.kernels.kv_cache.formats import kv_format

from test_attention import DEV, _filled_cache, _qg, _ref  # (this folder is on sys.path: pytest prepend mode)


def _rows(p0s, W, slot_ids):
    """positions / slots of verify rows: row r = slot slot_ids[r] at positions p0s[r] .. p0s[r] + W - 1."""
    pos = torch.tensor([p + j for p in p0s for j in range(W)], dtype=torch.int32, device=DEV)
    slots = torch.tensor([s for s in slot_ids for _ in range(W)], dtype=torch.int32, device=DEV)
    return pos, slots


def _run(route, q, gate, kc, vc, ks, vs, pos, slots, W, split, **kw):
    T, Hq, D = q.shape
    out = torch.empty(T, Hq * D, dtype=torch.bfloat16, device=DEV)
    ws = torch.full((max(1, launch.decode_workspace_numel(T, Hq, D, kc.shape[1], split)),), float("nan"), device=DEV)
    fn = launch.attention_verify if route == "verify" else launch.attention_decode
    fn(q, gate, kc, vc, pos, slots, out, workspace=ws, k_scale=ks, v_scale=vs, split_tokens=split, window=W, **kw)
    return out.float().cpu()


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("W,Hq,Hkv,D,split,p0s", [
    (2, 6, 1, 64, 64, [0]),                 # a row starting at position 0; one KV head, G = 6 (MP 16)
    (4, 6, 2, 128, 64, [60, 0, 126]),       # three rows, splits crossed inside a row (60..63 | 64)
    (3, 4, 2, 64, 512, [10, 97]),           # one split: the direct path
    (6, 3, 1, 192, 128, [33, 140]),         # head dim not a power of two, W x G = 18 (MP 32)
])
def test_verify_matches_reference_and_decode(int8, W, Hq, Hkv, D, split, p0s):
    ctx = 150
    kc, vc, ks, vs = _filled_cache(4, ctx, Hkv, D, int8, seed=D + W)
    pos, slots = _rows(p0s, W, [3, 0, 1][:len(p0s)])
    q, gate = _qg(len(p0s) * W, Hq, D, seed=W)
    got = _run("verify", q, gate, kc, vc, ks, vs, pos, slots, W, split)
    ref = _ref(q, gate, kc, vc, ks, vs, pos, slots)
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)
    dec = _run("decode", q, gate, kc, vc, ks, vs, pos, slots, W, split)
    torch.testing.assert_close(got, dec, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("balance", ["ctx", "fixed"])
def test_verify_balanced_and_fixed_splits_at_shallow_depths(balance):
    """A 300-row cache with rows far shallower: with balance ctx each column's own span differs from
    the row's (the deepest column's); every split the reduce reads is written (the workspace starts
    as NaN, so a split left unwritten would show)."""
    W, Hq, Hkv, D = 5, 4, 2, 64
    kc, vc, ks, vs = _filled_cache(3, 300, Hkv, D, False, seed=5)
    pos, slots = _rows([0, 61, 250], W, [2, 0, 1])
    q, gate = _qg(3 * W, Hq, D, seed=6)
    got = _run("verify", q, gate, kc, vc, ks, vs, pos, slots, W, 64, balance=balance)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, _ref(q, gate, kc, vc, ks, vs, pos, slots), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("kv", ["fp8", "rk4v4"])
def test_verify_quantized_formats(kv):
    """Formats decoded through kv_cache/codecs.py (one plain, one with rotated K)."""
    fmt = kv_format(kv)
    W, Hq, Hkv, D, ctx = 4, 4, 2, 64, 96
    g = torch.Generator().manual_seed(3)
    k = torch.randn(2, ctx, Hkv, D, generator=g)
    v = torch.randn(2, ctx, Hkv, D, generator=g)
    (kc, ks), (vc, vs) = kv_reference.encode(fmt.k, k), kv_reference.encode(fmt.v, v)
    kc, ks, vc, vs = (x.to(DEV) for x in (kc, ks, vc, vs))
    pos, slots = _rows([20, 70], W, [1, 0])
    q, gate = _qg(2 * W, Hq, D, seed=4)
    got = _run("verify", q, gate, kc, vc, ks, vs, pos, slots, W, 64)
    torch.testing.assert_close(got, _ref(q, gate, kc, vc, ks, vs, pos, slots), atol=3e-2, rtol=3e-2)


def test_verify_refuses_a_missing_or_bad_window():
    kc, vc, ks, vs = _filled_cache(2, 64, 1, 64, False, seed=1)
    q, gate = _qg(6, 2, 64, seed=2)
    pos, slots = _rows([3, 9], 3, [0, 1])
    out = torch.empty(6, 128, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(RouteError, match=r"^attention_verify: needs the verify op's window W >= 2"):
        launch.attention_verify(q, gate, kc, vc, pos, slots, out)
    with pytest.raises(RouteError, match=r"^attention_verify: T=6 is not a multiple of window 4"):
        launch.attention_verify(q, gate, kc, vc, pos, slots, out, window=4)


@pytest.mark.gpu
@pytest.mark.parametrize("W,rows", [(4, 1), (4, 8), (6, 2)])
def test_verify_27b_shapes_and_cuda_graph_gpu(W, rows):
    """The 27B's attention (24 query heads, 4 KV heads, head dim 256) over a 20K-row cache at depth ~4K:
    equal to the split-KV decode route on the same columns, and a CUDA graph replay equals eager."""
    Hq, Hkv, D, cache = 24, 4, 256, 20480
    kc, vc, ks, vs = _filled_cache(rows, cache, Hkv, D, False, seed=W + rows)
    pos, slots = _rows([4096 - W + 37 * r for r in range(rows)], W, list(range(rows)))
    q, gate = _qg(rows * W, Hq, D, seed=rows)
    got = _run("verify", q, gate, kc, vc, ks, vs, pos, slots, W, 512)
    dec = _run("decode", q, gate, kc, vc, ks, vs, pos, slots, W, 512)
    torch.testing.assert_close(got, dec, atol=1e-2, rtol=1e-2)
    T = rows * W
    out = torch.empty(T, Hq * D, dtype=torch.bfloat16, device=DEV)
    ws = torch.empty(launch.decode_workspace_numel(T, Hq, D, cache, 512), device=DEV)
    call = lambda: launch.attention_verify(q, gate, kc, vc, pos, slots, out, workspace=ws, window=W)  # noqa: E731
    call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.float().cpu(), got)
