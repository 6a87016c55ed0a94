"""state_select_copy (kernels/spec_state) vs its reference, and the rollback property of a verify
round: verify (GDN recurrence + conv) over rows of W columns, then state_select with accepted = a,
leaves each slot's state as a plain run over only the row's first a+1 columns would."""

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels.conv1d import launch as conv_launch
from ninfer_compile.kernels.conv1d import reference as conv_ref
from ninfer_compile.kernels.gdn import launch as gdn_launch
from ninfer_compile.kernels.gdn import reference as gdn_ref
from ninfer_compile.kernels.registry import default_registry
from ninfer_compile.kernels.spec_state import launch, reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _rows(C, W, n_slots, gen, p0s=(0, 7, 1)):
    row_slots = torch.randperm(n_slots, generator=gen)[:C]
    slots = row_slots.repeat_interleave(W).to(torch.int32)  # [T = C*W]
    pos = (torch.tensor(p0s[:C]).repeat_interleave(W) + torch.arange(W).repeat(C)).to(torch.int32)
    return pos, slots


@pytest.mark.parametrize("C,K,shape,dtype", [
    (1, 1, (3, 5), torch.float32), (2, 3, (2, 7, 9), torch.bfloat16), (3, 5, (1000,), torch.float32),
    (3, 2, (4, 3, 33), torch.int32),
])
def test_select_matches_reference(C, K, shape, dtype):
    gen = torch.Generator().manual_seed(C * 10 + K)
    n_slots = C + 2
    mk = lambda *s: (torch.randn(*s, generator=gen) * 100).to(dtype)  # noqa: E731
    state, cols = mk(n_slots, *shape), mk(C, K, *shape)  # [slots, *S], [C, K, *S]
    _, slots = _rows(C, K + 1, n_slots, gen)
    for acc in ([K] * C, [0] * C, [(r * 2) % (K + 1) for r in range(C)], [K - 1 - r % K for r in range(C)]):
        accepted = torch.tensor(acc, dtype=torch.int32)
        want = reference.state_select(state, cols, accepted, slots)
        sd = state.clone().to(DEV)
        launch.state_select(sd, cols.to(DEV), accepted.to(DEV), slots.to(DEV), BLOCK=256)
        assert torch.equal(sd.cpu(), want), acc


def test_select_all_accepted_writes_nothing():
    """accepted >= K everywhere: the state is left exactly as it was (no program copies)."""
    state = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    cols = torch.full((2, 3, 6), float("nan"))
    launch.state_select(state, cols, torch.tensor([3, 3], dtype=torch.int32),
                        torch.tensor([0] * 4 + [2] * 4, dtype=torch.int32))
    assert torch.equal(state, torch.arange(24, dtype=torch.float32).reshape(4, 6))


def test_select_narrowed_to_the_first_rows():
    """slots covering fewer rows than columns / accepted hold (a narrowed launch): only those rows."""
    state = torch.zeros(5, 4)
    cols = torch.arange(3 * 2 * 4, dtype=torch.float32).reshape(3, 2, 4)
    slots = torch.tensor([3, 3, 3, 1, 1, 1, 4, 4, 4], dtype=torch.int32)
    accepted = torch.tensor([1, 0, 0], dtype=torch.int32)
    launch.state_select(state, cols, accepted, slots[:6].contiguous())
    want = reference.state_select(torch.zeros(5, 4), cols[:2], accepted[:2], slots[:6])
    assert torch.equal(state, want) and (state[4] == 0).all() and (state[3] == cols[0, 1]).all()


