"""Tune specs: what the route tuner (`ninfer-compile tune`, `ninfer_compile/tune/`) needs to know
about an op family, declared in the family's folder beside its spec (`kernels/<folder>/tune.py`).

A `TuneSpec` says, per family: how to build its operands on the GPU for one match at one T
(`builder`, a `"module:function"` taking `(case, t, ctx, copies, seed)` and returning a
`tune.measure.Bench`), the relative RMS tolerance of the reference check (`tol`), the params to
try per route and T (`candidates`) and which routes not to measure at all at a T (`prune`),
whether the timing depends on a context depth (`contexts`: measured at the decode / prefill
contexts of `tune --decode-contexts / --prefill-contexts`, summed per T), the `--families` group it
belongs to (`group`, e.g. `gdn`), where its rows go in a written route table (`order`), and, when
one match stands for operands of several shapes (`variant`), the label that keeps them apart: the
tuner measures each (a case per variant) and picks the match's rows on their sum.

Each family folder exports them from `kernels/<folder>/tune.py`::

    TUNE = (TuneSpec(family="rmsnorm", order=30, group="norms",
                     builder="ninfer_compile.kernels.norms.tune:build_rmsnorm",
                     candidates=rmsnorm_candidates),)

`tune.py` must not import torch or triton at module level (builders import them when called):
the CPU side of the tuner (`--families`, table order, `--replay`) loads every `tune.py`.
A family declared with `builder=None` is not tunable; its entry only places its (carried-over)
table rows. Shared code (tune/shapes.py, measure.py, crossover.py, cli.py) iterates over the
registered specs and names no family. See docs/ADDING_A_FAMILY.md.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from ..errors import RouteError
from .family import folder_modules

__all__ = [
    "DEFAULT_TOL", "TuneSpec", "TuneSpecs", "tune_spec", "tune_specs", "find_tune_spec",
    "tunable_families", "family_groups", "table_order", "context_families", "register_tune_spec", "variant_of",
]

DEFAULT_TOL = 2e-2  # relative RMS tolerance of the reference check unless the family says otherwise

# (route, t, quick) -> raw param dicts to try (shared code keeps the legal ones, drops duplicates
# and default spellings, and keeps the first two under --quick)
CandidatesHook = Callable[[Any, int, bool], Iterable[dict]]
# (route, t, quick) -> True: do not measure the route at T at all
PruneHook = Callable[[Any, int, bool], bool]
# (shapes, dtypes, attrs) of one op -> a label ("" = the match alone decides): ops presenting the same
# match with different labels become separate cases, measured apart and summed into the match's rows
VariantHook = Callable[[Any, Any, Any], str]


@dataclass(frozen=True)
class TuneSpec:
    """One family's tuner description (see the module docstring).

    `family`: the op family (route `family`). `order`: the family's place in a written route table
    (ascending; families without a TuneSpec follow, by name). `builder`: `"module:function"` (or a
    callable) `(case, t, ctx, copies, seed) -> Bench`; None = not tunable. `tol`: relative RMS
    tolerance of the reference check. `candidates`: `(route, t, quick) -> [params]` (None: each
    route's defaults only). `prune`: `(route, t, quick) -> bool`, True = the route is not measured
    at T. `contexts`: the bench takes a context depth (`ctx`): decode cases are measured at the
    decode contexts, prefill cases at the prefill contexts (others get `ctx=None`; verify cases the
    decode contexts). `group`: a `--families` group name the family belongs to (besides its own
    name). `variant`: `(shapes, dtypes, attrs) -> str`, for a family whose match does not pin its
    operand shapes (e.g. one route for states of any shape): ops of one match with different labels
    are measured as separate cases, and the match's rows are picked on their summed timings."""

    family: str
    order: float
    builder: str | Callable[..., Any] | None = None
    tol: float = DEFAULT_TOL
    candidates: CandidatesHook | None = None
    prune: PruneHook | None = None
    contexts: bool = False
    group: str | None = None
    variant: VariantHook | None = None
    doc: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.family, str) or not self.family.isidentifier():
            raise RouteError(f"TuneSpec: bad family {self.family!r}")
        if isinstance(self.order, bool) or not isinstance(self.order, (int, float)):
            raise RouteError(f"TuneSpec {self.family}: order must be a number, got {self.order!r}")
        if isinstance(self.builder, str) and (":" not in self.builder):
            raise RouteError(f"TuneSpec {self.family}: builder must be 'module:function', got {self.builder!r}")
        if not (isinstance(self.tol, (int, float)) and self.tol > 0):
            raise RouteError(f"TuneSpec {self.family}: tol must be a positive number, got {self.tol!r}")
        if self.group is not None and (not isinstance(self.group, str) or not self.group.isidentifier()
                                       or self.group == "all"):
            raise RouteError(f"TuneSpec {self.family}: bad group {self.group!r}")

    @property
    def tunable(self) -> bool:
        return self.builder is not None

    def load_builder(self) -> Callable[..., Any]:
        if self.builder is None:
            raise RouteError(f"tune: family {self.family} is not tunable (no builder)")
        if callable(self.builder):
            return self.builder
        from .registry import load_callable

        return load_callable(self.builder)

    def raw_candidates(self, route: Any, t: int, quick: bool) -> list[dict]:
        if self.candidates is None:
            return []
        return [dict(c) for c in self.candidates(route, t, quick)]

    def pruned(self, route: Any, t: int, quick: bool) -> bool:
        return bool(self.prune(route, t, quick)) if self.prune is not None else False

    def variant_of(self, shapes: Any, dtypes: Any, attrs: Any) -> str:
        return str(self.variant(shapes, dtypes, attrs) or "") if self.variant is not None else ""


