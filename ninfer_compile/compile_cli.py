"""`ninfer-compile ARTIFACT --sm N` — compile an artifact into a plan directory for one GPU arch.

Reads only the artifact's JSON directory (no payload bytes), matches it to its model contract,
lowers one graph per extent (a prefill chunk; decode T = C per concurrency C; with --draft-tokens K > 0
also verify T = C x (K+1) and, when the artifact has MTP, the MTP head's extents), runs the
pass pipeline (passes/pipeline.py) with the route table for the sm, plans memory and writes
`ARTIFACT.smN.plan/` atomically: plan.json, memory.txt, kernels/ (the emitted source and, unless
--no-binaries, the kernels compiled ahead of time for the sm: kernels/bin/, codegen/aot.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .errors import CompileError, ContractError
from .ir.graph import Graph
from .ir.lower import (DRAFT_HEADS, KV_DTYPES, MAX_DRAFT_TOKENS, LowerOptions, draft_head, lower_all,
                       plan_extents)
from .passes.context import PassContext
from .passes.pipeline import PASS_NAMES, check_disabled, run_pipeline
from .plan.manifest import build_manifest
from .plan.memory import (MemoryReport, check_budget, check_budget_value, context_fit, fit_warnings,
                          memory_report, report_text)
from .plan.output import (DUMP_MARKER, DUMP_MARKER_TEXT, check_destination, dump_problem, make_temp_dir,
                          plan_problem, prepare_destination, swap_into_place)
from .plan.writer import write_plan


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", type=Path, help="the .ninfer artifact")
    parser.add_argument("--sm", type=int, required=True, help="target compute capability, e.g. 86, 89, 90, 120")
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="plan directory (default ARTIFACT.smN.plan); an existing one is replaced only if "
                             "it is a plan ninfer-compile wrote, anything else is refused")
    parser.add_argument("--routes", type=Path, default=None, help="route table (default routes/smN.yaml)")
    parser.add_argument("--contract", type=Path, default=None, help="model contract YAML")
    parser.add_argument("--concurrency", default="1", help="decode concurrencies C, comma separated (default 1)")
    parser.add_argument("--draft-tokens", type=int, default=0,
                        help=f"draft window K (0..{MAX_DRAFT_TOKENS}, default 0): K > 0 adds the speculative verify "
                             "extents verify_cC_kK (T = C x (K+1)) and, when the artifact has MTP, the MTP head's "
                             "extents (docs/SPECULATIVE.md)")
    parser.add_argument("--draft-head", choices=DRAFT_HEADS, default=None,
                        help="the MTP graphs' output head: shortlist (text/draft_head + a take of "
                             "text/draft_head_token_ids; the default when the artifact has them) or full "
                             "(text/output_head)")
    parser.add_argument("--prefill-chunk", type=int, default=1024,
                        help="prefill extent T (default 1024; clamped to --max-context, with a note)")
    parser.add_argument("--max-context", default="4096", metavar="N|auto",
                        help="KV cache positions per slot (default 4096); auto (needs --memory-budget): the "
                             "largest that fits the budget for the KV format and the concurrency")
    parser.add_argument("--kv-dtype", default="bf16",
                        help=f"KV cache format: {'|'.join(KV_DTYPES)} (kernels/kv_cache/formats.py; the memory "
                             f"report gives its exact B/token)")
    parser.add_argument("--memory-budget", type=float, default=None, metavar="GiB",
                        help="fail unless weights + KV + state + workspace fit in GiB (a finite number > 0). "
                             "Without it the plan's size is still checked: a warning (exit 0) when it exceeds "
                             "this machine's GPU memory (if that GPU has the target sm) or the largest "
                             "single GPU of that sm")
    parser.add_argument("--tp", type=int, default=1, choices=(1, 2, 4, 8), metavar="N",
                        help="tensor parallelism over N GPUs (1, 2, 4, 8; default 1): the plan holds one section "
                             "per rank (passes/shard_tensor_parallel.py); --memory-budget is per card")
    parser.add_argument("--explain", action="store_true", help="print every op's route and table row")
    parser.add_argument("--dump-ir", type=Path, default=None, metavar="DIR",
                        help="write the IR after lowering and every pass (txt, yaml, dot per extent); an "
                             "existing DIR is replaced only if it is an earlier dump")
    parser.add_argument("--disable-pass", action="append", default=[], metavar="NAME",
                        help=f"switch a pass off (repeatable): {', '.join(PASS_NAMES)}")
    parser.add_argument("--prefill-logits", choices=("last", "all"), default="last",
                        help="prefill head rows: last (the chunk's last column, for generation) or all (every "
                             "column: ninfer-run --perplexity needs it)")
    columns = parser.add_mutually_exclusive_group()
    columns.add_argument("--column-specialization", dest="column_specialization", action="store_const",
                         const="on", default="auto",
                         help="keep Triton's specialisation of every kernel's column-count arguments (more "
                              "binaries: on the 27B 70 instead of 45, a cold compile ~30 s instead of ~20 s on 2 "
                              "cores). Default: when binaries are built, the column counts (T, chunk counts) of "
                              "the kernels only prefill extents launch are left unspecialised "
                              "(@triton.jit(do_not_specialize=...) in the emitted source; a decode or verify "
                              "step's kernels are untouched; prefill speed unchanged on an H100; "
                              "codegen/column_specialization.py)")
    columns.add_argument("--no-column-specialization", dest="column_specialization", action="store_const",
                         const="off", help="leave those column counts unspecialised also with --no-binaries "
                                           "(an error where the launches cannot be reproduced)")
    parser.add_argument("--no-binaries", action="store_true",
                        help="emit kernel source only: skip the ahead-of-time cubins (kernels/bin/); the "
                             "runtime then JIT-compiles every kernel at load")
    parser.add_argument("--cache-dir", type=Path, default=None, metavar="DIR",
                        help="the binary cache: kernel binaries kept between compiles, keyed by everything that "
                             "decides their bytes (default $XDG_CACHE_HOME/ninfer-compile or "
                             "~/.cache/ninfer-compile); plans still get their own copies")
    parser.add_argument("--no-cache", action="store_true",
                        help="neither read nor write the binary cache: compile every kernel binary")
    parser.add_argument("--cache-size", default=None, metavar="SIZE",
                        help="the binary cache's size cap, e.g. 2G (default), 500M; least recently used "
                             "entries are deleted beyond it")
    parser.add_argument("--weight-digests", action="store_true",
                        help="hash every weight payload the plan binds into plan.json (reads all bound "
                             "payload bytes: ~15 GB on the 27B) so that `ninfer-run --verify-weights` can "
                             "check the weights themselves, not only the artifact's directory")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress lines on stderr (warnings, errors and the summary line stay)")


def _max_context(text: str):
    """--max-context: an integer or `auto` (a bad value is a CompileError)."""
    if str(text).strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise CompileError(f"--max-context must be an integer or auto, got {text!r}") from None


def _concurrency(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in str(text).split(",") if v.strip() != "")
    except ValueError:
        raise CompileError(f"--concurrency must be comma-separated integers, got {text!r}") from None
    if not vals:
        raise CompileError("--concurrency needs at least one value")
    return vals


@dataclass
class Compiled:
    graphs: list[Graph]  # rank 0's under --tp N (all ranks: rank_graphs)
    manifest: dict[str, Any]
    memory: MemoryReport
    memory_txt: str
    kernel_files: dict[str, str | bytes]  # emitted route library (+ binaries): relative path -> text / bytes
    binaries: dict[str, Any] | None = None  # kernels/manifest.json["binaries"] (None: nothing emitted)
    rank_graphs: list[list[Graph]] | None = None  # --tp N: each rank's graphs


# Emit the route library into every plan. Only the compiler's own tests, which route through an
# isolated registry of launcher-less fake routes, switch it off (tests/compile/conftest.py).
EMIT_KERNELS = True


def _can_reproduce(sm) -> bool:
    """Triton can target `sm` here (the cheap check: no runtime import): the default unspecialises
    the prefill-only kernels' column counts only then (and keeps them when the launches turn out not
    to be reproducible: `aot.column_parameters(required=False)`)."""
    from .codegen.aot import toolchain_problem

    return toolchain_problem(sm, runtime=False) is None


def compile_artifact(artifact_path: Path, sm: int, *, routes: Path | None = None, contract: Path | None = None,
                     opts: LowerOptions, budget_gib: float | None = None, disabled: list[str] = (),
                     dump_dir: Path | None = None, binaries: bool = True,
                     progress: Callable[[str], None] | None = None, auto_context: bool = False,
                     tp: int = 1, cache=None, column_specialization: str = "on") -> Compiled:
    """Compile an artifact for `sm`. `binaries`: also compile every launched kernel ahead of time
    into kernels/bin/ (codegen/aot.py; problems are recorded in the kernel manifest, fatal only
    under NINFER_AOT_STRICT=1). `cache`: the binary cache (codegen/binary_cache.py; None: none).
    `progress(line)` is told each phase and count ("lowering 5 extents", "passes: extent 3/5", ...).
    `auto_context`: opts.max_context is only the first probe; the plan gets the largest context per
    slot whose plan fits `budget_gib` (`_fit_context`). `column_specialization`: "on" keeps Triton's
    specialisation everywhere; "off" leaves the prefill-only kernels' column counts unspecialised
    (codegen/column_specialization.py); "auto" (the CLI default) is "off" when binaries are built and
    the launches can be reproduced here, else "on"."""
    say = progress or (lambda line: None)
    from .artifact import Artifact
    from .contracts import check_artifact, find_contract
    from .routes import table_for_sm

    disabled_set = check_disabled(disabled)
    check_budget_value(budget_gib)
    table = table_for_sm(sm, routes)
    with Artifact.open(artifact_path) as art:
        con = find_contract(art.path, art.model_id, contract)
        if con.model_id != art.model_id:
            raise ContractError(f"contract {con.source or contract} is for model {con.model_id!r}, the artifact "
                                f"{Path(artifact_path).name} is {art.model_id!r}")
        spec = con.resolve_for(art)
        check_artifact(art, spec)
        objects = dict(art.by_name)
        directory_sha256 = art.directory_sha256()
        model_id = art.model_id
    from .routes import table as table_mod

    ctx = PassContext(spec=spec, objects=objects, table=table, registry=table_mod.default_registry)
    if opts.draft_head is not None:  # an explicit head the artifact lacks is refused whatever K is
        draft_head(spec, opts)

    from dataclasses import replace

    def plan_for(o: LowerOptions, dump: Path | None) -> tuple[list[list[Graph]], list[MemoryReport]]:
        """Every rank's graphs and memory report (one rank without --tp)."""
        o = replace(o, argmax_decode=tp > 1)  # the greedy twins: only a --tp N > 1 plan gains from them
        extents = plan_extents(spec, o)
        say(f"lowering {len(extents)} extents" + (f" (--max-context auto: trying {o.max_context})"
                                                   if auto_context else ""))
        lowered = lower_all(spec, o)
        ranks, reports = [], []
        for r in range(tp):
            c = ctx if tp == 1 else replace(ctx, options={**ctx.options, "tp": tp, "rank": r})
            gs = []
            for i, g in enumerate(lowered, start=1):
                say(f"passes: extent {i}/{len(lowered)} ({g.extent.name})" + (f", rank {r}" if tp > 1 else ""))
                gs.append(run_pipeline(g, c, disabled_set, None if dump is None else
                                       (dump if tp == 1 else Path(dump) / f"rank{r}")))
            ranks.append(gs)
            reports.append(memory_report(gs, objects, spec, slots=o.slots, max_context=o.max_context,
                                         kv_dtype=o.kv_dtype, registry=ctx.registry))
        return ranks, reports

    if auto_context:  # the largest rank's report decides (a budget is per card)
        opts = _fit_context(opts, budget_gib, lambda o: max(plan_for(o, None)[1], key=lambda m: m.total))
    rank_graphs, reports = plan_for(opts, dump_dir)
    graphs, mem = rank_graphs[0], max(reports, key=lambda m: m.total)
    check_budget(mem, budget_gib)
    options = {"concurrency": sorted(set(opts.concurrency)), "draft_tokens": opts.draft_tokens,
               "prefill_chunk": opts.prefill_chunk, "max_context": opts.max_context, "kv_dtype": opts.kv_dtype,
               "memory_budget_gib": budget_gib, "prefill_logits": opts.prefill_logits,
               "slots": opts.slots}
    if column_specialization not in ("on", "off", "auto"):
        raise CompileError(f"column_specialization must be on, off or auto, got {column_specialization!r}")
    unspecialize = column_specialization == "off" or (
        column_specialization == "auto" and binaries and EMIT_KERNELS and _can_reproduce(sm))
    if unspecialize:  # (absent with --column-specialization: those plans are as before the option)
        options["column_specialization"] = False
    if opts.draft_tokens > 0:  # (absent at K = 0: those plans stay byte-identical to before)
        mtp = any(g.extent.graph == "mtp" for g in graphs)
        options["draft_head"] = draft_head(spec, opts) if mtp else None
    # file names only: a plan never carries host paths (the sha256 identifies the bytes)
    table_ref = f"{table.name} (--routes)" if routes is not None else f"routes/{table.name}"
    contract_ref = f"{Path(contract).name} (--contract)" if contract is not None else (
        f"graphs/{model_id}.yaml" if con.source and Path(con.source).parent.name == "graphs"
        else Path(con.source or f"{model_id}.yaml").name)
    from .passes.pipeline import applicable

    ran = applicable(replace(ctx, options={**ctx.options, "tp": tp}))
    enabled = [p for p in PASS_NAMES if p not in disabled_set and p in ran]
    manifests = [build_manifest(
        gs, model_id=model_id, artifact_file=Path(artifact_path).name, directory_sha256=directory_sha256,
        contract=contract_ref, sm=sm, table=table, table_ref=table_ref, options=options,
        enabled=enabled, disabled=sorted(disabled_set), memory=m, registry=ctx.registry)
        for gs, m in zip(rank_graphs, reports)]
    from .plan.tensor_parallel import join_ranks, memory_text, rank_view

    manifest = manifests[0] if tp == 1 else join_ranks(manifests)
    # emission: the route-library source of every launched route, standalone (runtime imports it)
    files = {}
    bins = None
    if EMIT_KERNELS:
        from .codegen import aot
        from .codegen.emit import kernel_files, launches_from_manifest

        say("emitting kernels")
        launches = [L for m in manifests for L in launches_from_manifest(m, registry=ctx.registry)]
        files, _ = kernel_files(launches)
        # the ranks' launches have the same shapes, so rank 0's specialisations are every rank's;
        # its JSON (in both cache keys: ~0.3 s for 18 extents) is serialised once
        view = rank_view(manifest, 0)
        view_text = aot.plan_json(view) if cache is not None and (unspecialize or binaries) else None
        if unspecialize:  # the prefill launches reproduced once to find the column-count arguments
            say("finding the kernels' column-count arguments")
            columns = aot.column_parameters(view, files, objects, sm, cache=cache,
                                            required=column_specialization == "off", plan_text=view_text)
            if columns:
                files, _ = kernel_files(launches, unspecialized=columns)
            elif column_specialization == "auto":  # nothing left unspecialised: the plan says so
                for m in {id(x): x for x in (manifest, *manifests)}.values():
                    m.get("options", {}).pop("column_specialization", None)
                view = rank_view(manifest, 0)
                view_text = aot.plan_json(view) if view_text is not None else None
        # ahead-of-time binaries for the plan's sm (needs the kernel source just rendered)
        result = (aot.precompile(view, files, objects, sm, progress=progress, cache=cache, plan_text=view_text)
                  if binaries
                  else aot.disabled("--no-binaries"))
        files = aot.attach_binaries(files, result)
        bins = result.summary
    text = report_text(mem, budget_gib) if tp == 1 else memory_text(reports, budget_gib)
    return Compiled(graphs, manifest, mem, text, files, bins, rank_graphs if tp > 1 else None)


