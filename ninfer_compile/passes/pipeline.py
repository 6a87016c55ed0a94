"""The pass pipeline: one flat, ordered list. Every pass has an off switch (`--disable-pass NAME`);
the verifier runs after lowering and after every pass; `dump_dir` receives the graph after each
phase as `<extent>/NN-<phase>.{txt,yaml,dot}` (00 = lowering)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import CompileError
from ..ir.graph import Graph
from ..ir.verify import verify
from . import (bind_weights, fuse, plan_cuda_graphs, plan_dependent_launch, plan_memory, select_routes,
               shard_tensor_parallel)
from .context import PassContext

PassFn = Callable[[Graph, PassContext], Graph]

PIPELINE: list[tuple[str, PassFn]] = [
    ("bind_weights", bind_weights.run),
    ("shard_tensor_parallel", shard_tensor_parallel.run),  # --tp N: rank r's graph (N = 1: unchanged)
    ("fuse", fuse.run),
    ("select_routes", select_routes.run),
    ("plan_memory", plan_memory.run),
    ("plan_cuda_graphs", plan_cuda_graphs.run),
    ("plan_dependent_launch", plan_dependent_launch.run),
]

PASS_NAMES = tuple(name for name, _ in PIPELINE)
# Passes that apply only to some compiles: skipped (not run, numbered, dumped or listed) elsewhere,
# so a compile without tensor parallelism is what it was before the pass existed.
APPLIES: dict[str, Callable[[PassContext], bool]] = {"shard_tensor_parallel": shard_tensor_parallel.applies}


def applicable(ctx: PassContext) -> tuple[str, ...]:
    return tuple(n for n in PASS_NAMES if n not in APPLIES or APPLIES[n](ctx))


def check_disabled(disabled: Iterable[str]) -> frozenset[str]:
    disabled = frozenset(disabled or ())
    unknown = sorted(disabled - set(PASS_NAMES))
    if unknown:
        raise CompileError(f"--disable-pass: unknown pass {unknown[0]} (passes: {', '.join(PASS_NAMES)})")
    return disabled


def run_pipeline(graph: Graph, ctx: PassContext, disabled: Iterable[str] = (),
                 dump_dir: Path | None = None, pipeline: list[tuple[str, PassFn]] | None = None) -> Graph:
    disabled = check_disabled(disabled) if pipeline is None else frozenset(disabled or ())
    steps = PIPELINE if pipeline is None else pipeline
    steps = [(n, f) for n, f in steps if n not in APPLIES or APPLIES[n](ctx)]
    verify(graph, ctx.objects, after="lowering")
    if dump_dir is not None:
        _dump(graph, dump_dir, 0, "lower")
    for i, (name, fn) in enumerate(steps, start=1):
        if name in disabled:
            graph = graph.copy()
            graph.meta.setdefault("disabled", []).append(name)
            continue
        graph = fn(graph, ctx)
        graph.meta["passes"] = [*graph.meta.get("passes", []), name]
        verify(graph, ctx.objects, after=name)
        if dump_dir is not None:
            _dump(graph, dump_dir, i, name)
    return graph


def _dump(graph: Graph, dump_dir: Path, index: int, name: str) -> None:
    from ..ir import printer

    d = Path(dump_dir) / graph.extent.name
    d.mkdir(parents=True, exist_ok=True)
    stem = f"{index:02d}-{name}"
    (d / f"{stem}.txt").write_text(printer.to_text(graph))
    (d / f"{stem}.yaml").write_text(printer.to_yaml(graph))
    (d / f"{stem}.dot").write_text(printer.to_dot(graph))
