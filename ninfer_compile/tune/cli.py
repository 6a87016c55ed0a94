"""`ninfer-compile tune`: measure route crossovers on the local GPU and write a route table.

    ninfer-compile tune --sm 90 [--artifact A] [--contract C] [-o routes/sm90.yaml]
                        [--families linear,gdn,attention] [--t-points 1,2,4,...] [--quick]

1. Refuses (exit 2) without a CUDA GPU, or when the local GPU's sm differs from --sm.
2. Derives the match set from the model (shapes.py): the ops `compile` would select routes for, at
   every KV dtype (`--kv-dtypes`, default all seven) and, for the verify extents, every draft window
   K (`--draft-tokens`, default 1..5) measured at the round sizes C x (K+1) (`--verify-rows`);
   `--untimed-in TABLE` keeps only the cases TABLE has no measured group for; `--dry-run` lists them.
3. Times every candidate (route whose declared domain covers the match and T, x the params its
   family's TuneSpec proposes) cold on the GPU (measure.py + the TuneSpec's builder), after
   checking it once against the route's reference at the family's tolerance.
4. Picks crossovers (crossover.py, picking.py) per match (a row group pinned to the shape) and per generic
   match (format/epilogue/phase/kv_dtype: the sum over the model's shapes), carries every other
   group of the base table over unchanged, validates the table and writes it atomically, plus a
   markdown report with the whole timing grid.
`--replay FILE` re-picks from saved measurements (`--save-measurements`) without a GPU.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


from ..errors import NinferError, RouteError
from . import crossover as X
from ..kernels.tuning import context_families
from .picking import (all_candidates, grids_from_records, merge_measurements, pick_groups,  # noqa: F401
                      render_report, route_candidates)
from .plan import (DECODE_CONTEXTS, DEFAULT_T_POINTS, PREFILL_CONTEXTS, QUICK_T_POINTS,  # noqa: F401
                   all_points, build_plan, candidates_for, case_points, contexts_for, untimed_cases)
from .plan import ints as _ints
from .plan import only_routes as _only
from .shapes import (DRAFT_TOKENS, KV_DTYPES, VERIFY_ROWS, MatchCase, derive_match_set, describe, load_model,
                     parse_families)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sm", type=int, required=True, help="the local GPU's architecture (e.g. 90); refused if it differs")
    parser.add_argument("--artifact", type=Path, help="take the shapes from this artifact (header only, never weights)")
    parser.add_argument("--contract", help="model contract (path or model id; default qwen3.6-27b)")
    parser.add_argument("-o", "--output", type=Path, help="table to write (default routes/smNN.yaml)")
    parser.add_argument("--report", type=Path, help="markdown report (default: the output with .md)")
    parser.add_argument("--families", help="families or groups to measure (linear, attention, gdn, norms, rope, "
                                           "kv_cache, conv1d, ..., all); default all tunable")
    parser.add_argument("--t-points", help="T points, comma separated (default %s; --quick %s)"
                        % (",".join(map(str, DEFAULT_T_POINTS)), ",".join(map(str, QUICK_T_POINTS))))
    parser.add_argument("--quick", action="store_true",
                        help="pruned: 2 param sets per route, fewer T points / contexts, 5 reps")
    parser.add_argument("--routes", help="measure only routes whose name contains one of these comma-separated "
                        "substrings (e.g. lowreg,packed); merge with a full run's measurements via --replay")
    parser.add_argument("--kv-dtypes", default=",".join(KV_DTYPES),
                        help="KV cache formats whose ops are derived (default all: %s)" % ",".join(KV_DTYPES))
    parser.add_argument("--draft-tokens", help="draft windows K whose verify extents are derived (default %s; 0 = no "
                        "verify cases)" % ",".join(map(str, DRAFT_TOKENS)))
    parser.add_argument("--verify-rows", help="concurrencies C a verify case is measured at, T = C x (K+1) (default %s; "
                        "--t-points applies to prefill / decode cases)" % ",".join(map(str, VERIFY_ROWS)))
    parser.add_argument("--untimed-in", type=Path, metavar="TABLE",
                        help="measure only the cases TABLE has no measured group for (no group pinned to the case's "
                             "match with evidence), e.g. routes/sm90.yaml's hand-added rows")
    parser.add_argument("--budget-s", type=float, metavar="S",
                        help="start no case after S seconds (derivation and compiles included); the cases left out "
                             "are named in a warning, the measured ones saved and picked")
    parser.add_argument("--candidates", type=int, metavar="N",
                        help="at most N param sets per route (the family's first N; default all, --quick 2)")
    parser.add_argument("--decode-contexts", help="attention decode contexts (default %s)" % ",".join(map(str, DECODE_CONTEXTS)))
    parser.add_argument("--prefill-contexts", help="attention prefill cached prefixes (default %s)"
                        % ",".join(map(str, PREFILL_CONTEXTS)))
    parser.add_argument("--reps", type=int, help="timed replays per measurement (median; default 10, --quick 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed replays before timing (default 2)")
    parser.add_argument("--hysteresis", type=float, default=X.HYSTERESIS,
                        help="keep the previous route unless another is this much faster (default 0.03)")
    parser.add_argument("--tol", type=float, help="relative RMS tolerance of the reference check (default per family)")
    parser.add_argument("--check", choices=("once", "all"), default="once",
                        help="reference-check each candidate once (first T) or at every T")
    parser.add_argument("--jobs", type=int, help="processes that pre-compile the Triton kernels (default cpus-2, at most 16; 1 = off)")
    parser.add_argument("--base", type=Path, help="table whose other groups are carried over (default: the output if it "
                                                  "exists, else the shipped routes/smNN.yaml)")
    parser.add_argument("--no-base", action="store_true", help="write only the measured groups")
    parser.add_argument("--no-generic", action="store_true", help="no per-format/phase fallback groups")
    parser.add_argument("--save-measurements", type=Path, help="write the raw measurements (JSON; with --replay: "
                        "the merged ones)")
    parser.add_argument("--replay", type=Path, nargs="+",
                        help="re-pick from saved measurements; no GPU needed. Several files merge: a later file's "
                             "timing of the same (op, T, context, route, params) replaces an earlier one")
    parser.add_argument("--last-owns-points", action="store_true",
                        help="with --replay: the last file owns every (op, T, context) it measured (earlier files' "
                             "timings there are dropped), for a run on another card of the same sm")
    parser.add_argument("--no-graph", action="store_true", help="time eager launches between events (no CUDA graph)")
    parser.add_argument("--dry-run", action="store_true", help="print the match set and measurement count, measure nothing")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars on stderr (warnings and errors stay)")


# --------------------------------------------------------------------------- helpers
def gpu_check(sm: int) -> tuple[int, str]:
    """(local sm, device name); NinferError (one line, exit 2) without a CUDA GPU or on a mismatch."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        raise NinferError(f"tune measures on the local GPU, and there is no CUDA GPU here; run it on the sm{sm} "
                          f"machine whose table you want (or --replay saved measurements)")
    major, minor = torch.cuda.get_device_capability()
    local = major * 10 + minor
    if local != sm:
        raise NinferError(f"--sm {sm} but the local GPU ({torch.cuda.get_device_name()}) is sm{local}; a table is only "
                          f"measured on its own architecture (run with --sm {local}, or on an sm{sm} GPU)")
    return local, torch.cuda.get_device_name()


