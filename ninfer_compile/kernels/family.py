"""Family specs: the one description of an op family, declared in its `kernels/<family>/` folder.

A `FamilySpec` says, as data plus a few small hooks, everything the rest of the compiler needs to
know about a family: its operands and attributes (what the verifier checks), the fp32 reference
the IR executor runs, the operand whose leading dimension is the op's column count T, the match
keys a route-table row may use and the concrete match an op presents, and (through its routes,
`Route.workspace`) the workspace each route needs. The tuner's shapes live beside it
(`kernels/<family>/tune.py`). Shared code — IR, verifier, executor, route selection, table schema,
routes CLI, memory report, tuner, plan writer — iterates over the registered specs and names no
family. See docs/ADDING_A_FAMILY.md.

Each family folder declares its spec(s) in `kernels/<family>/spec.py`::

    SPECS = (FamilySpec(name="rmsnorm", operands=(...), attrs=(...), t_operand="x", ...),)

`spec.py` must not import torch or triton at module level (hooks import lazily), like `routes.py`.

Launch bindings. A launch in `plan.json` lists its launcher's arguments by name
(`launch_bindings`): every operand (an arena `buffer`, a `weight` view, a per-slot `state`), every
attribute the spec marks `to_launcher` (a `scalar`), every route param (a `constexpr`), and, for
a route with a workspace, `workspace` (its float32 element count). Launcher parameter names ARE the
operand / attribute / param names: no aliases. An updated state (`io="inout"`) is one argument.
An operand given as column ranges (`parts=N`: `x0` .. `x{N-1}` at most) binds each range by its own name.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

from ..errors import RouteError

__all__ = [
    "REQUIRED", "Operand", "Attr", "OpView", "FamilySpec", "BindingKind",
    "family_spec", "family_specs", "family_names", "is_family", "launch_bindings",
]

REQUIRED: Any = object()  # Attr.default: the op must set it

Io = Literal["in", "out", "inout"]
Role = Literal["activation", "input", "weight", "state"]
BindingKind = Literal["buffer", "weight", "state", "scalar", "constexpr", "workspace", "group"]


@dataclass(frozen=True)
class Operand:
    """One operand of the family. `io="inout"`: a state read and updated, present under the same
    name in the op's inputs and outputs. `roles`: the tensor roles allowed (IR `TensorType.role`);
    `dtypes`: allowed dtypes (None = any; for weights the artifact format); `rank`: required rank
    (None = any). `optional`: may be absent (e.g. linear `residual` without that epilogue).
    `parts`: how many column ranges `<name>0, <name>1, ...` the family's launchers take instead of
    `<name>` (0 = none; the fuse rule `concat_into` splits an input only as far as this)."""

    name: str
    io: Io = "in"
    roles: tuple[str, ...] = ("activation",)
    dtypes: tuple[str, ...] | None = None
    rank: int | None = None
    optional: bool = False
    parts: int = 0
    doc: str = ""


@dataclass(frozen=True)
class Attr:
    """One op attribute. `types`: allowed Python types of its value. `to_launcher`: the launcher
    takes it as a scalar argument (a `scalar` binding); otherwise the compiler consumes it (route
    selection / the match, e.g. `kv_dtype`, `mode`, `epilogue`). `optional` (a launcher attribute
    whose default is None, e.g. attention's `window`, set on verify ops): bound only when the op sets it,
    so launches of ops without it keep their argument list. `binding`: the kind of its launch
    binding, `scalar` (the value itself) or `group` (the value names a process group; the runtime
    binds the group it created for that name: the collective family, kernels/collective/)."""

    name: str
    types: tuple[type, ...]
    default: Any = REQUIRED
    to_launcher: bool = True
    optional: bool = False
    doc: str = ""
    binding: Literal["scalar", "group"] = "scalar"


class OpView:
    """What a spec hook sees of one op: operand shapes / dtypes / formats, attributes (defaults
    filled), the extent's phase and T, and the graph's meta (e.g. `kv_dtype`). Built by shared code
    from an IR graph (`ir.graph.op_view`) or from a tuner case; hooks never see the graph."""

    def __init__(self, *, kind: str, name: str, shapes: Mapping[str, tuple[int, ...]],
                 dtypes: Mapping[str, str], formats: Mapping[str, str | None] | None = None,
                 attrs: Mapping[str, Any] | None = None, phase: str = "decode", extent_t: int = 1,
                 meta: Mapping[str, Any] | None = None, outputs: Mapping[str, tuple[int, ...]] | None = None,
                 output_dtypes: Mapping[str, str] | None = None):
        self.kind, self.name = kind, name
        self._shapes, self._dtypes = dict(shapes), dict(dtypes)
        self._formats = dict(formats or {})
        self._out_shapes, self._out_dtypes = dict(outputs or {}), dict(output_dtypes or {})
        self.attrs = dict(attrs or {})
        self.phase, self.extent_t = phase, extent_t
        self.meta = dict(meta or {})

    def has(self, operand: str) -> bool:
        return operand in self._shapes

    def shape(self, operand: str, out: bool = False) -> tuple[int, ...]:
        src = self._out_shapes if out else self._shapes
        if operand not in src:
            raise KeyError(f"missing {'output' if out else 'input'} operand {operand!r}")
        return tuple(src[operand])

    def dtype(self, operand: str, out: bool = False) -> str:
        return (self._out_dtypes if out else self._dtypes)[operand]

    def format(self, operand: str) -> str:
        """The weight's artifact format (its dtype when unbound / not a weight)."""
        return self._formats.get(operand) or self._dtypes[operand]

    def parts(self, base: str) -> list[str]:
        """`base` itself when present, else `base0, base1, ...` in order."""
        if base in self._shapes:
            return [base]
        return sorted((n for n in self._shapes if n.startswith(base) and n[len(base):].isdigit()),
                      key=lambda n: int(n[len(base):]))

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)


