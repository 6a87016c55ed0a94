"""CPU path of conv1d (`conv1d/torch_impl.py`) vs the fp32 reference (decode, prefill runs, verify
rows, input parts, both activations) and against the Triton launchers on a few shapes."""

import pytest
import torch

from ninfer_compile.kernels.conv1d import reference, torch_impl


def _case(T, C, K, n_slots, slots, pos, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, C, generator=g).bfloat16()
    w = (0.5 * torch.randn(K, C, generator=g)).bfloat16()
    state = torch.randn(n_slots, K - 1, C, generator=g).bfloat16()
    return x, w, state, torch.tensor(pos, dtype=torch.int32), torch.tensor(slots, dtype=torch.int32)


def _run(x, w, state, pos, slots, W=0, parts=None, activation="silu"):
    st = state.clone()
    out = torch.full(x.shape, float("nan"), dtype=torch.bfloat16)
    cols = torch.full((x.shape[0] // W, W - 1, *state.shape[1:]), float("nan"), dtype=state.dtype) if W else None
    xs = {"x": x} if parts is None else {f"x{i}": p for i, p in enumerate(parts)}
    torch_impl.conv1d(weight=w, conv_state=st, positions=pos, slots=slots, out=out, conv_state_columns=cols,
                      activation=activation, **xs)
    return out, st, cols


def _check(got, ref):
    out, st, cols = got
    torch.testing.assert_close(out.float(), ref[0], atol=2e-2, rtol=2e-2)
    assert torch.equal(st.float(), ref[1].bfloat16().float())  # copies of inputs (or zeros): exact
    if cols is not None:
        assert torch.equal(cols.float(), ref[2].bfloat16().float())


@pytest.mark.parametrize("activation", ["silu", "none"])
def test_decode_columns(activation):
    x, w, state, pos, slots = _case(3, 40, 4, 5, [4, 0, 2], [0, 1, 57], seed=1)
    _check(_run(x, w, state, pos, slots, activation=activation),
           reference.conv1d(x, w, state, pos, slots, activation=activation))


@pytest.mark.parametrize("pos", [0, 1, 2, 40])
def test_single_column(pos):
    x, w, state, pos_t, slots = _case(1, 36, 4, 3, [2], [pos], seed=pos)
    _check(_run(x, w, state, pos_t, slots), reference.conv1d(x, w, state, pos_t, slots))


@pytest.mark.parametrize("K", [2, 4])
def test_prefill_runs(K):
    slots = [1] * 5 + [3] * 12 + [0]
    pos = list(range(5)) + list(range(2, 14)) + [7]
    x, w, state, pos, slots = _case(18, 33, K, 4, slots, pos, seed=K)
    _check(_run(x, w, state, pos, slots), reference.conv1d(x, w, state, pos, slots))


def test_verify_rows_and_parts():
    W = 4
    slots = [2] * W + [0] * W
    pos = list(range(W)) + list(range(9, 9 + W))
    x, w, state, pos, slots = _case(2 * W, 70, 4, 3, slots, pos, seed=5)
    ref = reference.conv1d(x, w, state, pos, slots, window=W)
    _check(_run(x, w, state, pos, slots, W=W), ref)
    parts = [x[:, :20], x[:, 20:45], x[:, 45:]]
    _check(_run(x, w, state, pos, slots, W=W, parts=parts), ref)


def test_matches_launchers():
    from ninfer_compile.kernels.conv1d import launch

    x, w, state, pos, slots = _case(5, 40, 4, 3, [1, 1, 1, 2, 2], [3, 4, 5, 0, 1], seed=9)
    got = _run(x, w, state, pos, slots)
    st, out = state.clone(), torch.empty(x.shape, dtype=torch.bfloat16)
    launch.conv1d_prefill(x=x, weight=w, conv_state=st, positions=pos, slots=slots, out=out)
    torch.testing.assert_close(got[0].float(), out.float(), atol=1e-2, rtol=1e-2)
    assert torch.equal(got[1], st)


@pytest.mark.parametrize("activation,pos", [("silu", 1), ("none", 9)])
def test_fused_single_column_matches_torch_ops(activation, pos, monkeypatch):
    """The fused C++ decode column (conv1d/torch_fused.py) vs the torch ops: three strided input
    parts, bf16 state, a window reaching before position 0 (pos 1) and not (pos 9)."""
    from ninfer_compile.kernels.conv1d import torch_fused

    if torch_fused.kernel() is None:
        pytest.skip("no fused CPU kernel here (no compiler)")
    x, w, state, pos_t, slots = _case(1, 48, 4, 3, [1], [pos], seed=7)
    row = torch.randn(1, 96, generator=torch.Generator().manual_seed(2)).bfloat16()
    parts = [row[:, 0:16], row[:, 40:60], row[:, 80:92]]
    got = _run(x, w, state, pos_t, slots, parts=parts, activation=activation)
    assert torch_fused.fused_decode(parts, w.float(), state.clone(), 1, pos, torch.empty(1, 48), True)
    assert not torch_fused.fused_decode(parts, w.float(), state.clone(), state.shape[0], pos, torch.empty(1, 48), True)
    monkeypatch.setattr(torch_impl, "fused_decode", lambda *a: False)
    want = _run(x, w, state, pos_t, slots, parts=parts, activation=activation)
    torch.testing.assert_close(got[0].float(), want[0].float(), atol=1e-2, rtol=1e-2)
    assert torch.equal(got[1], want[1])
    # fp32 out: the torch ops' arithmetic up to expf's last bits
    st32, out32, ref32 = state.clone(), torch.full((1, 48), float("nan")), torch.empty(1, 48)
    assert torch_fused.fused_decode(parts, w.float(), st32, 1, pos, out32, activation == "silu")
    torch_impl._decode_one(torch.cat(parts, 1), w, state.clone(), pos, 1, ref32, activation)
    torch.testing.assert_close(out32, ref32, atol=1e-6, rtol=1e-6)
