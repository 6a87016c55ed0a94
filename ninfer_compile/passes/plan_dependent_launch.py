"""plan_dependent_launch — decide which extents launch their kernels with programmatic dependent
launch (PDL, `ninfer_compile/kernels/pdl.py`).

Requires: the CUDA-graph decision (plan_cuda_graphs) and the route table's sm.
Guarantees: `graph.meta["dependent_launch"] = {"enabled": bool, "reason": str}` — enabled for the
  extents captured as CUDA graphs (decode and verify, text and MTP) when the plan's sm is 90 or newer; the runtime then
  launches every PDL-capable kernel of that extent with the attribute (unless NINFER_PDL=0).
  Prefill extents and everything else launch plainly.

Why only the captured decode steps (H200, 27B plan, bf16 KV, one call, NINFER_PDL=1 vs 0, 2026-11-29):
decode C=1/2/4/8 130.4/212.0/397.1/703.8 vs 122.6/204.6/387.4/709.9 tok/s (a decode step is ~740
launches and PDL overlaps each launch with the previous kernel's tail), while eager prefill lost 6%
(1K/4K/16K: 7,398/7,413/7,273 vs 7,879/7,850/7,322 tok/s). Disable with
`--disable-pass plan_dependent_launch`.
"""

from __future__ import annotations

from ..ir.graph import Graph
from .context import PassContext

NAME = "plan_dependent_launch"
MIN_SM = 90  # griddepcontrol: Hopper and newer


def run(graph: Graph, ctx: PassContext) -> Graph:
    out = graph.copy()
    sm = getattr(ctx.table, "sm", None)
    captured = bool((graph.meta.get("cuda_graph") or {}).get("capture"))
    if sm is None or int(sm) < MIN_SM:
        dl = {"enabled": False, "reason": f"sm {sm} < {MIN_SM}: no programmatic dependent launch"}
    elif not captured:
        dl = {"enabled": False, "reason": "not a CUDA-graph extent (eager prefill measured slower with PDL)"}
    else:
        dl = {"enabled": True, "reason": f"CUDA-graph {graph.extent.phase} extent on sm >= 90: launches overlap the "
                                         f"previous kernel's tail"}
    out.meta["dependent_launch"] = dl
    return out
