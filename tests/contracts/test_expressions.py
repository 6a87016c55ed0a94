"""The shape-expression language: + - * // ( ) over dimension names and integers, no eval()."""

import pytest

from ninfer_compile.contracts import ExpressionError, parse_expr

DIMS = {"attn_heads": 24, "head_dim": 256, "kv_heads": 4, "hidden": 5120, "intermediate": 17408}


@pytest.mark.parametrize("text, value", [
    ("attn_heads*head_dim + kv_heads*head_dim", 7168),
    ("2*(attn_heads*head_dim + kv_heads*head_dim)", 14336),
    ("2*attn_heads*head_dim + kv_heads*head_dim", 13312),
    ("hidden // 128", 40),
    ("hidden - 1 - 1", 5118),          # left-associative
    ("-(2 - 5)", 3),
    ("7", 7),
    ("  ( ( hidden ) )  ", 5120),
    ("intermediate//3*3", 17406),      # // and * share precedence, left to right
])
def test_evaluates(text, value):
    assert parse_expr(text).evaluate(DIMS) == value


def test_names():
    assert parse_expr("2*(attn_heads*head_dim + kv_heads)").names == {"attn_heads", "head_dim", "kv_heads"}


@pytest.mark.parametrize("text", ["", "hidden +", "(hidden", "hidden)", "hidden ** 2", "hidden / 2",
                                  "hidden 2", "__import__('os')", "hidden.real", "1e3"])
def test_rejects_malformed(text):
    with pytest.raises(ExpressionError):
        parse_expr(text)


def test_unknown_dimension_and_division_by_zero():
    with pytest.raises(ExpressionError, match="unknown dimension 'hiden'"):
        parse_expr("hiden*2").evaluate(DIMS)
    with pytest.raises(ExpressionError, match="division by zero"):
        parse_expr("hidden // (kv_heads - 4)").evaluate(DIMS)
