"""Turn `bench_linear.py` results into a tuner measurement file, so that `ninfer-compile tune --replay`
can pick table rows from a kernel benchmark run (no GPU needed for the replay).

Why. `bench_linear --table T --new ROUTE` times, at each shape and T, the route the table picks and the
new route's param sets in one run (cold weights, CUDA-graph replay, median): a within-run comparison,
the same as a tuner case. When the run was on another card of the same sm than the table's evidence
(an H100 under an H200 table), the file owns its points (`"owns_points": true`, which `tune --replay`
honours): at every (shape, T) the bench measured, the older files' timings are dropped and the pick uses
this run alone.

    python bench/linear_bench_to_meas.py bench/results/X/*.json --skip-t 1 -o out/bench.meas.json
    ninfer-compile tune --sm 90 --replay <committed files...> out/bench.meas.json \
        --base routes/sm90.yaml -o routes/sm90.yaml

Cases come from the committed measurement files (the linear case of the same format, N, K and
epilogue); a bench shape that has no committed case is named and skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ninfer_compile.kernels.registry import get_route  # noqa: E402

MEAS_DIR = ROOT / "routes" / "measurements"
RENAMED = {"q5_gemv_packed": "q5_gemv_lowreg", "q6_gemv_packed": "q6_gemv_lowreg"}  # renamed 2026-12-06 (issue 27)


def committed_cases(sm: int) -> dict[str, dict]:
    """Linear cases of the committed measurement files, keyed by their match (JSON, sorted keys)."""
    out: dict[str, dict] = {}
    for path in sorted((MEAS_DIR / f"sm{sm}").glob("*.meas.json")):
        for c in json.loads(path.read_text()).get("cases", []):
            if c.get("family") == "linear" and not c.get("window"):
                out.setdefault(json.dumps(c["match"], sort_keys=True), c)
    return out


def convert(paths: list[Path], sm: int, skip_t: set[int]) -> dict:
    known = committed_cases(sm)
    cases: list[dict] = []
    index: dict[str, int] = {}
    records: list[dict] = []
    missing: set[str] = set()
    prov: dict = {}
    t_points: set[int] = set()
    for path in paths:
        data = json.loads(path.read_text())
        prov = data.get("provenance", prov)
        for row in data.get("rows", []):
            if row["t"] in skip_t:
                continue
            match = {"format": row["format"], "n": row["n"], "k": row["k"], "epilogue": row["epilogue"]}
            key = json.dumps(match, sort_keys=True)
            if key not in known:
                missing.add(f"{row['shape']} {key}")
                continue
            if key not in index:
                index[key] = len(cases)
                cases.append(known[key])
            route = RENAMED.get(row["route"], row["route"])
            dom = get_route(route).domain
            t_points.add(int(row["t"]))
            for cand in row.get("candidates", []):
                rec = {"case": index[key], "family": "linear", "match": match, "t": int(row["t"]), "ctx": None,
                       "route": route, "params": cand["params"], "min_t": dom.min_t, "max_t": dom.max_t,
                       "mode": "graph", "cold_bytes": row.get("weight_bytes")}
                rec.update({"us": cand["us"]} if "us" in cand else {"error": cand.get("error", "failed")})
                records.append(rec)
    for m in sorted(missing):
        print(f"linear_bench_to_meas: no committed case for {m}: skipped", file=sys.stderr)
    env = {"device": prov.get("gpu", "?"), "cuda": prov.get("cuda"), "torch": prov.get("torch"),
           "triton": prov.get("triton"), "driver": str(prov.get("nvidia_smi", "")).split(",")[0],
           "sm_count": prov.get("sm_count"), "date": prov.get("date")}
    return {"sm": sm, "source": "bench_linear", "owns_points": True, "command": "bench_linear: " + str(prov.get("command", "")),
            "environment": env, "t_points": sorted(t_points), "elapsed_s": None,
            "warnings": [f"converted from bench_linear results: {', '.join(p.name for p in paths)}"],
            "cases": cases, "records": records}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, nargs="+", help="bench_linear JSON result files")
    ap.add_argument("--sm", type=int, default=90)
    ap.add_argument("--skip-t", default="", help="T points to leave out (comma separated), e.g. 1")
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args(argv)
    skip = {int(v) for v in args.skip_t.split(",") if v.strip()}
    for p in args.results:
        if not p.is_file():
            print(f"linear_bench_to_meas: {p}: no such file", file=sys.stderr)
            return 2
    out = convert(args.results, args.sm, skip)
    args.output.write_text(json.dumps(out, indent=1, default=str))
    print(f"wrote {args.output}: {len(out['cases'])} cases, {len(out['records'])} records, "
          f"T points {','.join(map(str, out['t_points']))} ({out['environment']['device']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
