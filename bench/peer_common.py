"""What the two peers of bench_peers.py share: versions and provenance, the same-process read
rates, the roofline fields of a decode entry, the contract's shapes, the prompts, the partial result.

Imported as `peer_common` (bench/ is on sys.path when a bench script runs).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

PROMPT_VOCAB = 1000  # random prompt ids below min(this, vocab) are valid in any vocabulary


def versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for mod in ("torch", "transformers", "triton", "fla", "causal_conv1d"):
        try:
            m = __import__(mod)
            out[mod] = getattr(m, "__version__", "?")
        except Exception:  # noqa: BLE001  (absent or broken: recorded as such)
            out[mod] = None
    return out


def provenance(torch, device) -> dict:
    prov = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "device": str(device), **versions()}
    if device.type == "cuda":
        prov["gpu"] = torch.cuda.get_device_name(device)
        try:
            prov["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            prov["driver"] = "?"
    else:
        prov["gpu"], prov["driver"] = None, None
    return prov


def sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_streaming_read(torch, device) -> float | None:
    """The streaming read rate (bench/limits.py: read-only kernel, rotated cold buffers), GB/s; None on CPU."""
    if device.type != "cuda":
        return None
    from limits import streaming_read_gbs

    return streaming_read_gbs(torch)["gbs"]


def measure_read_bandwidth(torch, device) -> float | None:
    """bench_e2e's read roofline (bf16 cuBLAS GEMV over rotated cold weights), GB/s; None on CPU."""
    if device.type != "cuda":
        return None
    from bench_e2e import read_bandwidth_gbs

    return read_bandwidth_gbs(torch)


def roofline(entry: dict, wbytes: int, read_gbs: float | None) -> None:
    """Fill roofline_step_ms / fraction_of_roofline of a decode entry (None without a bandwidth)."""
    if read_gbs:
        roof_ms = wbytes / (read_gbs * 1e9) * 1e3
        entry["roofline_step_ms"] = roof_ms
        entry["fraction_of_roofline"] = roof_ms / entry["step_ms"]
    else:
        entry["roofline_step_ms"] = entry["fraction_of_roofline"] = None


def load_spec(contract: str):
    from ninfer_compile.contracts import load_contract

    c = load_contract(contract)
    return c.resolve(present=[p for p, s in c.part_status().items() if s == "optional"])


def prompts(n_seq: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """`n_seq` random prompts of `length` ids in [5, min(vocab, PROMPT_VOCAB)) (same for every peer)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    hi = min(vocab, PROMPT_VOCAB)
    return torch.randint(5, hi, (n_seq, length), generator=g).tolist()


def checkpoint(args, res: dict) -> None:
    """Write the partial result now (a peer killed later still reports what it measured)."""
    if args.result:
        Path(args.result).write_text(json.dumps(res, indent=1, default=str) + "\n")