def _fit_context(opts: LowerOptions, budget_gib: float | None, report_for) -> LowerOptions:
    """--max-context auto: the largest context per slot whose plan fits the budget. The KV cache
    grows by slots x B/token per position and the split-KV workspaces step with the context, so
    fit from a probe (opts.max_context), re-plan there, and refit until the context is stable
    (a few rounds); the largest context seen to fit wins."""
    from dataclasses import replace

    if budget_gib is None:
        raise CompileError("--max-context auto needs --memory-budget (the budget the context is fitted to)")
    least = max(opts.prefill_chunk, opts.draft_tokens + 1)
    cur, best, tried = opts.max_context, None, set()
    for _ in range(6):
        tried.add(cur)
        rep = report_for(replace(opts, max_context=cur))
        fit = context_fit(rep, budget_gib)
        if fit >= cur:
            best = cur if best is None else max(best, cur)
        if fit < least and best is None:
            raise CompileError(
                f"--max-context auto: not even {least} positions per slot (the prefill chunk / draft window) fit "
                f"--memory-budget {budget_gib:g} GiB with {rep.slots} slot(s), KV {rep.kv_dtype} "
                f"({rep.kv_bytes_per_token:,d} B/token; the rest of the plan needs "
                f"{rep.total - rep.kv:,d} B)")
        if fit in tried or fit < least:
            break
        cur = fit
    if best is None:
        raise CompileError(f"--max-context auto: no context fits --memory-budget {budget_gib:g} GiB")
    return replace(opts, max_context=best)


