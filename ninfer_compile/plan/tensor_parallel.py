"""A `--tp N` plan: one section per rank (passes/shard_tensor_parallel.py rewrote each rank's graphs).

plan.json keeps every member a one-GPU plan has except `extents`, `memory` and `buffers`, which move
into `tensor_parallel.ranks[r]` = {rank, extents, memory, buffers} (the rank's launches with their
bindings and weight shards, its memory report, its arena and per-slot state); `tensor_parallel` also
says `degree` N and the process `group` the collectives name. `options.tp` = N. A `--tp 1` plan has
none of this (byte for byte the plan of a compiler without tensor parallelism).
`rank_view(plan, r)` is the one-GPU-shaped plan a rank runs (the runtime has its own copy of it:
ninfer_runtime/tensor_parallel.py); memory.txt holds one report per rank.
"""

from __future__ import annotations

from typing import Any

from ..kernels.collective.spec import GROUP
from .memory import MemoryReport, report_text

RANK_MEMBERS = ("extents", "memory", "buffers")


def join_ranks(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    """The rank manifests (same compile, rank r's graphs each) as one plan with a section per rank."""
    base = {k: v for k, v in manifests[0].items() if k not in RANK_MEMBERS}
    base["used_routes"] = sorted({r for m in manifests for r in m.get("used_routes", [])})
    base["options"] = {**base["options"], "tp": len(manifests)}
    base["tensor_parallel"] = {
        "degree": len(manifests), "group": GROUP,
        "ranks": [{"rank": r, **{k: m[k] for k in RANK_MEMBERS}} for r, m in enumerate(manifests)],
    }
    return base


def rank_view(plan: dict[str, Any], rank: int) -> dict[str, Any]:
    """The plan of one rank, shaped like a one-GPU plan (a plan without sections is its own view)."""
    tp = plan.get("tensor_parallel")
    if not tp:
        return plan
    out = {k: v for k, v in plan.items() if k != "tensor_parallel"}
    out.update({k: tp["ranks"][rank][k] for k in RANK_MEMBERS})
    return out


def memory_text(reports: list[MemoryReport], budget_gib: float | None) -> str:
    """memory.txt of a --tp N plan: the per-card budget applies to every rank's report."""
    n = len(reports)
    parts = [f"tensor parallel: {n} ranks, one GPU each; every figure below is per card"
             + (f" (--memory-budget {budget_gib:g} GiB per card)" if budget_gib is not None else "") + "\n"]
    for r, rep in enumerate(reports):
        parts.append(f"\n== rank {r} of {n} ==\n" + report_text(rep, budget_gib))
    return "".join(parts)
