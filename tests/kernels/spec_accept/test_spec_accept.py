"""Speculative acceptance on the device (kernels/spec_accept) against its reference.

Greedy rows are exact (the reference's tokens and accepted counts, at odd shapes: C = 1, 2, 3 rows of
W = 2, 4, 6 columns, including fewer real drafts than K, all-accepted and none-accepted rows, mixed
greedy / sampling rows in one launch). Sampling rows are checked by distribution: for a target whose
per-column logits are fixed, the first emitted token must follow p_0 and, given the draft was
accepted, the next one p_1; the empirical joint distribution of the first two emitted tokens is
compared with the exact one by total variation, with a bound from the sample count (many samples on
the reference, fewer on the kernel under the interpreter), and a wrong rule must fail the same check.
"""

from __future__ import annotations

import math

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels.sampling import launch as sampling_launch
from ninfer_compile.kernels.sampling import sizing as sampling_sizing
from ninfer_compile.kernels.sampling.reference import filtered_probs
from ninfer_compile.kernels.spec_accept import launch, reference, sizing

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _params(T, temperature=0.0, top_k=0, top_p=1.0, seed=0, pos=0):
    """Per-column parameter inputs [T] ([T, 2] seed); each argument a scalar or a length-T list."""
    def col(v, dt):
        return torch.tensor(v if isinstance(v, (list, tuple)) else [v] * T, dtype=dt)
    seeds = seed if isinstance(seed, (list, tuple)) else [seed] * T
    s = torch.tensor([[x & 0xFFFFFFFF, x >> 32] for x in seeds], dtype=torch.int64)
    s = torch.where(s >= 2**31, s - 2**32, s).to(torch.int32)
    return col(temperature, torch.float32), col(top_k, torch.int32), col(top_p, torch.float32), s, col(pos, torch.int32)


def run_kernel(logits, ids, n_drafts, *params):
    """-> (tokens [T], accepted [C]) of the Triton launch (tokens past each row's stop: -1 or whatever
    the launch left there)."""
    T, V = logits.shape
    C = n_drafts.shape[0]
    tokens = torch.full((T,), -1, dtype=torch.int32, device=DEV)
    accepted = torch.full((C,), -1, dtype=torch.int32, device=DEV)
    ws = torch.full((sizing.workspace_elems(T, V),), float("nan"), device=DEV)
    launch.spec_accept(logits.to(DEV), ids.to(DEV), n_drafts.to(DEV), *(p.to(DEV) for p in params),
                       tokens, accepted, ws)
    return tokens.cpu(), accepted.cpu()


def emitted(tokens, accepted, W):
    """Row r's emitted tokens: tokens[r*W .. r*W + accepted[r]]."""
    return [tokens[r * W: r * W + int(a) + 1].tolist() for r, a in enumerate(accepted.tolist())]


