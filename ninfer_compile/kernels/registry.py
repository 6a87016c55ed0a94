"""Route registry: every concrete kernel schedule the compiler may select.

A `Route` is one schedule of an op family (e.g. linear `q4_gemv`). It declares, as data,
the domain it supports (`RouteDomain`: weight formats, epilogues, the column range
`min_t..max_t`, family-specific match keys such as `kv_dtype`, and shape rules such as
`k_multiple`) and its tunable parameters (`ParamSpec`). Route tables (`routes/smNN.yaml`) may
only hand a route a T range and a match that its domain covers: a kernel given more columns than
it supports corrupts memory or silently computes one column (see DESIGN §5).

Family modules register at import time (linear/routes.py builds its routes in a loop; written
out, its `q4_gemv` is, params shortened)::

    # ninfer_compile/kernels/linear/routes.py
    from ninfer_compile.kernels.registry import ParamSpec, Route, RouteDomain, register

    register(Route(
        name="q4_gemv", family="linear",
        domain=RouteDomain(formats=("Q4G64_F16S",), min_t=1, max_t=4,
                           epilogues=("none", "swiglu", "residual")),
        params={"BLOCK_N": ParamSpec("BLOCK_N", (1, 2, 4, 8, 16, 32, 64), 8),
                "SPLIT_K": ParamSpec("SPLIT_K", (1, 2, 4, 8, 16), 1)},
        reference="ninfer_compile.kernels.linear.reference:linear",
        launcher="ninfer_compile.kernels.linear.launch:q4_gemv",
        kernels=("ninfer_compile.kernels.linear.gemv:qlinear_gemv_kernel",),
        doc="Q4G64_F16S decode GEMV (T<=4), CUDA-core fp32 FMA, magic-number unpack, split-K two-phase",
    ))

Registration modules must not import torch kernels or triton at import time: `reference`,
`launcher` and `kernels` are `"module:function"` strings resolved on demand (`load_callable`).

The module-level functions (`register`, `get_route`, `routes_for`, `all_routes`, `families`)
act on `default_registry`, which on its first query imports `ninfer_compile.kernels.<family>.routes`
for every family sub-package present. Tests can build an isolated `Registry()` instead.

Semantics of `RouteDomain.covers` for a table row's `match`:
- `format`: a route with a non-empty `formats` requires the match to pin `format` to one of them.
- `epilogue`: a match without `epilogue` means `epilogue: none` (ops present it the same way), so
  fused epilogues are only ever chosen by rows that name them.
- `extra` keys (e.g. `kv_dtype`, `phase`): a restricted key must be pinned by the match to an
  allowed value.
- shape rules (`k_multiple`, `n_multiple`, `min_k`, `max_k`, `min_n`, `max_n`): checked against
  `k` / `n` when the match carries them (table rows may leave them out; the op's concrete match
  at selection time always carries them, and `RouteTable.select` checks it again).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import re
import threading
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from ..errors import RouteError

__all__ = [
    "ParamSpec",
    "RouteDomain",
    "Route",
    "Registry",
    "default_registry",
    "register",
    "get_route",
    "routes_for",
    "all_routes",
    "families",
    "load_callable",
    "SHAPE_RULES",
]

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_REF_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*$")

# shape rule field -> (match key, kind)
SHAPE_RULES: dict[str, tuple[str, str]] = {
    "k_multiple": ("k", "multiple"),
    "n_multiple": ("n", "multiple"),
    "min_k": ("k", "min"),
    "max_k": ("k", "max"),
    "min_n": ("n", "min"),
    "max_n": ("n", "max"),
}


def _fmt_t(t: int | None) -> str:
    return "max" if t is None else str(t)


@dataclass(frozen=True)
class ParamSpec:
    """A tunable launch/compile parameter: legal `choices` and the `default` used when a table
    row does not set it."""

    name: str
    choices: tuple
    default: Any
    doc: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise RouteError(f"ParamSpec: bad name {self.name!r}")
        choices = tuple(self.choices)
        object.__setattr__(self, "choices", choices)
        if not choices:
            raise RouteError(f"ParamSpec {self.name}: choices must not be empty")
        if not _value_in(self.default, choices):
            raise RouteError(
                f"ParamSpec {self.name}: default {self.default!r} is not one of {list(choices)}"
            )

    def check(self, value: Any) -> str | None:
        if not _value_in(value, self.choices):
            return f"param {self.name}={value!r} is not one of {list(self.choices)}"
        return None


def _value_in(value: Any, choices: Iterable) -> bool:
    """`value in choices`, except that bools only equal bools (True is not 1, False is not 0)."""
    for c in choices:
        if isinstance(c, bool) or isinstance(value, bool):
            if type(c) is type(value) and c == value:
                return True
        elif type(c) is type(value) and c == value:
            return True
    return False


@dataclass(frozen=True, eq=False)
class RouteDomain:
    """What a route supports. Empty `formats` = the family has no weight format / any format."""

    formats: tuple[str, ...] = ()
    min_t: int = 1
    max_t: int | None = None
    epilogues: tuple[str, ...] = ("none",)
    extra: Mapping[str, tuple] = field(default_factory=dict)
    k_multiple: int | None = None
    n_multiple: int | None = None
    min_k: int | None = None
    max_k: int | None = None
    min_n: int | None = None
    max_n: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.formats, str) or isinstance(self.epilogues, str):
            raise RouteError("RouteDomain: formats/epilogues must be tuples of strings, not a string")
        object.__setattr__(self, "formats", tuple(self.formats))
        object.__setattr__(self, "epilogues", tuple(self.epilogues))
        extra = {}
        for key, vals in dict(self.extra).items():
            if isinstance(vals, (str, int)):
                raise RouteError(f"RouteDomain.extra[{key!r}] must be a tuple of allowed values")
            extra[str(key)] = tuple(vals)
            if not extra[key]:
                raise RouteError(f"RouteDomain.extra[{key!r}] must not be empty")
        object.__setattr__(self, "extra", extra)
        if not isinstance(self.min_t, int) or self.min_t < 1:
            raise RouteError(f"RouteDomain: min_t must be an int >= 1, got {self.min_t!r}")
        if self.max_t is not None and (not isinstance(self.max_t, int) or self.max_t < self.min_t):
            raise RouteError(f"RouteDomain: max_t {self.max_t!r} must be an int >= min_t {self.min_t}")
        if not self.epilogues:
            raise RouteError("RouteDomain: epilogues must not be empty")
        for rule in SHAPE_RULES:
            v = getattr(self, rule)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise RouteError(f"RouteDomain: {rule} must be a positive int, got {v!r}")
        for reserved in ("format", "epilogue", "n", "k", "t"):
            if reserved in extra:
                raise RouteError(f"RouteDomain.extra must not restrict {reserved!r}; use the field")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RouteDomain):
            return NotImplemented
        return self.describe() == other.describe()

    def __hash__(self) -> int:
        return hash(repr(self.describe()))

    def describe(self) -> dict:
        """Plain-data summary (for `routes show`, plan manifests, --explain)."""
        out: dict[str, Any] = {"t": [self.min_t, "max" if self.max_t is None else self.max_t]}
        if self.formats:
            out["formats"] = list(self.formats)
        if self.epilogues != ("none",):
            out["epilogues"] = list(self.epilogues)
        for k, v in sorted(self.extra.items()):
            out[k] = list(v)
        for rule in SHAPE_RULES:
            v = getattr(self, rule)
            if v is not None:
                out[rule] = v
        return out

    def covers_t(self, t_lo: int, t_hi: int | None) -> str | None:
        if t_lo < self.min_t:
            return f"T={t_lo} is below the route's min_t {self.min_t}"
        if self.max_t is not None:
            if t_hi is None:
                return f"range [{t_lo}, max] is unbounded but the route's max_t is {self.max_t}"
            if t_hi > self.max_t:
                return f"range [{t_lo}, {t_hi}] exceeds the route's max_t {self.max_t}"
        return None

    def covers_match(self, match: Mapping[str, Any]) -> str | None:
        if self.formats:
            fmt = match.get("format")
            if fmt is None:
                return f"match does not pin format; the route supports only {list(self.formats)}"
            if fmt not in self.formats:
                return f"format {fmt} is not supported by the route (supports {list(self.formats)})"
        epi = match.get("epilogue", "none")
        if epi not in self.epilogues:
            return f"epilogue {epi} is not supported by the route (supports {list(self.epilogues)})"
        for key, allowed in self.extra.items():
            if key not in match:
                return f"match does not pin {key}; the route supports only {key} in {list(allowed)}"
            if not _value_in(match[key], allowed):
                return f"{key}={match[key]!r} is not supported by the route (supports {list(allowed)})"
        for rule, (key, kind) in SHAPE_RULES.items():
            limit = getattr(self, rule)
            if limit is None or key not in match:
                continue
            v = match[key]
            if not isinstance(v, int) or isinstance(v, bool):
                return f"{key}={v!r} is not an integer"
            if kind == "multiple" and v % limit:
                return f"{key}={v} is not a multiple of {limit} ({rule})"
            if kind == "min" and v < limit:
                return f"{key}={v} is below {rule} {limit}"
            if kind == "max" and v > limit:
                return f"{key}={v} exceeds {rule} {limit}"
        return None


@dataclass(frozen=True, eq=False)
class Route:
    """One concrete kernel schedule of an op family."""

    name: str
    family: str
    domain: RouteDomain
    params: Mapping[str, ParamSpec] = field(default_factory=dict)
    reference: str = ""
    launcher: str | None = None
    kernels: tuple[str, ...] = ()
    doc: str = ""
    # "module:function" sizing the route's float32 workspace: fn(view: OpView, params: dict) -> int
    # (element count; 0 = none needed for this op). None = the launcher takes no workspace.
    workspace: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise RouteError(f"Route: bad name {self.name!r}")
        if self.workspace is not None and not _REF_RE.match(str(self.workspace)):
            raise RouteError(f"Route {self.name}: workspace must be 'module:function' or None, got {self.workspace!r}")
        if not isinstance(self.family, str) or not _NAME_RE.match(self.family):
            raise RouteError(f"Route {self.name}: bad family {self.family!r}")
        if not isinstance(self.domain, RouteDomain):
            raise RouteError(f"Route {self.name}: domain must be a RouteDomain")
        params = dict(self.params)
        for key, spec in params.items():
            if not isinstance(spec, ParamSpec) or spec.name != key:
                raise RouteError(f"Route {self.name}: params[{key!r}] must be ParamSpec named {key!r}")
        object.__setattr__(self, "params", params)
        if not isinstance(self.reference, str) or not _REF_RE.match(self.reference):
            raise RouteError(
                f"Route {self.name}: reference must be 'module:function', got {self.reference!r}"
            )
        if self.launcher is not None and not _REF_RE.match(str(self.launcher)):
            raise RouteError(
                f"Route {self.name}: launcher must be 'module:function' or None, got {self.launcher!r}"
            )
        if isinstance(self.kernels, str):
            raise RouteError(f"Route {self.name}: kernels must be a tuple of 'module:name' strings")
        kernels = tuple(self.kernels)
        for k in kernels:
            if not isinstance(k, str) or not _REF_RE.match(k):
                raise RouteError(f"Route {self.name}: kernel {k!r} must be 'module:name'")
        object.__setattr__(self, "kernels", kernels)

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return hash((self.family, self.name))

    def __repr__(self) -> str:
        return f"Route({self.name!r}, family={self.family!r})"

    def covers(self, t_lo: int, t_hi: int | None, match: Mapping[str, Any]) -> str | None:
        """None when the domain covers columns `t_lo..t_hi` (`t_hi=None` = unbounded) and `match`;
        otherwise the reason it does not."""
        return self.domain.covers_t(t_lo, t_hi) or self.domain.covers_match(match)

    def check_params(self, params: Mapping[str, Any]) -> str | None:
        """None when every key is a declared param with a legal value; otherwise the reason."""
        for key, value in params.items():
            spec = self.params.get(key)
            if spec is None:
                declared = sorted(self.params) or "none"
                return f"route {self.name} has no param {key!r} (declared: {declared})"
            reason = spec.check(value)
            if reason:
                return f"route {self.name}: {reason}"
        return None

    def resolve_params(self, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Defaults overlaid with `params` (assumed checked)."""
        out = {k: spec.default for k, spec in self.params.items()}
        out.update(params or {})
        return out

    def load_reference(self) -> Callable:
        return load_callable(self.reference)

    def workspace_numel(self, view: Any, params: Mapping[str, Any]) -> int | None:
        """Float32 elements of this route's workspace for one op (None: the route takes none)."""
        if self.workspace is None:
            return None
        return int(load_callable(self.workspace)(view, dict(params)))

    def load_launcher(self) -> Callable:
        if self.launcher is None:
            raise RouteError(f"route {self.name} has no launcher")
        return load_callable(self.launcher)


