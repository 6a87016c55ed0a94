"""Small helpers for the families' `spec.py` check hooks (no torch / triton imports).

A check hook returns a reason string or None; writing it as a sequence of assertions reads better,
so `@checker` turns a `Bad` raised inside the hook (by `eq` or directly) into the returned reason.
"""

from __future__ import annotations

import functools
from typing import Callable

from .family import OpView

# Roles a value operand (not a weight / state) may have: produced by an op, a graph input, or the
# graph's output (e.g. the head's logits).
VALUE = ("activation", "input", "output")
# Roles of an index operand (positions, slots, ids): a graph input, or a value computed from one.
INDEX = ("input", "activation")


class Bad(Exception):
    """A shape rule failed; the message is the verifier's reason."""


def eq(what: str, got, want) -> None:
    if tuple(got) != tuple(want):
        raise Bad(f"{what}: shape {list(got)}, expected {list(want)}")


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def checker(fn: Callable[[OpView], None]) -> Callable[[OpView], str | None]:
    @functools.wraps(fn)
    def hook(view: OpView) -> str | None:
        try:
            fn(view)
        except Bad as exc:
            return str(exc)
        return None
    return hook
