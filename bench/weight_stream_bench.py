"""The weight stream's bandwidth (runtime/ninfer_runtime/weight_stream.py) against its limits, on a GPU.

    python bench/weight_stream_bench.py --plan P --artifact A [--readers 4,8,12] [--chunk-mib 4,8,16]
                                        [--repeat 2]

For each (readers, chunk size; two staging buffers a reader): a fresh `WeightStream` carries every object the plan uses from the
artifact file to the GPU (the artifact should be in the page cache: run it once first or after
`pack`), timed from `start()` to the end of `wait()`, then closed. Printed beside it, measured in the
same run: the host-to-device copy of one 1 GiB pinned buffer (torch, the PCIe limit the stream can
reach) and a single-threaded copy out of the artifact's mmap into pinned memory (what the
object-by-object upload's CPU side does). GB/s are 1e9 bytes per second.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runtime"))


def _objects(plan_dir: Path, artifact: Path):
    from ninfer_runtime.artifact_view import ArtifactView
    from ninfer_runtime.plan_source import read_plan
    from ninfer_runtime.weight_shards import weight_refs

    names, _ = weight_refs(read_plan(plan_dir)[0])
    with ArtifactView.open(artifact) as art:
        return [(n, art.payload_offset + art.objects[n].offset, art.objects[n].bytes) for n in names]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plan", type=Path, required=True)
    ap.add_argument("--artifact", type=Path, required=True)
    ap.add_argument("--readers", default="4,8,12")
    ap.add_argument("--chunk-mib", default="4,8,16")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args(argv)
    import torch

    from ninfer_runtime.artifact_view import ArtifactView
    from ninfer_runtime.cuda_driver import CudaDriver
    from ninfer_runtime.weight_stream import WeightStream

    objects = _objects(args.plan, args.artifact)
    total = sum(n for _, _, n in objects)
    dev = torch.device("cuda", torch.cuda.current_device())
    driver = CudaDriver.open(dev.index)
    pinned = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    on_dev = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    h2d = []
    for _ in range(3):
        torch.cuda.synchronize()
        t = time.perf_counter()
        on_dev.copy_(pinned, non_blocking=True)
        torch.cuda.synchronize()
        h2d.append((1 << 30) / (time.perf_counter() - t) / 1e9)
    with ArtifactView.open(args.artifact) as art:  # one thread, mmap -> pinned, the first GiB of the weights
        t, done = time.perf_counter(), 0
        for name, _, n in objects:
            k = min(n, pinned.numel() - done)
            if k <= 0:
                break
            pinned[done:done + k].copy_(torch.frombuffer(art.span(name), dtype=torch.uint8)[:k])
            done += k
        mmap_gbs = done / (time.perf_counter() - t) / 1e9
    del pinned, on_dev
    torch.cuda.empty_cache()
    print(f"{torch.cuda.get_device_name(dev)}: {len(objects)} objects, {total / 1e9:.2f} GB; host->device pinned "
          f"copy {max(h2d):.1f} GB/s (limit); mmap->pinned, one torch copy_ {mmap_gbs:.1f} GB/s", flush=True)
    rows = []
    for mib in (int(x) for x in args.chunk_mib.split(",")):
        for readers in (int(x) for x in args.readers.split(",")):
            for rep in range(args.repeat):
                s = WeightStream(driver, args.artifact, objects, readers=readers, buffers=max(2 * readers, 4),
                                 chunk_bytes=mib << 20)
                t = time.perf_counter()
                s.start().wait()
                dt = time.perf_counter() - t
                s.close()
                gbs = total / dt / 1e9
                rows.append({"readers": readers, "chunk_mib": mib, "run": rep + 1, "s": dt, "GB/s": gbs,
                             "of_limit": gbs / max(h2d)})
                print(f"readers {readers}, buffers {max(2 * readers, 4)} x {mib} MiB, run {rep + 1}: {dt:.3f} s, "
                      f"{gbs:.1f} GB/s ({100 * gbs / max(h2d):.0f}% of the pinned copy)", flush=True)
    print("json " + json.dumps({"h2d_GBs": max(h2d), "mmap_copy_GBs": mmap_gbs, "bytes": total, "rows": rows,
                                "cpus": os.cpu_count()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
