"""Memory accounting over the compiled extents: weights W, KV cache K, GDN state S, workspace A.

- W: bytes of every artifact object any extent's launches read (a fused parent counted once);
- K: KV cache of every attention layer (text + MTP), all slots, `max_context` positions, in the
  `--kv-dtype` format's buffers (kernels/kv_cache/formats.py: codes + scales; B/token exact);
- S: GDN conv state [slots, kernel-1, C] bf16 and recurrent state [slots, Hv, Dk, Dv] fp32;
- A: the activation arena = max over extents of each extent's high-water mark;
- R: route workspaces — one float32 buffer per extent, sized for the largest need among that
  extent's launches: each route's `Route.workspace` hook (`op_workspace_numel`, e.g. linear split-K
  partials / dequant-GEMM W_hat, split-KV decode attention, chunked GDN prefill, sampling). The plan
  writes the same numbers (`extents.X.workspace.numel`, each launch's `workspace` binding) and the
  runtime allocates what the plan says (tests/runtime/test_runtime_e2e.py checks all three agree).

Speculative plans (--draft-tokens K > 0) add two lines of their own (absent at K = 0):
- M: the MTP head's KV cache (`mtp_kv/*`, per slot like `kv/*`; part of K);
- V: the verify extents' per-column GDN states (`state_columns` + `conv_state_columns` of every
  verify op: arena activations, part of A), per verify extent; the line gives the largest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import CompileError, RouteError
from ..ir.graph import Graph, op_view

GIB = 1 << 30


@dataclass(frozen=True)
class MemoryReport:
    weights: int
    kv: int
    state: int
    workspace: int
    kv_bytes_per_token: int
    slots: int
    max_context: int
    kv_dtype: str
    weight_objects: int
    state_buffers: dict[str, dict[str, Any]] = field(default_factory=dict)
    arena_by_extent: dict[str, int] = field(default_factory=dict)
    route_workspace: int = 0
    route_workspace_by_extent: dict[str, int] = field(default_factory=dict)
    mtp_kv: int = 0  # bytes of mtp_kv/* (included in kv)
    verify_columns_by_extent: dict[str, int] = field(default_factory=dict)  # per-column states (in the arena)

    @property
    def verify_columns(self) -> int:
        """The largest verify extent's per-column state bytes (the arena is a max over extents)."""
        return max(self.verify_columns_by_extent.values(), default=0)

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.state + self.workspace + self.route_workspace

    def to_dict(self) -> dict[str, Any]:
        return {"weights_bytes": self.weights, "kv_bytes": self.kv, "state_bytes": self.state,
                "workspace_bytes": self.workspace, "total_bytes": self.total,
                "kv_bytes_per_token": self.kv_bytes_per_token, "slots": self.slots,
                "max_context": self.max_context, "kv_dtype": self.kv_dtype,
                "weight_objects": self.weight_objects, "arena_by_extent": dict(sorted(self.arena_by_extent.items())),
                "route_workspace_bytes": self.route_workspace,
                "route_workspace_by_extent": dict(sorted(self.route_workspace_by_extent.items())),
                **({"mtp_kv_bytes": self.mtp_kv} if self.mtp_kv else {}),
                **({"verify_columns_bytes": self.verify_columns,
                    "verify_columns_by_extent": dict(sorted(self.verify_columns_by_extent.items()))}
                   if self.verify_columns_by_extent else {})}


def _object_bytes(name: str, objects: Mapping[str, Any] | None, spec) -> int:
    obj = objects.get(name) if objects is not None else None
    if obj is not None and hasattr(obj, "bytes"):
        return int(obj.bytes)
    from ..artifact.formats import encoded_size

    exp = spec.objects[name]
    return int(encoded_size(exp.format, tuple(exp.shape)))


def _shard_bytes(t, objects: Mapping[str, Any] | None, spec) -> int:
    """Bytes of a --tp rank's copy of an object (a row-split format re-laid at its K slice)."""
    from ..artifact.formats import encoded_size

    obj = objects.get(t.object) if objects is not None else None
    shape = tuple(obj.shape) if obj is not None else tuple(spec.objects[t.object].shape)
    return int(encoded_size(t.format, t.shard.shape(shape)))


