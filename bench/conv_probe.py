"""Why the GDN conv takes 10.4 µs per launch in the C=8 decode step and 3.5 µs in the tuner (issue #16;
needs a CUDA GPU).

The tuner times `conv1d_decode` on one contiguous [T, 10240] input at small positions. The plan feeds it
the projections' outputs in place (fuse rule `conv_input_parts`): x0 = the query_key output [T, 4096]
(q | k) and x1 = the first 6,144 columns of the value_z output [T, 12288] (row stride 12,288), at the
step's positions (context 4096). This times both, at T = 1 and 8, the tuner's way (CUDA graph over
rotated state copies), so the difference is either the input layout or the step around the kernel.

Usage (GPU):  python3 bench/conv_probe.py [--out OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

C_QK, C_V, C_VZ, K = 4096, 6144, 12288, 4
SLOTS = 8


def probe(t: int, layout: str, position: int) -> float:
    import torch

    from ninfer_compile.kernels.conv1d.launch import conv1d_decode
    from ninfer_compile.tune import measure as M

    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(t)
    c = C_QK + C_V
    weight = torch.randn(K, c, device=dev, generator=gen).to(torch.bfloat16)
    states = [torch.randn(SLOTS, K - 1, c, device=dev, generator=gen).to(torch.bfloat16) for _ in range(16)]
    out = torch.empty(t, c, dtype=torch.bfloat16, device=dev)
    positions = torch.full((t,), position, dtype=torch.int32, device=dev) + torch.arange(t, dtype=torch.int32,
                                                                                            device=dev)
    slots = torch.arange(t, dtype=torch.int32, device=dev)
    if layout == "contiguous":
        x = torch.randn(t, c, device=dev, generator=gen).to(torch.bfloat16)
        inputs = {"x": x}
    else:  # the plan's parts: q | k from the query_key output, v from the value_z output (stride 12288)
        qk = torch.randn(t, C_QK, device=dev, generator=gen).to(torch.bfloat16)
        vz = torch.randn(t, C_VZ, device=dev, generator=gen).to(torch.bfloat16)
        inputs = {"x0": qk, "x1": vz[:, :C_V]}
    fns = [lambda s=s: conv1d_decode(weight=weight, conv_state=s, positions=positions, slots=slots, out=out,
                                     **inputs) for s in states]
    return M.time_launches(fns, reps=50, warmup=3)[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("error: conv_probe needs a CUDA GPU")
        return 2
    rows = []
    for t in (1, 8):
        for layout in ("contiguous", "parts"):
            for pos in (10, 4096):
                us = probe(t, layout, pos)
                rows.append({"t": t, "layout": layout, "position": pos, "us": us})
                print(f"conv T={t} {layout:10s} position {pos:5d}: {us:.2f} us", flush=True)
    if a.out:
        env = {"device": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "torch": torch.__version__}
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "conv_probe.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
