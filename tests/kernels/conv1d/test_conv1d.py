"""conv1d family kernels vs the fp32 reference (rolling per-slot state)."""

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels.conv1d import launch, reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _case(T, C, slots_n, K=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, C, generator=g).bfloat16()
    w = (0.5 * torch.randn(K, C, generator=g)).bfloat16()
    state = torch.randn(slots_n, K - 1, C, generator=g).bfloat16()
    return x, w, state


def _run(fn, x, w, state, pos, slots):
    xd, wd, sd = x.to(DEV), w.to(DEV), state.clone().to(DEV)
    out = torch.empty(x.shape, dtype=torch.bfloat16, device=DEV)
    fn(xd, wd, sd, pos.to(DEV), slots.to(DEV), out)
    ref_out, ref_state = reference.conv1d(x, w, state, pos, slots)
    torch.testing.assert_close(out.float().cpu(), ref_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(sd.float().cpu(), ref_state, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("T,C", [(1, 40), (3, 300), (5, 96)])
def test_decode_multi_slot(T, C):
    x, w, state = _case(T, C, 6, seed=T)
    slots = torch.tensor([4, 0, 2, 5, 1][:T], dtype=torch.int32)
    pos = torch.tensor([7, 0, 2, 1, 40][:T], dtype=torch.int32)  # 0, 1, 2: history partly before start
    _run(launch.conv1d_decode, x, w, state, pos, slots)


@pytest.mark.parametrize("T,p0", [(1, 5), (2, 1), (3, 0), (5, 9), (17, 0), (33, 2)])
def test_prefill_one_slot(T, p0):
    x, w, state = _case(T, 72, 3, seed=T + p0)
    slots = torch.full((T,), 1, dtype=torch.int32)
    pos = torch.arange(p0, p0 + T, dtype=torch.int32)
    _run(launch.conv1d_prefill, x, w, state, pos, slots)


def test_prefill_several_runs():
    x, w, state = _case(9, 130, 4, seed=5)
    slots = torch.tensor([2, 2, 2, 2, 2, 0, 3, 3, 1], dtype=torch.int32)
    pos = torch.tensor([4, 5, 6, 7, 8, 11, 0, 1, 2], dtype=torch.int32)
    _run(launch.conv1d_prefill, x, w, state, pos, slots)


def test_decode_refuses_t_outside_domain():
    T = launch.DECODE_MAX_T + 1
    x, w, state = _case(T, 8, T, seed=1)
    out = torch.empty(T, 8, dtype=torch.bfloat16)
    ids = torch.arange(T, dtype=torch.int32)
    with pytest.raises(RouteError, match=r"conv1d_decode: T=65 outside the route domain \[1, 64\]"):
        launch.conv1d_decode(x, w, state, ids, ids, out)


def test_decode_at_domain_edge():
    T = launch.DECODE_MAX_T
    x, w, state = _case(T, 8, T, seed=2)
    ids = torch.arange(T, dtype=torch.int32)
    _run(launch.conv1d_decode, x, w, state, ids.flip(0).contiguous(), ids)


@pytest.mark.gpu
def test_conv1d_27b_width_gpu():
    x, w, state = _case(64, 10240, 2, seed=9)
    slots = torch.zeros(64, dtype=torch.int32)
    _run(launch.conv1d_prefill, x, w, state, torch.arange(3, 67, dtype=torch.int32), slots)


def _as_parts(x, widths, pads):
    """x [T, C] split into channel ranges of `widths`, each a column view of its own wider buffer
    (row stride = width + pad, like the projections' output views the fused GDN conv reads)."""
    out, c = [], 0
    for wdt, pad in zip(widths, pads):
        buf = torch.full((x.shape[0], wdt + pad), float("nan"), dtype=x.dtype)
        buf[:, pad // 2: pad // 2 + wdt] = x[:, c:c + wdt]
        out.append(buf[:, pad // 2: pad // 2 + wdt])
        c += wdt
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("fn_name,T", [("conv1d_decode", 1), ("conv1d_decode", 8), ("conv1d_prefill", 64)])
def test_input_parts_27b_views_gpu(fn_name, T):
    """The 27B GDN conv as the fused plan runs it: q, k views of the [T, 4096] query_key output and
    the v view of the [T, 12288] value_z output (row strides 4096 / 12288) vs the joined input."""
    _parts_vs_joined(fn_name, T, (2048, 2048, 6144), (2048, 2048, 6144), seed=11)


@pytest.mark.parametrize("fn_name,T,widths", [
    ("conv1d_decode", 1, (32, 32, 48)), ("conv1d_decode", 3, (100, 200)), ("conv1d_decode", 5, (40, 8, 300)),
    ("conv1d_prefill", 1, (32, 32, 48)), ("conv1d_prefill", 17, (256, 256, 40)), ("conv1d_prefill", 33, (24, 72))])
def test_input_parts_equal_the_joined_input(fn_name, T, widths):
    """Channel ranges read straight from strided views give bit-identical output and state to the
    same input joined into one tensor (the concat the fuse rule conv_input_parts removes); the
    views' neighbours hold NaN, so a read outside a range shows."""
    _parts_vs_joined(fn_name, T, widths, (6, 10, 2)[:len(widths)], seed=T + sum(widths))


def _parts_vs_joined(fn_name, T, widths, pads, seed):
    C = sum(widths)
    x, w, state = _case(T, C, 6 if T <= 5 else max(T, 6), seed=seed)
    if fn_name == "conv1d_decode" and T <= 5:
        slots = torch.tensor([4, 0, 2, 5, 1][:T], dtype=torch.int32)
        pos = torch.tensor([7, 0, 2, 1, 40][:T], dtype=torch.int32)
    elif fn_name == "conv1d_decode":  # one column per slot
        slots = torch.arange(T, dtype=torch.int32).flip(0).contiguous()
        pos = torch.arange(T, dtype=torch.int32) * 5 + 1
    else:
        slots = torch.full((T,), 1, dtype=torch.int32)
        pos = torch.arange(2, 2 + T, dtype=torch.int32)
    fn = getattr(launch, fn_name)
    outs = []
    for parts in (None, _as_parts(x, widths, pads)):
        sd = state.clone().to(DEV)
        out = torch.empty(T, C, dtype=torch.bfloat16, device=DEV)
        if parts is None:
            fn(x.to(DEV), w.to(DEV), sd, pos.to(DEV), slots.to(DEV), out)
        else:
            fn(None, w.to(DEV), sd, pos.to(DEV), slots.to(DEV), out,
               **{f"x{i}": p.to(DEV) for i, p in enumerate(parts)})
        outs.append((out.cpu(), sd.cpu()))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    ref_out, _ = reference.conv1d(x, w, state, pos, slots)
    torch.testing.assert_close(outs[1][0].float(), ref_out, atol=2e-2, rtol=2e-2)


def test_input_parts_refused_when_inconsistent():
    x, w, state = _case(2, 16, 2)
    ids = torch.arange(2, dtype=torch.int32)
    out = torch.empty(2, 16, dtype=torch.bfloat16)
    with pytest.raises(RouteError, match="not both"):
        launch.conv1d_decode(x, w, state, ids, ids, out, x0=x)
    with pytest.raises(RouteError, match="no input"):
        launch.conv1d_decode(None, w, state, ids, ids, out)
    with pytest.raises(RouteError, match="one T"):
        launch.conv1d_decode(None, w, state, ids, ids, out, x0=x[:, :8], x1=x[:1, 8:])
    with pytest.raises(RouteError, match="shapes"):
        launch.conv1d_decode(None, w, state, ids, ids, out, x0=x[:, :8], x1=x[:, 8:12])