# ------------------------------------------------------------------------------ registry

class TuneSpecs:
    """The TuneSpecs of `<package>.<folder>.tune` modules (`TUNE = (...)`), loaded on first use,
    plus any registered explicitly (`register`: tests' fake families)."""

    def __init__(self, package: str | None):
        self._package = package
        self._specs: dict[str, TuneSpec] | None = None if package else {}
        self._extra: dict[str, TuneSpec] = {}
        self._lock = threading.RLock()

    def _load(self) -> dict[str, TuneSpec]:
        if self._specs is not None:
            return self._specs
        with self._lock:
            if self._specs is not None:
                return self._specs
            specs: dict[str, TuneSpec] = {}
            for mod_name, mod in folder_modules(self._package, "tune"):  # type: ignore[arg-type]
                for s in getattr(mod, "TUNE", ()):
                    if not isinstance(s, TuneSpec):
                        raise RouteError(f"{mod_name}: TUNE holds a {type(s).__name__}, not a TuneSpec")
                    if s.family in specs:
                        raise RouteError(f"tune spec of family {s.family} is declared twice ({mod_name})")
                    specs[s.family] = s
            self._specs = specs
            return specs

    def all(self) -> dict[str, TuneSpec]:
        """Every TuneSpec by family (registered ones last; a registered one replaces a loaded one)."""
        with self._lock:
            return {**self._load(), **self._extra}

    def register(self, spec: TuneSpec) -> TuneSpec:
        if not isinstance(spec, TuneSpec):
            raise RouteError(f"register_tune_spec: expected a TuneSpec, got {type(spec).__name__}")
        with self._lock:
            self._extra[spec.family] = spec
        return spec

    def unregister(self, family: str) -> None:
        with self._lock:
            self._extra.pop(family, None)


default_tune_specs = TuneSpecs(__name__.rpartition(".")[0])


def tune_specs() -> dict[str, TuneSpec]:
    """Every declared TuneSpec, by family."""
    return default_tune_specs.all()


def register_tune_spec(spec: TuneSpec) -> TuneSpec:
    """Add (or replace) a TuneSpec outside the folder discovery (tests: a fake family)."""
    return default_tune_specs.register(spec)


def find_tune_spec(family: str) -> TuneSpec | None:
    return tune_specs().get(family)


def tune_spec(family: str) -> TuneSpec:
    s = find_tune_spec(family)
    if s is None:
        raise RouteError(f"tune: no tune spec for family {family!r} (declared in kernels/<family>/tune.py: "
                         f"{', '.join(sorted(tune_specs())) or 'none'})")
    return s


def _by_order(specs: Iterable[TuneSpec]) -> list[TuneSpec]:
    return sorted(specs, key=lambda s: (s.order, s.family))


def tunable_families() -> tuple[str, ...]:
    """The families the tuner can build on the GPU, in table order."""
    return tuple(s.family for s in _by_order(tune_specs().values()) if s.tunable)


def family_groups() -> dict[str, tuple[str, ...]]:
    """`--families` groups: group name -> its tunable families (table order), groups ordered by
    their first family; plus `all`."""
    groups: dict[str, list[str]] = {}
    for s in _by_order(tune_specs().values()):
        if s.tunable and s.group and s.group != s.family:
            groups.setdefault(s.group, []).append(s.family)
    out = {g: tuple(v) for g, v in groups.items()}
    out["all"] = tunable_families()
    return out


def table_order(families: Iterable[str]) -> list[str]:
    """`families` in route-table order: those with a TuneSpec by its `order`, then the rest by name."""
    specs = tune_specs()
    fams = list(dict.fromkeys(families))
    known = _by_order(specs[f] for f in fams if f in specs)
    return [s.family for s in known] + sorted(f for f in fams if f not in specs)


def variant_of(family: str, shapes: Any, dtypes: Any, attrs: Any) -> str:
    """The family's variant label of one op's operands ("" without a TuneSpec or a `variant` hook)."""
    s = find_tune_spec(family)
    return s.variant_of(shapes, dtypes, attrs) if s is not None else ""


def context_families() -> list[str]:
    """The tunable families whose bench takes a context depth (TuneSpec `contexts`), table order."""
    return [s.family for s in _by_order(tune_specs().values()) if s.tunable and s.contexts]
