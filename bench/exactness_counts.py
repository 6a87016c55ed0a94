"""Exactness counts of the CPU's torch path (issue 28 item 2), one report.

    python bench/exactness_counts.py [--prompts 2] [--tokens 12] [--interp-tokens 3] [--work DIR]
                                     [--out bench/results/exactness_counts_<date>.md]

For the trained tiny model (examples/tiny-trained, bf16, its MTP head) and the random tiny configs
of the end-to-end tests (tests/runtime/support.py: head_dim 32 with a random MTP head, bf16, as in
test_speculative_e2e.py; the same model packed with the default quantized recipe, as in
test_runtime_e2e.py; head_dim 64, bf16, as in tests/kernels/kv_cache/test_kv_formats_e2e.py), every
KV format the model's head_dim allows, and plain decode, MTP rounds (models with an MTP part) and
n-gram rounds for K = 1..5 (one plan per K, C = 1, prefill chunk 8): each prompt runs for
`--tokens` greedy tokens through the runtime (torch path), and every token is judged
against ninfer_compile.reference (fp32, its KV cache storing the format's quantize -> dequantize)
by the end-to-end tests' rule (ninfer_compile/reference/greedy_check.py): the argmax for its prefix,
or a near-tie (within 2% of that row's logit spread). Counted: tokens checked, equal to the argmax,
accepted as near-ties, violations (every one is printed), and, for the speculative runs, tokens
equal to the plain run's.

The interpreter leg: the trained tiny model, K = 2, KV int8, one prompt, `--interp-tokens`
tokens each of plain / MTP / n-gram, with the plan's Triton kernels under Triton's interpreter
(kernels="interpret") beside the torch path on the same plan: both judged by the same rule, and
the tokens they share counted.
Not a test: nothing is asserted; the exit status is 1 when a violation was found.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: the interpreter leg needs it

import argparse  # noqa: E402
import datetime  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))  # bench_cpu
sys.path.insert(0, str(REPO / "tests"))  # runtime.support, quality.support, reference.hf_tiny (before bench/quality.py)

from bench_cpu import provenance  # noqa: E402
from runtime import support as S  # noqa: E402

from ninfer_compile.kernels.kv_cache import formats as F  # noqa: E402
from ninfer_compile.reference.greedy_check import EXACT, NEAR, NEAR_TIE, VIOLATION, judge_greedy  # noqa: E402

KS = (1, 2, 3, 4, 5)
CHUNK = 8
INTERP_K, INTERP_KV = 2, ("int8",)
NEAR_TIES: list[str] = []
VIOLATIONS: list[str] = []


def say(msg: str) -> None:
    print(msg, flush=True)


# ----------------------------------------------------------------------------- models


def models(work: Path, n_prompts: int) -> list[dict]:
    """(name, artifact, head_dim, has_mtp, prompts) of the trained tiny model and the e2e tests' configs."""
    import reference.hf_tiny as tiny
    from quality import support as Q

    ids = Q.heldout_ids()
    trained = [ids[:9], ids[500:530], ids[1200:1217], ids[2000:2013]]
    rand = [S.PROMPT, S.PROMPT[:9], [5, 77, 301, 12, 9, 250, 64, 3, 199, 42], [11, 300, 2, 4, 6, 90, 17]]
    out = [dict(name="tiny-trained", art=Q.pack(work / "tiny-trained-bf16.ninfer", "bf16"), head_dim=64, mtp=True,
                prompts=trained[:n_prompts])]
    S.make_hf_mtp_checkpoint(work / "hf32mtp")
    out.append(dict(name="random hd32 + MTP (bf16)", art=S.pack(work / "hf32mtp", work / "r32mtp.ninfer", "bf16"),
                    head_dim=32, mtp=True, prompts=rand[:n_prompts]))
    S.make_hf_checkpoint(work / "hf32")
    out.append(dict(name="random hd32 (default recipe)", art=S.pack(work / "hf32", work / "r32q.ninfer", "default"),
                    head_dim=32, mtp=False, prompts=rand[:n_prompts]))
    tiny.make_hf_model(0, **S.TINY_OVERRIDES, head_dim=64).save_pretrained(work / "hf64", safe_serialization=True)
    out.append(dict(name="random hd64 (bf16)", art=S.pack(work / "hf64", work / "r64.ninfer", "bf16"), head_dim=64,
                    mtp=False, prompts=rand[:n_prompts]))
    return out


