"""Token selection on the device: the per-row sampler (kernels/sampling) against the references.

Greedy rows are exact (torch.argmax, ties to the lowest index); sampled rows draw only from the
support of reference.filtered_probs and with its distribution (a TV-distance bound that a wrong
temperature / top-k / top-p fails); draws are a function of (seed, position, logits row) only.
"""

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels.sampling import launch, reference, spec

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _rows(R, temperature=0.0, top_k=0, top_p=1.0, seed=0, pos=0):
    def col(v, dt):
        v = v if isinstance(v, (list, tuple)) else [v] * R
        return torch.tensor(v, dtype=dt, device=DEV)
    seeds = seed if isinstance(seed, (list, tuple)) else [seed] * R
    s = torch.tensor([[x & 0xFFFFFFFF, x >> 32] for x in seeds], dtype=torch.int64)
    s = torch.where(s >= 2**31, s - 2**32, s).to(torch.int32).to(DEV)
    return (col(temperature, torch.float32), col(top_k, torch.int32), col(top_p, torch.float32), s,
            col(pos, torch.int32))


def run(logits, *rows):
    R, V = logits.shape
    ids = torch.full((R,), -1, dtype=torch.int32, device=DEV)
    ws = torch.full((spec.workspace_elems(R, V),), float("nan"), device=DEV)
    launch.sample(logits.to(DEV), *rows, ids, ws)
    return ids.cpu().long()


@pytest.mark.parametrize("R,V", [(1, 50), (3, 4097), (5, 9000)])
def test_greedy_rows_are_argmax(R, V):
    x = torch.randn(R, V, generator=torch.Generator().manual_seed(V)).bfloat16()
    x[0, V - 1] = 100.0  # maximum in the last (partial) block
    if R > 1:
        x[1, 7] = x[1, 4096] = 50.0  # a tie across blocks -> the lower index
    assert torch.equal(run(x, *_rows(R)), reference.argmax(x))


def _support_and_threshold_ok(x, ids, temps, ks, ps):
    for r in range(x.shape[0]):
        probs = reference.filtered_probs(x[r:r + 1], temps[r], ks[r], ps[r])[0]
        assert probs[ids[r]] > 0, (r, int(ids[r]))


@pytest.mark.parametrize("R,V", [(1, 1000), (3, 333), (3, 4097)])
def test_sampled_rows_stay_in_the_filtered_support(R, V):
    """Odd shapes (V not a power of two, C = 1 and 3), mixed modes in one launch."""
    g = torch.Generator().manual_seed(R * V)
    x = (torch.randn(R, V, generator=g) * 3).bfloat16()
    temps = [0.7, 1.3, 0.0][:R] if R > 1 else [1.0]
    ks = [5, 0, 7][:R] if R > 1 else [3]
    ps = [1.0, 0.6, 0.5][:R] if R > 1 else [0.9]
    for pos in range(6):
        ids = run(x, *_rows(R, temps, ks, ps, seed=[11, 12, 13][:R], pos=pos))
        _support_and_threshold_ok(x, ids, temps, ks, ps)
        for r in range(R):
            if temps[r] == 0:
                assert ids[r] == reference.argmax(x[r:r + 1])[0]


