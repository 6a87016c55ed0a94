"""The runtime side of programmatic dependent launch: a bound launch of an extent whose plan asks
for it allows PDL exactly around its own call (ninfer_runtime/executor.py Bound; the decision is
the compiler's plan_dependent_launch pass; kernels/pdl.py the launch side)."""

from __future__ import annotations

from ninfer_compile.kernels import pdl
from ninfer_runtime.executor import Bound


def test_bound_allows_pdl_only_around_its_call():
    seen = []

    def fn(**kw):
        seen.append((pdl._ALLOWED[0], kw))

    assert pdl._ALLOWED[0] is False
    Bound("op", "norm", "r", fn, {"x": 1}, pdl)()
    Bound("op", "norm", "r", fn, {"x": 2})()
    assert seen == [(True, {"x": 1}), (False, {"x": 2})]
    assert pdl._ALLOWED[0] is False  # restored

    def boom(**kw):
        raise ValueError("launch failed")

    try:
        Bound("op", "norm", "r", boom, {}, pdl)()
    except ValueError:
        pass
    assert pdl._ALLOWED[0] is False  # restored after a failing launch too


def test_pdl_is_never_on_under_the_interpreter():
    old = pdl.allow(True)
    try:
        assert pdl.enabled() is False  # the suite runs TRITON_INTERPRET=1
    finally:
        pdl.allow(old)
