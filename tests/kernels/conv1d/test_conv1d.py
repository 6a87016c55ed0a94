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
