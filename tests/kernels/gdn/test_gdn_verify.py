"""gdn_recurrent_verify (gated_delta_rule_verify) vs the sequential fp32 reference with window W."""

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels.gdn import launch, reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def verify_inputs(C, W, Hk, Hv, Dk, Dv, n_slots, seed):
    """C rows of W columns; row r uses slot perm[r] at consecutive positions from p0[r] (row 0 at 0)."""
    gen = torch.Generator().manual_seed(seed)
    T = C * W
    q = torch.randn(T, Hk, Dk, generator=gen).bfloat16()  # [T, Hk, Dk]
    k = torch.randn(T, Hk, Dk, generator=gen).bfloat16()
    v = torch.randn(T, Hv, Dv, generator=gen).bfloat16()  # [T, Hv, Dv]
    a = torch.randn(T, Hv, generator=gen).bfloat16()
    b = torch.randn(T, Hv, generator=gen).bfloat16()
    g, beta = reference.gdn_gating(a, b, torch.log(torch.rand(Hv, generator=gen) * 8 + 0.5),
                                   torch.randn(Hv, generator=gen))  # [T, Hv] f32
    state = 0.3 * torch.randn(n_slots, Hv, Dk, Dv, generator=gen)  # [slots, Hv, Dk, Dv] f32
    row_slots = torch.randperm(n_slots, generator=gen)[:C]
    p0 = torch.tensor([0] + [int(x) for x in torch.randint(1, 50, (C - 1,), generator=gen)])
    slots = row_slots.repeat_interleave(W).to(torch.int32)  # [T]
    pos = (p0.repeat_interleave(W) + torch.arange(W).repeat(C)).to(torch.int32)  # [T]
    return q, k, v, g, beta, state, pos, slots


def run_verify(q, k, v, g, beta, state, pos, slots, W, **kw):
    C = q.shape[0] // W
    Hv, Dk, Dv = state.shape[1:]
    sd = state.clone().to(DEV)
    o = torch.empty(q.shape[0], Hv, Dv, dtype=torch.bfloat16, device=DEV)
    cols = torch.full((C, W - 1, Hv, Dk, Dv), float("nan"), device=DEV)  # [C, W-1, Hv, Dk, Dv] f32
    launch.gated_delta_rule_verify(q.to(DEV), k.to(DEV), v.to(DEV), g.to(DEV), beta.to(DEV), sd,
                                   pos.to(DEV), slots.to(DEV), o, cols, **kw)
    return o.float().cpu(), sd.cpu(), cols.cpu()


def _rel_rms(a, b):
    return float((a - b).float().pow(2).mean().sqrt() / b.float().pow(2).mean().sqrt().clamp_min(1e-12))


@pytest.mark.parametrize("C,K,Hk,Hv,Dk,Dv", [
    (1, 1, 1, 2, 16, 16), (2, 3, 2, 4, 32, 48), (3, 5, 1, 3, 24, 20), (2, 1, 2, 2, 128, 32),
])
def test_verify_matches_reference(C, K, Hk, Hv, Dk, Dv):
    W = K + 1
    ins = verify_inputs(C, W, Hk, Hv, Dk, Dv, C + 3, seed=C * 10 + K)
    o_ref, s_ref, c_ref = reference.gated_delta_rule(*ins, window=W)
    assert c_ref.shape == (C, K, Hv, Dk, Dv)
    o, s, cols = run_verify(*ins, W, block_v=16 if Dv > 16 else None)
    assert _rel_rms(o, o_ref) < 1e-2
    assert _rel_rms(s, s_ref) < 1e-4 and _rel_rms(cols, c_ref) < 1e-4
    used = set(ins[7].tolist())
    untouched = [i for i in range(s.shape[0]) if i not in used]
    assert torch.equal(s[untouched], ins[5][untouched])  # other slots are never written


def test_reference_window_is_plain_run_plus_columns():
    """The windowed reference: same out/state as window 0; column j = the state after j+1 steps."""
    ins = verify_inputs(2, 3, 1, 2, 16, 16, 4, seed=3)
    o0, s0 = reference.gated_delta_rule(*ins)
    o, s, cols = reference.gated_delta_rule(*ins, window=3)
    assert torch.equal(o, o0) and torch.equal(s, s0)
    q, k, v, g, beta, state, pos, slots = ins
    for r in range(2):
        for j in range(2):
            cut = slice(r * 3, r * 3 + j + 1)
            _, sj = reference.gated_delta_rule(q[cut], k[cut], v[cut], g[cut], beta[cut], state, pos[cut], slots[cut])
            assert torch.allclose(cols[r, j], sj[int(slots[r * 3])], atol=1e-6)
    with pytest.raises(ValueError, match="window=4"):
        reference.gated_delta_rule(*ins, window=4)


def test_verify_narrowed_to_the_first_rows():
    """T covering fewer rows than state_columns holds (the runtime narrows a launch's columns): the
    first rows are computed as alone; the rest of the buffer and the other slots are untouched."""
    W = 2
    q, k, v, g, beta, state, pos, slots = verify_inputs(3, W, 1, 2, 16, 16, 4, seed=9)
    o_full, s_full, c_full = run_verify(q, k, v, g, beta, state, pos, slots, W)
    n = 2 * W
    sd = state.clone().to(DEV)
    o = torch.empty(n, 2, 16, dtype=torch.bfloat16, device=DEV)
    cols = torch.full((3, W - 1, 2, 16, 16), 7.0, device=DEV)
    launch.gated_delta_rule_verify(q[:n].to(DEV), k[:n].to(DEV), v[:n].to(DEV), g[:n].contiguous().to(DEV),
                                   beta[:n].contiguous().to(DEV), sd, pos[:n].to(DEV), slots[:n].to(DEV), o, cols)
    assert torch.equal(o.float().cpu(), o_full[:n]) and torch.equal(cols.cpu()[:2], c_full[:2])
    assert (cols.cpu()[2] == 7.0).all()
    last = int(slots[n])
    assert torch.equal(sd.cpu()[last], state[last])


