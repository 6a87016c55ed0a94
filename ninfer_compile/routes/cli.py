"""`ninfer-compile routes validate|show|diff` — inspect route tables.

- `routes validate FILE...`: load each table against the live route registry; print `ok` and a
  summary, or every error (`file:line: field: message`) and exit 2.
- `routes show --sm N [--routes FILE]`: the provenance header and, per family and match, the T
  ranges with their route and parameters (`*` marks a parameter left at the route's default).
- `routes diff A.yaml B.yaml [--artifact X [--contract FILE]]`: where the two tables choose
  differently. With an artifact: for the op shapes its model presents (linear per
  format/shape/epilogue, embedding per format/shape, the other families per table match, limited to
  the model's layer kinds). Without: row-wise, for every match group either table has. The last
  line counts what was compared ("match groups" row-wise, "op shapes" with an artifact); exit 0
  when every compared choice (route + parameters, per T) is equal, 1 when any differs, 2 on an error.
  Only choices are compared: provenance, evidence and comments are not.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterable

from ..errors import NinferError, RouteError
from ..kernels.family import family_specs
from .schema import TableErrors
from .table import RouteTable, UnsupportedRange, effective_match, fmt_match, load_table, table_for_sm


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="routes_command", metavar="ACTION")
    sub.required = True
    p = sub.add_parser("validate", help="validate route tables against the route registry (exit 2 on any error)",
                       description="Load each table against the live route registry; print ok and a summary, or "
                                   "every error as file:line: field: message (exit 2).")
    p.add_argument("files", nargs="+", type=Path, metavar="FILE", help="route table(s) to check, e.g. routes/sm90.yaml")
    p = sub.add_parser("show", help="print the route grid of a table",
                       description="The provenance header and, per family and match, the T ranges with their "
                                   "route and parameters (* marks a parameter left at the route's default).")
    p.add_argument("--sm", type=int, required=True, help="GPU architecture, e.g. 90 (reads routes/smN.yaml)")
    p.add_argument("--routes", type=Path, default=None, metavar="FILE",
                   help="table file instead of routes/smN.yaml (its sm: must equal --sm)")
    p = sub.add_parser("diff", help="which choices change between two tables (exit 1 when any does)",
                       description="Where tables A and B choose a different route or parameters, per T range. "
                                   "Row-wise (every match group either table has) unless --artifact limits it to "
                                   "the op shapes that model presents. Exit 0: same choices everywhere compared; "
                                   "1: some differ; 2: error. Provenance, evidence and comments are not compared.")
    p.add_argument("a", type=Path, metavar="A.yaml", help="the first (old) table")
    p.add_argument("b", type=Path, metavar="B.yaml", help="the second (new) table")
    p.add_argument("--artifact", type=Path, default=None,
                   help="compare only the op shapes of this model (.ninfer; header read only)")
    p.add_argument("--contract", type=Path, default=None, metavar="FILE",
                   help="model contract for --artifact (default: graphs/<model_id>.yaml or <artifact>.contract.yaml)")


def run(args: argparse.Namespace) -> int:
    cmd = args.routes_command
    if cmd == "validate":
        return _validate(args.files)
    if cmd == "show":
        table = table_for_sm(args.sm, args.routes)
        print(render_table(table))
        return 0
    if cmd == "diff":
        if args.contract is not None and args.artifact is None:
            raise RouteError("routes diff: --contract needs --artifact")
        a, b = load_table(args.a), load_table(args.b)
        text, changed = diff_tables(a, b, args.artifact, args.contract)
        print(text)
        return 1 if changed else 0
    raise RouteError(f"routes: unknown action {cmd!r}")  # pragma: no cover


# --------------------------------------------------------------------------- validate
def _validate(files: Iterable[Path]) -> int:
    rc = 0
    for path in files:
        try:
            table = load_table(path)
        except TableErrors as exc:
            for line in exc.errors:
                print(f"error: {line}", file=sys.stderr)
            print(f"{path}: {len(exc.errors)} error(s)", file=sys.stderr)
            rc = 2
            continue
        except NinferError as exc:
            print(f"error: {exc}", file=sys.stderr)
            rc = 2
            continue
        print(f"ok: {path} — {summary(table)}")
        for fam, groups in table.groups.items():
            names = sorted({row.route.name for g in groups for row in g.rows if row.route})
            nrows = sum(len(g.rows) for g in groups)
            print(f"  {fam}: {len(groups)} match(es), {nrows} row(s); routes: {', '.join(names)}")
    return rc


def summary(table: RouteTable) -> str:
    nrows = sum(len(g.rows) for gs in table.groups.values() for g in gs)
    return (f"sm {table.sm}, miss {table.miss}, source {table.provenance.get('source')}, "
            f"{len(table.groups)} families, {nrows} rows, sha256 {table.sha256[:16]}")


# --------------------------------------------------------------------------- show
def _show_match(family: str, eff: dict) -> str:
    """The effective match for display; `epilogue: none` is only shown for a family with an
    `epilogue` attribute (linear)."""
    spec = family_specs().get(family)
    if (spec is None or not any(a.name == "epilogue" for a in spec.attrs)) and eff.get("epilogue") == "none":
        eff = {k: v for k, v in eff.items() if k != "epilogue"}
    return fmt_match(eff) if eff else "{} (every op)"


def _fmt_params(resolved: dict, explicit: dict) -> str:
    parts = []
    for k in sorted(resolved):
        mark = "" if k in explicit else "*"
        parts.append(f"{k}={resolved[k]}{mark}")
    return " ".join(parts) or "-"


def _fmt_range(lo: int, hi: int | None) -> str:
    return f"T {lo}..{'max' if hi is None else hi}"


def render_table(table: RouteTable) -> str:
    out = [f"{table.path}  (sm {table.sm}, miss: {table.miss}, sha256 {table.sha256[:16]})"]
    prov = dict(table.provenance)
    out.append(f"provenance: source {prov.pop('source', '?')}")
    for key in ("reason", "derived_from", "command", "date", "device", "driver", "cuda", "torch",
                "triton", "power_w", "clocks", "host", "tool", "notes"):
        if key in prov:
            out.append(f"  {key}: {prov.pop(key)}")
    for key, value in prov.items():
        out.append(f"  {key}: {value}")
    out.append("(* = route default)")
    for fam, groups in table.groups.items():
        out.append("")
        out.append(f"{fam}:")
        for g in groups:
            out.append(f"  match {_show_match(fam, g.eff)}   [{table.where(g)}]")
            width = max(len(r.route.name) if r.route else 11 for r in g.rows)
            for r in g.rows:
                if r.route is None:
                    out.append(f"    {_fmt_range(r.lo, r.hi):<14} {'UNSUPPORTED':<{width}}  "
                               f"{r.unsupported}   {table.where(r)}")
                    continue
                out.append(f"    {_fmt_range(r.lo, r.hi):<14} {r.route.name:<{width}}  "
                           f"{_fmt_params(r.resolved, r.params):<40} {table.where(r)}")
                if r.evidence:
                    for t, cands in sorted(r.evidence.items()):
                        ev = ", ".join(f"{c} {us:g}us" for c, us in sorted(cands.items(), key=lambda x: x[1]))
                        out.append(f"{'':20}evidence T={t}: {ev}")
    return "\n".join(out)


# --------------------------------------------------------------------------- diff
def _choice(table: RouteTable, family: str, t: int, match: dict) -> str:
    try:
        sel = table.select(family, t, match)
    except UnsupportedRange:
        return "UNSUPPORTED"
    except RouteError:
        return "MISS (no row covers this op; miss: error)"
    params = " ".join(f"{k}={v}" for k, v in sorted(sel.params.items()))
    s = sel.route.name + (f" {params}" if params else "")
    if sel.nearest:
        s += " (nearest)"
    return s


def diff_op(a: RouteTable, b: RouteTable, family: str, match: dict) -> list[tuple[int, int | None, str, str]]:
    """Maximal T intervals where the two tables choose differently for one op match."""
    points = {1}
    for table in (a, b):
        for g in table.groups.get(family, []):
            for r in g.rows:
                points.add(r.lo)
                if r.hi is not None:
                    points.add(r.hi + 1)
    pts = sorted(points)
    intervals: list[list] = []
    for i, lo in enumerate(pts):
        hi = pts[i + 1] - 1 if i + 1 < len(pts) else None
        ca, cb = _choice(a, family, lo, match), _choice(b, family, lo, match)
        if intervals and intervals[-1][2] == ca and intervals[-1][3] == cb:
            intervals[-1][1] = hi
        else:
            intervals.append([lo, hi, ca, cb])
    return [tuple(x) for x in intervals if x[2] != x[3]]  # type: ignore[misc]


def _table_matches(a: RouteTable, b: RouteTable, family: str) -> list[dict]:
    seen: list[dict] = []
    for table in (a, b):
        for g in table.groups.get(family, []):
            m = dict(g.eff)
            if m not in seen:
                seen.append(m)
    return seen


def model_ops(a: RouteTable, b: RouteTable, artifact: Path, contract: Path | None) -> list[tuple[str, dict, str]]:
    """(family, op match, note) for the ops the artifact's model presents."""
    try:
        from ..artifact.reader import Artifact
        from ..contracts import find_contract
    except ImportError as exc:
        raise RouteError(f"routes diff --artifact needs the artifact and contracts packages: {exc}") from None
    with Artifact.open(artifact) as art:
        model_id = art.model_id
    contract_spec = find_contract(artifact, model_id, contract).resolve()
    kinds = set(getattr(contract_spec, "layer_kinds", []) or [])
    ops: list[tuple[str, dict, str]] = []
    specs = family_specs()
    families = set(a.groups) | set(b.groups) | {n for n, s in specs.items() if s.model_matches is not None}
    # families whose ops the contract's weights describe (e.g. one linear per weight shape) first
    for fam in sorted(families, key=lambda f: (specs[f].model_matches is None, f) if f in specs else (True, f)):
        spec = specs.get(fam)
        if spec is not None and spec.model_matches is not None:
            ops += [(fam, m, note) for m, note in spec.model_matches(contract_spec, (a, b))]
            continue
        if spec is not None and spec.layer_kind is not None and spec.layer_kind not in kinds:
            continue
        for m in _table_matches(a, b, fam):
            ops.append((fam, m, ""))
    return ops