def _greedy_case(C, W, V, seed):
    """Logits [T, V] bf16 and the rows' ids / n_drafts: row patterns cycle through all accepted,
    none accepted, a mismatch in the middle, and fewer real drafts than K (drafts past n_drafts equal
    the argmax: they must still not be accepted)."""
    g = torch.Generator().manual_seed(seed)
    T, K = C * W, W - 1
    x = (torch.randn(T, V, generator=g) * 2).bfloat16()
    am = torch.argmax(x.float(), -1).to(torch.int32)
    ids = torch.randint(0, V, (T,), generator=g, dtype=torch.int32)
    n = torch.full((C,), K, dtype=torch.int32)
    for r in range(C):
        base = r * W
        ids[base + 1: base + W] = am[base: base + K]  # every draft what the target would pick
        kind = (r + seed) % 4
        if kind == 1:
            ids[base + 1] = (am[base] + 1) % V  # none accepted
        elif kind == 2 and K >= 2:
            ids[base + 1 + K // 2] = (am[base + K // 2] + 3) % V  # mismatch at draft K // 2 + 1
        elif kind == 3:
            n[r] = K // 2  # fewer real drafts
    return x, ids, n


@pytest.mark.parametrize("C", [1, 2, 3])
@pytest.mark.parametrize("W", [2, 4, 6])
def test_greedy_rows_equal_the_reference(C, W):
    V = 300 if W == 4 else 37
    x, ids, n = _greedy_case(C, W, V, seed=C * 10 + W)
    params = _params(C * W)
    want_t, want_a = reference.spec_accept(x, ids, n, *params)
    got_t, got_a = run_kernel(x, ids, n, *params)
    assert got_a.tolist() == want_a.tolist()
    assert emitted(got_t, got_a, W) == emitted(want_t, want_a, W)
    assert all(0 <= int(a) <= int(k) for a, k in zip(got_a, n))


def test_greedy_patterns_and_ties_across_blocks():
    """V = 5000: two blocks of the reductions, a tie across them resolved to the lower index; the
    rows' outcomes are the ones the patterns promise."""
    C, W, V = 4, 4, 5000
    x, ids, n = _greedy_case(C, W, V, seed=0)
    x[1, 7] = x[1, 4500] = 60.0  # column 1: tie across blocks -> token 7
    ids[2] = 7  # row 0's draft 2 follows column 1: accepted only if the tie goes to 7
    params = _params(C * W)
    got_t, got_a = run_kernel(x, ids, n, *params)
    want_t, want_a = reference.spec_accept(x, ids, n, *params)
    assert got_a.tolist() == want_a.tolist() == [3, 0, 1, 1]  # all, none, mismatch at draft 2, n_drafts = 1
    assert emitted(got_t, got_a, W) == emitted(want_t, want_a, W)
    assert emitted(got_t, got_a, W)[0][1] == 7


def test_greedy_prefix_correction_and_bonus_reference():
    """The runtime's former host-side greedy rule, as a family reference case (V = 10, K = 3)."""
    W, V = 4, 10
    target = [[4, 5, 6, 8]] * 4  # the target's argmax at columns 0..3 of each row
    drafts = [[4, 5, 6], [4, 9, 6], [1, 5, 6], [4, 5, 6]]
    x = torch.zeros(4 * W, V)
    ids = torch.zeros(4 * W, dtype=torch.int32)
    for r in range(4):
        for j in range(W):
            x[r * W + j, target[r][j]] = 1.0
        ids[r * W + 1: r * W + W] = torch.tensor(drafts[r])
    n = torch.tensor([3, 3, 3, 2], dtype=torch.int32)
    tokens, acc = reference.spec_accept(x, ids, n, *_params(4 * W))
    assert acc.tolist() == [3, 1, 0, 2]
    assert emitted(tokens, acc, W) == [[4, 5, 6, 8], [4, 5], [4], [4, 5, 6]]


def test_mixed_greedy_and_sampling_rows_in_one_launch():
    """Row 0 greedy; row 1 sampled with top-k 1 (a one-hot target: must equal greedy exactly);
    row 2 sampled with temperature / top-k / top-p: accepted drafts are the drafts, the stop token lies
    in the filtered support and, at a rejected real draft, differs from it (the residual)."""
    C, W, V = 3, 4, 300
    T = C * W
    x, ids, n = _greedy_case(C, W, V, seed=5)
    x = x.float() + 1e-3 * torch.rand(x.shape, generator=torch.Generator().manual_seed(1))  # no ties: top-k 1 is one-hot
    temps = [0.0] * W + [0.8] * W + [0.9] * W
    ks = [0] * W + [1] * W + [20] * W
    ps = [1.0] * (2 * W) + [0.8] * W
    params = _params(T, temps, ks, ps, seed=list(range(100, 100 + T)), pos=list(range(T)))
    got_t, got_a = run_kernel(x, ids, n, *params)
    greedy_t, greedy_a = reference.spec_accept(x, ids, n, *_params(T))
    assert got_a[:2].tolist() == greedy_a[:2].tolist()
    assert emitted(got_t, got_a, W)[:2] == emitted(greedy_t, greedy_a, W)[:2]
    a = int(got_a[2])
    assert 0 <= a <= int(n[2])
    row = emitted(got_t, got_a, W)[2]
    assert row[:a] == ids[2 * W + 1: 2 * W + 1 + a].tolist()
    c = 2 * W + a
    p = filtered_probs(x[c:c + 1], 0.9, 20, 0.8)[0]
    assert p[row[a]] > 0
    if a < int(n[2]):
        assert row[a] != int(ids[c + 1])


def test_a_plain_sample_at_the_cut_is_the_sampling_kernels_draw():
    """Column n_drafts[r] draws with the sampling family's noise (seed, position, token): a row with
    no real draft emits the very token `sampling.launch.sample` picks at that seed and position."""
    W, V = 3, 300
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(2 * W, V, generator=g) * 2).bfloat16()
    ids = torch.randint(0, V, (2 * W,), generator=g, dtype=torch.int32)
    n = torch.zeros(2, dtype=torch.int32)
    params = _params(2 * W, [1.0] * W + [0.7] * W, [0] * W + [9] * W, [1.0] * W + [0.85] * W,
                     seed=[41] * W + [2**40 + 3] * W, pos=[17] * W + [2**20] * W)
    tokens, acc = run_kernel(x, ids, n, *params)
    assert acc.tolist() == [0, 0]
    rows = [0, W]
    ws = torch.zeros(sampling_sizing.workspace_elems(2, V), device=DEV)
    want = torch.zeros(2, dtype=torch.int32, device=DEV)
    sampling_launch.sample(x[rows].to(DEV), *(p[rows].contiguous().to(DEV) for p in params), want, ws)
    assert tokens[rows].tolist() == want.cpu().tolist()