def _command(args) -> str:
    argv = sys.argv
    if "tune" in argv:
        return "ninfer-compile " + shlex.join(argv[argv.index("tune"):])
    parts = ["ninfer-compile", "tune", "--sm", str(args.sm)]
    for flag, val in (("--artifact", args.artifact), ("--contract", args.contract), ("-o", args.output),
                      ("--families", args.families), ("--t-points", args.t_points)):
        if val is not None:
            parts += [flag, str(val)]
    if args.quick:
        parts.append("--quick")
    return shlex.join(parts)


def _nvidia_smi() -> dict:
    """driver / power limit / clocks as nvidia-smi reports them (read only; nothing is changed)."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,power.limit,clocks.max.sm,clocks.max.mem",
                            "--format=csv,noheader,nounits", "-i", str(_cuda_index())],
                           capture_output=True, text=True, timeout=20)
        vals = [v.strip() for v in r.stdout.strip().splitlines()[0].split(",")]
    except Exception:  # noqa: BLE001
        return {}
    out: dict[str, Any] = {}
    if vals and vals[0]:
        out["driver"] = vals[0]
    try:
        out["power_w"] = float(vals[1])
        if out["power_w"].is_integer():
            out["power_w"] = int(out["power_w"])
    except (IndexError, ValueError):
        pass
    if len(vals) > 3 and vals[2] and vals[3]:
        out["clocks"] = f"max sm {vals[2]} MHz, max mem {vals[3]} MHz"
    return out


def _cuda_index() -> int:
    import torch

    return torch.cuda.current_device()


def environment(device: str) -> dict:
    import torch
    import triton

    env = {"device": str(device), "cuda": str(torch.version.cuda), "torch": str(torch.__version__),
           "triton": str(triton.__version__), "host": platform.node() or None}
    env.update(_nvidia_smi())
    try:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        env["sm_count"] = props.multi_processor_count
        l2 = getattr(props, "L2_cache_size", 0)
        if l2:
            env["l2_bytes"] = int(l2)
    except Exception:  # noqa: BLE001
        pass
    return env


# --------------------------------------------------------------------------- measuring
def _precompile(cases, plan, jobs: int, progress, quiet: bool = False) -> list[str]:
    import concurrent.futures as cf
    import dataclasses
    import multiprocessing as mp

    from ..workers import stop_executor

    from .measure import _worker_init, precompile_job

    work = []
    for ci, ctx, t, cands in plan:
        c = cases[ci]
        data = dataclasses.asdict(c)
        # small contexts compile the same kernels
        cctx = None if ctx is None else min(int(ctx), 1024)
        work.append((data, t, cctx, [(r.name, p) for r, p in cands]))
    # one job per distinct specialisation-relevant key
    uniq, seen = [], set()
    for w in work:
        key = json.dumps([w[0]["family"], sorted(w[0]["match"].items()), w[0].get("window"), w[0].get("variant"),
                          w[1], w[2], [(n, sorted(p.items())) for n, p in w[3]]], default=str)
        if key not in seen:
            seen.add(key)
            uniq.append(w)
    errs: list[str] = []
    pool = None
    try:
        pool = cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"),
                                      initializer=_worker_init)
        futs = [pool.submit(precompile_job, w) for w in uniq]
        with progress(total=len(futs), desc="compile", unit="job", disable=quiet,
                      mininterval=0.5 if sys.stderr.isatty() else 20) as bar:
            for f in cf.as_completed(futs):
                try:
                    errs += f.result()
                except Exception as exc:  # noqa: BLE001
                    errs.append(f"precompile worker: {type(exc).__name__}: {exc}")
                bar.update(1)
        pool.shutdown(wait=True)
        pool = None
    except Exception as exc:  # noqa: BLE001 - the timed pass compiles what is missing
        errs.append(f"precompile pool failed ({type(exc).__name__}: {exc}); compiling in the timed pass")
    finally:
        if pool is not None:  # interrupted (SIGINT/SIGTERM) or failed: never wait for the workers
            stop_executor(pool)
    return errs


def measure_all(cases, plan, args, warn, deadline: float | None = None) -> list[dict]:
    """Time every planned candidate. `deadline` (time.time(), `--budget-s`): no case is started
    after it (a case is measured whole or not at all: its contexts are summed per T); the cases
    left out get one warning."""
    import torch
    from tqdm import tqdm

    from .measure import build, time_launches, tolerance

    reps = args.reps or (5 if args.quick else 10)
    total = sum(len(c) for *_, c in plan)
    records: list[dict] = []
    dropped: dict[tuple, str] = {}  # (case, route, params key) -> reason
    checked: set = set()
    current = None
    with tqdm(total=total, desc="measure", unit="run", dynamic_ncols=True, disable=getattr(args, "quiet", False),
              mininterval=0.5 if sys.stderr.isatty() else 20) as bar:
        for i, (ci, ctx, t, cands) in enumerate(plan):
            if ci != current and deadline is not None and time.time() > deadline:
                left = list(dict.fromkeys(describe(cases[j]) for j, *_ in plan[i:]))
                warn(f"--budget-s {args.budget_s:g}: {len(left)} cases not measured (their base rows stay): "
                     + "; ".join(left))
                break
            current = ci
            case = cases[ci]
            bar.set_postfix_str(f"{describe(case)[:48]} T={t}" + (f" ctx={ctx}" if ctx is not None else ""))
            try:
                bench = build(case, t, ctx)
            except Exception as exc:  # noqa: BLE001
                warn(f"{describe(case)} T={t} ctx={ctx}: cannot build operands: {type(exc).__name__}: {exc}")
                bar.update(len(cands))
                continue
            tol = args.tol if args.tol is not None else tolerance(case.family)
            for route, params in cands:
                ck = (ci, route.name, json.dumps(params, sort_keys=True, default=str))
                rec = {"case": ci, "family": case.family, "match": dict(case.match), "t": t, "ctx": ctx,
                       "route": route.name, "params": params, "min_t": route.domain.min_t,
                       "max_t": route.domain.max_t}
                if ck in dropped:
                    rec["error"] = f"dropped earlier: {dropped[ck]}"
                    records.append(rec)
                    bar.update(1)
                    continue
                try:
                    if args.check == "all" or ck not in checked:
                        err = bench.check(route, params)
                        checked.add(ck)
                        rec["rel_rms"] = err
                        if not err <= tol:
                            why = f"reference check failed at T={t}: relative RMS {err:.3g} > {tol:g}"
                            dropped[ck] = why
                            warn(f"dropping {route.name} {params or ''} for {describe(case)}: {why}")
                            rec["error"] = why
                            records.append(rec)
                            bar.update(1)
                            continue
                    us, mode = time_launches(bench.launches(route, params), reps=reps, warmup=args.warmup,
                                             use_graph=not args.no_graph)
                    rec.update(us=us, mode=mode, copies=bench.copies, cold_bytes=bench.cold_bytes)
                except Exception as exc:  # noqa: BLE001
                    why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                    warn(f"{route.name} {params or ''} failed for {describe(case)} T={t}"
                         + (f" ctx={ctx}" if ctx is not None else "") + f": {why} (not a candidate there)")
                    rec["error"] = why
                    torch.cuda.synchronize()
                records.append(rec)
                bar.update(1)
            del bench
            torch.cuda.empty_cache()
    return records


def run(args) -> int:
    from ..routes.table import ROUTES_DIR

    t0 = time.time()
    families = parse_families(args.families)
    quick = args.quick
    t_points = tuple(sorted(set(_ints(args.t_points, QUICK_T_POINTS if quick else DEFAULT_T_POINTS,
                                      "--t-points")) | {1}))
    out = args.output or (ROUTES_DIR / f"sm{args.sm}.yaml")
    report = args.report or out.with_suffix(".md")
    kv = tuple(v.strip() for v in args.kv_dtypes.split(",") if v.strip())
    bad = [v for v in kv if v not in KV_DTYPES]
    if bad or not kv:
        raise NinferError(f"--kv-dtypes: {bad[0] if bad else args.kv_dtypes!r} is not a KV cache format "
                          f"(formats: {', '.join(KV_DTYPES)})")
    drafts = tuple(k for k in _ints(getattr(args, "draft_tokens", None), DRAFT_TOKENS, "--draft-tokens", minimum=0)
                   if k > 0)
    rows = _ints(getattr(args, "verify_rows", None), VERIFY_ROWS, "--verify-rows")
    if getattr(args, "candidates", None) is not None and args.candidates < 1:
        raise NinferError(f"--candidates: must be >= 1, got {args.candidates}")
    warnings: list[str] = []

    def warn(msg: str) -> None:
        warnings.append(msg)
        try:
            from tqdm import tqdm

            tqdm.write(f"warning: {msg}", file=sys.stderr)
        except Exception:  # noqa: BLE001
            print(f"warning: {msg}", file=sys.stderr)

    for flag, path in (("-o", out), ("--report", report), ("--save-measurements", args.save_measurements)):
        if path is not None and (Path(path).is_dir() or Path(path).is_symlink() and not Path(path).exists()):
            raise NinferError(f"{flag} {path}: is a directory (or a dangling link); give the file to write")
    if _only(args) and args.replay is None and args.output is None and args.save_measurements is None \
            and not args.dry_run:
        raise NinferError("--routes measures a subset of the routes: give --save-measurements FILE (to merge "
                          "with --replay) or -o TABLE")
    if args.replay is not None:
        saved = merge_measurements(args.replay, args.sm, last_owns_points=args.last_owns_points)
        cases = [MatchCase(**c) for c in saved["cases"]]
        records = saved["records"]
        env = saved["environment"]
        t_points = tuple(saved.get("t_points", t_points))
        warnings = list(saved.get("warnings", []))
        elapsed = saved.get("elapsed_s")
        source = saved.get("source", "")
        command = saved.get("command", _command(args))
        if args.save_measurements:  # the merged measurements, in the format --replay reads
            X.write_text_atomic(args.save_measurements, json.dumps(saved, default=str, indent=1))
    else:
        device = "(dry run)" if args.dry_run else gpu_check(args.sm)[1]
        spec, objects, source = load_model(args.artifact, args.contract)
        notes_kv: list[str] = []
        cases = derive_match_set(spec, objects, kv_dtypes=kv, families=families, notes=notes_kv,
                                 draft_tokens=drafts)
        for n in notes_kv:
            print(f"note: {n}", file=sys.stderr)
        if args.untimed_in is not None:
            n_all = len(cases)
            cases = untimed_cases(cases, args.untimed_in, args.sm)
            print(f"--untimed-in {args.untimed_in}: {len(cases)} of {n_all} cases have no measured group there",
                  file=sys.stderr)
        if not cases:
            raise NinferError(f"{source}: no op of the families {', '.join(families)} to tune"
                              + (f" (none untimed in {args.untimed_in})" if args.untimed_in is not None else ""))
        plan = build_plan(cases, t_points, args)
        n_meas = sum(len(c) for *_, c in plan)
        n_ver = sum(1 for c in cases if c.window)
        print(f"tune sm{args.sm} on {device}: {source}; {len(cases)} matches, {len(plan)} operand sets, "
              f"{n_meas} measurements (T points {','.join(map(str, t_points))}{', quick' if quick else ''}"
              + (f"; {n_ver} verify cases at T = C x W, C in {','.join(map(str, rows))}" if n_ver else "") + ")",
              flush=True)
        per_case: dict[int, int] = {}
        for ci, _, _, cands in plan:
            per_case[ci] = per_case.get(ci, 0) + len(cands)
        for ci, c in enumerate(cases):
            pts = ",".join(map(str, case_points(c, t_points, args))) if c.window else ""
            print(f"  {describe(c)}" + (f" T={pts}" if pts else "") + f": {per_case.get(ci, 0)} measurements",
                  flush=True)
        t_points = all_points(cases, t_points, args)  # saved: the verify cases' round sizes too
        if args.dry_run:
            return 0
        env = environment(device)
        if env.get("l2_bytes"):
            from .measure import set_l2_bytes

            set_l2_bytes(env["l2_bytes"])
        jobs = args.jobs if args.jobs is not None else max(1, min(16, (os.cpu_count() or 1) - 2))
        if jobs > 1:
            from tqdm import tqdm

            tc = time.time()
            errs = _precompile(cases, plan, jobs, tqdm, quiet=getattr(args, "quiet", False))
            print(f"precompiled in {time.time() - tc:.0f} s with {jobs} processes", flush=True)
            if errs:
                print(f"precompile: {len(errs)} launch errors (the timed pass reports them per candidate)",
                      file=sys.stderr)
        budget = getattr(args, "budget_s", None)
        records = measure_all(cases, plan, args, warn, deadline=None if budget is None else t0 + budget)
        elapsed = time.time() - t0
        command = _command(args)
        if args.save_measurements:
            import dataclasses

            X.write_text_atomic(args.save_measurements, json.dumps({
                "sm": args.sm, "source": source, "command": command, "environment": env,
                "t_points": list(t_points), "elapsed_s": elapsed, "warnings": warnings,
                "cases": [dataclasses.asdict(c) for c in cases], "records": records}, default=str, indent=1))
    if _only(args) and args.replay is None and args.output is None:
        # a partial measurement: a table picked from a few routes would silently drop the others
        print(f"measured only routes matching {','.join(_only(args))}: no table written (no -o); merge "
              f"with a full run: ninfer-compile tune --sm {args.sm} --replay FULL.json "
              f"{args.save_measurements} -o TABLE", flush=True)
        return 0
    groups = pick_groups(cases, records, t_points, args.hysteresis, generic=not args.no_generic)
    if not groups:
        raise NinferError("no candidate produced a timing; nothing to write (see the warnings above)")
    carried: list[str] = []
    base_groups: list[X.Group] = []
    fuse_off: dict[str, str] = {}
    if not args.no_base:
        base = args.base or (out if out.is_file() else ROUTES_DIR / f"sm{args.sm}.yaml")
        if base.is_file():
            from ..routes.table import load_table_data
            from ..yaml_lines import YamlInputError

            try:
                data = load_table_data(base)  # with its `extends:` base merged in
            except YamlInputError as exc:
                raise NinferError(f"--base {base}: {str(exc).splitlines()[0]}") from None
            except OSError as exc:
                raise NinferError(f"--base {base}: cannot read: {exc.strerror or exc}") from None
            if isinstance(data, dict):
                if data.get("sm") not in (None, args.sm):
                    raise NinferError(f"--base {base}: table is for sm {data.get('sm')}, not {args.sm}")
                base_groups, carried = X.carry_groups(data, groups)
                fuse_off = dict(data.get("fuse_off") or {})  # the base's measured switch-offs stay
                carried = [f"{c} (from {base.name})" for c in carried]
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    dropped = [w for w in warnings if w.startswith("dropping ")]
    notes = [f"shapes from {source}",
             "rows pinned to a shape (n/k/head_dim) carry that op's evidence; fallback groups (format/epilogue/"
             "phase/kv_dtype only) were picked on the sum of µs over the model's shapes",
             "evidence: µs per route (best params) at each measured T inside the row; `selected` = the row's own "
             "params when they are not that route's best there"
             + "".join(f"; {f} sums its contexts" for f in context_families()),
             f"hysteresis {args.hysteresis:g}; cold = operands rotated over copies > 3x L2, CUDA graph replay, median"]
    if quick:
        notes.append("--quick: pruned params / T points / contexts")
    if dropped:
        notes.append(f"{len(dropped)} candidates dropped by the reference check (see the report)")
    if carried:
        notes.append("groups without evidence were carried over unmeasured from the base table: "
                     + "; ".join(carried))
    prov: dict[str, Any] = {"source": "measured", "command": command, "date": date,
                            "device": env.get("device"), "driver": env.get("driver"), "cuda": env.get("cuda"),
                            "torch": env.get("torch"), "triton": env.get("triton"), "power_w": env.get("power_w"),
                            "clocks": env.get("clocks"), "host": env.get("host"),
                            "tool": "ninfer-compile tune", "notes": ". ".join(notes)}
    prov = {k: v for k, v in prov.items() if v is not None}
    header = (f"Route table for sm_{args.sm}, measured by `ninfer-compile tune` on {env.get('device')} ({date}).\n"
              f"Timing grid: {report.name}. Validate: ninfer-compile routes validate {out.name}")
    from ..kernels.registry import default_registry

    text = X.render_table(args.sm, prov, groups + base_groups, header_comment=header, registry=default_registry,
                           fuse_off=fuse_off)
    try:
        table = X.write_table(out, text)
    except RouteError as exc:
        bad = out.with_name(out.name + ".rejected")
        X.write_text_atomic(bad, text)
        raise RouteError(f"the picked table did not validate (kept as {bad}; {out} untouched): "
                         f"{str(exc).splitlines()[0]}") from None
    md = render_report(cases, records, groups, {**prov, "sm": args.sm}, dropped, carried, t_points, elapsed)
    X.write_text_atomic(report, md)
    n_rows = sum(len(g.rows) for g in groups)
    print(f"wrote {out} ({len(groups)} measured groups, {n_rows} rows; {len(base_groups)} carried over; "
          f"sha256 {table.sha256[:12]}) and {report}; {len(warnings)} warnings", flush=True)
    return 0
