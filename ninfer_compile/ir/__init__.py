"""Graph IR: op and tensor types, the graph container, lowering, verifier, printers, executor."""

from .graph import Graph
from .types import DTYPE_BYTES, Extent, Op, RouteChoice, RowView, TensorType

__all__ = ["DTYPE_BYTES", "Extent", "Graph", "Op", "RouteChoice", "RowView", "TensorType"]
