"""Execute one extent's ordered launch list.

An `ExtentRunner` turns the plan's launch entries into bound Python callables once (tensors
resolved: weights on the device, arena views, per-slot state, per-step input buffers; params and
attributes matched to the launcher's signature; workspaces preallocated: one float32 buffer per
extent, the max over its launches of the route module's sizing hook — for linear,
`linear_workspace_numel(route, T, N, K, epilogue, params)` when the emitted module exports it), then `run(n)` calls them
in order. `n` < the extent's T narrows every per-column value to its first n rows (a prefill tail
chunk; the same memory, so no copy) — the route's declared T domain is checked for n.

Launch kinds:
- route families (`embedding`, `linear`, ...): the plan's emitted launcher for the route;
- builtins (`add`, `concat`, `swiglu`, `select_rows`): small torch ops here (graph-capturable);
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .errors import PlanError

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "i32": torch.int32,
          "i8": torch.int8, "u8": torch.uint8}
ESIZE = {"bf16": 2, "f16": 2, "f32": 4, "i32": 4, "i8": 1, "u8": 1}
BUILTINS = ("add", "concat", "swiglu", "select_rows")


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
        self.capture = bool((entry.get("cuda_graph") or {}).get("capture", False))
        # programmatic dependent launch (plan_dependent_launch): the plan's kernels/pdl module, which
        # each launch of this extent allows around its call; None = plain launches
        self._pdl = None
        if (entry.get("dependent_launch") or {}).get("enabled"):
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
            return self.engine.weight(ref["weight"], tuple(rows) if rows else None)
        raise PlanError(f"extent {self.name}: bad operand reference {ref!r}")

    # ------------------------------------------------------------------------- binding
    def _bind_all(self) -> None:
        self._launch_specs = []
        for L in self.entry.get("launches", []):
            kind = L["kind"]
            if L.get("route"):
                info = self.engine.route_info(L["route"])
                self._check_route(L, info)
                fn = self.engine.launcher(L["route"])
                self._launch_specs.append((L, info, fn, self._signature(fn, L)))
            elif kind in BUILTINS:
                self._launch_specs.append((L, None, None, None))
            else:
                raise PlanError(f"extent {self.name}: launch {L.get('op')} of kind {kind!r} has no route and is "
                                f"not a runtime builtin")
        # workspaces: one float32 buffer per extent, sized for its largest need
        need = 0
        for L, info, fn, sig in self._launch_specs:
            if sig is not None and "workspace" in sig:
                need = max(need, self._workspace_numel(L, fn))
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

    @staticmethod
    def _signature(fn, L) -> dict[str, inspect.Parameter]:
        try:
            return dict(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            raise PlanError(f"launcher of route {L['route']} has no inspectable signature") from None

    def _workspace_numel(self, L, fn) -> int:
        kind = L["kind"]
        mod = inspect.getmodule(fn)
        p = dict(L.get("params") or {})
        t = self.t
        try:
            if kind == "linear":
                epi = (L.get("attrs") or {}).get("epilogue", "none")
                out = self.tensors_spec[L["outs"]["out"]["buffer"]]
                hook = getattr(mod, "linear_workspace_numel", None)
                if hook is not None:  # route-aware: (route, T, weight rows N, K, epilogue, params)
                    w = self._resolve(L["args"]["weight"], None)
                    n, k = (int(w.n), int(w.k)) if hasattr(w, "n") else (int(w.shape[0]), int(w.shape[1]))
                    return int(hook(L["route"], int(out["shape"][0]), n, k, epi, p))
                split = int(p.get("SPLIT_K", 1))  # kernels emitted before the hook existed
                return int(mod.workspace_numel(int(out["shape"][0]), int(out["shape"][1]), epi, split))
            if kind == "attention":
                if not hasattr(mod, "decode_workspace_numel") or "split_tokens" not in _params_of(fn):
                    return 0
                q = self.tensors_spec[L["args"]["q"]["buffer"]]["shape"]
                cache = self.engine.state(L["args"]["k_cache"]["state"])
                sig = _params_of(fn)
                st = int(p.get("split_tokens", sig["split_tokens"].default))
                return int(mod.decode_workspace_numel(int(q[0]), int(q[1]), int(q[2]), int(cache.shape[1]), st))
            if kind == "gated_delta_rule":
                if not hasattr(mod, "chunked_workspace_numel"):
                    return 0
                q = self.tensors_spec[L["args"]["q"]["buffer"]]["shape"]
                v = self.tensors_spec[L["args"]["v"]["buffer"]]["shape"]
                return int(mod.chunked_workspace_numel(int(q[0]), int(v[1]), int(q[2]), int(v[2])))
            if kind == "sampling":
                lg = self.tensors_spec[L["args"]["logits"]["buffer"]]["shape"]
                return int(mod.select_workspace_numel(int(lg[0]), int(lg[1])))
        except (KeyError, AttributeError, TypeError) as exc:
            raise PlanError(f"extent {self.name}: cannot size the workspace of {L['op']} ({L['route']}): {exc}") from None
        raise PlanError(f"extent {self.name}: route {L['route']} takes a workspace, but the runtime does not know "
                        f"how to size one for family {kind}")

    def bound(self, n: int | None = None) -> list[Bound]:
        """The bound launches for n columns (None = the extent's T). Cached per n."""
        key = self.t if n is None else n
        out = self._cache.get(key)
        if out is not None:
            return out
        nn = None if key == self.t else key
        out = []
        for L, info, fn, sig in self._launch_specs:
            try:
                if fn is None:
                    out.append(self._bind_builtin(L, nn))
                else:
                    out.append(self._bind_route(L, info, fn, sig, nn))
            except PlanError:
                raise
            except (KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
                raise PlanError(f"extent {self.name}: launch {L.get('op')} (route {L.get('route')}): cannot bind "
                                f"its operands: {type(exc).__name__}: {_first_line(exc)}") from None
        self._cache[key] = out
        return out

    def _bind_route(self, L, info, fn, sig, n) -> Bound:
        t_op = int(L.get("t", self.t))
        t_eff = t_op if n is None or t_op != self.t else n
        dom = (info or {}).get("domain") or {}
        lo, hi = int(dom.get("min_t", 1)), dom.get("max_t")
        if t_eff < lo or (hi is not None and t_eff > int(hi)):
            raise PlanError(f"extent {self.name}: op {L['op']}: {t_eff} columns are outside route {L['route']}'s "
                            f"domain [{lo}, {hi if hi is not None else 'max'}]")
        kwargs: dict[str, Any] = {}
        names = set(sig)
        var_kw = any(p.kind == p.VAR_KEYWORD for p in sig.values())
        for group in ("args", "outs"):
            for operand, ref in (L.get(group) or {}).items():
                target = operand
                if group == "outs" and f"{operand}_out" in names:
                    target = f"{operand}_out"  # e.g. qk_norm_rope: outs q, k -> q_out, k_out
                elif target not in names and not var_kw:
                    alias = {"out": "o"}.get(operand)
                    if alias in names:
                        target = alias
                    else:
                        raise PlanError(f"extent {self.name}: op {L['op']}: launcher of route {L['route']} takes no "
                                        f"operand {operand!r}")
                value = self._resolve(ref, n)
                if target in kwargs:
                    if kwargs[target] is not value:  # an updated state is both an argument and an output
                        raise PlanError(f"extent {self.name}: op {L['op']}: output {operand!r} is not the tensor of "
                                        f"argument {target!r} and launcher of route {L['route']} has no "
                                        f"{operand}_out")
                    continue
                kwargs[target] = value
        for k, v in (L.get("attrs") or {}).items():
            if k in names and k not in kwargs:
                kwargs[k] = v
        params = dict(L.get("params") or {})
        if "params" in names:
            kwargs["params"] = params
        else:
            for k, v in params.items():
                if k not in names and not var_kw:
                    raise PlanError(f"extent {self.name}: op {L['op']}: launcher of route {L['route']} takes no "
                                    f"param {k!r}")
                kwargs[k] = v
        if "workspace" in names and self.workspace is not None:
            kwargs["workspace"] = self.workspace
        attrs = L.get("attrs") or {}
        if attrs.get("prologue"):
            raise PlanError(f"extent {self.name}: op {L['op']}: prologue {attrs['prologue']!r} is not supported "
                            f"by the runtime")
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
        else:  # pragma: no cover - filtered in _bind_all
            raise PlanError(f"unknown builtin {kind}")
        return Bound(L["op"], kind, None, fn, {})

    # ------------------------------------------------------------------------- running
    def run(self, n: int | None = None) -> None:
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


def _params_of(fn) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(fn).parameters)