def test_verify_refuses_bad_columns():
    q, k, v, g, beta, state, pos, slots = verify_inputs(2, 3, 1, 2, 16, 16, 4, seed=1)
    o = torch.empty(6, 2, 16, dtype=torch.bfloat16)
    with pytest.raises(RouteError, match="gated_delta_rule_verify: needs state_columns"):
        launch.gated_delta_rule_verify(q, k, v, g, beta, state, pos, slots, o)
    with pytest.raises(RouteError, match=r"T=6 = C\*W"):
        launch.gated_delta_rule_verify(q, k, v, g, beta, state, pos, slots, o, torch.empty(2, 3, 2, 16, 16))
    with pytest.raises(RouteError, match="fewer whole rows"):
        launch.gated_delta_rule_verify(q, k, v, g, beta, state, pos, slots, o, torch.empty(1, 2, 2, 16, 16))
    with pytest.raises(RouteError, match="must be float32"):
        launch.gated_delta_rule_verify(q, k, v, g, beta, state, pos, slots, o,
                                       torch.empty(2, 2, 2, 16, 16, dtype=torch.bfloat16))


@pytest.mark.gpu
def test_verify_27b_shapes_and_cuda_graph_gpu():
    """The 27B's GDN heads (16 q/k heads, 48 value heads, 128 x 128) at C = 8, K = 3: the kernel vs
    the reference, and a CUDA graph replay of the launch equals the eager launch bit for bit."""
    C, W = 8, 4
    ins = verify_inputs(C, W, 16, 48, 128, 128, 10, seed=27)
    o_ref, s_ref, c_ref = reference.gated_delta_rule(*ins, window=W)
    o, s, cols = run_verify(*ins, W)
    assert _rel_rms(o, o_ref) < 1e-2 and _rel_rms(s, s_ref) < 1e-3 and _rel_rms(cols, c_ref) < 1e-3
    q, k, v, g, beta, state, pos, slots = [t.cuda() for t in ins]
    st = state.clone()
    o_g = torch.empty(C * W, 48, 128, dtype=torch.bfloat16, device="cuda")
    cols_g = torch.zeros(C, W - 1, 48, 128, 128, device="cuda")
    args = (q, k, v, g, beta, st, pos, slots, o_g, cols_g)
    launch.gated_delta_rule_verify(*args)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch.gated_delta_rule_verify(*args)
    st.copy_(state)
    cols_g.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o_g.float().cpu(), o) and torch.equal(st.cpu(), s) and torch.equal(cols_g.cpu(), cols)


def test_plain_routes_refuse_state_columns():
    """A window-0 route writes no per-column states: given the verify output, it says which route does."""
    q, k, v, g, beta, state, pos, slots = verify_inputs(1, 2, 1, 2, 16, 16, 2, seed=2)
    o = torch.empty(2, 2, 16, dtype=torch.bfloat16)
    cols = torch.empty(1, 1, 2, 16, 16)
    with pytest.raises(RouteError, match="gated_delta_rule_decode: writes no state_columns .*gdn_recurrent_verify"):
        launch.gated_delta_rule_decode(q, k, v, g, beta, state, pos, slots, o, state_columns=cols)
    ws = torch.empty(launch.chunked_workspace_numel(2, 2, 16, 16))
    with pytest.raises(RouteError, match="gated_delta_rule_chunked: writes no state_columns"):
        launch.gated_delta_rule_chunked(q, k, v, g, beta, state, pos, slots, o, ws, state_columns=cols)


@pytest.mark.parametrize("W,Hk,Hv,Dk,Dv", [(2, 1, 2, 16, 16), (4, 2, 4, 32, 48), (6, 1, 3, 24, 20), (9, 2, 2, 128, 32)])
def test_verify_equals_decode_steps_bit_for_bit(W, Hk, Hv, Dk, Dv):
    """A verify row's outputs and states equal W plain decode steps (gated_delta_rule_decode, one
    column each) exactly: the same per-column arithmetic on the same state block."""
    q, k, v, g, beta, state, pos, slots = verify_inputs(2, W, Hk, Hv, Dk, Dv, 4, seed=W * 3 + Dk)
    bv = 16
    o, s, cols = run_verify(q, k, v, g, beta, state, pos, slots, W, block_v=bv)
    sd = state.clone().to(DEV)
    for r in range(2):
        for j in range(W):
            t = slice(r * W + j, r * W + j + 1)
            od = torch.empty(1, Hv, Dv, dtype=torch.bfloat16, device=DEV)
            launch.gated_delta_rule_decode(q[t].to(DEV), k[t].to(DEV), v[t].to(DEV), g[t].to(DEV), beta[t].to(DEV),
                                           sd, pos[t].to(DEV), slots[t].to(DEV), od, block_v=bv)
            assert torch.equal(od.float().cpu()[0], o[r * W + j]), (r, j)
            if j < W - 1:
                assert torch.equal(sd.cpu()[int(slots[r * W])], cols[r, j]), (r, j)
    assert torch.equal(sd.cpu(), s)
