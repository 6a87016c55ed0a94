"""One table of the KV formats end to end (issue #17 item 2) from bench_e2e runs: per format, prefill
4K tok/s, decode tok/s at 4K and at 32K depth, each against bf16 of the same call.

    python bench/kv_e2e_table.py DIR/e2e_27b-*-kv-4k.json DIR/e2e_27b-*-kv-32k.json --out DIR --label 27b

Inputs: bench_e2e JSON files labelled `27b-<kv>-kv-<depth>` (the `kve2e` stage of gpu_session.sh
writes them); each run's plan options give the format. Writes DIR/kv_e2e_<label>.{json,md}."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

FORMATS = ("bf16", "int8", "fp8", "k8v4", "rk8v4", "nvfp4", "rk4v4")


def collect(paths: list[Path]) -> dict:
    rows: dict[str, dict] = {}
    prov = None
    for p in paths:
        r = json.loads(p.read_text())
        kv = r["options"]["kv_dtype"]
        row = rows.setdefault(kv, {"kv": kv})
        prov = prov or r["provenance"]
        ctx = int(r["context"])
        for c, d in r["decode"].items():
            row[f"decode_c{c}_{ctx}"] = d["tok_s"]
            row[f"floor_pct_c{c}_{ctx}"] = 100.0 * d["fraction_of_floor"]
        for n, d in r["prefill"].items():
            row[f"prefill_{n}"] = d["tok_s"]
        row.setdefault("sources", []).append({"file": p.name, "date": r["provenance"]["date"]})
    return {"provenance": prov, "rows": [rows[f] for f in FORMATS if f in rows]}


def render(res: dict, label: str) -> str:
    prov = res["provenance"] or {}
    rows = res["rows"]
    base = next((r for r in rows if r["kv"] == "bf16"), None)
    keys = sorted({k for r in rows for k in r if k.startswith(("prefill_", "decode_"))},
                  key=lambda k: (k.split("_")[0] != "prefill", int(k.rsplit("_", 1)[1]), k))
    lines = [f"# KV formats end to end, {label}: {prov.get('gpu')}, {prov.get('date')}", "",
             f"driver {prov.get('driver')}, torch {prov.get('torch')}, triton {prov.get('triton')}; bench_e2e per format "
             "(one plan each, --kv-dtype F); decode = tokens/s of 32 greedy steps after a prompt of the depth; "
             "prefill = a 4K prompt; ratios against the bf16 row; `measured` = the runs' start (UTC; rows from "
             "different device calls differ here).", "",
             "| KV | " + " | ".join(k.replace("_", " ") for k in keys) + " | measured |",
             "|---|" + "---|" * (len(keys) + 1)]
    for r in rows:
        cells = []
        for k in keys:
            v = r.get(k)
            if v is None:
                cells.append("-")
                continue
            rel = f" ({100.0 * (v / base[k] - 1):+.1f}%)" if base and base.get(k) and r is not base else ""
            cells.append(f"{v:.1f}{rel}")
        when = sorted({src["date"][11:] for src in r.get("sources", [])})
        lines.append(f"| {r['kv']} | " + " | ".join(cells) + f" | {', '.join(when)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--label", default="27b")
    args = ap.parse_args(argv)
    files = [f for f in args.files if f.exists()]
    if not files:
        print("error: no bench_e2e JSON among the files given", file=sys.stderr)
        return 2
    res = collect(files)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"kv_e2e_{args.label}.json").write_text(json.dumps(res, indent=1) + "\n")
    md = render(res, args.label)
    (args.out / f"kv_e2e_{args.label}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
