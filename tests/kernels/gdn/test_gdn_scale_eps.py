"""The GDN launchers take `scale` and `l2_eps` (the op attributes set at lowering) and hand them to
the kernels: a non-default value changes the output to the reference's for that value, on every
gated_delta_rule route (decode, chunked, chunked fast); a value the kernels cannot honour is one
RouteError line."""

import math

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels.gdn import launch, launch_chunked_wy, reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(T, Hk, Hv, Dk, Dv, slots_n, seed):
    g_ = torch.Generator().manual_seed(seed)
    q = torch.randn(T, Hk, Dk, generator=g_).bfloat16()
    k = torch.randn(T, Hk, Dk, generator=g_).bfloat16()
    v = torch.randn(T, Hv, Dv, generator=g_).bfloat16()
    a = torch.randn(T, Hv, generator=g_).bfloat16()
    b = torch.randn(T, Hv, generator=g_).bfloat16()
    a_log = torch.log(torch.rand(Hv, generator=g_) * 8 + 0.5)
    dt_bias = torch.randn(Hv, generator=g_)
    g, beta = reference.gdn_gating(a, b, a_log, dt_bias)
    state = 0.3 * torch.randn(slots_n, Hv, Dk, Dv, generator=g_)
    return q, k, v, a, b, a_log, dt_bias, g, beta, state

SCALE, EPS = 0.61, 0.5  # far from 1/sqrt(Dk) and 1e-6: the outputs must move


def _run(route, T, scale=None, l2_eps=None):
    Hk, Hv, Dk, Dv = 1, 2, 16, 16
    q, k, v, a, b, a_log, dt_bias, g, beta, state = _inputs(T, Hk, Hv, Dk, Dv, 2, 11)
    q, k = (q * 0.05).bfloat16(), (k * 0.05).bfloat16()  # small rows: l2_eps matters
    if route == "decode":
        slots = torch.arange(T, dtype=torch.int32) % 2
        pos = torch.full((T,), 3, dtype=torch.int32)
    else:
        slots = torch.ones(T, dtype=torch.int32)
        pos = torch.arange(2, 2 + T, dtype=torch.int32)
    kw = {k_: v_ for k_, v_ in (("scale", scale), ("l2_eps", l2_eps)) if v_ is not None}
    o_ref, s_ref = reference.gated_delta_rule(q, k, v, g, beta, state, pos, slots, **kw)
    sd = state.clone().to(DEV)
    out = torch.empty(T, Hv, Dv, dtype=torch.float32, device=DEV)
    args = [t.to(DEV) for t in (q, k, v, g, beta)] + [sd, pos.to(DEV), slots.to(DEV), out]
    if route == "decode":
        launch.gated_delta_rule_decode(*args, **kw)
    elif route == "chunked":
        ws = torch.empty(launch.chunked_workspace_numel(T, Hv, Dk, Dv), device=DEV)
        launch.gated_delta_rule_chunked(*args, ws, **kw)
    else:
        ws = torch.empty(launch_chunked_wy.chunked_workspace_numel(T, Hv, Dk, Dv), device=DEV)
        launch_chunked_wy.gated_delta_rule_chunked_wy(*args, ws, **kw)
    return out.cpu(), sd.cpu(), o_ref, s_ref


@pytest.mark.parametrize("route,T", [("decode", 2), ("chunked", 5), ("fast", 5)])
def test_scale_and_l2_eps_reach_the_kernels(route, T):
    base, _, base_ref, _ = _run(route, T)
    torch.testing.assert_close(base, base_ref, atol=2e-2, rtol=2e-2)
    out, st, o_ref, s_ref = _run(route, T, scale=SCALE, l2_eps=EPS)
    torch.testing.assert_close(out, o_ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(st, s_ref, atol=2e-2, rtol=2e-2)
    assert (out - base).abs().max() > 0.05, "scale / l2_eps did not change the output"


def test_defaults_are_the_old_constants():
    """scale None = 1/sqrt(Dk) and l2_eps 1e-6 (what the kernels hard-coded): bit-identical."""
    a, sa, _, _ = _run("decode", 2)
    b, sb, _, _ = _run("decode", 2, scale=1.0 / math.sqrt(16), l2_eps=1e-6)
    assert torch.equal(a, b) and torch.equal(sa, sb)


@pytest.mark.parametrize("kw,msg", [({"scale": 0.0}, "must be > 0"), ({"l2_eps": -1.0}, "l2_eps=-1.0 >= 0"),
                                    ({"scale": float("nan")}, "must be a finite number"),
                                    ({"l2_eps": "1e-6"}, "must be a finite number")])
def test_bad_values_are_one_route_error(kw, msg):
    q, k, v, a, b, a_log, dt_bias, g, beta, state = _inputs(1, 1, 1, 16, 16, 1, 0)
    ids = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(RouteError, match="gated_delta_rule_decode: ") as e:
        launch.gated_delta_rule_decode(q, k, v, g, beta, state, ids, ids, torch.empty(1, 1, 16), **kw)
    assert msg in str(e.value) and "\n" not in str(e.value)
