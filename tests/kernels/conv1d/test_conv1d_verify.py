"""conv1d_verify vs the fp32 reference with window W (rows of W columns of one slot each)."""

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels.conv1d import launch, reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def verify_case(R, W, Ch, n_slots, kern=4, seed=0):
    """R rows of W columns; row r uses a distinct slot at consecutive positions from p0[r] (row 0 at 0,
    row 1 at 1 when there is one: history partly before the sequence start)."""
    gen = torch.Generator().manual_seed(seed)
    T = R * W
    x = torch.randn(T, Ch, generator=gen).bfloat16()  # [T, Ch]
    w = (0.5 * torch.randn(kern, Ch, generator=gen)).bfloat16()  # [K, Ch]
    state = torch.randn(n_slots, kern - 1, Ch, generator=gen).bfloat16()  # [slots, K-1, Ch]
    row_slots = torch.randperm(n_slots, generator=gen)[:R]
    p0 = torch.tensor([0, 1, 9, 30][:R])
    slots = row_slots.repeat_interleave(W).to(torch.int32)  # [T]
    pos = (p0.repeat_interleave(W) + torch.arange(W).repeat(R)).to(torch.int32)  # [T]
    return x, w, state, pos, slots


def run_verify(x, w, state, pos, slots, W, parts=None, **kw):
    R = x.shape[0] // W
    sd = state.clone().to(DEV)
    out = torch.empty(x.shape, dtype=torch.bfloat16, device=DEV)
    cols = torch.full((R, W - 1, *state.shape[1:]), float("nan"), dtype=state.dtype, device=DEV)
    xs = {"x": x.to(DEV)} if parts is None else {f"x{i}": p.to(DEV) for i, p in enumerate(parts)}
    launch.conv1d_verify(weight=w.to(DEV), conv_state=sd, positions=pos.to(DEV), slots=slots.to(DEV), out=out,
                         conv_state_columns=cols, **xs, **kw)
    return out.float().cpu(), sd.cpu(), cols.cpu()


@pytest.mark.parametrize("R,K,Ch,kern", [(1, 1, 40, 4), (2, 3, 300, 4), (3, 5, 96, 4), (2, 3, 33, 2), (2, 1, 20, 3)])
def test_verify_matches_reference(R, K, Ch, kern):
    W = K + 1
    x, w, state, pos, slots = verify_case(R, W, Ch, R + 2, kern, seed=R * 7 + K)
    ref_out, ref_state, ref_cols = reference.conv1d(x, w, state, pos, slots, window=W)
    assert ref_cols.shape == (R, K, kern - 1, Ch)
    out, st, cols = run_verify(x, w, state, pos, slots, W, block_c=64)
    torch.testing.assert_close(out, ref_out, atol=2e-2, rtol=2e-2)
    # the states are copies of bf16 inputs (or zeros before position 0): exact
    assert torch.equal(st.float(), ref_state.bfloat16().float())
    assert torch.equal(cols.float(), ref_cols.bfloat16().float())


def test_verify_input_parts():
    W = 4
    x, w, state, pos, slots = verify_case(2, W, 70, 3, seed=11)
    parts = [x[:, :20].contiguous(), x[:, 20:45].contiguous(), x[:, 45:].contiguous()]
    ref = run_verify(x, w, state, pos, slots, W)
    got = run_verify(x, w, state, pos, slots, W, parts=parts)
    for a, b in zip(got, ref):
        assert torch.equal(a, b)


def test_reference_window_columns_are_prefix_states():
    W = 3
    x, w, state, pos, slots = verify_case(2, W, 16, 3, seed=4)
    o0, s0 = reference.conv1d(x, w, state, pos, slots)
    o, s, cols = reference.conv1d(x, w, state, pos, slots, window=W)
    assert torch.equal(o, o0) and torch.equal(s, s0)
    for r in range(2):
        for j in range(W - 1):
            cut = slice(r * W, r * W + j + 1)
            _, sj = reference.conv1d(x[cut], w, state, pos[cut], slots[cut])
            assert torch.equal(cols[r, j], sj[int(slots[r * W])])


def test_verify_narrowed_to_the_first_rows():
    """T covering fewer rows than the columns buffer (the runtime narrows a launch's columns): the
    first rows are computed as alone, the rest of the buffer is left untouched."""
    W = 3
    x, w, state, pos, slots = verify_case(3, W, 24, 4, seed=6)
    full = run_verify(x, w, state, pos, slots, W)
    sd = state.clone().to(DEV)
    out = torch.empty(2 * W, 24, dtype=torch.bfloat16, device=DEV)
    cols = torch.full((3, W - 1, 3, 24), 7.0, dtype=state.dtype, device=DEV)
    launch.conv1d_verify(x[:2 * W].to(DEV), w.to(DEV), sd, pos[:2 * W].to(DEV), slots[:2 * W].to(DEV), out, cols)
    assert torch.equal(out.float().cpu(), full[0][:2 * W]) and torch.equal(cols.cpu()[:2], full[2][:2])
    assert (cols.cpu()[2] == 7.0).all()
    last = int(slots[2 * W])
    assert torch.equal(sd.cpu()[last], state[last])


