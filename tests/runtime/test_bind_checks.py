"""The runtime binds exactly a launch's `bind` list, and refuses (at load, one line naming the
extent, the launch index, the route and the argument) a list that does not match the route's
argument list recorded in kernels/manifest.json: a renamed, extra, missing or wrongly-kinded
argument, a constexpr set the kernels were not emitted for, a workspace over the extent's, an
operand other than the launch's."""

from __future__ import annotations

import json
import shutil

import pytest

import ninfer_runtime as nr
from ninfer_runtime.errors import PlanError

from . import support as S


def _gdn_launch(pj):
    # a decode one, else prefill's
    for phase in ("decode", "prefill"):
        for ext, x in sorted(pj["extents"].items()):
            if x["phase"] != phase:
                continue
            for i, L in enumerate(x["launches"]):
                if L["kind"] == "gated_delta_rule":
                    return ext, i, L
    raise AssertionError("no gated_delta_rule launch")


def _refused(tiny_plan, tmp_path, edit) -> tuple[str, str]:
    art, plan = tiny_plan
    d = tmp_path / "plan"
    shutil.copytree(plan, d)
    pj = json.loads((d / "plan.json").read_text())
    ext, i, L = _gdn_launch(pj)
    edit(L, pj["extents"][ext])
    S.seal_plan_dir(d, pj)
    with pytest.raises(PlanError) as e:
        nr.load(d, art, progress=False)
    msg = str(e.value)
    assert "\n" not in msg
    return msg, f"extent {ext}: launch {i} ({L['op']}, route {L['route']}): argument "


def _by(L, arg):
    return next(b for b in L["bind"] if b["arg"] == arg)


def test_renamed_argument(tiny_plan, tmp_path):
    msg, where = _refused(tiny_plan, tmp_path, lambda L, x: _by(L, "out").update(arg="o"))
    assert msg.startswith(where + "'o' is not an argument of the route's launcher"), msg


def test_extra_argument(tiny_plan, tmp_path):
    msg, where = _refused(tiny_plan, tmp_path, lambda L, x: L["bind"].append({"arg": "bogus", "scalar": 1}))
    assert msg.startswith(where + "'bogus' is not an argument"), msg


def test_missing_argument(tiny_plan, tmp_path):
    msg, where = _refused(tiny_plan, tmp_path, lambda L, x: L["bind"].remove(_by(L, "l2_eps")))
    assert msg.startswith(where + "'l2_eps' of the route's launcher is not bound"), msg


def test_argument_of_the_wrong_kind(tiny_plan, tmp_path):
    def edit(L, x):
        b = _by(L, "scale")
        del b["scalar"]
        b["buffer"] = _by(L, "q")["buffer"]
    msg, where = _refused(tiny_plan, tmp_path, edit)
    assert msg.startswith(where + "'scale' is bound as buffer, the launcher takes a scalar"), msg


def test_argument_bound_twice(tiny_plan, tmp_path):
    msg, where = _refused(tiny_plan, tmp_path, lambda L, x: L["bind"].append(dict(_by(L, "scale"))))
    assert msg.startswith(where + "'scale' is bound twice"), msg


def test_constexpr_not_emitted(tiny_plan, tmp_path):
    msg, where = _refused(tiny_plan, tmp_path, lambda L, x: _by(L, "block_v").update(constexpr=128))
    assert msg.startswith(where + "'block_v': constexprs"), msg


def test_operand_other_than_the_launch_s(tiny_plan, tmp_path):
    msg, where = _refused(tiny_plan, tmp_path, lambda L, x: _by(L, "q").update(buffer=_by(L, "k")["buffer"]))
    assert msg.startswith(where + "'q' binds"), msg


def test_workspace_over_the_extent_s(tiny_plan, tmp_path):
    art, plan = tiny_plan
    d = tmp_path / "plan"
    shutil.copytree(plan, d)
    pj = json.loads((d / "plan.json").read_text())
    ext, i, L = next((e, i, L) for e, x in sorted(pj["extents"].items()) for i, L in enumerate(x["launches"])
                     if any(b.get("workspace") for b in L.get("bind", [])))
    need = next(b["workspace"] for b in L["bind"] if "workspace" in b)
    assert pj["extents"][ext]["workspace"]["numel"] == need  # the tiny plan: one launch sets it
    pj["extents"][ext]["workspace"]["numel"] = need - 1
    S.seal_plan_dir(d, pj)
    with pytest.raises(PlanError) as e:
        nr.load(d, art, progress=False)
    assert str(e.value) == (f"extent {ext}: launch {i} ({L['op']}, route {L['route']}): argument 'workspace' needs "
                            f"{need} elements, the extent's workspace has {need - 1}")


def test_the_valid_plan_binds_the_list_exactly(tiny_plan):
    """Every routed launch's bound kwargs are exactly its bind list's arguments (no extras)."""
    art, plan = tiny_plan
    pj = json.loads((plan / "plan.json").read_text())
    with nr.load(plan, art, progress=False) as eng:
        for name, r in eng.extents.items():
            routed = [L for L in pj["extents"][name]["launches"] if L["route"]]
            bound = [b for b in r.bound() if b.route]
            assert [b.op for b in bound] == [L["op"] for L in routed]
            for b, L in zip(bound, routed):
                assert list(b.kwargs) == [x["arg"] for x in L["bind"]], (name, L["op"])
                for x in L["bind"]:
                    if "scalar" in x:
                        assert b.kwargs[x["arg"]] == x["scalar"]
