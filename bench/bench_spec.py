"""Speculative decoding on one GPU (issue #13 item 7, issue #17 item 1): round cost against a plain
step, the MTP draft cost, tok/s as a function of acceptance (forced) and modelled at the field
reports' 3.5 tokens per round, printed against the targets.

    python bench/bench_spec.py --plan P_K1 [--plan P_K2 ...] --artifact A --out DIR [--label 27b]
        [--concurrency 1,2,4,8] [--context 4096] [--reps 50] [--warmup 10]
        [--forced-concurrency 1] [--forced-tokens 64] [--forced-prompt 512]
    python bench/bench_spec.py --dry --out DIR    # CPU, Triton interpreter: the tiny synthetic MTP model
    python bench/bench_spec.py --merge DIR/spec_a.json DIR/spec_b.json --out DIR --label 27b

One plan per draft window K (`ninfer-compile A --draft-tokens K`); each is loaded in turn. Per plan
and concurrency C:
- plain step = `decode_c{C}_k0`, verify = `verify_c{C}_k{K}`, MTP draft = `mtp_verify_c{C}_k{K}` +
  (K-1) x `mtp_decode_c{C}_k0`: each extent replayed from its CUDA graph (eager where it has none)
  with static inputs at position `--context` (C rows in slots 0..C-1, every draft real), `--warmup`
  untimed replays, then `--reps` replays each between two CUDA events; the median. The KV rows read
  are whatever the cache holds (no prefill: attention and GDN cost do not depend on the values);
  the static drafts are rejected, so the verify time includes the rollback copies (state_select
  copies nothing when all K are accepted).
- round = verify + MTP draft; ratios against the plain step. Target: MTP3 round <= 1.10x a plain
  step at C = 1 (the field reports: 1.15x on an RTX 3090, 1.14x vLLM/Marlin).
- modelled tok/s = C x tokens-per-round / round time, at 3.5 tokens per round (the reports' MTP3
  figure; K >= 3) and at every a + 1 (a = accepted drafts per round). Target: >= 500 tok/s
  single-stream at 3.5 tokens per round.
- forced rows (`forced`: synthetic weights accept nothing, so acceptance is forced): the runtime's
  rounds (`generate(..., spec=drafter)`) with a host drafter that knows the target's greedy
  continuation from a plain run of the same prompt and corrupts the drafts after the first a, for
  a = 0..K every round: measured tokens per round, acceptance and decode tok/s (host overhead and the
  one read per round included; no MTP draft cost: the drafter is on the host), beside the plain
  (`--spec none`) tok/s of the same prompt.
Writes DIR/spec_<label>.json and .md with provenance (GPU, driver, torch, triton, date, plan options).
`--dry` packs tiny-qwen3.5-mtp, compiles it with K = 2 (C = 1) under the interpreter table and runs
every part once (reps 1, no warm-up, forced runs of 4 tokens): it proves the script and its
arithmetic; its timings mean nothing (interpreter extents take seconds each).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from spec_report import _n, render_md  # noqa: E402,F401  (render_md: part of this script's API)
FIELD_TOKENS_PER_ROUND = 3.5  # NInfer MTP3, vLLM MTP (issue #13)
TARGET_ROUND_RATIO = 1.10  # MTP3 round / plain step at C = 1
TARGET_TOK_S = 500.0  # single stream at FIELD_TOKENS_PER_ROUND


# ---------------------------------------------------------------------------------------- drafters


class ForcedDrafter:
    """A host drafter forcing `accept` accepted drafts per round: it knows `ref`, the target's
    greedy continuation of `prompt` (a plain run), and proposes ref's next `accept` tokens then
    wrong ones (ref's token + 1). Once the sequence left ref (a near-tie resolved differently by the
    verify width) every draft is wrong: the measured acceptance says so. Interface of
    ninfer_runtime.speculative.ngram.NgramDrafter: extend(tokens), propose(k)."""

    def __init__(self, prompt: list[int], ref: list[int], accept: int, vocab: int):
        self.prompt_len = len(prompt)
        self.tokens = list(prompt)
        self.ref = list(ref)
        self.accept = int(accept)
        self.vocab = int(vocab)

    def extend(self, tokens) -> None:
        self.tokens.extend(int(t) for t in tokens)

    def _wrong(self, i: int) -> int:
        right = self.ref[i] if i < len(self.ref) else 0
        return (right + 1) % self.vocab

    def propose(self, k: int) -> list[int]:
        n = len(self.tokens) - self.prompt_len  # generated so far; the last one is the round's t0
        on_ref = self.tokens[self.prompt_len:] == self.ref[:n]
        good = min(self.accept, k) if on_ref else 0
        good = min(good, max(0, len(self.ref) - n))
        return [self.ref[n + j] for j in range(good)] + [self._wrong(n + j) for j in range(good, k)]


def forced_factory(refs: dict[tuple[int, ...], list[int]], accept: int, vocab: int):
    """spec= drafter factory: prompt tokens -> ForcedDrafter over that prompt's plain continuation."""
    return lambda prompt: ForcedDrafter(list(prompt), refs[tuple(prompt)], accept, vocab)


