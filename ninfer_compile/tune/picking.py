"""Picking and reporting (pure Python, no torch): per-case timing grids from the measurement
records (contexts summed), the row groups of a table (a group pinned to each measured shape plus
a fallback per generic match), the markdown report with the whole timing grid, and the merge of
saved measurement files (`tune --replay A.json B.json`). Split from cli.py (the subcommand)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from ..errors import NinferError
from ..kernels.tuning import context_families
from . import crossover as X
from .shapes import case_ident, describe, generic_match, match_text


# --------------------------------------------------------------------------- picking
def grids_from_records(cases, records) -> dict[int, dict[int, dict[X.Candidate, float]]]:
    """Per case: T -> {candidate: µs}, summed over contexts (a candidate missing at one context
    is not a candidate at that T)."""
    per_ctx: dict[tuple, dict[int, dict[X.Candidate, float]]] = defaultdict(lambda: defaultdict(dict))
    ctxs: dict[int, set] = defaultdict(set)
    for r in records:
        ctxs[r["case"]].add(r["ctx"])
        if "us" not in r:
            continue
        c = X.Candidate.make(r["route"], r["params"], r.get("min_t", 1), r.get("max_t"))
        per_ctx[(r["case"], r["ctx"])][r["t"]][c] = float(r["us"])
    out = {}
    for ci in range(len(cases)):
        grids = [per_ctx[(ci, ctx)] for ctx in sorted(ctxs.get(ci, ()), key=lambda v: (v is None, v or 0))]
        grids = [g for g in grids if g]
        out[ci] = X.sum_grids(grids) if grids else {}
    return out


def all_candidates(records) -> dict[str, list[X.Candidate]]:
    fam: dict[str, set] = defaultdict(set)
    for r in records:
        fam[r["family"]].add(X.Candidate.make(r["route"], r["params"], r.get("min_t", 1), r.get("max_t")))
    return {k: sorted(v, key=lambda c: (c.route, repr(c.params))) for k, v in fam.items()}


def route_candidates(family: str, match) -> list[X.Candidate]:
    """Default-params candidates of every registered route covering the match (for coverage)."""
    from ..kernels.registry import routes_for
    from ..routes.table import effective_match

    eff = effective_match(match)
    return [X.Candidate.make(r.name, {}, r.domain.min_t, r.domain.max_t) for r in routes_for(family)
            if r.domain.covers_match(eff) is None]


def _measured_points(seen: set[int], t_points) -> list[int]:
    """The T points at which this match has any record (a timing or a failure). A merge of runs
    with different T points (--replay) must not turn a point that only another match was measured
    at into an `unsupported` hole here (2026-11-29: T=12, measured for the tensor-core GEMVs only,
    left BF16 T 12..15 unsupported). A point where every candidate failed stays a point."""
    return [t for t in t_points if t in seen]


def pick_groups(cases, records, t_points, hysteresis: float, generic: bool = True) -> list[X.Group]:
    from ..kernels.registry import routes_for
    from ..routes.table import effective_match

    grids = grids_from_records(cases, records)
    seen: dict[int, set[int]] = defaultdict(set)  # case -> T points with any record
    for r in records:
        seen[r["case"]].add(r["t"])
    groups: list[X.Group] = []
    gen_members: dict[tuple, list[int]] = defaultdict(list)
    # the cases of one match (verify windows, a family's variants) share its group: their grids summed
    by_match: dict[tuple, list[int]] = defaultdict(list)
    for ci, case in enumerate(cases):
        if any((grids.get(ci) or {}).values()):
            by_match[(case.family, json.dumps(sorted(case.match.items()), default=str))].append(ci)
    for members in by_match.values():
        case = cases[members[0]]
        grid = grids[members[0]] if len(members) == 1 else X.sum_grids([grids[ci] for ci in members])
        cands = route_candidates(case.family, case.match)
        pts = _measured_points(set().union(*(seen[ci] for ci in members)), t_points)
        rows = X.pick_rows(grid, cands, pts, hysteresis, what=f"{case.family} {match_text(case.match)}")
        if all(cases[ci].window for ci in members):
            rows = _from_one(rows)
        names = list(dict.fromkeys(n for ci in members for n in cases[ci].ops))
        ops = ", ".join(names[:4]) + (f", ... ({len(names)} ops)" if len(names) > 4 else "")
        if len(members) > 1:
            ops += "; evidence = sum over: " + "; ".join(cases[ci].suffix.strip() for ci in members)
        groups.append(X.Group(case.family, dict(case.match), rows, comment=f"measured: {ops}"))
        gm = generic_match(case.family, case.match, routes_for(case.family))
        gen_members[(case.family, json.dumps(gm, sort_keys=True))] += members
    if generic:
        for (fam, gm_text), members in gen_members.items():
            gm = json.loads(gm_text)
            if any(effective_match(gm) == effective_match(cases[ci].match) for ci in members):
                continue  # the pinned group already is the generic one
            grid = X.sum_grids([grids[ci] for ci in members if grids.get(ci)])
            pts = _measured_points(set().union(*(seen[ci] for ci in members)), t_points)
            rows = X.pick_rows(grid, route_candidates(fam, gm), pts, hysteresis,
                               what=f"{fam} {match_text(gm)}")
            if all(cases[ci].window for ci in members):
                rows = _from_one(rows)
            shapes = "; ".join(describe(cases[ci]).split(" (")[0] for ci in members)
            groups.append(X.Group(fam, gm, rows, comment=f"fallback for other shapes; evidence = sum over: {shapes}"))
    return groups


def _from_one(rows: list[X.Row]) -> list[X.Row]:
    """Rows of verify cases only: a verify round has at least 2 columns (C x (K+1), K >= 1), so T 1
    is never looked up; when the smallest measured round is T 2, its row serves from T 1 (its
    evidence stays at the measured points) instead of an `unsupported` row for T 1 alone."""
    if len(rows) >= 2 and rows[0].candidate is None and rows[0].lo == 1 and rows[0].hi == 1 \
            and rows[1].candidate is not None and rows[1].candidate.covers(1, rows[1].hi):
        first = rows[1]
        return [X.Row(1, first.hi, first.candidate, dict(first.evidence), first.reason)] + rows[2:]
    return rows


# --------------------------------------------------------------------------- report
def _fmt_us(v) -> str:
    return "" if v is None else f"{v:.1f}"


def render_report(cases, records, groups, prov: dict, dropped: list[str], carried: list[str],
                  t_points, elapsed: float | None) -> str:
    lines = [f"# Route tuning, sm{prov.get('sm', '?')} on {prov.get('device', '?')}", "",
             f"- command: `{prov.get('command', '')}`", f"- date: {prov.get('date', '')}",
             f"- driver {prov.get('driver', '?')}, CUDA {prov.get('cuda', '?')}, torch {prov.get('torch', '?')}, "
             f"triton {prov.get('triton', '?')}, power limit {prov.get('power_w', '?')} W",
             "- method: cold (cold operands rotate over copies > 3x L2), CUDA-graph replay, median µs per launch"
             + "".join(f"; {f} rows sum the contexts measured" for f in context_families())]
    if elapsed is not None:
        lines.append(f"- measured in {elapsed:.0f} s, {sum('us' in r for r in records)} timings")
    lines.append("")
    # choice summary
    lines += ["## Chosen rows", "", "| family | match | T | route | params |", "|---|---|---|---|---|"]
    for g in groups:
        if g.raw is not None:
            continue
        for r in g.rows:
            t = f"{r.lo}..{'max' if r.hi is None else r.hi}"
            if r.candidate is None:
                lines.append(f"| {g.family} | `{match_text(g.match)}` | {t} | unsupported | |")
            else:
                lines.append(f"| {g.family} | `{match_text(g.match)}` | {t} | {r.candidate.route} | "
                             f"{json.dumps(r.candidate.params_dict) if r.candidate.params else ''} |")
    # timing grids
    lines += ["", "## Timing grid (µs)", ""]
    by_case: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        by_case[(r["case"], r["ctx"])].append(r)
    for (ci, ctx), recs in sorted(by_case.items(), key=lambda kv: (kv[0][0], kv[0][1] is None, kv[0][1] or 0)):
        case = cases[ci]
        ts = [t for t in t_points if any(r["t"] == t for r in recs)]
        keys = []
        for r in recs:
            k = X.Candidate.make(r["route"], r["params"]).key
            if k not in keys:
                keys.append(k)
        title = describe(case) + (f", context {ctx}" if ctx is not None else "")
        lines += [f"### {title}", "", "| candidate | " + " | ".join(f"T={t}" for t in ts) + " |",
                  "|---|" + "---:|" * len(ts)]
        cell = {}
        for r in recs:
            k = X.Candidate.make(r["route"], r["params"]).key
            cell[(k, r["t"])] = _fmt_us(r.get("us")) if "us" in r else "fail"
        best = {}
        for t in ts:
            vals = [(r["us"], X.Candidate.make(r["route"], r["params"]).key) for r in recs if r["t"] == t and "us" in r]
            if vals:
                best[t] = min(vals)[1]
        for k in keys:
            row = []
            for t in ts:
                v = cell.get((k, t), "")
                row.append(f"**{v}**" if best.get(t) == k and v not in ("", "fail") else v)
            lines.append(f"| `{k}` | " + " | ".join(row) + " |")
        lines.append("")
    if dropped:
        lines += ["## Dropped candidates", ""] + [f"- {d}" for d in dropped] + [""]
    if carried:
        lines += ["## Groups carried over unmeasured from the base table", ""] + [f"- {c}" for c in carried] + [""]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- replay
def _registered_only(merged: dict, records: list[dict], warnings: list[str]) -> list[dict]:
    """Drop the cases of families and the records of routes no longer registered (a deleted route's
    measurements stay in the files as history), renumbering the cases; one warning names them."""
    from ..kernels.registry import all_routes

    names = {r.name for r in all_routes()}
    families = {r.family for r in all_routes()}
    keep = [i for i, c in enumerate(merged["cases"]) if c.get("family") in families]
    new = {old: i for i, old in enumerate(keep)}
    gone = sorted({r.get("route") for r in records if r.get("route") not in names or int(r["case"]) not in new})
    if gone:
        warnings.append(f"measurements of routes no longer registered skipped: {', '.join(map(str, gone))}")
    merged["cases"] = [merged["cases"][i] for i in keep]
    return [{**r, "case": new[int(r["case"])]} for r in records if r.get("route") in names and int(r["case"]) in new]


def merge_measurements(paths, sm: int, last_owns_points: bool = False) -> dict:
    """Saved measurement files (`--save-measurements`) merged into one: cases are matched by
    (family, match, verify window, variant); a later file's record of the same (op, T, context,
    route, params) replaces an earlier one; T points are the union; environment and command come
    from the last file, with the merge recorded in the command.

    A file that owns its points (`"owns_points": true` in it, or the last one with `last_owns_points`:
    measured on another card of the same sm, e.g. an H100 run over an H200 table): at every (case, T,
    context) it has a record for, the earlier files' records are dropped, so each point is picked from
    timings of one run; elsewhere they stay."""
    merged: dict | None = None
    case_keys: list[str] = []
    by_key: dict[str, dict] = {}
    t_points: set[int] = set()
    warnings: list[str] = []
    commands: list[str] = []
    for path in paths:
        try:
            saved = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise NinferError(f"--replay {path}: cannot read saved measurements: {exc}") from None
        if not isinstance(saved, dict) or not isinstance(saved.get("cases"), list) \
                or not isinstance(saved.get("records"), list):
            raise NinferError(f"--replay {path}: not a measurement file (no cases / records)")
        if int(saved.get("sm", -1)) != sm:
            raise NinferError(f"--replay {path}: measured on sm{saved.get('sm')}, not --sm {sm}")
        local = []
        owning = bool(saved.get("owns_points")) or (last_owns_points and path == paths[-1])
        for c in saved["cases"]:
            key = case_ident(c)  # family, match, verify window, variant
            if key not in case_keys:
                case_keys.append(key)
                if merged is None:
                    merged = {"cases": []}
                merged["cases"].append(c)
            local.append(case_keys.index(key))
        if owning:
            owned = {(local[int(r["case"])], r.get("t"), r.get("ctx")) for r in saved["records"]}
            dropped = [k for k, r in by_key.items() if (r["case"], r.get("t"), r.get("ctx")) in owned]
            for k in dropped:
                del by_key[k]
            warnings.append(f"{path}: owns its {len(owned)} (case, T, context) points; {len(dropped)} earlier "
                            f"records there dropped")
        for r in saved["records"]:
            r = dict(r)
            r["case"] = local[int(r["case"])]
            rk = json.dumps([r["case"], r.get("t"), r.get("ctx"), r.get("route"),
                             sorted((r.get("params") or {}).items())], default=str)
            by_key[rk] = r
        t_points |= {int(t) for t in saved.get("t_points", [])}
        warnings += list(saved.get("warnings", []))
        commands.append(str(saved.get("command", "")))
        last = saved
    assert merged is not None
    records = _registered_only(merged, list(by_key.values()), warnings)
    merged.update(sm=sm, source=last.get("source", ""), environment=last.get("environment", {}),
                  t_points=sorted(t_points), warnings=warnings, records=records,
                  elapsed_s=last.get("elapsed_s"),
                  command=commands[0] if len(commands) == 1 else
                  "merged measurements of: " + " | ".join(commands))
    return merged
