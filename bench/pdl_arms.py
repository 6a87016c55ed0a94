"""The PDL A/B of issue 30 (bench/gpu_call_pdl.sh): the route-table variants and the summary.

    python bench/pdl_arms.py table --bytes 0 [--base routes/sm90.yaml] -o /tmp/t0.yaml
    python bench/pdl_arms.py summary --arm base=e2e_27b-base.json --arm both=e2e_27b-both.json ... \
        [--predictions bench/results/pdl_prefetch_predictions_2026-12-06.md] -o pdl_ab.md

`table` writes `base` with PDL_PREFETCH_BYTES = N on every row of every route that declares that
parameter (the routes come from the registry, not a list here): 0 is the "prefetch off" arm, the
shipped table (rows without the key take the route's default) the "on" arm.
`summary` reads bench_e2e JSON files (one per arm, same card, same call) and writes one table per
concurrency: tok/s, step ms, % of the byte floor, launches per step (profile), the change against the
first arm, and the kernel note (binaries loaded / JIT-compiled, PDL order), so a mismatch between the
compile-time and run-time NINFER_PDL_EARLY (binaries JIT-compiled at load) is visible.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PARAM = "PDL_PREFETCH_BYTES"


def prefetch_routes() -> set[str]:
    from ninfer_compile.kernels.registry import all_routes

    return {r.name for r in all_routes() if PARAM in r.params}


def variant_table(base: Path, nbytes: int, dest: Path) -> int:
    """`base` with PDL_PREFETCH_BYTES = nbytes on every row of a prefetching route; returns the rows set."""
    import yaml

    from ninfer_compile.kernels.registry import get_route

    names = prefetch_routes()
    if not names:
        raise SystemExit("pdl_arms: no route declares PDL_PREFETCH_BYTES")
    reason = next((get_route(n).params[PARAM].check(nbytes) for n in sorted(names)), None)
    if reason:
        raise SystemExit(f"pdl_arms: --bytes {nbytes}: {reason}")
    doc = yaml.safe_load(base.read_text())
    hits = 0
    for key, entries in doc.items():
        if not isinstance(entries, list):
            continue
        for entry in entries:
            for row in entry.get("routes", []) if isinstance(entry, dict) else []:
                if row.get("route") in names:
                    row.setdefault("params", {})[PARAM] = nbytes
                    hits += 1
    if not hits:
        raise SystemExit(f"pdl_arms: {base}: no row of {sorted(names)}")
    dest.write_text(yaml.safe_dump(doc, sort_keys=False))
    return hits


def _jit_note(note: str | None) -> str:
    m = re.search(r"(\d+)/(\d+) loaded from the plan, (\d+) JIT-compiled", note or "")
    return f"{m.group(1)}/{m.group(2)} bin, {m.group(3)} JIT" if m else "?"


def summary(arms: list[tuple[str, Path]], predictions: Path | None) -> str:
    runs = {name: json.loads(p.read_text()) for name, p in arms}
    first = next(iter(runs.values()))
    prov = first["provenance"]
    lines = [f"# PDL A/B (issue 30, lever 1): {prov['gpu']}, {prov['date']}", "",
             f"driver {prov['driver']}, torch {prov['torch']}, triton {prov['triton']}; context "
             f"{first.get('context')}; one device call, arms in this order on the same card "
             f"(bench/gpu_call_pdl.sh). Streaming read per arm: "
             + ", ".join(f"{n} {(r.get('streaming_read') or {}).get('gbs', 0):.0f}" for n, r in runs.items())
             + " GB/s.", ""]
    concs = sorted({c for r in runs.values() for c in r["decode"]}, key=int)
    base_name = next(iter(runs))
    for c in concs:
        lines += [f"## C = {c}", "", "| arm | tok/s | step ms | vs " + base_name + " | byte floor ms | % of floor | "
                  "launches/step | GPU idle µs/step (profile) | kernels |", "|---|---|---|---|---|---|---|---|---|"]
        b = runs[base_name]["decode"].get(c)
        for name, r in runs.items():
            d = r["decode"].get(c)
            if d is None:
                lines.append(f"| {name} | — | | | | | | | {_jit_note(r.get('kernels'))} |")
                continue
            prof = (r.get("decode_profile") or {}).get(c) or {}
            delta = (f"{d['step_ms'] - b['step_ms']:+.3f} ms ({100 * (d['step_ms'] / b['step_ms'] - 1):+.1f}%)"
                     if b else "—")
            launches = prof.get("launches_per_step")
            idle = prof.get("idle_us_per_step")
            lines.append(f"| {name} | {d['tok_s']:.1f} | {d['step_ms']:.3f} | {delta} | {d['floor_step_ms']:.2f} | "
                         f"{100 * d['fraction_of_floor']:.0f}% | {'—' if launches is None else f'{launches:.0f}'} | "
                         f"{'—' if idle is None else f'{idle:.0f}'} | {_jit_note(r.get('kernels'))} |")
        lines.append("")
    lines += ["Kernel notes (PDL order as the runtime saw it):", ""]
    lines += [f"- {n}: {r.get('kernels')}" for n, r in runs.items()]
    if predictions is not None and predictions.is_file():
        lines += ["", f"Predictions written before this run: `{predictions}`."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table", help="the shipped table with PDL_PREFETCH_BYTES set on every prefetching row")
    t.add_argument("--bytes", type=int, required=True)
    t.add_argument("--base", type=Path, default=REPO / "routes" / "sm90.yaml")
    t.add_argument("-o", "--out", type=Path, required=True)
    s = sub.add_parser("summary", help="one table per concurrency over the arms' bench_e2e JSON files")
    s.add_argument("--arm", action="append", default=[], help="NAME=PATH (repeatable; the first is the baseline)")
    s.add_argument("--predictions", type=Path)
    s.add_argument("-o", "--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "table":
        n = variant_table(a.base, a.bytes, a.out)
        print(f"wrote {a.out}: {PARAM}={a.bytes} on {n} rows")
        return 0
    arms = []
    for text in a.arm:
        name, sep, path = text.partition("=")
        if not sep or not name:
            raise SystemExit(f"pdl_arms: --arm {text!r}: want NAME=PATH")
        if Path(path).is_file():
            arms.append((name, Path(path)))
        else:
            print(f"pdl_arms: arm {name}: {path} missing (not run)", file=sys.stderr)
    if not arms:
        raise SystemExit("pdl_arms: no arm has results")
    md = summary(arms, a.predictions)
    a.out.write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
