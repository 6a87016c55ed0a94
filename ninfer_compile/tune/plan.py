"""The measurement plan of `ninfer-compile tune` (pure Python, no torch): which (case, context, T,
[(route, params)]) to time. Split from cli.py (the subcommand).

- T points: a prefill / decode case at the run's T points (`--t-points`); a verify case (shapes.py:
  `window` W) at its round sizes T = C x W, C in `--verify-rows` (shapes.verify_points).
- Contexts: a family whose TuneSpec says `contexts` is measured at the decode contexts (decode and
  verify cases) or the prefill cached prefixes (prefill cases); others at one (None).
- Candidates: every route whose declared domain covers the case's match and T, not pruned by the
  family's TuneSpec, x the params the TuneSpec proposes (measure.param_candidates; `--candidates N`
  keeps the first N of them, `--quick` 2).
- `--untimed-in TABLE`: only the cases the table has no measured group for (shapes.timed_in_table).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..errors import NinferError
from .shapes import VERIFY_ROWS, MatchCase, timed_in_table, verify_points

DEFAULT_T_POINTS = (1, 2, 3, 4, 5, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512, 1024)
QUICK_T_POINTS = (1, 2, 4, 5, 8, 16, 32, 64, 128, 512, 1024)
DECODE_CONTEXTS = (1024, 8192, 32768)
QUICK_DECODE_CONTEXTS = (4096, 32768)
PREFILL_CONTEXTS = (0, 4096, 16384)
QUICK_PREFILL_CONTEXTS = (0, 8192)
# the phases measured at the decode contexts (a verify round's columns read the cache at a decode depth)
DECODE_DEPTH_PHASES = ("decode", "verify")


def ints(text: str | None, default, what: str, minimum: int = 1) -> tuple[int, ...]:
    if text is None:
        return tuple(default)
    try:
        vals = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise NinferError(f"{what}: expected comma-separated integers, got {text!r}") from None
    if not vals or vals[0] < minimum:
        raise NinferError(f"{what}: values must be integers >= {minimum}, got {text!r}")
    return tuple(vals)


def candidates_for(case: MatchCase, t: int, quick: bool, only: tuple[str, ...] = (),
                   limit: int | None = None):
    """[(route, params)] whose declared domain covers the case's match and T (and, when `only` is
    given, whose name contains one of its substrings); at most `limit` params per route."""
    from ..kernels.registry import routes_for
    from ..kernels.tuning import find_tune_spec
    from ..routes.table import effective_match
    from .measure import param_candidates

    eff = effective_match(case.match)
    spec = find_tune_spec(case.family)
    out = []
    for r in routes_for(case.family):
        if r.covers(t, t, eff) is not None:
            continue
        if only and not any(o in r.name for o in only):
            continue
        if spec is not None and spec.pruned(r, t, quick):
            continue  # the family's TuneSpec prunes the route at this T (e.g. --quick)
        params = param_candidates(r, t, quick and limit is None)
        for p in params[:limit] if limit is not None else params:
            out.append((r, p))
    return out


def only_routes(args) -> tuple[str, ...]:
    return tuple(v.strip() for v in (getattr(args, "routes", None) or "").split(",") if v.strip())


def verify_rows(args) -> tuple[int, ...]:
    return ints(getattr(args, "verify_rows", None), VERIFY_ROWS, "--verify-rows")


def case_points(case: MatchCase, t_points: Sequence[int], args) -> tuple[int, ...]:
    """The T points a case is measured at: a verify case's round sizes, else `t_points`."""
    return verify_points(case, verify_rows(args)) if case.window else tuple(t_points)


def all_points(cases: Sequence[MatchCase], t_points: Sequence[int], args) -> tuple[int, ...]:
    """The run's T points: `t_points` and every verify case's round sizes (saved with the
    measurements; picking reads a case's rows at the points it has records for)."""
    pts = set(t_points)
    for c in cases:
        pts |= set(case_points(c, t_points, args))
    return tuple(sorted(pts))


def contexts_for(case: MatchCase, args) -> list:
    """The context depths a case is measured at: [None] unless its TuneSpec says `contexts`; then the
    decode contexts for a decode or verify case, the prefill cached prefixes otherwise."""
    from ..kernels.tuning import find_tune_spec

    spec = find_tune_spec(case.family)
    if spec is None or not spec.contexts:
        return [None]
    if case.phase in DECODE_DEPTH_PHASES or case.window:
        return list(ints(args.decode_contexts, QUICK_DECODE_CONTEXTS if args.quick else DECODE_CONTEXTS,
                         "--decode-contexts"))
    return list(ints(args.prefill_contexts, QUICK_PREFILL_CONTEXTS if args.quick else PREFILL_CONTEXTS,
                     "--prefill-contexts", minimum=0))


def build_plan(cases: list[MatchCase], t_points, args) -> list[tuple[int, Any, int, list]]:
    """[(case index, ctx, T, [(route, params)])] in measurement order."""
    limit = getattr(args, "candidates", None)
    plan = []
    for ci, case in enumerate(cases):
        for ctx in contexts_for(case, args):
            for t in case_points(case, t_points, args):
                cands = candidates_for(case, t, args.quick, only_routes(args), limit)
                if cands:
                    plan.append((ci, ctx, t, cands))
    return plan


def untimed_cases(cases: list[MatchCase], table: Path, sm: int) -> list[MatchCase]:
    """`--untimed-in TABLE`: the cases without a measured group of their own in TABLE."""
    from ..routes.table import load_table_data
    from ..yaml_lines import YamlInputError

    try:
        data = load_table_data(table)
    except YamlInputError as exc:
        raise NinferError(f"--untimed-in {table}: {str(exc).splitlines()[0]}") from None
    except OSError as exc:
        raise NinferError(f"--untimed-in {table}: cannot read: {exc.strerror or exc}") from None
    if not isinstance(data, dict):
        raise NinferError(f"--untimed-in {table}: not a route table")
    if data.get("sm") not in (None, sm):
        raise NinferError(f"--untimed-in {table}: table is for sm {data.get('sm')}, not {sm}")
    return [c for c in cases if not timed_in_table(c, data)]
