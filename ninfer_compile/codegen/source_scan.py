"""Small readings of a Python module's source (no import): what kernel emission checks of the
torch implementations it copies into a plan (codegen/emit.py)."""

from __future__ import annotations

import ast
import functools

__all__ = ["defines_name", "parse", "triton_import_line"]


@functools.lru_cache(maxsize=256)
def parse(source: str) -> ast.Module:
    """`ast.parse(source)`, once per text (emission reads each module's tree several times; the
    readers here never modify it)."""
    return ast.parse(source)


def defines_name(source: str, name: str) -> bool:
    """Whether a module's top level binds `name` (def, class, assignment or import)."""
    for node in parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name for a in node.names):
            return True
    return False


@functools.lru_cache(maxsize=512)
def triton_import_line(source: str) -> int | None:
    """The line of the first `import triton...` / `from triton... import` of a module, or None."""
    for node in ast.walk(parse(source)):
        mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
        if any(m == "triton" or m.startswith("triton.") for m in mods):
            return node.lineno
    return None