def test_rows_are_a_function_of_their_own_inputs():
    """The same inputs give the same outputs, and a row's outcome does not depend on the other rows
    or on its index (the noise is keyed by seed and position only)."""
    W, V = 3, 37
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2 * W, V, generator=g)
    ids = torch.randint(0, V, (2 * W,), generator=g, dtype=torch.int32)
    ids[1] = int(torch.argmax(x[0]))
    n = torch.tensor([2, 1], dtype=torch.int32)
    params = _params(2 * W, 1.0, seed=[5] * W + [6] * W, pos=[3, 4, 5, 9, 10, 11])
    a = run_kernel(x, ids, n, *params)
    assert all(torch.equal(u, v) for u, v in zip(a, run_kernel(x, ids, n, *params)))
    swap = torch.cat([torch.arange(W, 2 * W), torch.arange(0, W)])
    b = run_kernel(x[swap], ids[swap], n.flip(0), *(p[swap].contiguous() for p in params))
    assert b[1].tolist() == a[1].flip(0).tolist()
    assert emitted(*b, W) == emitted(*a, W)[::-1]


def test_launcher_refuses_bad_arguments_in_one_line():
    W, V = 2, 37
    x = torch.randn(2 * W, V)
    ids = torch.zeros(2 * W, dtype=torch.int32)
    n = torch.ones(2, dtype=torch.int32)
    params = _params(2 * W)
    tokens = torch.zeros(2 * W, dtype=torch.int32)
    acc = torch.zeros(2, dtype=torch.int32)
    ws = torch.zeros(sizing.workspace_elems(2 * W, V))
    with pytest.raises(RouteError, match=r"rows 4 must be C x W with W >= 2 for n_drafts \[3\]"):
        launch.spec_accept(x, ids, torch.ones(3, dtype=torch.int32), *params, tokens, torch.zeros(3, dtype=torch.int32), ws)
    with pytest.raises(RouteError, match="ids must be a contiguous int32"):
        launch.spec_accept(x, ids.long(), n, *params, tokens, acc, ws)
    with pytest.raises(RouteError, match="top_p must be a contiguous f32"):
        launch.spec_accept(x, ids, n, *params[:2], params[2].double(), *params[3:], tokens, acc, ws)
    with pytest.raises(RouteError, match=r"workspace of >= \d+ elements"):
        launch.spec_accept(x, ids, n, *params, tokens, acc, ws[:3])