# ---------------------------------------------------------------------------------------- arithmetic


def median_ms(samples: list[float]) -> float:
    return float(statistics.median(samples)) if samples else float("nan")


def round_row(c: int, k: int, t: dict[str, float]) -> dict:
    """One (C, K) row from the medians t: plain, verify, mtp_verify, mtp_decode (ms; the MTP ones
    absent without MTP extents). round = verify + mtp_verify + (K-1) x mtp_decode."""
    draft = None
    if t.get("mtp_verify") is not None and t.get("mtp_decode") is not None:
        draft = t["mtp_verify"] + (k - 1) * t["mtp_decode"]
    rnd = t["verify"] + (draft or 0.0)
    return {"C": c, "K": k, "plain_ms": t["plain"], "verify_ms": t["verify"], "mtp_verify_ms": t.get("mtp_verify"),
            "mtp_decode_ms": t.get("mtp_decode"), "draft_ms": draft, "round_ms": rnd,
            "verify_ratio": t["verify"] / t["plain"], "round_ratio": rnd / t["plain"] if draft is not None else None,
            "plain_tok_s": c / t["plain"] * 1e3}


def modelled(row: dict, tokens_per_round: float) -> dict | None:
    """tok/s of C streams at `tokens_per_round` (<= K + 1) from a round row; None where K is too small."""
    if tokens_per_round > row["K"] + 1:
        return None
    ms = row["round_ms"]
    tok_s = row["C"] * tokens_per_round / ms * 1e3
    return {"C": row["C"], "K": row["K"], "tokens_per_round": tokens_per_round, "round_ms": ms, "tok_s": tok_s,
            "speedup_vs_plain": tok_s / row["plain_tok_s"], "mtp_draft_included": row["draft_ms"] is not None}


def modelled_rows(rows: list[dict], field: float = FIELD_TOKENS_PER_ROUND) -> list[dict]:
    """At the field reports' tokens per round (K >= 3) and at every forced a + 1 (a = 0..K)."""
    out = []
    for r in rows:
        for tau in sorted({field, *[a + 1.0 for a in range(r["K"] + 1)]}):
            m = modelled(r, tau)
            if m is not None:
                m["source"] = "field reports" if tau == field else f"a = {int(tau) - 1}"
                out.append(m)
    return out


def targets(rows: list[dict], field: float = FIELD_TOKENS_PER_ROUND) -> dict:
    """The two targets: MTP3 round ratio at C = 1 (<= 1.10) and the best single-stream modelled tok/s
    at the field reports' tokens per round (>= 500), with the K that reaches it."""
    out: dict = {"round_ratio_target": TARGET_ROUND_RATIO, "tok_s_target": TARGET_TOK_S, "tokens_per_round": field}
    k3 = next((r for r in rows if r["C"] == 1 and r["K"] == 3), None)
    if k3 is not None:
        ratio = k3["round_ratio"] if k3["round_ratio"] is not None else k3["verify_ratio"]
        out.update(mtp3_round_ratio=ratio, mtp3_ratio_of="round" if k3["round_ratio"] is not None else "verify only",
                   mtp3_round_met=ratio <= TARGET_ROUND_RATIO)
    single = [m for m in (modelled(r, field) for r in rows if r["C"] == 1) if m is not None]
    if single:
        best = max(single, key=lambda m: m["tok_s"])
        out.update(single_stream_tok_s=best["tok_s"], single_stream_k=best["K"],
                   single_stream_met=best["tok_s"] >= TARGET_TOK_S)
    return out


