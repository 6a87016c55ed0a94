"""CPU path of state_select (`spec_state/torch_impl.py`) vs the reference and the launcher."""

import torch

from ninfer_compile.kernels.spec_state import reference, torch_impl


def _case(seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    state = torch.randn(5, 2, 3, 4, generator=g).to(dtype)
    columns = torch.randn(3, 2, 2, 3, 4, generator=g).to(dtype)     # C = 3 rows, K = 2
    accepted = torch.tensor([1, 2, 0], dtype=torch.int32)          # row 1 kept every draft: untouched
    slots = torch.tensor([4, 4, 4, 0, 0, 0, 2, 2, 2], dtype=torch.int32)
    return state, columns, accepted, slots


def test_matches_reference_and_fewer_rows():
    for dtype in (torch.float32, torch.bfloat16):
        state, columns, accepted, slots = _case(1, dtype)
        want = reference.state_select(state, columns, accepted, slots)
        got = state.clone()
        torch_impl.state_select(got, columns, accepted, slots, BLOCK=1024, num_warps=4)
        assert torch.equal(got, want)
        got2 = state.clone()
        torch_impl.state_select(got2, columns, accepted, slots[:6])  # rows 0..1 only
        assert torch.equal(got2, reference.state_select(state, columns[:2], accepted[:2], slots[:6]))
        assert not torch.equal(got2, got)  # row 2 (slot 2) would have changed


def test_matches_launcher():
    from ninfer_compile.kernels.spec_state import launch

    state, columns, accepted, slots = _case(2)
    got, want = state.clone(), state.clone()
    torch_impl.state_select(got, columns, accepted, slots)
    launch.state_select(want, columns, accepted, slots)
    assert torch.equal(got, want)
