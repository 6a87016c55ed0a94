"""CPU path of speculative acceptance (`spec_accept/torch_impl.py`): greedy rows equal the
reference; mixed greedy / sampled rows (top-k, top-p, fewer real drafts) give exactly the Triton
launcher's tokens and accepted counts (the same Philox noise), over several seeds."""

import pytest
import torch

from ninfer_compile.kernels.spec_accept import reference, sizing, torch_impl


def _params(T, temps, ks, ps, seeds, poss):
    s = torch.tensor([[x & 0xFFFFFFFF, x >> 32] for x in seeds], dtype=torch.int64)
    s = torch.where(s >= 2**31, s - 2**32, s).to(torch.int32)
    return (torch.tensor(temps, dtype=torch.float32), torch.tensor(ks, dtype=torch.int32),
            torch.tensor(ps, dtype=torch.float32), s, torch.tensor(poss, dtype=torch.int32))


def _case(C, W, V, seed):
    g = torch.Generator().manual_seed(seed)
    T, K = C * W, W - 1
    x = (torch.randn(T, V, generator=g) * 2).bfloat16()
    am = torch.argmax(x.float(), -1).to(torch.int32)
    ids = torch.randint(0, V, (T,), generator=g, dtype=torch.int32)
    n = torch.full((C,), K, dtype=torch.int32)
    for r in range(C):
        ids[r * W + 1: r * W + W] = am[r * W: r * W + K]
        if r % 3 == 1:
            ids[r * W + 2] = (am[r * W + 1] + 1) % V
        if r % 3 == 2:
            n[r] = K // 2
    return x, ids, n


def _run(fn, x, ids, n, params, **kw):
    T, C = x.shape[0], n.shape[0]
    tokens = torch.full((T,), -1, dtype=torch.int32)
    accepted = torch.full((C,), -1, dtype=torch.int32)
    fn(x, ids, n, *params, tokens, accepted, **kw)
    return tokens, accepted


def _emitted(tokens, accepted, W):
    return [tokens[r * W: r * W + int(a) + 1].tolist() for r, a in enumerate(accepted.tolist())]


@pytest.mark.parametrize("C,W", [(1, 2), (3, 4)])
def test_greedy_rows_equal_the_reference(C, W):
    x, ids, n = _case(C, W, 41, seed=C + W)
    params = _params(C * W, [0.0] * (C * W), [0] * (C * W), [1.0] * (C * W), [0] * (C * W), [0] * (C * W))
    got_t, got_a = _run(torch_impl.spec_accept, x, ids, n, params)
    want_t, want_a = reference.spec_accept(x, ids, n, *params)
    assert got_a.tolist() == want_a.tolist()
    assert _emitted(got_t, got_a, W) == _emitted(want_t, want_a, W)


@pytest.mark.parametrize("seed", [0, 1])
def test_sampled_rows_match_the_launcher(seed):
    from ninfer_compile.kernels.spec_accept import launch

    C, W, V = 3, 4, 64
    T = C * W
    x, ids, n = _case(C, W, V, seed=seed)
    temps = [0.0] * W + [0.6] * W + [1.0] * W
    ks = [0] * W + [0] * W + [8] * W
    ps = [1.0] * W + [0.9] * W + [0.95] * W
    params = _params(T, temps, ks, ps, [seed * 1000 + c for c in range(T)], list(range(5, 5 + T)))
    got_t, got_a = _run(torch_impl.spec_accept, x, ids, n, params)
    ws = torch.empty(sizing.workspace_elems(T, V))
    want_t, want_a = _run(launch.spec_accept, x, ids, n, params, workspace=ws)
    assert got_a.tolist() == want_a.tolist()
    assert _emitted(got_t, got_a, W) == _emitted(want_t, want_a, W)
