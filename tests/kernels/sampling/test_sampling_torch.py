"""CPU path of token selection (`sampling/torch_impl.py`): greedy rows are the reference argmax;
sampled rows (top-k, top-p, both, neither) draw exactly the tokens of the Triton launcher (the same
Philox noise), over many seeds; the Philox emulation matches Triton's on known counters."""

import pytest
import torch

from ninfer_compile.kernels.sampling import reference, sizing, torch_impl


def _params(temps, ks, ps, seeds, poss):
    s = torch.tensor([[x & 0xFFFFFFFF, x >> 32] for x in seeds], dtype=torch.int64)
    s = torch.where(s >= 2**31, s - 2**32, s).to(torch.int32)
    return (torch.tensor(temps, dtype=torch.float32), torch.tensor(ks, dtype=torch.int32),
            torch.tensor(ps, dtype=torch.float32), s, torch.tensor(poss, dtype=torch.int32))


def test_greedy_rows_are_the_argmax():
    logits = torch.randn(4, 301, generator=torch.Generator().manual_seed(0)).bfloat16()
    logits[2, 7] = logits[2, 9] = logits[2].max() + 1  # a tie: the first index
    ids = torch.full((4,), -1, dtype=torch.int32)
    torch_impl.sample(logits, *_params([0.0] * 4, [0] * 4, [1.0] * 4, [1] * 4, [0] * 4), ids)
    assert ids.tolist() == reference.argmax(logits).tolist()


@pytest.mark.parametrize("V", [1, 7, 8, 301, 4099])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_argmax_is_torchs(V, dtype):
    """The fused greedy pass (sampling/torch_fused.py) vs torch.argmax: ties (the first index), the
    maximum in the ragged tail, -inf rows, NaN (torch's rule: the first NaN), a strided row view."""
    from ninfer_compile.kernels.sampling import torch_fused

    if torch_fused.kernel() is None:
        pytest.skip("no fused CPU kernel here (no compiler / AVX2)")
    g = torch.Generator().manual_seed(V)
    wide = torch.randn(6, V + 5, generator=g).to(dtype)
    x = wide[:, 2:2 + V]
    x[1, V // 3] = x[1, V - 1] = 50.0          # a tie
    x[2, V - 1] = 60.0                          # in the tail
    x[3] = float("-inf")
    x[4, V // 2] = float("nan")
    x[4, V - 1] = 70.0
    x[5, :] = 3.0                               # all equal
    ids = torch.full((6,), -1, dtype=torch.int32)
    assert torch_fused.fused_argmax(x, ids)
    assert ids.tolist() == torch.argmax(x.float(), dim=1).tolist()
    ids2 = torch.full((6,), -1, dtype=torch.int32)
    torch_impl.sample(x, *_params([0.0] * 6, [0] * 6, [1.0] * 6, [1] * 6, [0] * 6), ids2)
    assert ids2.tolist() == ids.tolist()


def test_sampled_rows_match_the_launcher():
    from ninfer_compile.kernels.sampling import launch

    R, V = 8, 257
    logits = (2 * torch.randn(R, V, generator=torch.Generator().manual_seed(3))).bfloat16()
    temps = [0.7, 1.0, 0.0, 1.3, 0.9, 2.0, 0.5, 1.0]
    ks = [0, 5, 0, 40, 0, 3, 1, 0]
    ps = [1.0, 1.0, 1.0, 0.8, 0.5, 0.9, 1.0, 0.95]
    seeds = [2**40 + 17, 5, 9, 2**63 - 1, 123456789, 2**32, 77, 3]
    poss = [0, 3, 9, 2**31 - 1, 100, 5, 6, 7]
    params = _params(temps, ks, ps, seeds, poss)
    got = torch.full((R,), -1, dtype=torch.int32)
    torch_impl.sample(logits, *params, got)
    want = torch.full((R,), -1, dtype=torch.int32)
    launch.sample(logits, *params, want, torch.empty(sizing.workspace_elems(R, V)))
    assert got.tolist() == want.tolist()
    assert got[6] == reference.argmax(logits[6:7])[0]  # top-k 1 keeps only the argmax


def test_draws_follow_the_filtered_distribution():
    V = 12
    logits = torch.linspace(-2, 2, V)[None].repeat(400, 1)
    params = _params([1.0] * 400, [6] * 400, [0.9] * 400, list(range(400)), [0] * 400)
    ids = torch.empty(400, dtype=torch.int32)
    torch_impl.sample(logits, *params, ids)
    p = reference.filtered_probs(logits[:1], 1.0, 6, 0.9)[0]
    freq = torch.bincount(ids.long(), minlength=V).float() / 400
    assert (freq[p == 0] == 0).all()
    assert 0.5 * (freq - p).abs().sum() < 0.12


@pytest.mark.parametrize("key,counter", [(0, (0, 0, 0, 0)), (2**64 - 1, (2**32 - 1, 5, 1, 0)),
                                         (0x243F6A8885A308D3, (13, 2**31, 0, 7))])
def test_philox_matches_triton(key, counter):
    import triton
    import triton.language as tl

    @triton.jit
    def k(out_ptr, in_ptr):
        one = tl.arange(0, 1)
        lo = tl.load(in_ptr + one).to(tl.uint32).to(tl.uint64)
        hi = tl.load(in_ptr + 1 + one).to(tl.uint32).to(tl.uint64)
        c = [tl.load(in_ptr + 2 + i + one).to(tl.uint32) for i in tl.static_range(4)]
        a, _, _, _ = tl.philox((hi << 32) | lo, c[0], c[1], c[2], c[3])
        tl.store(out_ptr + one, a.to(tl.int64))

    out = torch.zeros(1, dtype=torch.int64)
    k[(1,)](out, torch.tensor([key & 0xFFFFFFFF, key >> 32, *counter], dtype=torch.int64))
    assert int(torch_impl.philox_word0(key, *counter)) == int(out[0]) & 0xFFFFFFFF
