"""Measurement and provenance helpers shared by the route benchmarks (bench_attention, bench_gdn).

Imported as `_common` (the scripts run as `python bench/bench_<x>.py`, so bench/ is on sys.path).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
from collections.abc import Callable

import torch
import triton
from triton.testing import do_bench, do_bench_cudagraph


def env_info() -> dict:
    try:
        drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:  # noqa: BLE001
        drv = "unknown"
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(), "driver": drv, "torch": torch.__version__,
            "triton": triton.__version__}


def copy_bandwidth() -> float:
    """bytes read + written per second of a 1 GiB device-to-device copy."""
    a = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), rep=200)
    return 2 * a.numel() * 4 / (ms * 1e-3)


def streaming_read() -> float:
    """The streaming read rate in bytes/s (`limits.streaming_read_gbs`: a read-only kernel over
    rotated cold buffers), the limit a read-bound kernel is compared with."""
    from limits import streaming_read_gbs

    return streaming_read_gbs(torch)["gbs"] * 1e9


def eager(fn) -> dict:
    return {"eager_us": do_bench(fn, warmup=10, rep=40) * 1e3}


def timed(fn) -> dict:
    out = eager(fn)
    try:
        out["graph_us"] = do_bench_cudagraph(fn, rep=40) * 1e3
    except Exception as exc:  # noqa: BLE001
        out["graph_error"] = f"{type(exc).__name__}: {exc}"[:200]
    return out


def best(d: dict) -> float:
    return d.get("graph_us", d["eager_us"])


def try_config(row: dict, name: str, fn: Callable, measure: Callable[[Callable], dict] = timed) -> None:
    """Time one launch config into row["configs"][name] (its error, cut short, if it fails)."""
    try:
        row["configs"][name] = measure(fn)
    except Exception as exc:  # noqa: BLE001
        row["configs"][name] = {"error": str(exc)[:200]}


def pick_best(row: dict) -> None:
    """row["best_config"] / row["ours_us"]: the fastest config that ran (CUDA graph time if any)."""
    ok = {k: best(v) for k, v in row["configs"].items() if "eager_us" in v}
    row["best_config"] = min(ok, key=ok.get)
    row["ours_us"] = ok[row["best_config"]]


def out_dir(doc: str, argv=None) -> str:
    """Parse `--out DIR` (the script's first doc line as description) and create DIR."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    return args.out


def write_results(out: str, stem: str, res: dict, markdown: Callable[[dict], str]) -> None:
    """<out>/<stem>.json and <out>/<stem>.md; the markdown is printed too."""
    with open(os.path.join(out, f"{stem}.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(out, f"{stem}.md"), "w") as f:
        f.write(markdown(res))
    print(markdown(res))