def diff_tables(a: RouteTable, b: RouteTable, artifact: Path | None = None,
                contract: Path | None = None) -> tuple[str, int]:
    """(report, how many compared units choose differently). A unit is a match group (row-wise)
    or an op shape of the artifact's model (with `artifact`)."""
    if artifact is not None:
        ops = model_ops(a, b, artifact, contract)
        unit = "op shape(s) of the model"
        head = f"routes diff {a.path} -> {b.path} for {artifact}"
    else:
        ops = []
        for fam in list(dict.fromkeys([*a.groups, *b.groups])):
            for m in _table_matches(a, b, fam):
                ops.append((fam, m, ""))
        unit = "match group(s)"
        head = f"routes diff {a.path} -> {b.path} (row-wise)"
    out = [head, f"  A: {a.name} sm {a.sm} ({a.provenance.get('source')})",
           f"  B: {b.name} sm {b.sm} ({b.provenance.get('source')})"]
    changed = 0
    for fam, match, note in ops:
        d = diff_op(a, b, fam, match)
        if not d:
            continue
        changed += 1
        out.append("")
        out.append(f"{fam} {_show_match(fam, effective_match(match))}" + (f"   [{note}]" if note else ""))
        for lo, hi, ca, cb in d:
            out.append(f"  {_fmt_range(lo, hi):<14} A: {ca}")
            out.append(f"  {'':<14} B: {cb}")
    out.append("")
    out.append(f"{changed} of {len(ops)} {unit} choose differently" if changed else
               f"no differences ({len(ops)} {unit} compared)")
    return "\n".join(out), changed
