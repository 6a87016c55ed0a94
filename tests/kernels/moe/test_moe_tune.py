"""The MoE families' tuner share (kernels/moe/tune.py) on tiny shapes under the interpreter: the
builders' operands and reference checks, the routing draws, the route domains the tuner's plan
respects (the decode route only to T 16) and a check that fails when a route routes wrongly."""

from __future__ import annotations

import pytest
import torch

from ninfer_compile.kernels.moe import launch as L
from ninfer_compile.kernels.moe import tune as MT
from ninfer_compile.kernels.registry import get_route
from ninfer_compile.kernels.tuning import tune_spec
from ninfer_compile.tune import measure as M
from ninfer_compile.tune.plan import candidates_for
from ninfer_compile.tune.shapes import MatchCase

E, H, I, K = 8, 96, 32, 2


@pytest.fixture
def device(monkeypatch):
    monkeypatch.setattr(M, "DEVICE", None if torch.cuda.is_available() else "cpu")


def _experts_case(gu="Q4G64_F16S", dn="Q6G64_F16S"):
    return MatchCase("moe_experts", {"format": gu, "n": E * 2 * I, "k": H},
                     {"x": (1, H), "expert_ids": (1, K), "gate_up": (E * 2 * I, H), "down": (E * H, I)},
                     dtypes={"gate_up": gu, "down": dn})


def _router_case():
    return MatchCase("moe_router", {"format": "BF16", "n": E + 1, "k": H},
                     {"x": (1, H), "weight": (E + 1, H), "out:expert_ids": (1, K)}, {"top_k": K})


def test_routing_draws_are_distinct_per_token_and_skew_onto_the_hot_experts():
    gen = torch.Generator().manual_seed(0)
    ids, w, gate = MT.routing_draw(64, 40, 8, gen, "cpu")
    assert ids.dtype == torch.int32 and ids.shape == (64, 8) and gate.shape == (64,)
    assert all(len(set(r)) == 8 for r in ids.tolist()) and torch.allclose(w.sum(-1), torch.ones(64))
    hot = torch.tensor([3, 7, 11, 19, 23, 31])
    ids, _, _ = MT.routing_draw(64, 40, 8, gen, "cpu", hot=hot, hot_slots=4)
    assert all(len(set(r)) == 8 and len(set(r) & set(hot.tolist())) == 4 for r in ids.tolist())
    assert len({tuple(r[:4]) for r in ids.tolist()}) > 1  # hot picks are not always in the first slots
    assert MT.expected_hits(1, 256, 8) == pytest.approx(8) and MT.expected_hits(64, 256, 8) < 256


def test_the_plan_times_the_decode_route_only_inside_its_domain():
    case = _experts_case()
    names = lambda t: {r.name for r, _ in candidates_for(case, t, quick=False)}  # noqa: E731
    assert names(16) == {"moe_experts_gemv", "moe_experts_grouped_gemm"}
    assert names(17) == {"moe_experts_grouped_gemm"}
    assert tune_spec("moe_experts").tunable and tune_spec("moe_router").tunable
    assert MT.experts_variant({}, {"down": "Q5G64_F16S"}, {}) == "down Q5G64_F16S"


def test_experts_builder_checks_both_routes_and_fails_on_wrong_routing(device, monkeypatch):
    """Both routes' defaults pass the builder's check at T 5 (Q4 gate_up, Q6 down: the case's
    variant format); a launcher that routes every pair to the next expert fails it."""
    case = _experts_case()
    bench = M.build(case, 5, copies=2)
    assert bench.copies == 2 and bench.cold_bytes > 0
    assert bench.keep[0][0][1].format == "Q6G64_F16S"
    for name in ("moe_experts_gemv", "moe_experts_grouped_gemm"):
        assert len(bench.launches(get_route(name), {})) == 2
        assert bench.check(get_route(name), {}) < tune_spec("moe_experts").tol, name
    real = L.moe_experts_grouped_gemm

    def misrouted(x, expert_ids, *args, **kw):
        real(x, (expert_ids + 1) % E, *args, **kw)

    monkeypatch.setattr(L, "moe_experts_grouped_gemm", misrouted)
    assert bench.check(get_route("moe_experts_grouped_gemm"), {}) > 0.1


def test_router_builder_checks_its_candidates(device):
    bench = M.build(_router_case(), 5, copies=2)
    route = get_route("moe_router_split")
    assert bench.copies == 2 and bench.cold_bytes == (E + 1) * H * 2
    for params in M.param_candidates(route, 5, quick=True):
        assert bench.check(route, params) < tune_spec("moe_router").tol, params