@dataclass(frozen=True)
class FamilySpec:
    """One op family. Hooks take an `OpView`:
    - `check(view) -> str | None`: shape rules beyond the generic operand checks (a reason or None);
    - `match(view) -> dict`: the concrete match the op presents to the route table (`format`, `n`,
      `k`, `epilogue` and the family's `match_keys`);
    - `reference`: `"module:function"`, the fp32 reference the IR executor calls with the op's
      operands and attributes by name (launcher-only attributes included); it returns the single
      output, or a tuple in the order of the spec's outputs (`io` out / inout).
    `match_keys`: the family-specific keys a table row may use (beyond format / n / k / epilogue);
    `int_match_keys`: those of them that are integers. `layer_kind`: the contract layer kind whose
    presence makes a model need the family (`routes` CLI), None = every model.
    `model_matches(contract, tables) -> [(match, note), ...]`: the matches a model's ops present,
    read from its resolved contract's weight objects (`routes diff --artifact`; `tables`: the
    compared RouteTables); None = the tables' own match groups stand for the model's ops.
    `torch_impl`: `"module:function"`, the family's CPU implementation (`kernels/<family>/torch_impl.py`,
    the function named like the family): the launchers' keyword arguments plus `**params` (route
    params, ignored) and `workspace=None`, outputs and states written in place, no triton import.
    Emission copies it into the plan beside the kernels; the runtime calls it for every route of
    the family when a plan runs on the CPU (`--kernels torch`). None: the family has no CPU path
    (such a plan runs on the CPU only under the Triton interpreter)."""

    name: str
    operands: tuple[Operand, ...]
    t_operand: str
    match: Callable[[OpView], dict[str, Any]]
    reference: str
    attrs: tuple[Attr, ...] = ()
    check: Callable[[OpView], str | None] | None = None
    match_keys: tuple[str, ...] = ()
    int_match_keys: tuple[str, ...] = ()
    layer_kind: str | None = None
    doc: str = ""
    model_matches: Callable[[Any, tuple], list[tuple[dict[str, Any], str]]] | None = None
    torch_impl: str | None = None

    def operand(self, name: str) -> Operand:
        for o in self.operands:
            if o.name == name:
                return o
        raise KeyError(name)

    @property
    def inputs(self) -> tuple[Operand, ...]:
        return tuple(o for o in self.operands if o.io in ("in", "inout"))

    @property
    def outputs(self) -> tuple[Operand, ...]:
        return tuple(o for o in self.operands if o.io in ("out", "inout"))

    def attr(self, name: str) -> Attr:
        for a in self.attrs:
            if a.name == name:
                return a
        raise KeyError(name)

    def resolve_attrs(self, attrs: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults filled in; an unknown attribute or a missing required one is a RouteError."""
        known = {a.name: a for a in self.attrs}
        for k in attrs:
            if k not in known:
                raise RouteError(f"family {self.name} has no attribute {k!r} (declared: {sorted(known) or 'none'})")
        out = {}
        for a in self.attrs:
            if a.name in attrs:
                v = attrs[a.name]
                if not isinstance(v, a.types) or (isinstance(v, bool) and bool not in a.types):
                    raise RouteError(f"family {self.name}: attribute {a.name}={v!r} is not "
                                     f"{'/'.join(t.__name__ for t in a.types)}")
                out[a.name] = v
            elif a.default is REQUIRED:
                raise RouteError(f"family {self.name}: attribute {a.name} is required")
            else:
                out[a.name] = a.default
        return out


def launch_bindings(spec: FamilySpec, operand_refs: Mapping[str, dict], attrs: Mapping[str, Any],
                    params: Mapping[str, Any], workspace_numel: int | None) -> list[dict[str, Any]]:
    """The explicit argument list of one launch, in a stable order: operands (spec order; parts in
    index order), launcher attributes, route params (sorted), then `workspace`.
    `operand_refs`: operand name (parts: `x0`, ...) -> its plan reference ({"buffer"|"weight"|"state": ...}).
    Each binding is `{"arg": name, <kind>: value}` with `<kind>` one of `BindingKind`."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for o in spec.operands:
        names = [o.name] if o.name in operand_refs else (
            sorted((n for n in operand_refs if n.startswith(o.name) and n[len(o.name):].isdigit()),
                   key=lambda n: int(n[len(o.name):])) if o.parts else [])
        if not names:
            if o.optional:
                continue
            raise RouteError(f"family {spec.name}: operand {o.name} is not bound")
        for n in names:
            if n in seen:
                continue
            seen.add(n)
            out.append({"arg": n, **operand_refs[n]})
    extra = sorted(set(operand_refs) - seen)
    if extra:
        raise RouteError(f"family {spec.name}: operands {extra} are not declared by the family")
    resolved = spec.resolve_attrs(attrs)
    for a in spec.attrs:
        if a.to_launcher and not (a.optional and resolved[a.name] is None):
            out.append({"arg": a.name, a.binding: resolved[a.name]})
    for k in sorted(params):
        out.append({"arg": k, "constexpr": params[k]})
    if workspace_numel is not None:
        out.append({"arg": "workspace", "workspace": int(workspace_numel)})
    return out


# ------------------------------------------------------------------------------ registry

def folder_modules(package: str, leaf: str):
    """Yield (name, module) of `<package>.<folder>.<leaf>` for every family folder that has one, in
    folder order; a module that fails to import is a RouteError (a broken family is loud, never
    silently absent). Shared by the spec loader here and the tuner's (`kernels/tuning.py`)."""
    pkg = importlib.import_module(package)
    folders = sorted({i.name for i in pkgutil.iter_modules(pkg.__path__) if i.ispkg} |
                     {d.name for b in pkg.__path__ for d in Path(b).iterdir()
                      if d.is_dir() and (d / f"{leaf}.py").is_file()})
    for folder in folders:
        mod_name = f"{package}.{folder}.{leaf}"
        if importlib.util.find_spec(mod_name) is None:
            continue
        try:
            yield mod_name, importlib.import_module(mod_name)
        except Exception as exc:
            raise RouteError(f"importing {mod_name} failed: {type(exc).__name__}: {exc}") from exc


class _Specs:
    def __init__(self, package: str):
        self._package = package
        self._specs: dict[str, FamilySpec] | None = None
        self._lock = threading.RLock()

    def load(self) -> dict[str, FamilySpec]:
        if self._specs is not None:
            return self._specs
        with self._lock:
            if self._specs is not None:
                return self._specs
            specs: dict[str, FamilySpec] = {}
            for mod_name, mod in folder_modules(self._package, "spec"):
                for s in getattr(mod, "SPECS", ()):
                    if not isinstance(s, FamilySpec):
                        raise RouteError(f"{mod_name}: SPECS holds a {type(s).__name__}, not a FamilySpec")
                    if s.name in specs:
                        raise RouteError(f"family {s.name} is declared twice ({mod_name})")
                    specs[s.name] = s
            self._specs = specs
            return specs

_default = _Specs(__name__.rpartition(".")[0])


def family_specs() -> dict[str, FamilySpec]:
    """Every declared family, by name."""
    return _default.load()


def family_names() -> tuple[str, ...]:
    return tuple(sorted(family_specs()))


def is_family(kind: str) -> bool:
    return kind in family_specs()


def family_spec(kind: str) -> FamilySpec:
    s = family_specs().get(kind)
    if s is None:
        raise RouteError(f"unknown op family {kind!r} (declared: {', '.join(family_names())})")
    return s
