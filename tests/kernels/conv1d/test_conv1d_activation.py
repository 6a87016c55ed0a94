"""The conv1d launchers take `activation` (the op attribute set at lowering) and hand it to the
kernels: `none` gives the plain conv (the reference's), `silu` the default; anything else is one
RouteError line."""

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


@pytest.mark.parametrize("fn,T", [("conv1d_decode", 3), ("conv1d_prefill", 5)])
def test_activation_reaches_the_kernel(fn, T):
    x, w, state = _case(T, 72, 4, seed=3)
    if fn == "conv1d_decode":
        slots, pos = torch.tensor([3, 0, 2], dtype=torch.int32), torch.tensor([5, 1, 9], dtype=torch.int32)
    else:
        slots, pos = torch.full((T,), 1, dtype=torch.int32), torch.arange(2, 2 + T, dtype=torch.int32)
    outs = {}
    for act in ("silu", "none"):
        sd = state.clone().to(DEV)
        out = torch.empty(x.shape, dtype=torch.float32, device=DEV)
        getattr(launch, fn)(x.to(DEV), w.to(DEV), sd, pos.to(DEV), slots.to(DEV), out, activation=act)
        ref_out, ref_state = reference.conv1d(x, w, state, pos, slots, activation=act)
        torch.testing.assert_close(out.cpu(), ref_out, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(sd.float().cpu(), ref_state, atol=1e-2, rtol=1e-2)
        outs[act] = out.cpu()
    assert (outs["none"] - outs["silu"]).abs().max() > 0.1


def test_unsupported_activation_is_one_route_error():
    x, w, state = _case(1, 40, 1)
    ids = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(RouteError, match=r"^conv1d_decode: activation 'gelu' is not supported \(supported: silu, none\)$"):
        launch.conv1d_decode(x, w, state, ids, ids, torch.empty(1, 40), activation="gelu")