def state_buffers(graphs: list[Graph]) -> dict[str, dict[str, Any]]:
    """Every persistent buffer the graphs name: shape (slot-major), per-slot shape, dtype, bytes."""
    out: dict[str, dict[str, Any]] = {}
    for g in graphs:
        for t in g.tensors.values():
            if t.role != "state" or t.buffer != t.name or t.name in out:
                continue
            kind = "kv" if (t.name.startswith("kv/") or t.name.startswith("mtp_kv/")) else "gdn"
            out[t.name] = {"shape": list(t.shape), "per_slot_shape": list(t.shape[1:]), "dtype": t.dtype,
                           "bytes": t.nbytes, "kind": kind}
    return dict(sorted(out.items()))


def op_workspace_numel(g: Graph, op, registry=None) -> int | None:
    """float32 elements of the workspace one routed op's route needs (its `Route.workspace` hook
    on the op's view and the route's params, defaults overlaid); None: the route takes none.
    The ONE sizing: the plan's launch bindings and extent workspace (manifest.py), the memory
    report and (through the plan) the runtime all read it."""
    if registry is None:
        from ..kernels.registry import default_registry as registry
    route = registry.get_route(op.route.route)
    if route.workspace is None:
        return None
    try:
        n = route.workspace_numel(op_view(g, op), route.resolve_params(dict(op.route.params or {})))
    except (KeyError, TypeError, ValueError, RouteError) as exc:
        raise CompileError(f"{g.extent.name}: op {op.name} (route {op.route.route}): cannot size its workspace: "
                           f"{type(exc).__name__}: {exc}") from None
    if n < 0:
        raise CompileError(f"{g.extent.name}: op {op.name} (route {op.route.route}): workspace hook returned {n}")
    return n


def extent_workspace_numel(g: Graph, registry=None) -> int:
    """float32 elements of extent `g`'s one workspace buffer: the max over its routed ops
    (`registry`: the compile's route registry, default the library's)."""
    need = 0
    for op in g.ops():
        if op.route is None:
            continue
        n = op_workspace_numel(g, op, registry)
        if n:
            need = max(need, n)
    return need


def route_workspace_bytes(g: Graph, registry=None) -> int:
    """Bytes of the float32 workspace of extent `g` (the plan's `extents.X.workspace.numel` x 4)."""
    return extent_workspace_numel(g, registry) * 4


# outputs of a verify op (attribute window >= 2) holding its per-column states
COLUMN_OUTPUTS = ("state_columns", "conv_state_columns")


def verify_column_bytes(g: Graph) -> int:
    """Bytes of every per-column state a verify extent's ops write (kernels/gdn/spec.py WINDOW)."""
    return sum(g.tensors[t].nbytes for op in g.ops() if op.attrs.get("window")
               for name, t in op.outputs.items() if name in COLUMN_OUTPUTS)


