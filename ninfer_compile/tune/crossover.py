"""Crossover picking and table writing (pure Python: no torch, runs on the CPU in tests).

A *candidate* is one (route, params) pair. A timing grid maps T -> {candidate: µs}; a candidate
absent at some T was not measured there (outside its domain, pruned, failed to launch, or dropped
by the reference check). `pick_rows` walks the T points in order and chooses the fastest candidate
at each, keeping the previous one unless another is at least `hysteresis` (default 3%) faster.
The candidate chosen at point t_i serves [t_i, t_{i+1} - 1]; the last point's winner serves up to
`max`. A range never exceeds the route's declared domain: a route with max_t 4 is cut at 4 and the
rest of the range goes to the best candidate whose domain covers it (or becomes an explicit
`unsupported` row when none does). Beyond the largest point the last winner continues only when
its domain is unbounded; otherwise the best unbounded candidate there takes `max`.

`render_table` writes the routes/ schema (DESIGN §5) with `source: measured` provenance and per
row the `evidence` (µs per route at the T points inside the row), families in the order their
TuneSpecs give (`kernels/tuning.py: table_order`); `write_table` validates the
text with `ninfer_compile.routes.load_table` before atomically replacing the output.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import yaml

from ..kernels.tuning import table_order
from ..routes.schema import HEADER_KEYS

HYSTERESIS = 0.03


@dataclass(frozen=True)
class Candidate:
    """One (route, params) pair and its route's declared column range."""

    route: str
    params: tuple = ()  # sorted (key, value) pairs
    min_t: int = 1
    max_t: int | None = None

    @classmethod
    def make(cls, route: str, params: Mapping[str, Any] | None = None, min_t: int = 1,
             max_t: int | None = None) -> "Candidate":
        return cls(route, tuple(sorted((params or {}).items())), min_t, max_t)

    @property
    def params_dict(self) -> dict:
        return dict(self.params)

    @property
    def key(self) -> str:
        """Stable text id: `route` or `route{K=V,...}`."""
        if not self.params:
            return self.route
        return self.route + "{" + ",".join(f"{k}={v}" for k, v in self.params) + "}"

    def covers(self, lo: int, hi: int | None) -> bool:
        if lo < self.min_t:
            return False
        if self.max_t is None:
            return True
        return hi is not None and hi <= self.max_t


@dataclass
class Row:
    lo: int
    hi: int | None  # None = max
    candidate: Candidate | None  # None: unsupported
    evidence: dict[int, dict[str, float]] = field(default_factory=dict)
    reason: str | None = None  # for unsupported rows

    @property
    def route(self) -> str | None:
        return None if self.candidate is None else self.candidate.route


def _order(c: Candidate) -> tuple:
    return (c.route, repr(c.params))


def _best(times: Mapping[Candidate, float], pool: Iterable[Candidate]) -> Candidate | None:
    pool = [c for c in pool if c in times and _finite(times[c])]
    if not pool:
        return None
    return min(pool, key=lambda c: (times[c], _order(c)))


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def pick_rows(grid: Mapping[int, Mapping[Candidate, float]], candidates: Sequence[Candidate],
              t_points: Sequence[int] | None = None, hysteresis: float = HYSTERESIS,
              what: str = "") -> list[Row]:
    """Contiguous rows covering 1..max for one match.

    `grid`: T -> {candidate: µs}; `candidates`: every candidate considered (their domains decide
    coverage of the gaps between T points); `t_points`: the T points (default: the grid's keys;
    1 is always included, a point without any measured candidate becomes part of an
    unsupported range unless a covering candidate's domain spans it)."""
    pts = sorted(set(t_points if t_points is not None else grid) | {1})
    cands = sorted(set(candidates) | {c for t in grid for c in grid[t]}, key=_order)
    segs: list[tuple[int, int | None, Candidate | None]] = []
    prev: Candidate | None = None
    for i, t in enumerate(pts):
        hi = pts[i + 1] - 1 if i + 1 < len(pts) else None
        times = {c: v for c, v in (grid.get(t) or {}).items() if _finite(v) and c.covers(t, t)}
        best = _best(times, times)
        choice = best
        if prev is not None and prev in times and best is not None and best != prev:
            if not times[best] <= times[prev] * (1.0 - hysteresis):
                choice = prev
        if choice is None:
            segs.append((t, hi, None))
            prev = None
            continue
        prev = choice
        lo = t
        if choice.covers(lo, hi):
            segs.append((lo, hi, choice))
            continue
        # The route's domain ends inside the range: cut it there, give the rest to the best
        # candidate covering it (by its time at this point, else at the next measured point).
        cut = choice.max_t
        segs.append((lo, cut, choice))
        rest_lo = cut + 1
        cover = [c for c in cands if c.covers(rest_lo, hi)]
        nxt = grid.get(pts[i + 1]) if i + 1 < len(pts) else None
        filler = _best(times, cover) or (_best(nxt, cover) if nxt else None)
        if filler is None and cover and hi is None:
            filler = cover[0]
        segs.append((rest_lo, hi, filler))
        prev = filler
    # merge equal neighbours and attach evidence
    rows: list[Row] = []
    for lo, hi, c in segs:
        if rows and rows[-1].candidate == c:
            rows[-1].hi = hi
        else:
            rows.append(Row(lo, hi, c))
    for row in rows:
        for t in pts:
            if t >= row.lo and (row.hi is None or t <= row.hi):
                ev = evidence_at(grid.get(t) or {}, row.candidate)
                if ev:
                    row.evidence[t] = ev
        if row.candidate is None:
            rng = f"{row.lo}..{'max' if row.hi is None else row.hi}"
            row.reason = (f"no measured route covers T {rng}" + (f" for {what}" if what else "")
                          + " (outside every registered route's domain, or every candidate failed)")
            row.evidence = {}
    return rows


