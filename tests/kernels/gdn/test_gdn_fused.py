"""Route gdn_decode_fused_keyhead (conv1d + gated delta rule + gated RMSNorm in one launch) against
its reference, and that reference against the unfused references it composes. Conv state and
recurrent state are compared too. Under the interpreter on the CPU; a 27B-shaped case on the GPU."""

from __future__ import annotations

import inspect

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels.conv1d import reference as conv_ref
from ninfer_compile.kernels.gdn import launch_fused, reference
from ninfer_compile.kernels.norms import reference as norm_ref

DEV = "cuda" if torch.cuda.is_available() else "cpu"
N_SLOTS = 9


def _rel_rms(got, want) -> float:
    got, want = got.float().cpu(), want.float().cpu()
    return float((got - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt().clamp_min(1e-12))


def _case(T, Hk, Hv, Dk, Dv, K=4, seed=0, positions=None):
    gen = torch.Generator().manual_seed(seed)
    C = 2 * Hk * Dk + Hv * Dv
    x = torch.randn(T, C, generator=gen).bfloat16()
    conv_w = (0.5 * torch.randn(K, C, generator=gen)).bfloat16()
    conv_state = torch.randn(N_SLOTS, K - 1, C, generator=gen).bfloat16()
    g = -torch.rand(T, Hv, generator=gen) * 0.7
    beta = torch.rand(T, Hv, generator=gen)
    state = 0.3 * torch.randn(N_SLOTS, Hv, Dk, Dv, generator=gen)
    z = torch.randn(T, Hv, Dv, generator=gen).bfloat16()
    norm_w = (1 + 0.2 * torch.randn(Dv, generator=gen)).bfloat16()
    slots = torch.tensor([5, 0, 3, 8, 1, 2, 7, 4, 6][:T], dtype=torch.int32)
    pos = torch.tensor(positions or [9, 0, 2, 1, 77, 3, 40, 5, 6][:T], dtype=torch.int32)
    return dict(x=x, conv_weight=conv_w, conv_state=conv_state, g=g, beta=beta, state=state,
                positions=pos, slots=slots, z=z, norm_weight=norm_w)


def _run(case, Hk, parts: bool, **kw):
    """The launcher on device copies; returns (out, conv_state, state) on the CPU."""
    d = {k: v.clone().to(DEV) for k, v in case.items()}
    T, C = d["x"].shape
    _, Hv, Dk, Dv = d["state"].shape
    out = torch.empty(T, Hv * Dv, dtype=torch.bfloat16, device=DEV)
    if parts:  # the projections' columns, each a strided view of a wider buffer (as in a plan)
        qk = torch.zeros(T, 2 * Hk * Dk + 3, dtype=torch.bfloat16, device=DEV)
        vz = torch.zeros(T, 2 * Hv * Dv, dtype=torch.bfloat16, device=DEV)
        qk[:, : 2 * Hk * Dk] = d["x"][:, : 2 * Hk * Dk]
        vz[:, : Hv * Dv] = d["x"][:, 2 * Hk * Dk:]
        x = d.pop("x")
        d.update(x0=qk[:, : Hk * Dk], x1=qk[:, Hk * Dk: 2 * Hk * Dk], x2=vz[:, : Hv * Dv])
        del x
    launch_fused.gdn_decode_fused(**d, out=out, key_heads=Hk, scale=Dk ** -0.5, l2_eps=1e-6, eps=1e-6, **kw)
    return out.cpu(), d["conv_state"].cpu(), d["state"].cpu()


def _ref(case, Hk, **kw):
    return reference.gdn_decode_fused(**case, key_heads=Hk, scale=case["state"].shape[2] ** -0.5, l2_eps=1e-6,
                                      eps=1e-6, **kw)


SHAPES = [  # (T, Hk, Hv, Dk, Dv): the tiny model (2, 6, 32, 24), odd head dims, REP 1 / 2 / 3
    (1, 2, 6, 32, 24), (2, 2, 6, 32, 24), (3, 1, 2, 16, 48), (5, 2, 4, 32, 20), (3, 3, 3, 16, 16),
]


@pytest.mark.parametrize("T,Hk,Hv,Dk,Dv", SHAPES)
@pytest.mark.parametrize("parts", [True, False], ids=["parts", "joined"])
def test_fused_decode_matches_reference(T, Hk, Hv, Dk, Dv, parts):
    case = _case(T, Hk, Hv, Dk, Dv, seed=T * 7 + Dv)
    r_out, r_cs, r_st = _ref(case, Hk)
    out, cs, st = _run(case, Hk, parts)
    assert _rel_rms(out, r_out) < 1e-2
    assert _rel_rms(st, r_st) < 2e-3  # q / k / v rounded to bf16 where the unfused conv stores them
    # the conv state holds inputs (bf16 in, bf16 out): exact; slots not in the step unchanged
    torch.testing.assert_close(cs, r_cs.bfloat16(), atol=0, rtol=0)
    used = set(case["slots"].tolist())
    for s in range(N_SLOTS):
        if s not in used:
            assert torch.equal(cs[s], case["conv_state"][s]) and torch.equal(st[s], case["state"][s])


def test_fused_decode_activation_none_and_early_positions():
    """Positions 0..2 read zeros for the state rows before the sequence (and roll zeros in);
    activation none changes the result as the reference says."""
    case = _case(3, 2, 4, 16, 16, seed=3, positions=[0, 1, 2])
    for act in ("silu", "none"):
        r_out, r_cs, r_st = _ref(case, 2, activation=act)
        out, cs, st = _run(case, 2, True, activation=act)
        assert _rel_rms(out, r_out) < 1e-2
        torch.testing.assert_close(cs, r_cs.bfloat16(), atol=0, rtol=0)
        assert _rel_rms(st, r_st) < 2e-3
    a = _ref(case, 2, activation="silu")[0]
    b = _ref(case, 2, activation="none")[0]
    assert _rel_rms(a, b) > 0.05


def _unfused_kernels(case, Hk, **kw):
    """conv1d_decode -> gated_delta_rule_decode -> gated_rmsnorm (the launches the fusion replaces)."""
    from ninfer_compile.kernels.conv1d import launch as conv_launch
    from ninfer_compile.kernels.gdn import launch as gdn_launch
    from ninfer_compile.kernels.norms import launch as norm_launch

    d = {k: v.clone().to(DEV) for k, v in case.items()}
    T, C = d["x"].shape
    _, Hv, Dk, Dv = d["state"].shape
    conv = torch.empty(T, C, dtype=torch.bfloat16, device=DEV)
    conv_launch.conv1d_decode(x=d["x"], weight=d["conv_weight"], conv_state=d["conv_state"], positions=d["positions"],
                              slots=d["slots"], out=conv, **kw)
    q, k, v = torch.split(conv, [Hk * Dk, Hk * Dk, Hv * Dv], 1)
    o = torch.empty(T, Hv, Dv, dtype=torch.bfloat16, device=DEV)
    gdn_launch.gated_delta_rule_decode(q.reshape(T, Hk, Dk), k.reshape(T, Hk, Dk), v.reshape(T, Hv, Dv), d["g"],
                                       d["beta"], d["state"], d["positions"], d["slots"], o, scale=Dk ** -0.5)
    out = torch.empty(T, Hv * Dv, dtype=torch.bfloat16, device=DEV)
    norm_launch.gated_rmsnorm(o, d["z"], d["norm_weight"], out, eps=1e-6)
    return out.cpu(), d["conv_state"].cpu(), d["state"].cpu()


@pytest.mark.parametrize("T,Hk,Hv,Dk,Dv,prefetch", [(1, 2, 6, 32, 24, True), (3, 1, 2, 16, 48, True),
                                                    (5, 2, 4, 32, 20, True), (2, 2, 6, 32, 24, False),
                                                    (3, 3, 3, 16, 16, False)])
def test_fused_decode_equals_the_unfused_kernels(T, Hk, Hv, Dk, Dv, prefetch):
    """Same rounding points and operation order as the three launches it replaces: a plain decode
    step (fused) and a verify round (unfused ops) give the same tokens."""
    case = _case(T, Hk, Hv, Dk, Dv, seed=T + 40)
    u_out, u_cs, u_st = _unfused_kernels(case, Hk)
    out, cs, st = _run(case, Hk, True, PREFETCH=prefetch)
    torch.testing.assert_close(cs, u_cs, atol=0, rtol=0)
    if DEV == "cpu":  # the interpreter: bit for bit
        assert torch.equal(st, u_st) and torch.equal(out, u_out)
    torch.testing.assert_close(st, u_st, atol=1e-6, rtol=1e-5)  # GPU: reductions may order differently
    torch.testing.assert_close(out.float(), u_out.float(), atol=1e-2, rtol=1e-2)
    assert (out != u_out).float().mean() < 0.02  # bf16 outputs: at most a rare last-bit flip


def test_reference_is_the_unfused_composition():
    """The fused reference = conv1d -> split -> gated_delta_rule -> gated_rmsnorm (their own references)."""
    Hk, Hv, Dk, Dv = 2, 6, 32, 24
    c = _case(3, Hk, Hv, Dk, Dv, seed=11)
    conv, cs = conv_ref.conv1d(c["x"], c["conv_weight"], c["conv_state"], c["positions"], c["slots"])
    q, k, v = torch.split(conv, [Hk * Dk, Hk * Dk, Hv * Dv], 1)
    o, st = reference.gated_delta_rule(q.reshape(3, Hk, Dk), k.reshape(3, Hk, Dk), v.reshape(3, Hv, Dv),
                                       c["g"], c["beta"], c["state"], c["positions"], c["slots"], scale=Dk ** -0.5)
    out = norm_ref.gated_rmsnorm(o, c["z"], c["norm_weight"], 1e-6)
    got = _ref(c, Hk)
    for a, b in zip(got, (out, cs, st)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_bad_inputs_are_one_line_route_errors():
    c = _case(2, 2, 4, 16, 16)
    d = dict(c)
    out = torch.empty(2, 64, dtype=torch.bfloat16)
    with pytest.raises(RouteError, match="not a multiple of key_heads"):
        launch_fused.gdn_decode_fused(**d, out=out, key_heads=3, scale=0.25)
    with pytest.raises(RouteError, match="conv input width"):
        launch_fused.gdn_decode_fused(**{**d, "x": d["x"][:, :-1]}, out=out, key_heads=2, scale=0.25)
    with pytest.raises(RouteError, match="inside one input part"):
        x = d.pop("x")
        launch_fused.gdn_decode_fused(**d, x0=x[:, :20], x1=x[:, 20:], out=out, key_heads=2, scale=0.25)
    with pytest.raises(RouteError, match="missing operand"):
        launch_fused.gdn_decode_fused(x=x, out=out, key_heads=2)


def test_launcher_takes_every_spec_attribute():
    names = set(inspect.signature(launch_fused.gdn_decode_fused).parameters)
    assert {"key_heads", "scale", "l2_eps", "eps", "activation", "num_warps", "x0", "x1", "x2"} <= names


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 3, 8])
@pytest.mark.parametrize("num_warps,prefetch", [(8, True), (16, True), (4, False), (8, False)])
def test_fused_decode_27b_shape_gpu(T, num_warps, prefetch):
    """qwen3.6-27b's GDN: Hk 16, Hv 48, Dk = Dv = 128, C = 10240."""
    case = _case(T, 16, 48, 128, 128, seed=T)
    r_out, r_cs, r_st = _ref(case, 16)
    out, cs, st = _run(case, 16, True, num_warps=num_warps, PREFETCH=prefetch)
    assert _rel_rms(out, r_out) < 1e-2
    torch.testing.assert_close(cs, r_cs.bfloat16(), atol=0, rtol=0)
    assert _rel_rms(st, r_st) < 2e-3
    u_out, u_cs, u_st = _unfused_kernels(case, 16)
    torch.testing.assert_close(st, u_st, atol=1e-4, rtol=1e-4)  # GPU reductions may order differently
    torch.testing.assert_close(out.float(), u_out.float(), atol=2e-2, rtol=2e-2)