def test_verify_refuses_bad_columns():
    x, w, state, pos, slots = verify_case(2, 3, 8, 3)
    out = torch.empty(6, 8, dtype=torch.bfloat16)
    with pytest.raises(RouteError, match="conv1d_verify: needs conv_state_columns"):
        launch.conv1d_verify(x, w, state, pos, slots, out)
    with pytest.raises(RouteError, match=r"T=6 = R\*W"):
        launch.conv1d_verify(x, w, state, pos, slots, out, torch.empty(2, 3, 3, 8, dtype=torch.bfloat16))  # W=4
    with pytest.raises(RouteError, match="fewer whole rows"):
        launch.conv1d_verify(x, w, state, pos, slots, out, torch.empty(1, 2, 3, 8, dtype=torch.bfloat16))
    with pytest.raises(RouteError, match="dtype"):
        launch.conv1d_verify(x, w, state, pos, slots, out, torch.empty(2, 2, 3, 8))


@pytest.mark.gpu
def test_verify_27b_width_and_cuda_graph_gpu():
    """10240 channels (the 27B's q | k | v conv) at 4 rows of W = 4: exact states, and a CUDA graph
    replay equals the eager launch."""
    W = 4
    x, w, state, pos, slots = verify_case(4, W, 10240, 6, seed=27)
    ref_out, ref_state, ref_cols = reference.conv1d(x, w, state, pos, slots, window=W)
    out, st, cols = run_verify(x, w, state, pos, slots, W)
    torch.testing.assert_close(out, ref_out, atol=2e-2, rtol=2e-2)
    assert torch.equal(st.float(), ref_state.bfloat16().float())
    assert torch.equal(cols.float(), ref_cols.bfloat16().float())
    xd, wd, sd, pd, sld = x.cuda(), w.cuda(), state.clone().cuda(), pos.cuda(), slots.cuda()
    o_g = torch.empty(x.shape, dtype=torch.bfloat16, device="cuda")
    c_g = torch.zeros(4, W - 1, 3, 10240, dtype=torch.bfloat16, device="cuda")
    launch.conv1d_verify(xd, wd, sd, pd, sld, o_g, c_g)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch.conv1d_verify(xd, wd, sd, pd, sld, o_g, c_g)
    sd.copy_(state.cuda())
    c_g.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o_g.float().cpu(), out) and torch.equal(sd.cpu(), st) and torch.equal(c_g.cpu(), cols)


def test_plain_routes_refuse_conv_state_columns():
    x, w, state, pos, slots = verify_case(1, 2, 8, 2)
    out = torch.empty(2, 8, dtype=torch.bfloat16)
    cols = torch.empty(1, 1, 3, 8, dtype=torch.bfloat16)
    for fn in (launch.conv1d_decode, launch.conv1d_prefill):
        with pytest.raises(RouteError, match=f"{fn.__name__}: writes no conv_state_columns .*conv1d_verify"):
            fn(x, w, state, pos, slots, out, conv_state_columns=cols)


@pytest.mark.parametrize("W,kern,Ch", [(2, 4, 40), (4, 4, 300), (6, 4, 33), (3, 2, 17), (5, 3, 64)])
def test_verify_equals_decode_steps_bit_for_bit(W, kern, Ch):
    """A verify row's outputs and states equal W plain decode steps (conv1d_decode, one column each):
    the same taps summed in the same order, so a verify round and plain decoding agree exactly."""
    x, w, state, pos, slots = verify_case(2, W, Ch, 4, kern, seed=W + 10 * kern)
    out, st, cols = run_verify(x, w, state, pos, slots, W, block_c=64)
    sd = state.clone().to(DEV)
    for r in range(2):
        for j in range(W):
            t = r * W + j
            o = torch.empty(1, Ch, dtype=torch.bfloat16, device=DEV)
            launch.conv1d_decode(x[t:t + 1].to(DEV), w.to(DEV), sd, pos[t:t + 1].to(DEV), slots[t:t + 1].to(DEV), o)
            assert torch.equal(o.float().cpu()[0], out[t]), (r, j)
            if j < W - 1:
                assert torch.equal(sd.cpu()[int(slots[t])], cols[r, j]), (r, j)
    assert torch.equal(sd.cpu(), st)
