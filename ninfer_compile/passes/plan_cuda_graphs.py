"""plan_cuda_graphs — decide which extents the runtime captures as CUDA graphs.

Requires: memory planned (a captured step must use fixed arena offsets and preallocated state).
Guarantees: `graph.meta["cuda_graph"] = {"capture": bool, "reason": str}` — decode and verify
  extents (text and MTP graphs) are captured (fixed T, launch-bound, replayed every step / round);
  prefill extents are not (chunk lengths vary at the tail and launch overhead is amortised over T
  columns).
"""

from __future__ import annotations

from ..ir.graph import Graph
from .context import PassContext

NAME = "plan_cuda_graphs"


def run(graph: Graph, ctx: PassContext) -> Graph:
    out = graph.copy()
    if graph.extent.phase == "decode":
        cg = {"capture": True, "reason": "decode extent: fixed T, replayed every step"}
    elif graph.extent.phase == "verify":
        cg = {"capture": True, "reason": "verify extent: fixed T = C x (K+1), replayed every round"}
    else:
        cg = {"capture": False, "reason": "prefill extent: run eagerly (launch cost amortised over T)"}
    if "memory" not in out.meta:
        cg = {"capture": False, "reason": "memory not planned (plan_memory disabled)"}
    out.meta["cuda_graph"] = cg
    return out
