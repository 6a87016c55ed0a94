"""Route tables: load, validate against the route registry, select.

`load_table(path)` parses `routes/smNN.yaml` (schema.py) and checks its semantics against the
route registry, collecting every error as `file:line: field: message`:
- per family, rows of one `match` are in T order, contiguous, non-overlapping and cover 1..max
  (the last `hi` is `max`);
- a row names a route or says `unsupported: REASON` (selection there is a RouteError);
- every route exists, belongs to the section's family, and its declared domain (formats,
  epilogues, min_t..max_t, extra keys, shape rules) covers the row's T range and match;
- params are declared by the route and take legal values;
- match keys are known for the family; two groups with the same match are an error, and so are
  two groups an op could match at once without one being more specific (a strict superset) than
  the other — so "most specific row wins" is always unique.

A match without `epilogue` means `epilogue: none` (for table rows and ops alike).

`extends: FILE` (a base table, path relative to the table): the base's groups are inherited and
each group of the table replaces the base group with the same effective match (in its place) or
is added after the base's. Every row keeps its own file (`TableRow.file`), so errors, `source`
and `--explain` cite `base.yaml:LINE` for an inherited row; `sha256` covers both files' bytes.
One level: a base extends nothing, and a table extending an unmeasured base cannot say measured.
The merge is inherit.py's.

`RouteTable.select(family, t, match)` returns the `Selection` of the most specific group whose
match is a subset of the op's match, at the row covering T. The chosen route's domain is checked
again against the op's concrete match (shape rules on n/k). On a miss, `miss: error` raises a
RouteError naming family, match and T; `miss: nearest` picks the closest group whose route covers
the op and records it (`Selection.nearest`, `RouteTable.misses`, a logging warning).
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..errors import RouteError
from ..kernels.registry import Registry, Route, default_registry
from .inherit import base_hint, load_table_data, merge_families, read_base  # noqa: F401  (load_table_data re-exported)
from .schema import (
    BASE_MATCH_KEYS,
    family_match_keys,
    int_match_keys,
    known_families,
    ParsedGroup,
    TableErrors,
    parse_table_text,
    read_table_file,
)

log = logging.getLogger(__name__)

ROUTES_DIR = Path(__file__).resolve().parents[2] / "routes"


def _fmt_t(t: int | None) -> str:
    return "max" if t is None else str(t)


class UnsupportedRange(RouteError):
    """Selection hit a row the table marks `unsupported` (an explicit, reasoned gap)."""


def effective_match(match: Mapping[str, Any]) -> dict[str, Any]:
    """The match as compared: `epilogue` defaults to `none`."""
    out = {"epilogue": "none"}
    out.update(match)
    return out


def fmt_match(match: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(match.items())) + "}"


@dataclass(frozen=True)
class Selection:
    """The route chosen for one op at one T. `t_range` = (lo, hi) of the row, hi None = max.
    `nearest` is None for an exact hit, else the recorded reason a `miss: nearest` fallback ran."""

    route: Route
    params: dict
    source: str
    t_range: tuple[int, int | None]
    match: dict = field(default_factory=dict)
    nearest: str | None = None

    @property
    def name(self) -> str:
        return self.route.name


@dataclass(frozen=True)
class TableRow:
    lo: int
    hi: int | None
    route: Route | None  # None: an explicit `unsupported` row
    params: dict  # as written
    resolved: dict  # defaults overlaid with the row's params
    evidence: dict | None
    line: int
    unsupported: str | None = None
    file: str = ""  # the file the row is written in (the table's, or its base's)

    def contains(self, t: int) -> bool:
        return self.lo <= t and (self.hi is None or t <= self.hi)


@dataclass(frozen=True)
class TableGroup:
    family: str
    match: dict  # as written
    eff: dict  # effective (epilogue defaulted)
    rows: tuple[TableRow, ...]
    line: int
    file: str = ""  # the file the group is written in (the table's, or its base's)

    def row_at(self, t: int) -> TableRow:
        for row in self.rows:
            if row.contains(t):
                return row
        raise RouteError(f"internal: no row covers T={t}")  # ranges are validated to cover 1..max

    def matches(self, op_eff: Mapping[str, Any]) -> bool:
        return all(k in op_eff and _eq(op_eff[k], v) for k, v in self.eff.items())


def _eq(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b or (
        isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool)
        and not isinstance(b, bool) and a == b)


class RouteTable:
    """A validated route table. Use `load_table` / `table_for_sm` to build one."""

    def __init__(self, path: Path, raw: bytes, sm: int, provenance: dict, miss: str,
                 groups: dict[str, list[TableGroup]], base: Path | None = None, base_raw: bytes = b"",
                 fuse_off: Mapping[str, tuple[str, int]] | None = None):
        self.path = Path(path)
        self.name = self.path.name
        self.base = None if base is None else Path(base)  # the `extends:` file, if any
        self.sha256 = hashlib.sha256(raw + base_raw).hexdigest()
        self.sm = sm
        self.provenance = provenance
        self.miss = miss
        self.groups = groups
        self.misses: list[str] = []
        # fusion rule -> (reason, YAML line): the rules this table switches off (the fuse pass skips them)
        self.fuse_off: dict[str, tuple[str, int]] = dict(fuse_off or {})

    def __repr__(self) -> str:
        return f"RouteTable({self.name}, sm={self.sm}, miss={self.miss})"

    @property
    def families(self) -> list[str]:
        return list(self.groups)

    def where(self, item: TableRow | TableGroup) -> str:
        """`file:line` of a row or group: its own file (the base's for an inherited one)."""
        return f"{item.file or self.name}:{item.line}"

    _src = where

    def select(self, family: str, t: int, match: Mapping[str, Any] | None = None) -> Selection:
        match = dict(match or {})
        if not isinstance(t, int) or isinstance(t, bool) or t < 1:
            raise RouteError(f"{self.name}: {family}: T must be an integer >= 1, got {t!r}")
        groups = self.groups.get(family)
        if groups is None:
            raise RouteError(
                f"{self.name}: no section for family {family!r} (table has: {', '.join(self.groups)})")
        op = effective_match(match)
        hits = [g for g in groups if g.matches(op)]
        if hits:
            best = max(hits, key=lambda g: len(g.eff))  # hits form a chain (checked at load)
            row = best.row_at(t)
            if row.route is None:
                raise UnsupportedRange(f"{self._src(row)}: no route for {family} match {fmt_match(match)} "
                                 f"at T={t}: the table marks T {row.lo}..{_fmt_t(row.hi)} unsupported: "
                                 f"{row.unsupported}")
            reason = row.route.covers(t, t, op)
            if reason is None:
                return Selection(row.route, dict(row.resolved), self._src(row), (row.lo, row.hi),
                                 dict(best.match))
            why = f"row {self._src(row)} route {row.route.name} does not cover the op: {reason}"
        else:
            why = "no row matches"
        what = f"{family} match {fmt_match(match)} at T={t}"
        if self.miss == "error":
            raise RouteError(f"{self.name}: no route for {what}: {why} (miss: error)")
        # miss: nearest — the closest group whose route at T covers the op.
        best_score = None
        best_row = best_group = None
        for g in groups:
            row = g.row_at(t)
            if row.route is None or row.route.covers(t, t, op) is not None:
                continue
            score = _closeness(g.eff, op)
            if best_score is None or score > best_score:
                best_score, best_row, best_group = score, row, g
        if best_row is None:
            raise RouteError(f"{self.name}: no route for {what}: {why}; miss: nearest found no "
                             f"row whose route covers the op")
        note = f"nearest: {what}: {why}; used {self._src(best_row)} {fmt_match(best_group.match)}"
        self.misses.append(note)
        log.warning("%s: %s", self.name, note)
        return Selection(best_row.route, dict(best_row.resolved), self._src(best_row),
                         (best_row.lo, best_row.hi), dict(best_group.match), nearest=note)

    def rows(self, family: str) -> list[TableGroup]:
        return list(self.groups.get(family, []))


def _closeness(row_eff: Mapping[str, Any], op: Mapping[str, Any]) -> tuple:
    agree = conflict = 0
    distance = 0.0
    for k, v in row_eff.items():
        if k in op and _eq(op[k], v):
            agree += 1
        else:
            conflict += 1
            ov = op.get(k)
            if isinstance(v, int) and isinstance(ov, int) and v > 0 and ov > 0:
                distance += abs(math.log(v / ov))
            else:
                distance += 100.0
    return (-conflict, agree, -distance)


# --------------------------------------------------------------------------- loading
def _allowed_match_keys(family: str, routes: list[Route]) -> set[str]:
    keys = set(BASE_MATCH_KEYS) | set(family_match_keys(family))
    for r in routes:
        keys |= set(r.domain.extra)
    return keys


def _check_group(name: str, g: ParsedGroup, registry: Registry, errors: list[str]) -> TableGroup | None:
    """Semantic checks of one group written in file `name` (errors cite it)."""
    fam = g.family
    where = f"{fam}[{g.index}]"
    fam_routes = registry.routes_for(fam)
    ok = True
    allowed = _allowed_match_keys(fam, fam_routes)
    for key, value in g.match.items():
        if key not in allowed:
            errors.append(f"{name}:{g.match_line}: {where}.match.{key}: unknown match key for "
                          f"{fam} (known: {', '.join(sorted(allowed))})")
            ok = False
        elif key in int_match_keys(fam) and (not isinstance(value, int) or isinstance(value, bool)):
            errors.append(f"{name}:{g.match_line}: {where}.match.{key}: must be an integer, got {value!r}")
            ok = False
        elif key in ("format", "epilogue", "phase", "kv_dtype") and not isinstance(value, str):
            errors.append(f"{name}:{g.match_line}: {where}.match.{key}: must be a string, got {value!r}")
            ok = False
    eff = effective_match(g.match)
    rows: list[TableRow] = []
    prev_hi: int | None = 0
    for ri, r in enumerate(g.rows):
        rwhere = f"{where}.routes[{ri}]"
        rng = f"[{r.lo}, {_fmt_t(r.hi)}]"
        # ranges
        if ri == 0 and r.lo != 1:
            errors.append(f"{name}:{r.line}: {rwhere}.t: first range {rng} must start at 1")
            ok = False
        elif ri > 0:
            if prev_hi is None:
                errors.append(f"{name}:{r.line}: {rwhere}.t: range {rng} overlaps the previous row, "
                              f"which already runs to max")
                ok = False
            elif r.lo <= prev_hi:
                errors.append(f"{name}:{r.line}: {rwhere}.t: range {rng} overlaps the previous row "
                              f"(which ends at {prev_hi})")
                ok = False
            elif r.lo > prev_hi + 1:
                errors.append(f"{name}:{r.line}: {rwhere}.t: gap: T {prev_hi + 1}..{r.lo - 1} is not "
                              f"covered (previous row ends at {prev_hi}, this one starts at {r.lo})")
                ok = False
        if ri == len(g.rows) - 1 and r.hi is not None:
            errors.append(f"{name}:{r.line}: {rwhere}.t: last range {rng} must end at max "
                          f"(T {r.hi + 1}..max is not covered)")
            ok = False
        prev_hi = r.hi if prev_hi is not None else None
        if r.route is None:  # explicit unsupported range
            rows.append(TableRow(r.lo, r.hi, None, {}, {}, None, r.line, r.unsupported, file=name))
            continue
        # route
        route = registry.find(r.route)
        if route is None:
            known = ", ".join(x.name for x in fam_routes) or "none registered"
            errors.append(f"{name}:{r.line}: {rwhere}.route: unknown route {r.route!r} "
                          f"({fam} routes: {known})")
            ok = False
            continue
        if route.family != fam:
            errors.append(f"{name}:{r.line}: {rwhere}.route: route {r.route} belongs to family "
                          f"{route.family}, not {fam}")
            ok = False
            continue
        reason = route.covers(r.lo, r.hi, eff)
        if reason:
            errors.append(f"{name}:{r.line}: {rwhere}.route: {r.route} does not cover T {rng} "
                          f"with match {fmt_match(g.match)}: {reason}")
            ok = False
        reason = route.check_params(r.params)
        if reason:
            errors.append(f"{name}:{r.line}: {rwhere}.params: {reason}")
            ok = False
        if r.evidence:
            for sample_t in r.evidence:
                if sample_t < 1:
                    errors.append(f"{name}:{r.line}: {rwhere}.evidence: sample T {sample_t} must be >= 1")
                    ok = False
        rows.append(TableRow(r.lo, r.hi, route, dict(r.params), route.resolve_params(r.params),
                             r.evidence, r.line, file=name))
    if not ok:
        return None
    return TableGroup(fam, dict(g.match), eff, tuple(rows), g.line, file=name)


def _check_ambiguity(fam: str, groups: list[tuple[ParsedGroup, TableGroup]], errors: list[str]) -> None:
    for i, (pa, a) in enumerate(groups):
        for pb, b in groups[:i]:
            shared = a.eff.keys() & b.eff.keys()
            if not all(_eq(a.eff[k], b.eff[k]) for k in shared):
                continue  # disjoint: no op matches both
            other = f"line {pb.match_line}" if b.file == a.file else f"{b.file}:{pb.match_line}"
            if a.eff == b.eff:
                errors.append(f"{a.file}:{pa.match_line}: {fam}[{pa.index}].match: duplicate match "
                              f"{fmt_match(a.eff)} (same as {other})")
            elif not (a.eff.items() <= b.eff.items() or b.eff.items() <= a.eff.items()):
                union = dict(a.eff)
                union.update(b.eff)
                errors.append(f"{a.file}:{pa.match_line}: {fam}[{pa.index}].match: ambiguous with "
                              f"{other}: an op {fmt_match(union)} matches both and neither "
                              f"is more specific")


def _error_line(err: str) -> int:
    try:
        return int(err.split(":", 2)[1])
    except (IndexError, ValueError):
        return 0


def load_table(path: str | Path, registry: Registry | None = None) -> RouteTable:
    """Load and fully validate a route table (with its `extends:` base); RouteError (all errors,
    one per line, each naming the file it is in) if invalid."""
    reg = registry or default_registry
    path = Path(path)
    name, raw, text = read_table_file(path)
    registered_families = set(reg.families()) | set(known_families())

    def family_ok(key: str) -> bool:
        return key in registered_families

    parsed, errors = parse_table_text(name, text, family_ok)
    if parsed is None:
        hint = base_hint(name, text)
        raise TableErrors([hint] if hint else errors)
    errors = list(errors)
    families = {fam: [(name, pg) for pg in pgs] for fam, pgs in parsed.families.items()}
    files = [name]
    bpath, braw = None, b""
    if parsed.header.extends is not None:
        bpath, braw, bparsed, berrors = read_base(path, name, parsed, family_ok)
        files.insert(0, bpath.name)
        errors = berrors + errors
        if bparsed is None:
            raise TableErrors(errors)
        if parsed.header.provenance.source == "measured" and bparsed.header.provenance.source != "measured":
            errors.append(f"{name}:{parsed.doc.line_of(('provenance',))}: provenance: source measured, but "
                          f"the rows of {bpath.name} are {bparsed.header.provenance.source}")
        families = merge_families({fam: [(bpath.name, pg) for pg in pgs]
                                    for fam, pgs in bparsed.families.items()}, families)
    groups: dict[str, list[TableGroup]] = {}
    for fam, pgroups in families.items():
        checked = []
        for gname, pg in pgroups:
            tg = _check_group(gname, pg, reg, errors)
            if tg is not None:
                checked.append((pg, tg))
        _check_ambiguity(fam, checked, errors)
        groups[fam] = [tg for _, tg in checked]
    if errors:
        order = {f: i for i, f in enumerate(files)}
        raise TableErrors(sorted(errors, key=lambda e: (order.get(e.split(":", 1)[0], len(files)), _error_line(e))))
    prov = parsed.header.provenance.model_dump(exclude_none=True)
    if "date" in prov:
        prov["date"] = str(prov["date"])
    fuse_off = {rule: (reason, parsed.doc.line_of(("fuse_off", rule)))
                for rule, reason in parsed.header.fuse_off.items()}
    return RouteTable(path, raw, parsed.header.sm, prov, parsed.header.miss, groups, bpath, braw, fuse_off)


def shipped_tables() -> dict[int, Path]:
    out = {}
    for p in sorted(ROUTES_DIR.glob("sm*.yaml")):  # base.yaml (a base, not a table) is not one
        stem = p.stem[2:]
        if stem.isdigit():
            out[int(stem)] = p
    return out


def table_for_sm(sm: int, override: str | Path | None = None,
                 registry: Registry | None = None) -> RouteTable:
    """The table for `sm`: `override` if given, else the shipped `routes/sm{sm}.yaml`. Refuses an
    unknown sm and a table whose `sm:` differs from the requested one."""
    if override is not None:
        path = Path(override)
    else:
        shipped = shipped_tables()
        if sm not in shipped:
            have = ", ".join(f"sm{s}" for s in sorted(shipped)) or "none"
            raise RouteError(f"no route table for sm{sm} (shipped: {have}); pass --routes FILE "
                             f"or run `ninfer-compile tune --sm {sm}`")
        path = shipped[sm]
    table = load_table(path, registry)
    if table.sm != sm:
        raise RouteError(f"{table.name}: table is for sm {table.sm}, not the requested sm {sm}")
    return table