# ------------------------------------------------------------------------------ distribution

def exact_joint(p0: torch.Tensor, p1: torch.Tensor, d0: int, n: int) -> torch.Tensor:
    """[V, V + 1] probabilities of (first emitted token a, second b) where b = V means the round
    stopped after a: with a real draft d0 (n >= 1), a = d0 with p0(d0), then b ~ p1; any other a
    with p0(a) and a stop; without one (n = 0), a ~ p0 and a stop."""
    V = p0.shape[0]
    out = torch.zeros(V, V + 1, dtype=torch.float64)
    out[:, V] = p0
    if n >= 1:
        out[d0, V] = 0.0
        out[d0, :V] = p0[d0] * p1
    return out


def empirical_joint(tokens: torch.Tensor, accepted: torch.Tensor, W: int, V: int) -> torch.Tensor:
    t = tokens.view(-1, W).long()
    second = torch.where(accepted >= 1, t[:, 1], torch.full_like(t[:, 1], V))
    counts = torch.bincount(t[:, 0] * (V + 1) + second, minlength=V * (V + 1)).double()
    return (counts / counts.sum()).view(V, V + 1)


def tv(emp: torch.Tensor, exact: torch.Tensor) -> tuple[float, int]:
    """(total variation, cells) over the exact distribution's support cells plus one cell for all
    the rest (a coarsening: it never exceeds the full distance, and anything emitted outside the
    support counts in full)."""
    e, p = emp.flatten(), exact.flatten()
    sup = p > 0
    d = float((e[sup] - p[sup]).abs().sum()) + float(e[~sup].sum())
    return 0.5 * d, int(sup.sum()) + 1


def tv_bound(n: int, cells: int, delta: float = 1e-6) -> float:
    """With probability >= 1 - delta the empirical distribution of n draws over `cells` outcomes lies
    within this total variation of the true one (Bretagnolle-Huber-Carol)."""
    return math.sqrt((cells * math.log(2) + math.log(1 / delta)) / (2 * n))