def parse_each_route_table_once() -> None:
    """Speed only: compile_artifact parses its route table on every call (2/3 of a tiny plan's compile
    time); this script compiles ~100 plans from two tables, so each table is parsed once (the same
    validated RouteTable, read-only, per (sm, path))."""
    import functools

    import ninfer_compile.routes as routes

    routes.table_for_sm = functools.lru_cache(maxsize=None)(routes.table_for_sm)


def compile_plan(art: Path, out: Path, *, k: int, kv: str, max_context: int, table: Path | None = None) -> Path:
    from ninfer_compile.compile_cli import compile_artifact
    from ninfer_compile.ir.lower import LowerOptions
    from ninfer_compile.plan.writer import write_plan

    opts = LowerOptions(prefill_chunk=CHUNK, concurrency=(1,), max_context=max_context, draft_tokens=k, kv_dtype=kv)
    c = compile_artifact(art, 90, routes=table, opts=opts, binaries=False)
    write_plan(out, c.manifest, c.memory_txt, extra_files=c.kernel_files)
    return out


class Judge:
    """The reference of one (artifact, KV format), its teacher-forced logits remembered per token list
    (the speculative runs mostly repeat the plain run's tokens)."""

    def __init__(self, art: Path, kv: str):
        self.fn, self.memo = S.reference_logits_fn(art, kv_dtype=kv), {}

    def logits(self, tokens):
        key = tuple(tokens)
        if key not in self.memo:
            self.memo[key] = self.fn(tokens)
        return self.memo[key]

    def verdicts(self, prompt, tokens):
        return judge_greedy(self.logits, prompt, tokens)


def tally(counts: Counter, verdicts, where: str) -> None:
    counts["checked"] += len(verdicts)
    for v in verdicts:
        counts[v.kind] += 1
        if v.kind == NEAR:
            NEAR_TIES.append(f"{where} {v.describe()} (gap {v.gap / v.spread:.2%} of the spread)")
        elif v.kind == VIOLATION:
            VIOLATIONS.append(f"{where} {v.describe()} (gap {v.gap / v.spread:.2%} of the spread)")
            say(f"  VIOLATION {VIOLATIONS[-1]}")


# ----------------------------------------------------------------------------- the torch leg


def torch_leg(m: dict, kv: str, n_tokens: int, work: Path) -> list[dict]:
    """Plain, then MTP / n-gram for K = 1..5, for one model and KV format: one row per mode."""
    import ninfer_runtime as nr

    judge = Judge(m["art"], kv)
    prompts = m["prompts"]
    ctx = max(map(len, prompts)) + n_tokens + max(KS) + 2
    modes = ["mtp", "ngram"] if m["mtp"] else ["ngram"]
    rows = {mode: dict(model=m["name"], kv=kv, mode=mode, runs=0, c=Counter(), same=0, accepted=0, proposed=0)
            for mode in ["plain", *modes]}
    plain = None
    for k in KS:
        plan = compile_plan(m["art"], work / f"{m['name'][:12].replace(' ', '_')}-{kv}-k{k}.plan", k=k, kv=kv,
                            max_context=ctx)
        with nr.load(plan, m["art"], progress=False) as eng:
            assert eng.kernels == "torch", eng.kernels
            for mode in (["plain"] if plain is None else []) + modes:
                row, toks = rows[mode], []
                for i, p in enumerate(prompts):
                    toks.append(eng.generate(p, n_tokens, spec="none" if mode == "plain" else mode,
                                             ignore_eos=True).tokens)
                    tag = f"{m['name']} kv={kv} {mode}" + ("" if mode == "plain" else f" K={k}") + f" prompt {i}:"
                    tally(row["c"], judge.verdicts(p, toks[-1]), tag)
                    row["runs"] += 1
                    if mode != "plain":
                        row["same"] += sum(a == b for a, b in zip(toks[-1], plain[i]))
                        row["accepted"] += eng.last_stats["spec"]["accepted"]
                        row["proposed"] += eng.last_stats["spec"]["proposed"]
                if mode == "plain":
                    plain = toks
    return list(rows.values())