def _shape(s) -> str:
    return "[" + ",".join(str(d) for d in s) + "]"


def explain(compiled: Compiled, out=None) -> None:
    out = out or sys.stdout
    ranks = compiled.rank_graphs or [compiled.graphs]
    for r, gs in enumerate(ranks):
        if len(ranks) > 1:
            print(f"# rank {r} of {len(ranks)}", file=out)
        _explain_graphs(gs, out)


def _explain_graphs(graphs: list[Graph], out) -> None:
    for g in graphs:
        e = g.extent
        print(f"# extent {e.name}: {e.phase}, T={e.t}, C={e.concurrency}, K={e.draft_tokens}, "
              f"cuda_graph={g.meta.get('cuda_graph', {}).get('capture', False)}", file=out)
        for op in g.ops():
            if op.kind in ("input", "output", "reshape", "split"):
                continue
            outs = [g.tensors[t] for t in op.outputs.values() if g.tensors[t].role != "state"]
            shape = _shape(outs[0].shape) if outs else "-"
            w = op.inputs.get("weight") or op.inputs.get("table")
            if w is not None:
                shape = f"{_shape(g.tensors[w].shape)}->{shape}"
            if op.route is not None:
                from .passes.select_routes import op_t

                params = ",".join(f"{k}={v}" for k, v in sorted(op.route.params.items())) or "-"
                epi = op.attrs.get("epilogue")
                kind = op.kind + (f"+{epi}" if epi and epi != "none" else "")
                print(f"{e.name}\t{op.name}\t{kind}\t{shape}\tT={op_t(g, op)}\t{op.route.route}\t{params}\t"
                      f"{op.route.source}", file=out)
            else:
                print(f"{e.name}\t{op.name}\t{op.kind}\t{shape}\tT={e.t}\t(builtin)\t-\t-", file=out)


