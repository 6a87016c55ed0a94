"""bind_weights — resolve every logical weight to an artifact object or a fused row view.

Requires: a lowered graph whose weights carry `logical` (an object name of the contract) and, for
  a role of a fused parent, `logical_rows` (role, default rows from the dimensions).
Guarantees: every weight tensor has `object` (the stored parent), `format` (= its dtype) and, for
  a role, `view` = RowView(parent, row_begin, row_count) taken from the contract's views; the
  object exists in the artifact directory with the contract's shape and format (when a directory
  is given) and the view lies inside it. Aliases of the contract resolve to their targets.
"""

from __future__ import annotations

from ..errors import CompileError
from ..ir.graph import Graph
from ..ir.types import RowView
from .context import PassContext

NAME = "bind_weights"


def run(graph: Graph, ctx: PassContext) -> Graph:
    out = graph.copy()
    spec = ctx.spec
    expected = getattr(spec, "objects", None) or {}
    aliases = getattr(spec, "aliases", None) or {}
    for t in list(out.tensors.values()):
        if t.role != "weight" or t.object is not None:
            continue
        name = t.logical
        name = aliases.get(name, name) if name not in expected else name
        if isinstance(name, tuple):  # an alias to a view is (parent, role)
            name = name[0]
        exp = expected.get(name)
        if exp is None:
            raise CompileError(f"{NAME}: {graph.extent.name}: {t.name}: the contract has no object {name}")
        fmt = exp.format
        shape = tuple(exp.shape)
        if ctx.objects is not None:
            obj = ctx.objects.get(name)
            if obj is None:
                raise CompileError(f"{NAME}: artifact has no object {name} (needed by {t.name})")
            if getattr(obj, "kind", "tensor") != "tensor":
                raise CompileError(f"{NAME}: artifact object {name} is a {obj.kind}, not a tensor")
            if obj.format != fmt or tuple(obj.shape) != shape:
                raise CompileError(f"{NAME}: artifact object {name} is {obj.format} {list(obj.shape)}, "
                                   f"the contract says {fmt} {list(shape)}")
        view = None
        if t.logical_rows is not None:
            _, begin, count = t.logical_rows
            if begin < 0 or count < 1 or begin + count > shape[0]:
                raise CompileError(f"{NAME}: {t.name}: rows [{begin},{begin + count}) outside {name} {list(shape)}")
            view = RowView(parent=name, row_begin=begin, row_count=count)
            want = (count, *shape[1:])
        else:
            want = shape
        if tuple(t.shape) != want:
            raise CompileError(f"{NAME}: {t.name}: lowered shape {list(t.shape)} != bound {list(want)}")
        out.set_tensor(t.model_copy(update={"object": name, "view": view, "format": fmt, "dtype": fmt}))
    return out