def memory_report(graphs: list[Graph], objects: Mapping[str, Any] | None, spec, *, slots: int,
                  max_context: int, kv_dtype: str, registry=None) -> MemoryReport:
    used: set[str] = set()
    shards: dict[tuple[str, Any], int] = {}  # a --tp rank's copies: (object, shard) -> bytes
    for g in graphs:
        for t in g.tensors.values():
            if t.role == "weight" and getattr(t, "shard", None) is not None:
                shards.setdefault((t.object, t.shard), _shard_bytes(t, objects, spec))
            elif t.role == "weight":
                used.add(t.object or t.logical)
    weights = sum(_object_bytes(n, objects, spec) for n in sorted(used)) + sum(shards.values())
    used |= {o for o, _ in shards}
    bufs = state_buffers(graphs)
    kv = sum(b["bytes"] for b in bufs.values() if b["kind"] == "kv")
    st = sum(b["bytes"] for b in bufs.values() if b["kind"] == "gdn")
    arenas = {g.extent.name: int(g.meta.get("memory", {}).get("arena_bytes", 0)) for g in graphs}
    per_token = kv // max(1, slots * max_context)
    rws = {g.extent.name: route_workspace_bytes(g, registry) for g in graphs}
    rws = {k: v for k, v in rws.items() if v}
    mtp_kv = sum(b["bytes"] for n, b in bufs.items() if n.startswith("mtp_kv/"))
    cols = {g.extent.name: verify_column_bytes(g) for g in graphs if g.extent.phase == "verify"}
    return MemoryReport(mtp_kv=mtp_kv, verify_columns_by_extent={k: v for k, v in cols.items() if v},
                        weights=weights, kv=kv, state=st, workspace=max(arenas.values(), default=0),
                        kv_bytes_per_token=per_token, slots=slots, max_context=max_context, kv_dtype=kv_dtype,
                        weight_objects=len(used), state_buffers=bufs, arena_by_extent=arenas,
                        route_workspace=sum(rws.values()), route_workspace_by_extent=rws)


def check_budget_value(budget_gib: float | None) -> None:
    """--memory-budget must be a finite number > 0 (inf, nan, 0 and negatives are refused)."""
    if budget_gib is None:
        return
    if not (isinstance(budget_gib, (int, float)) and math.isfinite(budget_gib) and budget_gib > 0):
        raise CompileError(f"--memory-budget must be a finite positive number of GiB, got {budget_gib}")


def check_budget(report: MemoryReport, budget_gib: float | None) -> None:
    if budget_gib is None:
        return
    check_budget_value(budget_gib)
    budget = int(budget_gib * GIB)
    if report.total > budget:
        raise CompileError(
            f"needs {report.total} bytes (weights {report.weights}, KV {report.kv}, state {report.state}, "
            f"workspace {report.workspace}"
            f"{f', route workspaces {report.route_workspace}' if report.route_workspace else ''}), budget {budget} ({budget_gib:g} GiB) for {report.slots} slot(s) x "
            f"{report.max_context} context, KV {report.kv_dtype}")