def _sampling_rows(C, W, logits_w, d, n, temperature=1.0, top_k=0, top_p=1.0, pos0=7):
    """C independent rounds of one context-free target: every row has the logits [W, V] and the
    drafts d (len W - 1); rows differ only in their seed."""
    T = C * W
    x = logits_w.repeat(C, 1)
    ids = torch.zeros(T, dtype=torch.int32)
    for r in range(C):
        ids[r * W + 1: r * W + W] = torch.tensor(d, dtype=torch.int32)
    seeds = [1_000_003 * (c // W) + 12345 for c in range(T)]
    params = _params(T, temperature, top_k, top_p, seed=seeds, pos=[pos0 + c % W for c in range(T)])
    return x, ids, torch.full((C,), n, dtype=torch.int32), params


def _biased_accept(x, ids, n_drafts, temperature, top_k, top_p, seed, sample_pos):
    """Negative control: the reference with one change, a rejection resamples p itself (not the
    residual), which over-weights the rejected draft."""
    T, V = x.shape
    C = n_drafts.shape[0]
    W = T // C
    tokens = torch.zeros(T, dtype=torch.int32)
    acc = torch.zeros(C, dtype=torch.int32)
    for r in range(C):
        for j in range(int(n_drafts[r]) + 1):
            c = r * W + j
            p = filtered_probs(x[c:c + 1], float(temperature[c]), int(top_k[c]), float(top_p[c]))[0].double()
            g = reference._generator(seed[c], int(sample_pos[c]))
            u = float(torch.rand((), generator=g, dtype=torch.float64))
            if j < int(n_drafts[r]) and u < float(p[int(ids[c + 1])]):
                tokens[c] = int(ids[c + 1])
                continue
            tokens[c] = int(torch.multinomial(p, 1, generator=g))
            acc[r] = j
            break
    return tokens, acc


REF_CASE = dict(V=6, W=4, n=3)


def _ref_case():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(REF_CASE["W"], REF_CASE["V"], generator=g) * 1.5
    p0 = filtered_probs(logits[0:1], 1.0, 5, 0.95)[0].double()
    p1 = filtered_probs(logits[1:2], 1.0, 5, 0.95)[0].double()
    d0 = int(torch.argsort(p0, descending=True)[1])  # the second most likely: 0 < p0(d0) < 1
    d = [d0, int(torch.argmin(p1)), 2]
    return logits, p0, p1, d


@pytest.mark.parametrize("rule", ["reference", "biased"])
def test_reference_emits_the_target_distribution_and_a_wrong_rule_fails(rule):
    """6,000 rounds on the reference (top-k 5, top-p 0.95 on V = 6, K = 3): the joint distribution
    of the first two emitted tokens is the target's within the sample-count bound; the negative
    control (resampling p after a rejection) is far outside it."""
    C, W, V, n = 6_000, REF_CASE["W"], REF_CASE["V"], REF_CASE["n"]
    logits, p0, p1, d = _ref_case()
    x, ids, nd, params = _sampling_rows(C, W, logits, d, n, top_k=5, top_p=0.95)
    fn = reference.spec_accept if rule == "reference" else _biased_accept
    tokens, acc = fn(x, ids, nd, *params)
    got, cells = tv(empirical_joint(tokens, acc, W, V), exact_joint(p0, p1, d[0], n))
    bound = tv_bound(C, cells)
    if rule == "reference":
        assert got < bound, (got, bound)
        assert abs(float((acc >= 1).double().mean()) - float(p0[d[0]])) < 0.03
    else:
        assert got > 2 * bound, (got, bound)


def test_reference_at_the_cut_samples_p_itself():
    """n_drafts = 0 with the draft slot holding the most likely token: nothing is removed, the one
    emitted token follows p0 (including that token)."""
    C, W, V = 5_000, 3, 5
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0], [0.0] * 5, [0.0] * 5])
    x, ids, nd, params = _sampling_rows(C, W, logits, [0, 1], 0)
    tokens, acc = reference.spec_accept(x, ids, nd, *params)
    assert int(acc.max()) == 0
    p0 = filtered_probs(logits[0:1], 1.0)[0].double()
    got, cells = tv(empirical_joint(tokens, acc, W, V), exact_joint(p0, p0, 0, 0))
    assert got < tv_bound(C, cells), got


def test_kernel_emits_the_target_distribution():
    """The Triton launch on few rounds (the interpreter is slow): V = 2, K = 1, p0 uniform. The
    bound is loose at this count; the exact distance of the wrong rule (resampling p after a
    rejection: it moves p0(d0) (1 - p0(d0)) = 1/4 of the mass) is checked to exceed it."""
    C, W, V = 144, 2, 2
    logits = torch.tensor([[0.0, 0.0], [0.4, -0.4]])
    p0, p1 = (torch.softmax(logits[i].double(), -1) for i in (0, 1))
    d0 = 1
    x, ids, nd, params = _sampling_rows(C, W, logits, [d0], 1)
    tokens, acc = run_kernel(x, ids, nd, *params)
    exact = exact_joint(p0, p1, d0, 1)
    wrong = exact.clone()  # a = d0 also stops, with (1 - p0(d0)) p0(d0); other stops shrink
    wrong[:, V] = wrong[:, V] * (1 - p0[d0])
    wrong[d0, V] = (1 - p0[d0]) * p0[d0]
    got, cells = tv(empirical_joint(tokens, acc, W, V), exact)
    bound = tv_bound(C, cells, delta=1e-3)
    assert abs(float(wrong.sum()) - 1) < 1e-9 and tv(wrong, exact)[0] > bound + 0.05
    assert got < bound, (got, bound)
    assert int(acc.max()) <= 1 and int(acc.min()) >= 0


