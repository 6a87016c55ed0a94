"""Explicit launch bindings (issue 11 §2): each routed launch lists its launcher's arguments,
written from the family spec; every launcher's signature IS that list; an attribute or operand
nothing consumes is a compile error naming extent, op and attribute."""

from __future__ import annotations

import inspect
import re

import pytest

from ninfer_compile.codegen.emit import route_arguments
from ninfer_compile.errors import CompileError
from ninfer_compile.ir.graph import Graph
from ninfer_compile.ir.types import Extent, Op, RouteChoice, TensorType
from ninfer_compile.kernels.family import family_spec
from ninfer_compile.kernels.registry import default_registry
from ninfer_compile.plan.manifest import extent_entry, launch_bind

# Families whose launchers do not follow their spec yet, with who makes them (delete when done).
NOT_YET: dict[str, str] = {}


def _routes():
    return sorted((r for r in default_registry.all_routes() if r.launcher), key=lambda r: r.name)


@pytest.mark.parametrize("route", _routes(), ids=lambda r: r.name)
def test_launcher_signature_is_the_spec_argument_list(route):
    """Signature inspection is fine in a test: the runtime never inspects, it binds the plan's list."""
    if route.family in NOT_YET:
        pytest.skip(NOT_YET[route.family])
    args = route_arguments(route)
    assert args is not None, f"family {route.family} has no spec"
    params = inspect.signature(route.load_launcher()).parameters
    assert not any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in params.values()), \
        f"{route.name}: the launcher's signature must list its arguments"
    names = set(params)
    expected = {a["name"] for a in args}
    spec = family_spec(route.family)
    # an operand given as parts is also bound as <name>0 .. <name>{parts-1}: exactly those, all optional
    extra_parts = {f"{o.name}{i}" for o in spec.operands for i in range(o.parts)}
    assert names == expected | extra_parts, (route.name, sorted(names ^ (expected | extra_parts)))
    for n in extra_parts:
        assert params[n].default is None, (route.name, n)
    for a in args:  # an optional operand may be left out; the plan always binds every route param
        if a["optional"]:
            assert params[a["name"]].default is None, (route.name, a["name"])


def test_route_arguments_order_and_kinds():
    r = default_registry.get_route("gdn_chunked_prefill")
    args = route_arguments(r)
    assert [a["name"] for a in args] == ["q", "k", "v", "g", "beta", "state", "positions", "slots", "out",
                                         "state_columns", "scale", "l2_eps", "block_v", "chunk", "workspace"]
    kinds = {a["name"]: a["kinds"] for a in args}
    assert kinds["state"] == ["state"] and kinds["scale"] == ["scalar"] and kinds["chunk"] == ["constexpr"]
    assert kinds["workspace"] == ["workspace"]
    assert not any(a["name"] == "workspace" for a in route_arguments(default_registry.get_route("gdn_recurrent_decode")))


# ----------------------------------------------------------------------------- one tiny graph

def _gdn_graph(attrs=None, extra_input=None, route="gdn_chunked_prefill", t=8):
    g = Graph(Extent(name=f"prefill_t{t}", phase="prefill", t=t))
    T, Hk, Hv, Dk, Dv = t, 1, 2, 16, 16
    act = {"q": (T, Hk, Dk), "k": (T, Hk, Dk), "v": (T, Hv, Dv), "g": (T, Hv), "beta": (T, Hv),
           "o": (T, Hv, Dv)}
    for n, shape in act.items():
        g.add_tensor(TensorType(name=n, shape=shape, dtype="f32" if n in ("g", "beta") else "bf16",
                                role="activation"))
    for n in ("positions", "slots"):
        g.add_tensor(TensorType(name=n, shape=(T,), dtype="i32", role="input"))
    for v in ("s@0", "s@1"):
        g.add_tensor(TensorType(name=v, shape=(1, Hv, Dk, Dv), dtype="f32", role="state", buffer="s@0"))
    ins = {"q": "q", "k": "k", "v": "v", "g": "g", "beta": "beta", "state": "s@0", "positions": "positions",
           "slots": "slots"}
    if extra_input:
        g.add_tensor(TensorType(name="extra", shape=(T, Hv), dtype="f32", role="activation"))
        ins[extra_input] = "extra"
    op = Op(name="l0.delta_rule", kind="gated_delta_rule", inputs=ins, outputs={"out": "o", "state": "s@1"},
            attrs={"scale": 0.25, "l2_eps": 1e-3, **(attrs or {})},
            route=RouteChoice(route=route, params={"block_v": 16}, source="test.yaml:1", t_range=(1, None)))
    g.add_op(op)
    return g, op


def test_bind_carries_launcher_attributes_params_and_workspace():
    g, op = _gdn_graph()
    bind = launch_bind(g, op)
    by = {b["arg"]: b for b in bind}
    assert by["scale"] == {"arg": "scale", "scalar": 0.25} and by["l2_eps"] == {"arg": "l2_eps", "scalar": 1e-3}
    assert by["state"] == {"arg": "state", "state": "s@0"}  # an updated state: one argument
    assert by["out"] == {"arg": "out", "buffer": "o"}
    assert by["block_v"]["constexpr"] == 16 and by["chunk"]["constexpr"] == 64  # defaults overlaid
    assert by["workspace"]["workspace"] == 8 * 2 * (16 + 16 + 1)
    assert [b["arg"] for b in bind][-1] == "workspace"


def test_extent_workspace_is_the_max_of_its_launches():
    g, op = _gdn_graph(route="gdn_chunked_wy_prefill")
    e = extent_entry(g)
    ws = [b["workspace"] for L in e["launches"] for b in L["bind"] if "workspace" in b]
    assert e["workspace"] == {"numel": max(ws), "dtype": "f32"} and max(ws) > 0


def test_unconsumed_attribute_is_a_compile_error():
    g, op = _gdn_graph(attrs={"chunk_hint": 3})
    with pytest.raises(CompileError) as e:
        launch_bind(g, op)
    msg = str(e.value)
    assert msg.startswith("extent prefill_t8: op l0.delta_rule (gated_delta_rule): attribute 'chunk_hint'")
    assert "nothing in the compiler consumes it" in msg and "\n" not in msg


def test_unconsumed_operand_is_a_compile_error():
    g, op = _gdn_graph(extra_input="bias")
    with pytest.raises(CompileError, match=r"^extent prefill_t8: op l0\.delta_rule \(gated_delta_rule\): input operand "
                                           r"'bias' is not declared by family gated_delta_rule"):
        launch_bind(g, op)


def test_inout_state_must_be_one_buffer():
    g, op = _gdn_graph()
    g.set_tensor(g.tensors["s@1"].model_copy(update={"buffer": "other"}))
    with pytest.raises(CompileError, match="updated operand state: its output is not the buffer of its input"):
        launch_bind(g, op)
