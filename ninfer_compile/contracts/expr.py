"""Shape expressions: + - * // and parentheses over dimension names and integers. A tiny
recursive-descent parser instead of eval(): contracts are data and must not execute code."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Optional, Union

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(//|[-+*()]))")


class ExpressionError(ValueError):
    """A shape expression is malformed, names an unknown dimension, or divides by zero."""


@dataclass(frozen=True)
class ShapeExpr:
    """A parsed shape expression. `tree` is a nested tuple: ("int", n) | ("dim", name) |
    ("neg", x) | (op, left, right) with op in + - * //."""

    text: str
    tree: tuple

    @property
    def names(self) -> frozenset[str]:
        """Dimension names the expression refers to."""
        found: set[str] = set()

        def walk(node: tuple) -> None:
            if node[0] == "dim":
                found.add(node[1])
            elif node[0] != "int":
                for child in node[1:]:
                    walk(child)

        walk(self.tree)
        return frozenset(found)

    def evaluate(self, dims: dict[str, int]) -> int:
        def ev(node: tuple) -> int:
            tag = node[0]
            if tag == "int":
                return node[1]
            if tag == "dim":
                if node[1] not in dims:
                    known = ", ".join(sorted(dims)) or "none"
                    raise ExpressionError(
                        f"unknown dimension {node[1]!r} in {self.text!r} (known: {known})"
                    )
                return dims[node[1]]
            if tag == "neg":
                return -ev(node[1])
            left, right = ev(node[1]), ev(node[2])
            if tag == "+":
                return left + right
            if tag == "-":
                return left - right
            if tag == "*":
                return left * right
            if right == 0:
                raise ExpressionError(f"division by zero in {self.text!r}")
            return left // right

        return ev(self.tree)


@functools.lru_cache(maxsize=None)
def parse_expr(text: str) -> ShapeExpr:
    """Parse one expression (cached: the 27B inventory reuses a few dozen expressions)."""
    tokens: list[tuple[str, Any]] = []
    pos = 0
    stripped = text.rstrip()
    while pos < len(stripped):
        m = _TOKEN.match(stripped, pos)
        if not m or m.end() == pos:
            raise ExpressionError(f"bad expression {text!r}: unexpected {stripped[pos:].strip()[:10]!r}")
        number, name, op = m.groups()
        if number is not None:
            tokens.append(("int", int(number)))
        elif name is not None:
            tokens.append(("dim", name))
        else:
            tokens.append(("op", op))
        pos = m.end()
    if not tokens:
        raise ExpressionError("empty expression")

    index = 0

    def peek() -> Optional[tuple[str, Any]]:
        return tokens[index] if index < len(tokens) else None

    def take() -> tuple[str, Any]:
        nonlocal index
        tok = peek()
        if tok is None:
            raise ExpressionError(f"bad expression {text!r}: ends too early")
        index += 1
        return tok

    def expr() -> tuple:
        node = term()
        while (tok := peek()) in (("op", "+"), ("op", "-")):
            take()
            node = (tok[1], node, term())
        return node

    def term() -> tuple:
        node = factor()
        while (tok := peek()) in (("op", "*"), ("op", "//")):
            take()
            node = (tok[1], node, factor())
        return node

    def factor() -> tuple:
        tok = take()
        if tok[0] in ("int", "dim"):
            return tok
        if tok == ("op", "-"):
            return ("neg", factor())
        if tok == ("op", "("):
            node = expr()
            if take() != ("op", ")"):
                raise ExpressionError(f"bad expression {text!r}: missing ')'")
            return node
        raise ExpressionError(f"bad expression {text!r}: unexpected {tok[1]!r}")

    tree = expr()
    if index != len(tokens):
        raise ExpressionError(f"bad expression {text!r}: unexpected {tokens[index][1]!r}")
    return ShapeExpr(text=text, tree=tree)


def validate_expr(value: Any) -> Union[int, str]:
    # bool is an int subclass; `true` in a shape is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"expected an integer or an expression string, got {type(value).__name__}")
    if isinstance(value, str):
        try:
            parse_expr(value)
        except ExpressionError as exc:
            raise ValueError(str(exc)) from None
    return value


def as_expr(value: Union[int, str]) -> ShapeExpr:
    return parse_expr(str(value)) if isinstance(value, str) else ShapeExpr(str(value), ("int", value))