def context_fit(report: MemoryReport, budget_gib: float) -> int:
    """Positions of context per slot that fit `budget_gib` for the report's KV format and slots:
    the budget less everything but the KV cache, over slots x B/token. The split-KV workspaces
    also grow with the context (stepwise); --max-context auto re-plans at the fitted context."""
    budget = int(budget_gib * GIB)
    per_position = report.slots * report.kv_bytes_per_token
    if per_position <= 0:
        return 0
    return max(0, (budget - (report.total - report.kv)) // per_position)


def kv_lines(r: MemoryReport, budget_gib: float | None = None) -> list[str]:
    """The KV cache line (exact B/token of the format) and, with a budget, the context that fits."""
    lines = [f"KV cache  K {_h(r.kv)}  ({r.kv_bytes_per_token:,d} B/token, all attention layers)"]
    if budget_gib is not None:
        fit = context_fit(r, budget_gib)
        lines.append(f"context fit {fit:>14,d} tokens per slot fit the budget (KV {r.kv_dtype}, "
                     f"{r.kv_bytes_per_token:,d} B/token, C = {r.slots} slot(s); this plan: {r.max_context:,d})")
    return lines


def _h(n: int) -> str:
    return f"{n:>16,d} B  {n / GIB:10.3f} GiB"


def report_text(r: MemoryReport, budget_gib: float | None = None) -> str:
    lines = [
        f"memory plan: {r.slots} slot(s) x {r.max_context} context, KV {r.kv_dtype}",
        f"weights   W {_h(r.weights)}  ({r.weight_objects} artifact objects)",
        *kv_lines(r, budget_gib),
        f"state     S {_h(r.state)}  (GDN conv + recurrent, {r.slots} slot(s))",
        *([f"MTP KV    M {_h(r.mtp_kv)}  (mtp_kv/*: the MTP head's own cache, {r.slots} slot(s); in K)"]
          if r.mtp_kv else []),
        f"workspace A {_h(r.workspace)}  (activation arena, max over extents)",
        *([f"verify    V {_h(r.verify_columns)}  (per-column GDN states of the largest verify extent: "
           f"state_columns + conv_state_columns; in A)"] if r.verify_columns_by_extent else []),
        f"route ws  R {_h(r.route_workspace)}  (route workspaces, per extent: linear split-K / dequant-GEMM, "
        f"split-KV attention, chunked GDN, sampling)",
        f"total       {_h(r.total)}",
    ]
    if budget_gib is not None:
        lines.append(f"budget      {_h(int(budget_gib * GIB))}")
    lines.append("")
    lines.append("arena by extent:")
    for name, n in sorted(r.arena_by_extent.items()):
        lines.append(f"  {name:<24} {n:>14,d} B")
    if r.route_workspace_by_extent:
        lines.append("")
        lines.append("route workspace by extent (float32 buffer, max over the extent's launches):")
        for name, n in sorted(r.route_workspace_by_extent.items()):
            lines.append(f"  {name:<24} {n:>14,d} B")
    if r.verify_columns_by_extent:
        lines.append("")
        lines.append("verify per-column states by extent (arena activations, read by state_select):")
        for name, n in sorted(r.verify_columns_by_extent.items()):
            lines.append(f"  {name:<24} {n:>14,d} B")
    lines.append("")
    lines.append("persistent buffers (slot-major):")
    for name, b in r.state_buffers.items():
        lines.append(f"  {name:<32} {b['dtype']:<4} {str(b['shape']):<28} {b['bytes']:>16,d} B")
    return "\n".join(lines) + "\n"


# The most memory one GPU of each architecture has (GiB, rounded up to what the largest card of the
# sm offers: A100 80 GB, RTX A6000 / L40 48 GB, GH200 144 GB, B200 192 GB, B300 288 GB, RTX PRO 6000
# 96 GB, ...). A plan above it cannot load on any single GPU of that sm; other sms: 1 TiB.
LARGEST_GPU_GIB = {70: 32, 75: 48, 80: 80, 86: 48, 87: 64, 89: 48, 90: 144, 100: 192, 103: 288, 110: 128,
                   120: 96, 121: 128}
ABSURD_GIB = 1024


def _local_gpu_bytes(sm: int) -> tuple[int, str] | None:
    """(total memory, name) of this machine's GPU 0 when it has the target sm, else None."""
    import sys

    torch = sys.modules.get("torch")  # the compile has imported it (kernels); never imported here for this
    try:
        if torch is None or not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability(0)
        if major * 10 + minor != sm:
            return None
        props = torch.cuda.get_device_properties(0)
        return int(props.total_memory), str(props.name)
    except Exception:  # noqa: BLE001 - no usable GPU: nothing to compare with
        return None


def fit_warnings(report: MemoryReport, sm: int, local: tuple[int, str] | None | bool = True) -> list[str]:
    """One line per size check the plan fails: it needs more than this machine's GPU (when that GPU
    has the target sm; `local` = (bytes, name) to give it, None for none, True to detect), or more
    than the largest single GPU of the sm (LARGEST_GPU_GIB, else ABSURD_GIB). The compile still
    succeeds (a given --memory-budget is a hard limit instead)."""
    total = report.total
    need = f"the plan needs {total / GIB:.1f} GiB ({report.slots} slot(s) x {report.max_context} context)"
    hint = "; lower --max-context or --concurrency, or use --kv-dtype int8"
    out = []
    gpu = _local_gpu_bytes(sm) if local is True else local
    if gpu is not None and total > gpu[0]:
        out.append(f"{need}, more than this machine's {gpu[1]} has ({gpu[0] / GIB:.1f} GiB){hint}")
    limit = LARGEST_GPU_GIB.get(sm, ABSURD_GIB)
    if total > limit * GIB:
        which = f"the largest single sm{sm} GPU" if sm in LARGEST_GPU_GIB else "any single GPU"
        out.append(f"{need}, more than {which} has ({limit} GiB): it cannot load{hint}")
    return out