# ----------------------------------------------------------------------------- the interpreter leg


def interpreter_leg(m: dict, n_tokens: int, work: Path) -> list[dict]:
    """The trained model's K = 2 plan (the interpreter-friendly route table of the e2e tests), one
    prompt: torch path vs Triton interpreter, plain / MTP / n-gram, per KV format in INTERP_KV."""
    import ninfer_runtime as nr

    prompt = m["prompts"][0]
    table = S.interp_table(work / "interp90.yaml")
    rows = []
    for kv in INTERP_KV:
        judge = Judge(m["art"], kv)
        plan = compile_plan(m["art"], work / f"interp-{kv}-k{INTERP_K}.plan", k=INTERP_K, kv=kv,
                            max_context=len(prompt) + n_tokens + INTERP_K + 2, table=table)
        got, rounds = {}, {}
        for kernels in ("torch", "interpret"):
            with nr.load(plan, m["art"], progress=False, kernels=kernels) as eng:
                for mode in ("none", "mtp", "ngram"):
                    t0 = time.perf_counter()
                    got[kernels, mode] = eng.generate(prompt, n_tokens, spec=mode, ignore_eos=True).tokens
                    sp = eng.last_stats.get("spec")
                    rounds[kernels, mode] = "—" if sp is None else f"{sp['rounds']} ({sp['accepted']}/{sp['proposed']})"
                    if kernels == "interpret":
                        say(f"  interpreter kv={kv} {mode}: {got[kernels, mode]} ({time.perf_counter() - t0:.0f} s)")
        for mode in ("none", "mtp", "ngram"):
            a, b = got["torch", mode], got["interpret", mode]
            c = Counter()
            for kernels, toks in (("torch", a), ("interpret", b)):
                tally(c, judge.verdicts(prompt, toks), f"{m['name']} kv={kv} K={INTERP_K} {mode} {kernels}:")
            rows.append(dict(kv=kv, mode="plain" if mode == "none" else mode, tokens=len(b), c=c,
                             rounds=rounds["interpret", mode],
                             same=sum(x == y for x, y in zip(a, b)),
                             first_diff=next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)))
    return rows


# ----------------------------------------------------------------------------- report