def _overlap(a: Path, b: Path) -> bool:
    ra, rb = Path(os.path.realpath(a)), Path(os.path.realpath(b))
    return ra == rb or ra in rb.parents or rb in ra.parents


def run(args) -> int:
    def progress(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    # everything that can be refused without reading the artifact is refused here, before any work
    check_budget_value(args.memory_budget)
    if not 0 <= args.draft_tokens <= MAX_DRAFT_TOKENS:
        raise CompileError(f"--draft-tokens must be in 0..{MAX_DRAFT_TOKENS}, got {args.draft_tokens}")
    chunk = args.prefill_chunk
    args.max_context = _max_context(args.max_context)
    auto = args.max_context == "auto"
    if auto and args.memory_budget is None:
        raise CompileError("--max-context auto needs --memory-budget (the budget the context is fitted to)")
    from .codegen.binary_cache import open_cache, parse_size

    try:
        cache_size = parse_size(args.cache_size) if args.cache_size is not None else None
    except ValueError as exc:
        raise CompileError(str(exc)) from None
    cache = None if args.no_binaries or args.no_cache else open_cache(args.cache_dir, cache_size)
    max_context = max(chunk, args.draft_tokens + 1, 1) if auto else args.max_context  # auto: the first probe
    if 1 <= max_context < chunk:
        print(f"note: --prefill-chunk {chunk} clamped to --max-context {max_context}", file=sys.stderr)
        chunk = max_context
    # the MTP head only serves drafting: without a draft window (K = 0) its graphs, KV cache and
    # kernels would be compiled, allocated and captured for nothing
    opts = LowerOptions(prefill_chunk=chunk, concurrency=_concurrency(args.concurrency),
                        draft_tokens=args.draft_tokens, max_context=max_context, kv_dtype=args.kv_dtype,
                        mtp=args.draft_tokens > 0, prefill_logits=args.prefill_logits,
                        draft_head=args.draft_head)
    out_dir = args.output or Path(f"{args.artifact}.sm{args.sm}.plan")
    inputs = [args.artifact, args.routes, args.contract]
    out_flag = "-o" if args.output is not None else "-o (default)"
    check_destination(out_dir, flag=out_flag, what="plan", problem=plan_problem, inputs=inputs)
    if args.dump_ir is not None:
        if _overlap(args.dump_ir, out_dir):
            raise CompileError(f"--dump-ir {args.dump_ir}: overlaps the plan directory {out_dir}; give them "
                               f"separate paths")
        check_destination(args.dump_ir, flag="--dump-ir", what="IR dump", problem=dump_problem, inputs=inputs)
    # every refusal is above (nothing touched); now clean interrupted swaps' leftovers, probe the parents
    notes = prepare_destination(out_dir, flag=out_flag, problem=plan_problem)
    if args.dump_ir is not None:
        notes += prepare_destination(args.dump_ir, flag="--dump-ir", problem=dump_problem)
    for n in notes:  # a plan an interrupted swap had left under .NAME.old-PID-... is back at its path
        print(f"note: {n}", file=sys.stderr)
    dump_tmp = None
    try:
        if args.dump_ir is not None:
            dump_tmp = make_temp_dir(args.dump_ir)
            (dump_tmp / DUMP_MARKER).write_text(DUMP_MARKER_TEXT)
        compiled = compile_artifact(args.artifact, args.sm, routes=args.routes, contract=args.contract, opts=opts,
                                    budget_gib=args.memory_budget, disabled=args.disable_pass, dump_dir=dump_tmp,
                                    binaries=not args.no_binaries, progress=progress, auto_context=auto,
                                    tp=args.tp, cache=cache, column_specialization=args.column_specialization)
        if args.weight_digests:
            from .plan.integrity import add_weight_digests, weight_digests

            progress("weight digests: hashing the bound payloads")
            compiled.manifest = add_weight_digests(
                compiled.manifest, weight_digests(args.artifact, compiled.manifest, progress=not args.quiet))
        progress(f"writing {out_dir}")
        write_plan(out_dir, compiled.manifest, compiled.memory_txt, extra_files=compiled.kernel_files)
        if dump_tmp is not None:
            swap_into_place(dump_tmp, args.dump_ir)
            dump_tmp = None
    except OSError as exc:  # the dump directory (the plan's own errors are CompileErrors)
        raise CompileError(f"--dump-ir {args.dump_ir}: cannot write: {exc.strerror or exc}") from None
    finally:
        if dump_tmp is not None:
            shutil.rmtree(dump_tmp, ignore_errors=True)
    if args.explain:
        explain(compiled)
    from .plan.tensor_parallel import rank_view

    extents = rank_view(compiled.manifest, 0)["extents"]
    off = sorted({r for x in extents.values() for r in x.get("fusions_off", {})})
    if off and not args.quiet:
        print(f"note: the route table switches fusion rules off: {', '.join(off)} (why: plan.json "
              f"extents.*.fusions_off)", file=sys.stderr)
    m = compiled.memory
    print(f"wrote {out_dir}: {len(compiled.graphs)} extents, "
          f"{sum(len(x['launches']) for x in extents.values())} launches"
          f"{f' per rank, {args.tp} ranks' if args.tp > 1 else ''}, "
          f"needs {m.total} bytes{' per card' if args.tp > 1 else ''} (weights {m.weights}, KV {m.kv}, state {m.state}, workspace {m.workspace}"
          f"{f', route workspaces {m.route_workspace}' if m.route_workspace else ''})",
          file=sys.stderr)
    for w in fit_warnings(m, args.sm):
        print(f"warning: {w}", file=sys.stderr)
    b = compiled.binaries
    if b is not None:
        from .codegen import aot

        why = aot.failure(b)  # binaries failed: the plan is still written (the runtime JITs), and says why
        if b.get("status") in ("ok", "partial"):
            print(f"kernel binaries: {b['entries']} for sm_{b['sm']} (triton {b['triton']})", file=sys.stderr)
        elif why is None:
            print(f"kernel binaries: none ({b.get('status')}: {b.get('reason')}); the runtime JITs the source",
                  file=sys.stderr)
        if why is not None:
            print(f"warning: {why}", file=sys.stderr)
    return 0
