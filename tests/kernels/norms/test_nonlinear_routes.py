"""The non-linear route families register loadable routes with the declared domains."""

import pytest

from ninfer_compile.kernels.registry import default_registry, load_callable

FAMILIES = {"rmsnorm", "head_rmsnorm", "gated_rmsnorm", "rope", "qk_norm_rope", "conv1d",
            "gdn_gating", "gated_delta_rule", "attention", "kv_append", "embedding", "sampling"}


def _routes():
    return [r for r in default_registry.all_routes() if r.family in FAMILIES]


def test_every_family_has_routes():
    assert {r.family for r in _routes()} == FAMILIES


@pytest.mark.parametrize("route", _routes(), ids=lambda r: r.name)
def test_route_callables_load(route):
    assert callable(route.load_reference())
    assert callable(route.load_launcher())
    for k in route.kernels:
        load_callable(k)


@pytest.mark.parametrize("name,max_t", [("gdn_recurrent_decode", 64), ("conv1d_decode", 64),
                                        ("attention_decode_splitkv", 128)])  # 128: verify extents too
def test_decode_routes_are_t_limited(name, max_t):
    r = default_registry.get_route(name)
    assert r.domain.max_t == max_t
    assert r.covers(1, max_t, {"phase": "decode", "kv_dtype": "bf16"}) is None
    assert "exceeds" in r.covers(1, max_t + 1, {"phase": "decode", "kv_dtype": "bf16"})


def test_prefill_routes_take_any_t():
    for name in ("gdn_chunked_prefill", "attention_prefill_flash", "conv1d_prefill"):
        r = default_registry.get_route(name)
        assert r.covers(1, None, {"phase": "prefill", "kv_dtype": "int8_g64"}) is None