def evidence_at(times: Mapping[Candidate, float], chosen: Candidate | None) -> dict[str, float]:
    """µs per route at one T (each route's best params), plus `selected` when the row's own
    (route, params) is not that route's best."""
    out: dict[str, float] = {}
    for c, v in times.items():
        if not _finite(v):
            continue
        if c.route not in out or v < out[c.route]:
            out[c.route] = v
    if chosen is not None and chosen in times and _finite(times[chosen]) \
            and times[chosen] != out.get(chosen.route):
        out["selected"] = times[chosen]
    return {k: round(float(v), 2) for k, v in sorted(out.items())}


def sum_grids(grids: Sequence[Mapping[int, Mapping[Candidate, float]]]) -> dict[int, dict[Candidate, float]]:
    """Aggregate grids (e.g. several contexts, or every shape of one generic match): at each T the
    sum of µs over the grids, for candidates measured in every grid that has that T."""
    out: dict[int, dict[Candidate, float]] = {}
    ts = sorted({t for g in grids for t in g})
    for t in ts:
        parts = [g[t] for g in grids if t in g]
        common = set(parts[0])
        for p in parts[1:]:
            common &= set(p)
        row = {}
        for c in common:
            vals = [p[c] for p in parts]
            if all(_finite(v) for v in vals):
                row[c] = float(sum(vals))
        out[t] = row
    return out


# --------------------------------------------------------------------------- table text
@dataclass
class Group:
    family: str
    match: dict
    rows: list[Row]
    comment: str = ""
    raw: dict | None = None  # a group carried over from a base table (plain data, written as is)


def _plain(value: Any) -> Any:
    """Plain YAML-representable data (str subclasses such as torch's version become str)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def _flow(value: Any) -> str:
    return yaml.safe_dump(_plain(value), default_flow_style=True, sort_keys=False, width=10 ** 9,
                          allow_unicode=True).strip().removesuffix("...").strip()


def row_data(row: Row, registry=None) -> dict:
    """One table row. With `registry`, params are written fully resolved (defaults included), so
    a later change of a route's defaults cannot silently change what a measured row means."""
    d: dict[str, Any] = {"t": [row.lo, "max" if row.hi is None else row.hi]}
    if row.candidate is None:
        d["unsupported"] = row.reason or "no route"
        return d
    d["route"] = row.candidate.route
    params = row.candidate.params_dict
    if registry is not None:
        params = registry.get_route(row.candidate.route).resolve_params(params)
    if params:
        d["params"] = params
    if row.evidence:
        d["evidence"] = {int(t): dict(v) for t, v in sorted(row.evidence.items())}
    return d