def forced_summary(stats: dict, decode_s: float, accept: int, k: int) -> dict:
    """A forced row from engine.last_stats["spec"] (+ decode seconds)."""
    rounds = max(1, int(stats.get("lane_rounds", stats.get("rounds", 0))))  # sequence rounds (C rows per launch)
    proposed = int(stats.get("proposed", 0))
    accepted = int(stats.get("accepted", 0))
    tokens = int(stats.get("tokens", 0))
    return {"forced_accept": accept, "K": k, "rounds": int(stats.get("lane_rounds", stats.get("rounds", 0))),
            "launches": int(stats.get("rounds", 0)), "proposed": proposed,
            "accepted": accepted, "acceptance": accepted / proposed if proposed else 0.0,
            "tokens_per_round": tokens / rounds, "plain_steps": int(stats.get("plain_steps", 0)),
            "decode_s": decode_s, "label": "forced"}


# ---------------------------------------------------------------------------------------- report


def provenance(torch, dry: bool) -> dict:
    import triton

    drv, gpu = "-", "CPU (Triton interpreter)"
    if not dry and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name()
        try:
            drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            drv = "?"
    return {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "gpu": gpu, "driver": drv,
            "torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0]}


# ---------------------------------------------------------------------------------------- measurement


def runner_of(engine, name: str):
    """The bound extent `name` (text or MTP graph), or None when the plan has none."""
    for attr in ("extents", "mtp_extents", "runners"):
        d = getattr(engine, attr, None)
        if isinstance(d, dict) and name in d:
            return d[name]
    return None


def fill_static(engine, runner, c: int, w: int, context: int, k: int) -> None:
    """Static inputs for timing: C rows of W columns in slots 0..C-1 at positions context.., every
    draft real (n_drafts = K), ids small, greedy sampling rows; other inputs (hidden) left as they are."""
    import torch

    from ninfer_runtime.sampling import host_rows, upload_rows

    ins = runner.inputs
    T = ins["ids"].shape[0]
    cols = [(r, j) for r in range(c) for j in range(w)][:T]
    ins["ids"].copy_(torch.tensor([7 + j for _, j in cols], dtype=torch.int32))
    ins["positions"].copy_(torch.tensor([context + j for _, j in cols], dtype=torch.int32))
    ins["slots"].copy_(torch.tensor([r % engine.slots for r, _ in cols], dtype=torch.int32))
    if "n_drafts" in ins:
        ins["n_drafts"].fill_(k)
    if "temperature" in ins:
        upload_rows(runner, host_rows([], ins["temperature"].shape[0]))


def time_replays(engine, runner, reps: int, warmup: int) -> list[float]:
    """ms per replay (CUDA events around each on a GPU; perf_counter on the CPU)."""
    import torch

    from ninfer_runtime.graphs import replay_or_run

    for _ in range(warmup):
        replay_or_run(engine, runner)
    out = []
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for a, b in ev:
            a.record()
            replay_or_run(engine, runner)
            b.record()
        torch.cuda.synchronize(engine.device)
        out = [a.elapsed_time(b) for a, b in ev]
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            replay_or_run(engine, runner)
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def measure_rounds(engine, k: int, concurrency: list[int], context: int, reps: int, warmup: int,
                   floor_ms=None) -> list[dict]:
    """Per C the round_row of the four extents' medians; `floor_ms(extent name) -> ms` (GPU runs) adds
    each extent's byte floor at the streaming rate (row["floor_ms"])."""
    rows = []
    for c in concurrency:
        names = {"plain": f"decode_c{c}_k0", "verify": f"verify_c{c}_k{k}", "mtp_verify": f"mtp_verify_c{c}_k{k}",
                 "mtp_decode": f"mtp_decode_c{c}_k0"}
        t: dict[str, float] = {}
        for part, name in names.items():
            r = runner_of(engine, name)
            if r is None:
                if part in ("plain", "verify"):
                    raise SystemExit(f"error: the K={k} plan has no extent {name}")
                continue
            w = 1 if part in ("plain", "mtp_decode") else k + 1
            fill_static(engine, r, c, w, context, k)
            t[part] = median_ms(time_replays(engine, r, reps, warmup))
        engine.zero_state()
        rows.append(round_row(c, k, t))
        if floor_ms is not None:
            rows[-1]["floor_ms"] = {part: floor_ms(name) for part, name in names.items() if part in t}
        r = rows[-1]
        print(f"K={k} C={c}: plain {r['plain_ms']:.3f} ms, verify {r['verify_ms']:.3f} ms "
              f"({r['verify_ratio']:.2f}x), round {r['round_ms']:.3f} ms ({_n(r['round_ratio'], '.2f')}x)", flush=True)
    return rows


def forced_runs(engine, k: int, concurrency: list[int], prompt_len: int, new_tokens: int, vocab: int) -> list[dict]:
    """Per C: the plain reference continuation, then a = 0..K forced rounds; rows labelled forced."""
    import torch

    g = torch.Generator().manual_seed(1)
    out = []
    for c in concurrency:
        prompts = [torch.randint(5, vocab, (prompt_len,), generator=g).tolist() for _ in range(c)]
        kw = dict(greedy=True, ignore_eos=True, concurrency=c)
        if engine.device.type == "cuda":
            engine.generate(prompts, max_new_tokens=new_tokens + k + 1, spec="none", **kw)  # warm
        ref = engine.generate(prompts, max_new_tokens=new_tokens + k + 1, spec="none", **kw)
        st = engine.last_stats
        plain_tok_s = st["decode_tokens"] / max(st["decode_s"], 1e-9)
        refs = {tuple(p): list(r.tokens) for p, r in zip(prompts, ref)}
        for a in range(k + 1):
            res = engine.generate(prompts, max_new_tokens=new_tokens, spec=forced_factory(refs, a, vocab), **kw)
            st = engine.last_stats
            row = forced_summary(st.get("spec") or {}, st["decode_s"], a, k)
            row.update(C=c, tok_s=st["decode_tokens"] / max(st["decode_s"], 1e-9), plain_tok_s=plain_tok_s,
                       same_tokens_as_plain=all(r.tokens == refs[tuple(p)][:len(r.tokens)]
                                                for p, r in zip(prompts, res)))
            out.append(row)
            print(f"forced K={k} C={c} a={a}: acceptance {100 * row['acceptance']:.1f}%, "
                  f"{row['tokens_per_round']:.2f} tokens/round, {row['tok_s']:.1f} tok/s "
                  f"(plain {plain_tok_s:.1f})", flush=True)
    return out


def interp_spec_table(dest: Path) -> Path:
    """tests/runtime/support.interp_table: routes/sm90.yaml with interpreter-friendly linear params."""
    sys.path.insert(0, str(REPO / "tests"))
    from runtime.support import interp_table

    return interp_table(dest)


def dry_plans(d: Path, ks: list[int]) -> tuple[Path, list[Path]]:
    """tiny-qwen3.5-mtp packed and compiled for each K under the interpreter route table."""
    sys.path.insert(0, str(REPO / "tests"))
    from ninfer_compile.compile_cli import compile_artifact
    from ninfer_compile.convert.synthetic import pack_synthetic
    from ninfer_compile.ir.lower import LowerOptions
    from ninfer_compile.plan.writer import write_plan

    art = d / "tiny-mtp.ninfer"
    pack_synthetic("tiny-qwen3.5-mtp", art, progress=False)
    table = interp_spec_table(d / "interp90.yaml")
    plans = []
    for k in ks:
        opts = LowerOptions(prefill_chunk=8, concurrency=(1,), max_context=32, draft_tokens=k)
        c = compile_artifact(art, 90, routes=table, opts=opts, binaries=False)
        plan = d / f"tiny-mtp-k{k}.plan"
        write_plan(plan, c.manifest, c.memory_txt, extra_files=c.kernel_files)
        plans.append(plan)
    return art, plans


def run(args) -> dict:
    import torch

    import ninfer_runtime

    res = {"provenance": provenance(torch, args.dry), "label": args.label, "dry": args.dry, "context": args.context,
           "reps": args.reps, "warmup": args.warmup, "timer": "CUDA events" if torch.cuda.is_available() and
           not args.dry else "perf_counter", "plans": {}, "rounds": [], "forced": [], "errors": [], "profiles": []}
    concurrency = [int(x) for x in args.concurrency.split(",") if x]
    forced_c = [int(x) for x in args.forced_concurrency.split(",") if x]
    floors = None
    if torch.cuda.is_available() and not args.dry:  # the physical limit beside the ratios (issue #16 item 1)
        from bench_e2e import _entry_bytes
        from limits import step_floor_bytes, streaming_read_gbs

        res["streaming_read"] = streaming_read_gbs(torch)
        entry_bytes = _entry_bytes(args.artifact)

        def floors(plan, ctx):
            gbs = res["streaming_read"]["gbs"]
            return lambda name: step_floor_bytes(plan, plan["extents"][name], entry_bytes, context=ctx)["total"] / gbs / 1e6
    for path in args.plan:
        plan = json.loads((Path(path) / "plan.json").read_text())
        k = int(plan.get("options", {}).get("draft_tokens", 0))
        if k < 1:
            raise SystemExit(f"error: {path} was compiled without --draft-tokens (K = 0)")
        res["plans"][k] = {"path": str(path), "options": plan.get("options")}
        eng = ninfer_runtime.load(path, args.artifact, progress=False)
        try:
            cs = [c for c in concurrency if c <= eng.max_concurrency]
            ctx = min(args.context, eng.max_context - k - 2)
            res["rounds"] += measure_rounds(eng, k, cs, ctx, args.reps, args.warmup,
                                            floors(plan, ctx) if floors else None)
            prof_c = [c for c in (int(x) for x in args.profile.split(",") if x) if c in cs]
            if prof_c and eng.device.type == "cuda":
                try:  # a profiler failure must not lose the timed rounds
                    from spec_profile import profile_rounds

                    res["profiles"] += profile_rounds(torch, eng, plan, path, k, prof_c, ctx)
                except Exception as exc:  # noqa: BLE001
                    res["errors"].append(f"profile K={k}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
                    print(res["errors"][-1], flush=True)
            try:  # a failure here (runtime API) must not lose the timed rounds
                res["forced"] += forced_runs(eng, k, [c for c in forced_c if c <= eng.max_concurrency],
                                             min(args.forced_prompt, eng.max_context // 2),
                                             min(args.forced_tokens, eng.max_context // 2 - k - 2),
                                             min(args.vocab, eng.vocab_rows))
            except Exception as exc:  # noqa: BLE001
                res["errors"].append(f"forced K={k}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
                print(res["errors"][-1], flush=True)
        finally:
            eng.close()
            del eng
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    res["modelled"] = modelled_rows(res["rounds"])
    res["targets"] = targets(res["rounds"])
    return res


def merge(paths: list[Path]) -> dict:
    """One result from several runs' JSON (plans of different K measured in separate calls): rounds,
    forced rows and plans concatenated, modelled rows and targets recomputed; the first run's
    provenance, the others' dates listed."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    res = dict(runs[0])
    res["merged_from"] = [{"path": str(p), "date": r["provenance"]["date"]} for p, r in zip(paths, runs)]
    for key in ("rounds", "forced", "errors", "profiles"):
        res[key] = [x for r in runs for x in r.get(key, [])]
    res["plans"] = {k: v for r in runs for k, v in r.get("plans", {}).items()}
    res["rounds"].sort(key=lambda r: (r["K"], r["C"]))
    res["modelled"] = modelled_rows(res["rounds"])
    res["targets"] = targets(res["rounds"])
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", action="append", default=[], help="a plan compiled with --draft-tokens K (repeat)")
    ap.add_argument("--artifact", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--label", default="run")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--context", type=int, default=4096, help="position of the timed rows (KV depth)")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--forced-concurrency", default="1")
    ap.add_argument("--forced-tokens", type=int, default=64)
    ap.add_argument("--forced-prompt", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=1000, help="random prompt ids below this")
    ap.add_argument("--profile", default="", help="concurrencies whose extents are broken down per op (GPU only)")
    ap.add_argument("--dry", action="store_true", help="CPU interpreter run on the tiny synthetic MTP model")
    ap.add_argument("--merge", nargs="+", type=Path, default=None, metavar="JSON",
                    help="combine earlier runs' spec_*.json (e.g. K = 1..3 and 4..5 from two calls) into spec_<label>")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        res = merge(args.merge)
        res["label"] = args.label
        (args.out / f"spec_{args.label}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
        md = render_md(res)
        (args.out / f"spec_{args.label}.md").write_text(md)
        print(md)
        return 0
    tmp = None
    if args.dry:
        import os

        os.environ.setdefault("TRITON_INTERPRET", "1")
        tmp = tempfile.TemporaryDirectory()
        args.artifact, plans = dry_plans(Path(tmp.name), [2])
        args.plan = [str(p) for p in plans]
        args.label = "dry" if args.label == "run" else args.label
        args.concurrency, args.forced_concurrency = "1", "1"
        args.context, args.reps, args.warmup = 16, 1, 0
        args.forced_tokens, args.forced_prompt, args.vocab = min(args.forced_tokens, 4), 4, 200
    if not args.plan or args.artifact is None:
        ap.error("--plan and --artifact are required (or --dry)")
    try:
        res = run(args)
    finally:
        if tmp is not None:
            tmp.cleanup()
    (args.out / f"spec_{args.label}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    md = render_md(res)
    (args.out / f"spec_{args.label}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
