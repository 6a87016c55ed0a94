"""Execute one extent's ordered launch list.

An `ExtentRunner` turns the plan's launch entries into bound Python callables once: each routed
launch's `bind` list, exactly (buffer -> arena view, weight -> the device weight, state -> the
per-slot state, scalar / constexpr -> the value, workspace -> the extent's float32 workspace,
allocated once at the size the plan's `workspace.numel` gives), after checking it against the
route's argument list in kernels/manifest.json (plan_checks.check_bind). Then `run(n)` calls them
in order. `n` < the extent's T narrows every per-column value to its first n rows (a prefill tail
chunk; the same memory, so no copy) — the route's declared T domain is checked for n.

Launch kinds:
- route families (`embedding`, `linear`, ...): the plan's emitted launcher for the route, or on
  the CPU's torch path its family's torch implementation (`Engine.launcher`; same arguments);
- builtins (`add`, `concat`, `swiglu`, `select_rows`, `take`): small torch ops here (graph-capturable;
  `take`: out[i] = table[index[i]], the MTP shortlist head's row -> token id);
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .errors import PlanError
from .plan_checks import check_bind
from .weight_shards import shard_key

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "i32": torch.int32,
          "i8": torch.int8, "u8": torch.uint8}
ESIZE = {"bf16": 2, "f16": 2, "f32": 4, "i32": 4, "i8": 1, "u8": 1}
BUILTINS = ("add", "concat", "swiglu", "select_rows", "take")


@dataclass
class Bound:
    """One launch, ready to call: `fn(**kwargs)` (narrowed per column count)."""

    op: str
    kind: str
    route: str | None
    fn: Callable
    kwargs: dict[str, Any]
    pdl: Any = None  # the plan's kernels/pdl module when this launch may use dependent launch

    def __call__(self) -> None:
        if self.pdl is None:
            self.fn(**self.kwargs)
            return
        old = self.pdl.allow(True)
        try:
            self.fn(**self.kwargs)
        finally:
            self.pdl.allow(old)


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= int(x)
    return n


class ExtentRunner:
    """Runs one extent of the plan. Built by the Engine at load."""

    def __init__(self, engine, name: str, entry: dict[str, Any]):
        self.engine = engine
        self.name = name
        self.entry = entry
        self.t = int(entry["t"])
        self.phase = entry["phase"]
        self.concurrency = int(entry.get("concurrency", 1))
        self.head = entry.get("head", "sample")  # "argmax": a --tp plan's greedy decode twin (ids, no logits)
        if self.head not in ("sample", "argmax"):
            raise PlanError(f"extent {name}: head {self.head!r} (sample or argmax)")
        self.capture = bool((entry.get("cuda_graph") or {}).get("capture", False))
        # programmatic dependent launch (plan_dependent_launch): the plan's kernels/pdl module, which
        # each launch of this extent allows around its call; None = plain launches
        self._pdl = None
        if (entry.get("dependent_launch") or {}).get("enabled") and engine.kernels != "torch":
            try:
                self._pdl = importlib.import_module(f"{engine.kernel_package}.pdl")
            except ImportError:
                raise PlanError(f"extent {name}: dependent_launch is enabled but the plan's kernels have no "
                                f"pdl module (recompile the plan)") from None
        self.tensors_spec: dict[str, dict] = entry.get("tensors", {})
        if not entry.get("memory_planned", True) or entry.get("arena_bytes") is None:
            raise PlanError(f"extent {name}: memory was not planned (compiled with plan_memory disabled)")
        self._roots: dict[str, torch.Tensor] = {}
        self._cache: dict[int, list[Bound]] = {}
        self._views: dict[tuple[str, int], torch.Tensor] = {}
        self.workspace = None
        self._ws_numel = 0
        self.inputs = {k: self.value(v) for k, v in entry.get("inputs", {}).items()}
        self.outputs = {k: self.value(v) for k, v in entry.get("outputs", {}).items()}
        self._bind_all()

    # ------------------------------------------------------------------------- values
    def value(self, name: str, n: int | None = None) -> torch.Tensor:
        """The arena tensor of a value (narrowed to n leading rows when its leading dim is T)."""
        key = (name, -1 if n is None else n)
        v = self._views.get(key)
        if v is not None:
            return v
        spec = self.tensors_spec.get(name)
        if spec is None:
            raise PlanError(f"extent {self.name}: launch references unknown value {name!r}")
        shape = [int(d) for d in spec["shape"]]
        if n is not None and shape and shape[0] == self.t:
            shape[0] = n
        dt = spec["dtype"]
        if dt not in DTYPES:
            raise PlanError(f"extent {self.name}: value {name} has unsupported dtype {dt}")
        es = ESIZE[dt]
        arena = self.engine.arena
        if "view_of" in spec:
            root = self.tensors_spec.get(spec["view_of"])
            if root is None or "offset" not in root:
                raise PlanError(f"extent {self.name}: value {name} is a view of unplaced {spec['view_of']!r}")
            start = int(root["offset"]) + int(spec["byte_offset"])
            if start % es:
                raise PlanError(f"extent {self.name}: view {name} is misaligned for {dt}")
            base = arena.view(DTYPES[dt]) if arena.numel() % es == 0 else arena[: arena.numel() // es * es].view(DTYPES[dt])
            rest = shape[1:]
            inner = [1] * len(rest)
            for i in range(len(rest) - 2, -1, -1):
                inner[i] = inner[i + 1] * rest[i + 1]
            row = int(spec.get("row_stride", _prod(rest)))
            strides = [row] + inner if shape else []
            v = torch.as_strided(base, shape, strides, start // es)
        else:
            off = int(spec["offset"])
            nbytes = _prod(shape) * es
            if off + nbytes > arena.numel():
                raise PlanError(f"extent {self.name}: value {name} [{off}, {off + nbytes}) exceeds the arena "
                                f"({arena.numel()} bytes)")
            v = arena[off:off + nbytes].view(DTYPES[dt]).view(shape)
        self._views[key] = v
        return v

    def _resolve(self, ref: dict[str, Any], n: int | None):
        if "buffer" in ref:
            return self.value(ref["buffer"], n)
        if "state" in ref:
            return self.engine.state(ref["state"])
        if "weight" in ref:
            rows = ref.get("rows")
            return self.engine.weight(ref["weight"], tuple(rows) if rows else None, shard_key(ref))
        raise PlanError(f"extent {self.name}: bad operand reference {ref!r}")

    # ------------------------------------------------------------------------- binding
    def _bind_all(self) -> None:
        self._launch_specs = []
        for i, L in enumerate(self.entry.get("launches", [])):
            kind = L["kind"]
            if L.get("route"):
                info = self.engine.route_info(L["route"])
                self._check_route(L, info)
                check_bind(f"extent {self.name}: launch {i} ({L['op']}, route {L['route']})", L, info)
                fn = self.engine.launcher(L["route"])
                self._launch_specs.append((L, info, fn))
            elif kind in BUILTINS:
                self._launch_specs.append((L, None, None))
            else:
                raise PlanError(f"extent {self.name}: launch {L.get('op')} of kind {kind!r} has no route and is "
                                f"not a runtime builtin")
        # the workspace: one float32 buffer per extent, of the size the plan gives (the compiler's
        # max over the extent's launches; each launch's `workspace` binding is <= it)
        ws = self.entry.get("workspace") or {}
        need = int(ws.get("numel", 0))
        for i, L in enumerate(self.entry.get("launches", [])):
            for b in L.get("bind") or ():
                if "workspace" in b and int(b["workspace"]) > need:
                    raise PlanError(f"extent {self.name}: launch {i} ({L['op']}, route {L.get('route')}): argument "
                                    f"'workspace' needs {b['workspace']} elements, the extent's workspace has {need}")
        if need:
            self.workspace = torch.zeros(need, dtype=torch.float32, device=self.engine.device)
        self._ws_numel = need

    def _check_route(self, L, info: dict) -> None:
        """The launch must be one the plan's kernels were emitted for: the route's family is the
        launch's kind and its params are one of the sets kernels/manifest.json records for it."""
        where = f"extent {self.name}: launch {L['op']} (route {L['route']})"
        family = info.get("family")
        if family is not None and family != L["kind"]:
            raise PlanError(f"{where}: the route is of family {family}, the launch is a {L['kind']}")
        phases = (info.get("domain") or {}).get("phase")
        if isinstance(phases, list) and self.phase not in phases:
            raise PlanError(f"{where}: the route serves {'/'.join(map(str, phases))} extents, this is a "
                            f"{self.phase} extent")
        sets = info.get("params")
        params = L.get("params") or {}
        if isinstance(sets, list) and not any(isinstance(s, dict) and all(k in s and s[k] == v and
                                                                          type(s[k]) is type(v)
                                                                          for k, v in params.items())
                                              for s in sets):
            raise PlanError(f"{where}: params {params} are not among the parameter sets the kernels were emitted "
                            f"for ({sets})")

    def bound(self, n: int | None = None) -> list[Bound]:
        """The bound launches for n columns (None = the extent's T). Cached per n."""
        key = self.t if n is None else n
        out = self._cache.get(key)
        if out is not None:
            return out
        out = self.bind_launches(range(len(self._launch_specs)), n)
        self._cache[key] = out
        return out

    def bind_launches(self, indices, n: int | None = None) -> list[Bound]:
        """The launches at `indices` (positions in the plan's launch list) bound for n columns, in
        that order, exactly as `bound(n)` binds them (not cached: the compiler's ahead-of-time pass
        binds one launch of each kind per column count)."""
        nn = None if n is None or n == self.t else n
        out = []
        for i in indices:
            L, info, fn = self._launch_specs[i]
            try:
                if fn is None:
                    out.append(self._bind_builtin(L, nn))
                else:
                    out.append(self._bind_route(L, info, fn, nn))
            except PlanError:
                raise
            except (KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
                raise PlanError(f"extent {self.name}: launch {L.get('op')} (route {L.get('route')}): cannot bind "
                                f"its operands: {type(exc).__name__}: {_first_line(exc)}") from None
        return out

    def _bind_route(self, L, info, fn, n) -> Bound:
        """Exactly the plan's `bind` list: buffer -> the arena view (narrowed to n columns),
        weight -> engine.weight, state -> engine.state, scalar / constexpr -> the value, workspace ->
        the extent's workspace (None when the launch needs none)."""
        t_op = int(L.get("t", self.t))
        t_eff = t_op if n is None or t_op != self.t else n
        dom = (info or {}).get("domain") or {}
        lo, hi = int(dom.get("min_t", 1)), dom.get("max_t")
        if t_eff < lo or (hi is not None and t_eff > int(hi)):
            raise PlanError(f"extent {self.name}: op {L['op']}: {t_eff} columns are outside route {L['route']}'s "
                            f"domain [{lo}, {hi if hi is not None else 'max'}]")
        kwargs: dict[str, Any] = {}
        for b in L["bind"]:
            arg = b["arg"]
            if "scalar" in b:
                kwargs[arg] = b["scalar"]
            elif "constexpr" in b:
                kwargs[arg] = b["constexpr"]
            elif "workspace" in b:
                kwargs[arg] = self.workspace[: int(b["workspace"])] if int(b["workspace"]) else None
            elif "group" in b:  # a collective's process group: the runtime's, by the plan's name
                kwargs[arg] = self.engine.process_group(b["group"])
            else:
                kwargs[arg] = self._resolve(b, n)
        return Bound(L["op"], L["kind"], L["route"], fn, kwargs, self._pdl)

    def _bind_builtin(self, L, n) -> Bound:
        kind = L["kind"]
        a = {k: self._resolve(r, n) for k, r in (L.get("args") or {}).items()}
        o = {k: self._resolve(r, n) for k, r in (L.get("outs") or {}).items()}
        attrs = L.get("attrs") or {}
        out = o.get("out")
        if out is None:
            raise PlanError(f"extent {self.name}: builtin {L['op']} has no output 'out'")
        if kind == "add":
            x, y = a["a"], a["b"]

            def fn():
                torch.add(x, y, out=out)
        elif kind == "swiglu":
            gate, up = a["gate"], a["up"]

            def fn():
                out.copy_(F.silu(gate.float()) * up.float())
        elif kind == "concat":
            axis = int(attrs.get("axis", 1))
            parts = [a[f"x{i}"] for i in range(len(a))]
            offs = []
            pos = 0
            for p in parts:
                offs.append(pos)
                pos += p.shape[axis]
            if pos != out.shape[axis]:
                raise PlanError(f"extent {self.name}: concat {L['op']}: parts do not fill the output")
            srcs = coalesce_adjacent(parts, axis)
            dests = []
            pos = 0
            for p in srcs:
                dests.append(out.narrow(axis, pos, p.shape[axis]))
                pos += p.shape[axis]

            def fn():
                for d, p in zip(dests, srcs):
                    d.copy_(p)
        elif kind == "select_rows":
            x, rows = a["x"], a["rows"]

            def fn():
                torch.index_select(x, 0, rows, out=out)
        elif kind == "take":  # table [N] (a weight, e.g. i32 token ids), index [R] i32 -> out [R]
            table, index = a["table"].reshape(-1), a["index"]

            def fn():
                torch.index_select(table, 0, index, out=out)
        else:  # pragma: no cover - filtered in _bind_all
            raise PlanError(f"unknown builtin {kind}")
        return Bound(L["op"], kind, None, fn, {})

    # ------------------------------------------------------------------------- running
    def run(self, n: int | None = None) -> None:
        if self.engine.lockstep is not None:  # --tp rank 0: the other ranks run the same step
            self.engine.lockstep.run(self, n)
        for b in self.bound(n):
            try:
                b()
            except PlanError:
                raise
            except Exception as exc:  # noqa: BLE001 - e.g. the emitted launcher's RouteError on bad shapes
                # a launcher refusing its arguments (the kernels check shapes / params): name the launch
                raise PlanError(f"extent {self.name}: launch {b.op} (route {b.route}) failed: "
                                f"{type(exc).__name__}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else "(no message)"


def coalesce_adjacent(parts: list[torch.Tensor], axis: int) -> list[torch.Tensor]:
    """Merge consecutive concat parts that are adjacent views of one buffer along `axis` (e.g. the
    q and k column views of one merged projection) into one view: one copy kernel instead of one
    per part. Parts that do not line up are kept as they are."""
    out: list[torch.Tensor] = []
    for p in parts:
        if out:
            q = out[-1]
            nxt = q.data_ptr() + q.shape[axis] * q.stride(axis) * q.element_size()
            same = (q.dtype == p.dtype and q.device == p.device and q.stride() == p.stride()
                    and q.untyped_storage().data_ptr() == p.untyped_storage().data_ptr()
                    and all(q.shape[d] == p.shape[d] for d in range(q.dim()) if d != axis))
            if same and p.data_ptr() == nxt:
                size = list(q.shape)
                size[axis] += p.shape[axis]
                out[-1] = q.as_strided(size, q.stride(), q.storage_offset())
                continue
        out.append(p)
    return out