def render_table(sm: int, provenance: Mapping[str, Any], groups: Sequence[Group],
                 header_comment: str = "", miss: str = "error", registry=None,
                 fuse_off: Mapping[str, str] | None = None) -> str:
    """The table's YAML; `fuse_off`: the base table's switched-off fusion rules, carried with their reasons."""
    lines = []
    for c in header_comment.splitlines():
        lines.append(f"# {c}".rstrip())
    lines.append(f"sm: {int(sm)}")
    lines.append("provenance:")
    for k, v in provenance.items():
        if v is None:
            continue
        lines.append(f"  {k}: {_flow(v)}")
    lines.append(f"miss: {miss}")
    if fuse_off:
        lines.append("fuse_off:")
        for rule, reason in fuse_off.items():
            lines.append(f"  {rule}: {_flow(reason)}")
    fams: dict[str, list[Group]] = {}
    for g in groups:
        fams.setdefault(g.family, []).append(g)
    for fam in table_order(fams):  # the TuneSpecs' `order`, then undeclared families by name
        lines.append("")
        lines.append(f"{fam}:")
        for g in fams[fam]:
            if g.comment:
                for c in g.comment.splitlines():
                    lines.append(f"  # {c}".rstrip())
            if g.raw is not None:
                lines.append(f"  - match: {_flow(dict(g.raw.get('match') or {}))}")
                lines.append("    routes:")
                for r in g.raw["routes"]:
                    lines.append(f"      - {_flow(r)}")
                continue
            lines.append(f"  - match: {_flow(dict(g.match))}")
            lines.append("    routes:")
            for r in g.rows:
                lines.append(f"      - {_flow(row_data(r, registry))}")
    return "\n".join(lines) + "\n"


def _eff(match: Mapping[str, Any]) -> dict:
    out = {"epilogue": "none"}
    out.update(match)
    return out


def conflicts(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """'duplicate' / 'ambiguous' when two groups of one family could not coexist in a table
    (the rule of routes/table.py), else None."""
    ea, eb = _eff(a), _eff(b)
    shared = ea.keys() & eb.keys()
    if not all(ea[k] == eb[k] and type(ea[k]) is type(eb[k]) for k in shared):
        return None
    if ea == eb:
        return "duplicate"
    if ea.items() <= eb.items() or eb.items() <= ea.items():
        return None
    return "ambiguous"


def carry_groups(base_data: Mapping[str, Any] | None, new_groups: Sequence[Group],
                 ) -> tuple[list[Group], list[str]]:
    """Groups of a base table (parsed YAML) not replaced by `new_groups`: each kept unless it
    duplicates or is ambiguous with a new group of its family. Returns (kept, notes)."""
    if not base_data:
        return [], []
    kept: list[Group] = []
    notes: list[str] = []
    for fam, groups in base_data.items():
        if fam in HEADER_KEYS or not isinstance(groups, list):
            continue
        mine = [g for g in new_groups if g.family == fam]
        for g in groups:
            match = dict(g.get("match") or {})
            clash = next((conflicts(match, m.match) for m in mine if conflicts(match, m.match)), None)
            if clash:
                if clash == "ambiguous":
                    notes.append(f"dropped base {fam} {_flow(match)} (ambiguous with a measured group)")
                continue
            rows = [{k: v for k, v in r.items()} for r in g.get("routes") or []]
            kept.append(Group(fam, match, [], raw={"match": match, "routes": rows}))
            notes.append(f"{fam} {_flow(match)}")
    return kept, notes


def write_table(path: Path, text: str, registry=None) -> Any:
    """Validate `text` as a route table (ninfer_compile.routes.load_table), then atomically
    replace `path` (temp file in the same folder + os.replace). Returns the loaded RouteTable;
    RouteError (with every `file:line: field: message`) leaves `path` untouched."""
    from ..errors import RouteError
    from ..routes.table import load_table

    path = Path(path)

    def validate(tmp: str) -> Any:
        try:
            return load_table(tmp, registry)
        except RouteError as exc:  # name the output, not the temp file
            raise RouteError(str(exc).replace(Path(tmp).name, path.name)) from None

    table = write_text_atomic(path, text, validate)
    table.path, table.name = path, path.name
    return table


def write_text_atomic(path: Path, text: str, check: Callable[[str], Any] | None = None) -> Any:
    """Write `text` to a temp file beside `path`, run `check(temp_path)` on it (if given), then
    os.replace it onto `path`; any failure removes the temp file and leaves `path` untouched.
    Returns what `check` returned (None without one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        result = check(tmp) if check is not None else None
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return result
