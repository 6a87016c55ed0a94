"""Printers: text (one line per op), YAML (full dump), DOT (graphviz)."""

from __future__ import annotations

import json
from typing import Any

import yaml

from .graph import Graph


def _shape(s) -> str:
    return "[" + ",".join(str(d) for d in s) + "]"


def _val(v: Any) -> str:
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def to_text(graph: Graph) -> str:
    e = graph.extent
    lines = [f"graph {e.name} ({e.graph}, {e.phase}, T={e.t}, C={e.concurrency}, K={e.draft_tokens})"
             f" passes={graph.meta.get('passes', [])}"]
    for op in graph.ops():
        ins = ", ".join(f"{k}={graph.tensors[v].ref()}" for k, v in op.inputs.items())
        outs = ", ".join(f"{graph.tensors[v].ref()}:{_shape(graph.tensors[v].shape)} {graph.tensors[v].dtype}"
                         for v in op.outputs.values())
        attrs = " {" + ", ".join(f"{k}: {_val(v)}" for k, v in sorted(op.attrs.items())) + "}" if op.attrs else ""
        route = ""
        if op.route is not None:
            route = f"  # {op.route.route} {_val(op.route.params)} {op.route.source}"
        lines.append(f"  {op.name} = {op.kind}({ins}){attrs} -> {outs}{route}")
    return "\n".join(lines) + "\n"


def to_dict(graph: Graph) -> dict[str, Any]:
    e = graph.extent
    return {
        "extent": e.model_dump(),
        "meta": {k: v for k, v in graph.meta.items() if k != "memory"} | (
            {"arena_bytes": graph.meta["memory"]["arena_bytes"]} if "memory" in graph.meta else {}),
        "tensors": {n: t.model_dump(exclude_none=True, mode="json") for n, t in sorted(graph.tensors.items())},
        "ops": [op.model_dump(exclude_none=True, mode="json") for op in graph.ops()],
    }


def to_yaml(graph: Graph) -> str:
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(to_dict(graph), Dumper=dumper, sort_keys=True, default_flow_style=None, width=120)


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _label(*lines: str) -> str:
    """A DOT label of several lines: each line quoted on its own, joined by DOT's `\\n` escape
    (escaping the joined text would turn the separator into a literal backslash-n)."""
    return '"' + "\\n".join(_q(x)[1:-1] for x in lines) + '"'


def to_dot(graph: Graph) -> str:
    lines = [f"digraph {_q(graph.extent.name)} {{", "  rankdir=TB;", "  node [shape=box, fontsize=10];"]
    for op in graph.ops():
        parts = [op.name, op.kind] + ([op.route.route] if op.route is not None else [])
        lines.append(f"  {_q(op.name)} [label={_label(*parts)}];")
    for u, v, data in sorted(graph.g.edges(data=True)):
        lines.append(f"  {_q(u)} -> {_q(v)} [label={_q(','.join(data['tensors']))}, fontsize=8];")
    lines.append("}")
    return "\n".join(lines) + "\n"