def load_callable(ref: str) -> Any:
    """Import `"module:attr.path"` and return the attribute (RouteError if it is missing)."""
    mod_name, _, attr = ref.partition(":")
    try:
        obj: Any = importlib.import_module(mod_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise RouteError(f"cannot load {ref}: {exc}") from exc
    return obj


class Registry:
    """A set of routes keyed by name. `autoload` = a package whose family sub-packages'
    `routes` modules are imported on the first query (None for an isolated, empty registry)."""

    def __init__(self, autoload: str | None = None) -> None:
        self._routes: dict[str, Route] = {}
        self._autoload = autoload
        self._loaded = autoload is None
        self._loading = False
        self._lock = threading.RLock()
        self.loaded_modules: list[str] = []

    # -- population -----------------------------------------------------------------
    def register(self, route: Route) -> Route:
        """Add `route`; another route under the same name is a RouteError (the identical object
        again is a no-op, so re-importing a registration module is harmless)."""
        if not isinstance(route, Route):
            raise RouteError(f"register: expected a Route, got {type(route).__name__}")
        with self._lock:
            old = self._routes.get(route.name)
            if old is route:  # the same object again (a module re-imported): a no-op
                return route
            if old is not None:
                raise RouteError(
                    f"route {route.name!r} is already registered (family {old.family}); "
                    f"route names are unique across families"
                )
            self._routes[route.name] = route
        return route

    def _ensure_loaded(self) -> None:
        if self._loaded or self._loading:
            return
        with self._lock:
            if self._loaded or self._loading:
                return
            self._loading = True
            try:
                pkg = importlib.import_module(self._autoload)  # type: ignore[arg-type]
                names = {i.name for i in pkgutil.iter_modules(pkg.__path__) if i.ispkg}
                for base in pkg.__path__:  # family folders that lack an __init__.py too
                    base_path = Path(base)
                    if base_path.is_dir():
                        for d in base_path.iterdir():
                            if d.is_dir() and _NAME_RE.match(d.name) and (
                                    (d / "routes.py").is_file() or (d / "routes").is_dir()):
                                names.add(d.name)
                for family_pkg in sorted(names):
                    mod_name = f"{self._autoload}.{family_pkg}.routes"
                    try:
                        spec = importlib.util.find_spec(mod_name)
                    except ImportError as exc:
                        raise RouteError(f"cannot import family package {family_pkg}: {exc}") from exc
                    if spec is None:
                        continue
                    try:
                        importlib.import_module(mod_name)
                    except RouteError:
                        raise
                    except Exception as exc:  # a broken family must be loud, never silently absent
                        raise RouteError(
                            f"importing {mod_name} failed: {type(exc).__name__}: {exc}"
                        ) from exc
                    self.loaded_modules.append(mod_name)
                self._loaded = True
            finally:
                self._loading = False

    # -- queries ----------------------------------------------------------------------
    def get_route(self, name: str) -> Route:
        self._ensure_loaded()
        route = self._routes.get(name)
        if route is None:
            raise RouteError(f"unknown route {name!r}")
        return route

    def find(self, name: str) -> Route | None:
        self._ensure_loaded()
        return self._routes.get(name)

    def routes_for(self, family: str) -> list[Route]:
        self._ensure_loaded()
        return sorted((r for r in self._routes.values() if r.family == family), key=lambda r: r.name)

    def all_routes(self) -> list[Route]:
        self._ensure_loaded()
        return sorted(self._routes.values(), key=lambda r: (r.family, r.name))

    def families(self) -> list[str]:
        self._ensure_loaded()
        return sorted({r.family for r in self._routes.values()})

    def __contains__(self, name: str) -> bool:
        return self.find(name) is not None

    def __len__(self) -> int:
        self._ensure_loaded()
        return len(self._routes)


default_registry = Registry(autoload=__name__.rpartition(".")[0])


def register(route: Route) -> Route:
    """Register `route` in the default registry (duplicate name → RouteError)."""
    return default_registry.register(route)


def get_route(name: str) -> Route:
    return default_registry.get_route(name)


def routes_for(family: str) -> list[Route]:
    return default_registry.routes_for(family)


def all_routes() -> list[Route]:
    return default_registry.all_routes()


def families() -> list[str]:
    return default_registry.families()