def test_tune_builder_times_c_rows_of_four_and_checks_exactly(monkeypatch):
    """The TuneSpec: a verify case per window W is planned at T = C x W (tune/shapes.py; nothing
    pruned), a case without a window is a round of W = 4; the bench's check is exact on greedy rows
    (0 relative error) and its timed launch runs."""
    from ninfer_compile.kernels.registry import default_registry
    from ninfer_compile.kernels.tuning import tune_spec
    from ninfer_compile.tune import measure as M
    from ninfer_compile.tune.shapes import MatchCase

    if not torch.cuda.is_available():
        monkeypatch.setattr(M, "DEVICE", "cpu")
    spec = tune_spec("spec_accept")
    route = default_registry.get_route("spec_accept_rows")
    assert not any(spec.pruned(route, t, False) for t in range(1, 65))
    case = MatchCase("spec_accept", {"format": "BF16", "n": 50}, {"logits": (8, 50)})
    bench = spec.load_builder()(case, 8, None, None, 0)
    assert bench.check(route, {}) == 0.0
    bench.launches(route, {})[0]()
    bench = spec.load_builder()(MatchCase("spec_accept", {"format": "BF16", "n": 50}, {"logits": (2, 50)}, window=2),
                                6, None, None, 0)  # C = 3 rows of W = 2
    assert bench.check(route, {}) == 0.0


@pytest.mark.gpu
def test_qwen_vocab_verify_round_in_a_cuda_graph_gpu():
    """C = 8 rows x W = 9 at the 27B vocabulary, captured once and replayed with new inputs: greedy
    rows equal the reference exactly; then sampled rows (new per-column parameters, same graph)
    emit accepted drafts and a stop token from the filtered support."""
    C, W, V = 8, 9, 248320
    T = C * W
    real, ids, n = _greedy_case(C, W, V, seed=3)
    x, ids, n = real.flip(1).cuda(), ids.cuda(), n.cuda()  # captured with other logits
    params = [p.cuda() for p in _params(T, seed=list(range(T)), pos=list(range(T)))]
    tokens = torch.empty(T, dtype=torch.int32, device="cuda")
    acc = torch.empty(C, dtype=torch.int32, device="cuda")
    ws = torch.empty(sizing.workspace_elems(T, V), device="cuda")
    launch.spec_accept(x, ids, n, *params, tokens, acc, ws)  # compile
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        launch.spec_accept(x, ids, n, *params, tokens, acc, ws)
    x.copy_(real)  # the round's logits, same buffers
    want_t, want_a = reference.spec_accept(x.cpu(), ids.cpu(), n.cpu(), *(p.cpu() for p in params))
    g.replay()
    assert acc.cpu().tolist() == want_a.tolist()
    assert emitted(tokens.cpu(), acc.cpu(), W) == emitted(want_t, want_a, W)
    params[0].fill_(0.8)
    params[1].fill_(40)
    params[2].fill_(0.9)
    g.replay()
    got_a = acc.cpu()
    for r, row in enumerate(emitted(tokens.cpu(), got_a, W)):
        a = int(got_a[r])
        assert 0 <= a <= int(n[r]) and row[:a] == ids[r * W + 1: r * W + 1 + a].tolist()
        c = r * W + a
        assert filtered_probs(x[c:c + 1].cpu(), 0.8, 40, 0.9)[0][row[a]] > 0


@pytest.mark.gpu
def test_kernel_distribution_on_many_rounds_gpu():
    """The reference's distribution test on the device kernel with 100,000 rounds in one launch."""
    C, W, V, n = 100_000, REF_CASE["W"], REF_CASE["V"], REF_CASE["n"]
    logits, p0, p1, d = _ref_case()
    x, ids, nd, params = _sampling_rows(C, W, logits, d, n, top_k=5, top_p=0.95)
    tokens, acc = run_kernel(x, ids, nd, *params)
    got, cells = tv(empirical_joint(tokens, acc, W, V), exact_joint(p0, p1, d[0], n))
    assert got < tv_bound(C, cells), got
    assert abs(float((acc >= 1).double().mean()) - float(p0[d[0]])) < 0.01