def markdown(prov: dict, args, torch_rows: list[dict], interp_rows: list[dict], seconds: dict) -> str:
    mode_name = {"plain": "plain", "mtp": "MTP K=1..5", "ngram": "n-gram K=1..5"}
    lines = [f"# Exactness counts of the CPU torch path ({prov['date'][:10]})", "",
             f"Provenance: {prov['date']}, {prov['cpu']}, {prov['cores']} cores (shared; load {prov['load_average_1m']}), "
             f"torch {prov['torch']} ({prov['torch_threads']} threads), Python {prov['python']}, commit {prov['commit']}. "
             f"`python bench/exactness_counts.py --prompts {args.prompts} --tokens {args.tokens} "
             f"--interp-tokens {args.interp_tokens}`: torch leg {seconds['torch']:.0f} s, interpreter leg "
             f"{seconds['interp']:.0f} s.", "",
             f"Rule (`ninfer_compile/reference/greedy_check.py`, the end-to-end tests'): each greedy token is the fp32 "
             f"reference's argmax for its prefix, or a near-tie within {NEAR_TIE:.0%} of that row's logit spread. "
             f"The reference is `ninfer_compile.reference` over the same artifact with the plan's KV format "
             f"(quantize -> dequantize of K / V). {args.prompts} prompts x {args.tokens} tokens per run; C = 1 "
             f"plans with a draft window K = 1..5 (one each), prefill chunk {CHUNK}; plain decode "
             f"runs on the K = 1 plan. \"= plain\": speculative tokens equal to the plain run's at the same position.",
             "", "## Torch path", "",
             "| model | KV | mode | sequences | tokens checked | = argmax | near-tie | violations | = plain | drafts accepted |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    tot = Counter()
    for r in torch_rows:
        c = r["c"]
        tot.update({"checked": c["checked"], EXACT: c[EXACT], NEAR: c[NEAR], VIOLATION: c[VIOLATION]})
        same = "—" if r["mode"] == "plain" else f"{r['same']}"
        acc = "—" if r["mode"] == "plain" else f"{r['accepted']}/{r['proposed']}"
        lines.append(f"| {r['model']} | {r['kv']} | {mode_name[r['mode']]} | {r['runs']} | {c['checked']} | {c[EXACT]} | "
                     f"{c[NEAR]} | {c[VIOLATION]} | {same} | {acc} |")
    lines.append(f"| **all** | | | {sum(r['runs'] for r in torch_rows)} | **{tot['checked']}** | **{tot[EXACT]}** | "
                 f"**{tot[NEAR]}** | **{tot[VIOLATION]}** | | |")
    lines += ["", f"## Interpreter vs torch path (tiny-trained, K = {INTERP_K}, one prompt, {args.interp_tokens} tokens)", "",
              "Both paths' tokens judged by the same rule (counts over both); \"same\": positions where the two "
              "paths gave the same token.", "",
              "| KV | mode | tokens per path | interpreter rounds (drafts accepted) | checked | = argmax | near-tie | "
              "violations | same | first difference |",
              "|---|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in interp_rows:
        c = r["c"]
        lines.append(f"| {r['kv']} | {r['mode']} | {r['tokens']} | {r['rounds']} | {c['checked']} | {c[EXACT]} | {c[NEAR]} | "
                     f"{c[VIOLATION]} | {r['same']}/{r['tokens']} | {'—' if r['first_diff'] is None else r['first_diff']} |")
    lines += ["", "## Near-ties accepted", ""] + ([f"- {x}" for x in NEAR_TIES] or ["none"])
    lines += ["", "## Violations", ""] + ([f"- {x}" for x in VIOLATIONS] or ["none"])
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=1, help="prompts per model (1..4)")
    ap.add_argument("--tokens", type=int, default=8, help="greedy tokens per prompt and run")
    ap.add_argument("--interp-tokens", type=int, default=3, help="tokens per interpreter run (0: no interpreter leg)")
    ap.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temporary one)")
    ap.add_argument("--out", type=Path, default=None, help="write the Markdown report here")
    args = ap.parse_args(argv)
    if not 1 <= args.prompts <= 4 or args.tokens < 1 or args.interp_tokens < 0:
        ap.error("--prompts must be 1..4, --tokens >= 1, --interp-tokens >= 0")
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    work = args.work or Path(tempfile.mkdtemp(prefix="exactness_"))
    work.mkdir(parents=True, exist_ok=True)
    prov = provenance()
    prov["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=REPO).stdout.strip() or "unknown"
    parse_each_route_table_once()
    t0 = time.perf_counter()
    ms = models(work, args.prompts)
    torch_rows = []
    for m in ms:
        for kv in F.KV_DTYPES:
            why = F.FORMATS[kv].head_dim_problem(m["head_dim"])
            if why:
                say(f"{m['name']} kv={kv}: skipped, the format needs {why}")
                continue
            t = time.perf_counter()
            rows = torch_leg(m, kv, args.tokens, work)
            torch_rows += rows
            c = sum((r["c"] for r in rows), Counter())
            say(f"{m['name']} kv={kv}: {c['checked']} tokens, {c[EXACT]} argmax, {c[NEAR]} near-tie, "
                f"{c[VIOLATION]} violations ({time.perf_counter() - t:.0f} s)")
    seconds = {"torch": time.perf_counter() - t0}
    t0 = time.perf_counter()
    interp_rows = interpreter_leg(ms[0], args.interp_tokens, work) if args.interp_tokens else []
    seconds["interp"] = time.perf_counter() - t0
    md = markdown(prov, args, torch_rows, interp_rows, seconds)
    print(md)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(md)
        say(f"wrote {args.out}")
    return 1 if VIOLATIONS else 0


if __name__ == "__main__":
    sys.exit(main())