def test_select_refuses_bad_operands():
    st, cols = torch.zeros(4, 6), torch.zeros(2, 3, 6)
    acc, slots = torch.zeros(2, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
    with pytest.raises(RouteError, match="state_select: columns dtype"):
        launch.state_select(st, cols.bfloat16(), acc, slots)
    with pytest.raises(RouteError, match=r"must be \[C, K, \*S\]"):
        launch.state_select(st, torch.zeros(2, 3, 5), acc, slots)
    with pytest.raises(RouteError, match=r"C\*\(K\+1\)=8"):
        launch.state_select(st, cols, acc, slots[:6])
    with pytest.raises(RouteError, match="contiguous block"):
        launch.state_select(torch.zeros(4, 6, 2)[:, :, 0], cols, acc, slots)


def test_route_registered():
    (r,) = default_registry.routes_for("state_select")
    assert r.name == "state_select_copy" and callable(r.load_launcher()) and callable(r.load_reference())
    for fam, name in (("gated_delta_rule", "gdn_recurrent_verify"), ("conv1d", "conv1d_verify")):
        (v,) = [x for x in default_registry.routes_for(fam) if x.name == name]
        assert v.covers(1, 72, {"phase": "verify", "format": "BF16"}) is None
        assert "phase" in v.covers(1, 8, {"phase": "decode", "format": "BF16"})


# ---------------------------------------------------------------------------- rollback property

@pytest.mark.parametrize("C,K", [(1, 1), (2, 3), (3, 5)])
def test_rollback_equals_a_plain_run_over_the_accepted_prefix(C, K):
    W = K + 1
    T = C * W
    Hk, Hv, Dk, Dv, Ch, kern, n_slots = 1, 2, 16, 24, 40, 4, C + 2
    gen = torch.Generator().manual_seed(100 + C * 10 + K)
    q = torch.randn(T, Hk, Dk, generator=gen).bfloat16()  # [T, Hk, Dk]
    k = torch.randn(T, Hk, Dk, generator=gen).bfloat16()
    v = torch.randn(T, Hv, Dv, generator=gen).bfloat16()  # [T, Hv, Dv]
    g = -torch.rand(T, Hv, generator=gen)  # [T, Hv] f32
    beta = torch.rand(T, Hv, generator=gen)
    state0 = 0.3 * torch.randn(n_slots, Hv, Dk, Dv, generator=gen)  # [slots, Hv, Dk, Dv] f32
    x = torch.randn(T, Ch, generator=gen).bfloat16()  # [T, Ch]
    w = (0.5 * torch.randn(kern, Ch, generator=gen)).bfloat16()  # [kern, Ch]
    cstate0 = torch.randn(n_slots, kern - 1, Ch, generator=gen).bfloat16()  # [slots, kern-1, Ch]
    pos, slots = _rows(C, W, n_slots, gen)

    # the verify round on the device: both stateful ops, then their per-column states
    d = lambda t: t.to(DEV)  # noqa: E731
    st, cst = d(state0.clone()), d(cstate0.clone())
    cols = torch.empty(C, K, Hv, Dk, Dv, device=DEV)
    ccols = torch.empty(C, K, kern - 1, Ch, dtype=torch.bfloat16, device=DEV)
    gdn_launch.gated_delta_rule_verify(d(q), d(k), d(v), d(g), d(beta), st, d(pos), d(slots),
                                       torch.empty(T, Hv, Dv, dtype=torch.bfloat16, device=DEV), cols)
    conv_launch.conv1d_verify(d(x), d(w), cst, d(pos), d(slots), torch.empty(T, Ch, dtype=torch.bfloat16, device=DEV),
                              ccols)
    for a in range(K + 1):
        acc = [(a + r) % (K + 1) for r in range(C)]  # every a in every row, rows mixed
        accepted = torch.tensor(acc, dtype=torch.int32)
        s_a, c_a = st.clone(), cst.clone()
        launch.state_select(s_a, cols, d(accepted), d(slots))
        launch.state_select(c_a, ccols, d(accepted), d(slots))
        # a plain run over only each row's first acc[r]+1 columns (one run per row)
        want_s, want_c = state0.clone(), cstate0.clone()
        for r in range(C):
            rk = torch.arange(r * W, r * W + acc[r] + 1)
            _, want_s = gdn_ref.gated_delta_rule(q[rk], k[rk], v[rk], g[rk], beta[rk], want_s, pos[rk], slots[rk])
            _, c = conv_ref.conv1d(x[rk], w, want_c, pos[rk], slots[rk])
            want_c = c.bfloat16()
        torch.testing.assert_close(s_a.cpu(), want_s, atol=1e-4, rtol=1e-4)  # close for the recurrence
        assert torch.equal(c_a.cpu(), want_c), f"conv state after rollback to accepted={acc} is not exact"


@pytest.mark.gpu
def test_select_cuda_graph_reads_accepted_on_the_device_gpu():
    """One captured launch serves any acceptance: `accepted` is read on the device at replay."""
    C, K = 8, 3
    gen = torch.Generator().manual_seed(8)
    state = torch.randn(12, 48, 128, 128, generator=gen).cuda()  # the 27B's recurrent state per slot
    cols = torch.randn(C, K, 48, 128, 128, generator=gen).cuda()
    _, slots = _rows(C, K + 1, 12, gen, p0s=(0,) * C)
    slots = slots.cuda()
    accepted = torch.zeros(C, dtype=torch.int32, device="cuda")
    st = state.clone()
    launch.state_select(st, cols, accepted, slots)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch.state_select(st, cols, accepted, slots)
    for acc in ([K] * C, list(range(C)), [1] * C):
        a = torch.tensor([x % (K + 1) for x in acc], dtype=torch.int32)
        st.copy_(state)
        accepted.copy_(a.cuda())
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(st.cpu(), reference.state_select(state.cpu(), cols.cpu(), a, slots.cpu()))