def test_threshold_is_exact():
    """The kept set equals the reference's: its smallest kept x (the row record's tau)."""
    R, V = 3, 777
    x = (torch.randn(R, V, generator=torch.Generator().manual_seed(3)) * 2).bfloat16()
    temps, ks, ps = [1.0, 0.5, 2.0], [10, 0, 40], [1.0, 0.8, 0.3]
    ws = torch.zeros(spec.workspace_elems(R, V), device=DEV)
    ids = torch.empty(R, dtype=torch.int32, device=DEV)
    launch.sample(x.to(DEV), *_rows(R, temps, ks, ps, seed=5), ids, ws)
    nb = -(-V // spec.block(V))
    tau = ws[R * nb * 4:].view(R, 2)[:, 0].cpu()
    for r in range(R):
        probs = reference.filtered_probs(x[r:r + 1], temps[r], ks[r], ps[r])[0]
        xs = x[r].float() / temps[r]
        assert float(tau[r]) == float(xs[probs > 0].min()), r
        assert torch.equal(probs > 0, xs >= tau[r])


# (temperature, top_k, top_p) and near misses of it (a filter off by one, or ignored)
# (case, near misses of it: a filter off by one, or ignored, or another temperature), N draws, TV bound
# (~4 sigma of the sampling error at N). A filtered row costs the interpreter ~1 s (its threshold
# bisection, ~65 passes): one combined top-k + top-p case with fewer draws; the exact kept sets of
# top-k / top-p are test_threshold_is_exact's.
CASES = [((1.0, 0, 1.0), [(0.6, 0, 1.0)], 500, 0.08), ((0.6, 0, 1.0), [(1.0, 0, 1.0)], 500, 0.08),
         pytest.param((1.5, 3, 0.75), [(1.5, 4, 0.75), (1.5, 3, 1.0), (1.5, 0, 0.75)], 150, 0.12,
                      marks=pytest.mark.slow)]


@pytest.mark.parametrize("case,misses,N,BOUND", CASES)
def test_distribution_matches_filtered_probs(case, misses, N, BOUND):
    """N draws (N rows of one logits vector, distinct positions) against filtered_probs: the TV
    distance must stay below BOUND, while each near miss of the filter is more than BOUND + 0.05
    away (so the bound can fail)."""
    base = torch.tensor([2.0, 1.6, 1.2, 0.8, 0.0, -1.0])
    V = base.numel()
    ids = run(base.repeat(N, 1), *_rows(N, *case, seed=2026, pos=list(range(N))))
    freq = torch.bincount(ids, minlength=V).double() / N
    want = reference.filtered_probs(base[None], *case)[0].double()
    tv = 0.5 * (freq - want).abs().sum().item()
    assert tv < BOUND, (tv, freq.tolist(), want.tolist())
    assert (freq[want == 0] == 0).all()
    for m in misses:
        other = reference.filtered_probs(base[None], *m)[0].double()
        assert 0.5 * (other - want).abs().sum().item() > BOUND + 0.05, m


def test_draws_depend_on_seed_and_position_only():
    V = 600
    x = torch.randn(1, V, generator=torch.Generator().manual_seed(1)).bfloat16()
    kw = dict(temperature=1.0, top_k=50, top_p=0.95)
    a = run(x, *_rows(1, seed=123, pos=7, **kw))
    # the same row in another batch, at another index, beside rows with other settings
    y = torch.cat([torch.randn(2, V).bfloat16(), x, torch.randn(1, V).bfloat16()])
    b = run(y, *_rows(4, [0.5, 0.0, 1.0, 2.0], [0, 0, 50, 3], [1.0, 1.0, 0.95, 0.5], seed=[9, 8, 123, 7],
                      pos=[1, 2, 7, 3]))
    assert int(b[2]) == int(a[0])
    draws = {int(run(x, *_rows(1, seed=s, pos=p, **kw))[0]) for s in (1, 2, 2**40 + 3) for p in (0, 1, 2)}
    assert len(draws) > 1  # the noise does change with seed / position
    big = run(x, *_rows(1, seed=2**63 - 1, pos=7, **kw))
    assert big.shape == (1,)


def test_bad_operands_are_one_line_route_errors():
    x = torch.zeros(2, 10, device=DEV)
    ids = torch.empty(2, dtype=torch.int32, device=DEV)
    with pytest.raises(RouteError, match="workspace"):
        launch.sample(x, *_rows(2), ids, torch.empty(1, device=DEV))
    t, k, p, s, pos = _rows(2)
    with pytest.raises(RouteError, match="top_k must be"):
        launch.sample(x, t, k.float(), p, s, pos, ids, torch.empty(100, device=DEV))


def test_workspace_hook_is_the_launchers_size():
    from ninfer_compile.kernels.family import OpView
    from ninfer_compile.kernels.registry import get_route

    view = OpView(kind="sampling", name="sampling", shapes={"logits": (3, 9000)}, dtypes={"logits": "bf16"})
    assert get_route("sample_per_slot").workspace_numel(view, {}) == launch.select_workspace_numel(3, 9000) == \
        spec.workspace_elems(3, 9000) == 3 * (4 * 3 + 2)


@pytest.mark.gpu
def test_27b_vocab_in_a_cuda_graph_gpu():
    """Greedy + sampled rows at the 27B vocabulary, captured once and replayed with new per-row
    parameters: no allocation or host sync inside (the capture would fail)."""
    R, V = 4, 248320
    x = torch.randn(R, V, device="cuda").bfloat16()
    rows = _rows(R, [0.0, 1.0, 0.8, 0.0], [0, 40, 0, 0], [1.0, 0.9, 0.95, 1.0], seed=[1, 2, 3, 4], pos=5)
    ids = torch.empty(R, dtype=torch.int32, device="cuda")
    ws = torch.empty(spec.workspace_elems(R, V), device="cuda")
    launch.sample(x, *rows, ids, ws)  # compile
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        launch.sample(x, *rows, ids, ws)
    rows[0].copy_(torch.tensor([0.0, 0.0, 0.0, 0.0]))
    g.replay()
    assert torch.equal(ids.long().cpu(), reference.argmax(x.cpu()))
    rows[0].copy_(torch.tensor([1.0, 1.0, 0.8, 0.0]))
    g.replay()
    got = ids.long().cpu()
    assert got[3] == reference.argmax(x[3:].cpu())[0]
    for r, (t, k, p) in enumerate([(1.0, 0, 1.0), (1.0, 40, 0.9), (0.8, 0, 0.95)]):  # rows 0..2 as set above
        probs = reference.filtered_probs(x[r:r + 1].cpu(), t, k, p)[0]
        assert probs[got[r]] > 0
